//! torch `OneCycleLR` with `anneal_strategy="cos"`, `three_phase=False`, `cycle_momentum=False`
//! (torch/optim/lr_scheduler.py). The seed (ChatLM-mini-Chinese model/trainer.py) ran it with
//! `max_lr = div_factor * learn_rate`, `div_factor = 50`, torch's default `pct_start = 0.3` and
//! `final_div_factor = 1e4`.

use super::anneal_cos;

#[derive(Debug, Clone, PartialEq)]
pub struct OneCycle {
    pub max_lr: f64,
    pub total_steps: u64,
    /// Fraction of the steps spent increasing the rate (torch default 0.3).
    pub pct_start: f64,
    /// `initial_lr = max_lr / div_factor` (torch default 25; the seed used 50).
    pub div_factor: f64,
    /// `min_lr = initial_lr / final_div_factor` (torch default 1e4).
    pub final_div_factor: f64,
}

impl OneCycle {
    /// torch's defaults for everything but `max_lr` and `total_steps`.
    pub fn torch_defaults(max_lr: f64, total_steps: u64) -> Self {
        Self {
            max_lr,
            total_steps,
            pct_start: 0.3,
            div_factor: 25.0,
            final_div_factor: 1e4,
        }
    }

    pub fn initial_lr(&self) -> f64 {
        self.max_lr / self.div_factor
    }

    pub fn min_lr(&self) -> f64 {
        self.initial_lr() / self.final_div_factor
    }

    /// torch's `get_lr()` at `last_epoch = step`. Steps past the end (torch raises) hold the final rate.
    pub fn lr_at(&self, step: u64) -> f64 {
        let step = step.min(self.total_steps.saturating_sub(1)) as f64;
        // torch: phase ends are `float(pct_start * total_steps) - 1` and `total_steps - 1`.
        let warm_end = self.pct_start * self.total_steps as f64 - 1.0;
        let last = self.total_steps as f64 - 1.0;
        if step <= warm_end {
            // Phase 1 starts at step 0; a zero-length phase cannot be reached here (step <= -1).
            anneal_cos(self.initial_lr(), self.max_lr, step / warm_end)
        } else {
            let span = last - warm_end;
            let pct = if span > 0.0 {
                (step - warm_end) / span
            } else {
                1.0
            };
            anneal_cos(self.max_lr, self.min_lr(), pct)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() <= 1e-12 * b.abs().max(1e-30), "{a} vs {b}");
    }

    #[test]
    fn starts_at_initial_peaks_at_max_ends_at_min() {
        // max_lr 0.005 = 50 × 1e-4 as the seed; 100 steps; phase 1 ends at step 29.
        let s = OneCycle {
            div_factor: 50.0,
            ..OneCycle::torch_defaults(0.005, 100)
        };
        close(s.lr_at(0), 1e-4);
        close(s.lr_at(29), 0.005);
        close(s.lr_at(99), 1e-4 / 1e4);
    }

    #[test]
    fn hand_computed_midpoints() {
        // total 10, pct_start 0.3: warm_end = 2.0, last = 9.
        let s = OneCycle::torch_defaults(1.0, 10);
        // step 1: pct 0.5 → end + (start-end)/2 × (cos(π/2)+1) = 1 + (0.04-1)/2 = 0.52
        close(s.lr_at(1), 0.52);
        // step 2: phase end → exactly max_lr.
        close(s.lr_at(2), 1.0);
        // step 5: pct (5-2)/7; min_lr = 0.04/1e4 = 4e-6.
        let pct: f64 = 3.0 / 7.0;
        let expected = 4e-6 + (1.0 - 4e-6) / 2.0 * ((std::f64::consts::PI * pct).cos() + 1.0);
        close(s.lr_at(5), expected);
        // These literal values were also computed by hand: cos(3π/7) = 0.2225209340.
        assert!((s.lr_at(5) - 0.611_262_0).abs() < 1e-6);
        close(s.lr_at(9), 4e-6);
    }

    #[test]
    fn past_the_end_holds_the_final_rate() {
        let s = OneCycle::torch_defaults(1.0, 10);
        close(s.lr_at(10), s.lr_at(9));
        close(s.lr_at(1000), s.lr_at(9));
    }

    #[test]
    fn rate_rises_then_falls_monotonically() {
        let s = OneCycle::torch_defaults(3e-3, 1000);
        let lrs: Vec<f64> = (0..1000).map(|k| s.lr_at(k)).collect();
        let peak = lrs
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i)
            .unwrap();
        assert_eq!(peak, 299);
        assert!(lrs[..=peak].windows(2).all(|w| w[0] <= w[1]));
        assert!(lrs[peak..].windows(2).all(|w| w[0] >= w[1]));
    }
}
