//! Plain progress lines for a log: when stderr is not a terminal (nohup, CI, a file) a progress bar
//! draws nothing, so a long run prints a line at its first step, then every [`LINE_EVERY_S`] seconds
//! or [`LINE_EVERY_STEPS`] steps, whichever comes first, and at its last step — as Hugging Face
//! Trainer's `logging_steps` lines do. An evaluation reports its progress on the same cadence from its
//! start (a short one prints only its cost, when it ends).

use crate::metrics::StepMetrics;

/// Seconds between two progress lines at most (while steps complete).
pub const LINE_EVERY_S: f64 = 30.0;
/// Steps between two progress lines at most (Hugging Face Trainer's default `logging_steps`).
pub const LINE_EVERY_STEPS: u64 = 500;

/// Decides when the next line is due; the caller passes the time, so the rule is testable.
#[derive(Debug, Clone, Default)]
pub struct Cadence {
    last: Option<(f64, u64)>,
}

impl Cadence {
    /// Whether a line is due at `elapsed_s` seconds and `count` (steps or rows); `force` for the first
    /// and last ones. A due line is taken to be printed.
    pub fn due(&mut self, elapsed_s: f64, count: u64, force: bool) -> bool {
        let due = force
            || self.last.is_none_or(|(t, n)| {
                elapsed_s - t >= LINE_EVERY_S || count >= n + LINE_EVERY_STEPS
            });
        if due {
            self.last = Some((elapsed_s, count));
        }
        due
    }

    /// Starts the clock without a line: the first line comes a period after `elapsed_s`.
    pub fn start(&mut self, elapsed_s: f64) {
        self.last = Some((elapsed_s, 0));
    }
}

/// Seconds left for `remaining` steps at the pace of `done` steps in `elapsed_s` (none before a step).
pub fn eta_s(done: u64, remaining: u64, elapsed_s: f64) -> Option<f64> {
    (done > 0).then(|| elapsed_s / done as f64 * remaining as f64)
}

/// `1h02m`, `4m05s`, `12s`.
pub fn duration(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m{sec:02}s"),
        (h, m, _) => format!("{h}h{m:02}m"),
    }
}

/// `step 120/3750 (3%) epoch 0 loss 2.3456 lr 1.20e-3 12345 tok/s rss 26.1 MiB eta 5m12s`
pub fn step_line(m: &StepMetrics, total: u64, eta_s: Option<f64>) -> String {
    let pct = if total > 0 {
        100.0 * m.step as f64 / total as f64
    } else {
        100.0
    };
    format!(
        "step {}/{total} ({pct:.0}%) epoch {} loss {:.4} lr {:.2e} {:.0} tok/s rss {:.1} MiB eta {}",
        m.step,
        m.epoch,
        m.loss,
        m.lr,
        m.tokens_per_s,
        m.rss_bytes as f64 / (1u64 << 20) as f64,
        eta_s.map_or("?".into(), duration)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_come_first_then_every_30_s_or_500_steps_and_when_forced() {
        let mut c = Cadence::default();
        assert!(c.due(0.1, 1, false), "the first line");
        assert!(!c.due(10.0, 40, false));
        assert!(!c.due(30.0, 80, false));
        assert!(c.due(30.2, 81, false), "30 s after the first line");
        assert!(!c.due(31.0, 580, false));
        assert!(c.due(32.0, 581, false), "500 steps after the last line");
        assert!(c.due(32.1, 582, true), "forced (the last step)");
        c.start(40.0);
        assert!(!c.due(41.0, 10, false), "a started phase waits a period");
        assert!(c.due(70.0, 11, false));
    }

    #[test]
    fn eta_and_durations_read_as_a_person_writes_them() {
        assert_eq!(eta_s(0, 10, 5.0), None);
        assert_eq!(eta_s(10, 30, 5.0), Some(15.0));
        assert_eq!(duration(12.4), "12s");
        assert_eq!(duration(245.0), "4m05s");
        assert_eq!(duration(3725.0), "1h02m");
    }

    #[test]
    fn a_step_line_names_step_loss_lr_throughput_memory_and_eta() {
        let m = StepMetrics {
            step: 120,
            epoch: 1,
            micro_batch: 8,
            accum: 1,
            loss: 2.345_67,
            lr: 1.2e-3,
            grad_norm: 1.0,
            tokens: 100,
            tokens_per_s: 12_345.4,
            step_s: 0.1,
            input_wait_s: 0.0,
            rank_input_wait_s: None,
            rss_bytes: 26 << 20,
            peak_rss_bytes: 30 << 20,
            gpu_bytes: None,
        };
        assert_eq!(
            step_line(&m, 3750, Some(312.0)),
            "step 120/3750 (3%) epoch 1 loss 2.3457 lr 1.20e-3 12345 tok/s rss 26.0 MiB eta 5m12s"
        );
    }
}
