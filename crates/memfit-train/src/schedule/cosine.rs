//! Linear warm-up then cosine decay to zero: transformers' `get_cosine_schedule_with_warmup` with
//! `num_cycles = 0.5` (the schedule the seed's SFT ran through `Seq2SeqTrainer` with `warmup_steps`).

#[derive(Debug, Clone, PartialEq)]
pub struct WarmupCosine {
    pub base_lr: f64,
    pub warmup_steps: u64,
    pub total_steps: u64,
}

impl WarmupCosine {
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.base_lr * step as f64 / self.warmup_steps.max(1) as f64;
        }
        let decay = self.total_steps.saturating_sub(self.warmup_steps).max(1) as f64;
        let progress = ((step - self.warmup_steps) as f64 / decay).min(1.0);
        let factor = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.base_lr * factor.max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed_values() {
        let s = WarmupCosine {
            base_lr: 1e-3,
            warmup_steps: 10,
            total_steps: 110,
        };
        assert_eq!(s.lr_at(0), 0.0);
        assert!((s.lr_at(5) - 5e-4).abs() < 1e-15);
        assert!((s.lr_at(10) - 1e-3).abs() < 1e-15);
        // Half-way through the decay: cos(π/2) = 0 → half the base rate.
        assert!((s.lr_at(60) - 5e-4).abs() < 1e-15);
        // A quarter: 0.5 × (1 + cos(π/4)) = 0.853553390593...
        assert!((s.lr_at(35) - 0.853_553_390_593_273_8e-3).abs() < 1e-15);
        assert!(s.lr_at(110).abs() < 1e-18);
        assert!(s.lr_at(500).abs() < 1e-18);
    }

    #[test]
    fn zero_warmup_starts_at_base() {
        let s = WarmupCosine {
            base_lr: 2.0,
            warmup_steps: 0,
            total_steps: 4,
        };
        assert_eq!(s.lr_at(0), 2.0);
        assert!((s.lr_at(2) - 1.0).abs() < 1e-12);
    }
}
