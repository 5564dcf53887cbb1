//! What a run on real data (`--data`, `--init`) trains with where no layer says: per task and
//! method, the defaults of the tools fine-tuning users know — never the demo's (a tiny model from
//! scratch in two minutes: lr 3e-3 one-cycle, 30 epochs, seq 16). docs/train.md has the table.
//!
//! Sources:
//! - classification, full/freeze: transformers' `TrainingArguments` (lr 5e-5, 3 epochs, AdamW,
//!   clip 1.0); batch 16 and the 5e-5 rate are in BERT's fine-tuning grid (Devlin et al. 2019,
//!   appendix A.3: batch 16/32, lr 5e-5/3e-5/2e-5, 2–4 epochs); 6% warm-up: RoBERTa's GLUE recipe
//!   (Liu et al. 2019, table 10).
//! - seq2seq (T5), full/freeze: the seed's rate 1e-4 with Adafactor at the scheduled rate, as
//!   transformers' `Trainer` builds Adafactor (`relative_step=False`); 3 epochs, batch 16.
//! - causal-lm, full/freeze: Stanford Alpaca's `train.py` recipe (lr 2e-5, cosine, 3% warm-up,
//!   3 epochs).
//! - causal-lm, LoRA: lr 2e-4 (the QLoRA paper's and PEFT's examples), cosine, 3% warm-up.
//!
//! transformers decays linearly after the warm-up by default; memfit's schedule is warm-up +
//! cosine (as the seed's SFT ran), the nearest it has.

use crate::config::{ConfigLayer, Method, OptimizerKind, TaskKind};
use crate::schedule::ScheduleKind;

/// The defaults of one task × method.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TaskDefaults {
    pub lr: f64,
    pub optimizer: OptimizerKind,
    /// Warm-up steps as a share of the run's optimizer steps (warm-up + cosine decay).
    pub warmup_ratio: f64,
    pub epochs: u32,
    /// The effective batch (rows per optimizer step); the planner splits it into micro × accum.
    pub batch: usize,
    /// The row of the table, as the start line names it: "classification, full".
    pub row: &'static str,
}

/// The defaults of `task` trained by `method`.
pub fn for_run(task: TaskKind, method: Method) -> TaskDefaults {
    let base = TaskDefaults {
        lr: 5e-5,
        optimizer: OptimizerKind::Adamw,
        warmup_ratio: 0.06,
        epochs: 3,
        batch: 16,
        row: "classification, full",
    };
    match (task, method) {
        (TaskKind::Classification, Method::Freeze) => TaskDefaults {
            row: "classification, freeze",
            ..base
        },
        (TaskKind::Classification, _) => base,
        (TaskKind::Seq2seq, method) => TaskDefaults {
            lr: 1e-4,
            optimizer: OptimizerKind::Adafactor,
            row: if method == Method::Freeze {
                "seq2seq, freeze"
            } else {
                "seq2seq, full"
            },
            ..base
        },
        (TaskKind::CausalLm, Method::Lora) => TaskDefaults {
            lr: 2e-4,
            warmup_ratio: 0.03,
            row: "causal-lm, lora",
            ..base
        },
        (TaskKind::CausalLm, method) => TaskDefaults {
            lr: 2e-5,
            warmup_ratio: 0.03,
            row: if method == Method::Freeze {
                "causal-lm, freeze"
            } else {
                "causal-lm, full"
            },
            ..base
        },
    }
}

impl TaskDefaults {
    /// The defaults as the bottom layer of the settings (every other layer overrides them).
    pub fn layer(&self) -> ConfigLayer {
        ConfigLayer {
            lr: Some(self.lr),
            optimizer: Some(self.optimizer),
            // transformers' Trainer builds Adafactor at the scheduled rate
            adafactor_relative_step: Some(false),
            schedule: Some(ScheduleKind::Cosine),
            warmup_steps: Some(0),
            warmup_ratio: Some(self.warmup_ratio),
            epochs: Some(self.epochs),
            batch: Some(self.batch),
            accum: Some(1),
            ..ConfigLayer::default()
        }
    }

    /// How far `lr` is from this row's rate, as a factor ≥ 1 (10: an order of magnitude).
    pub fn lr_factor(&self, lr: f64) -> f64 {
        let r = lr / self.lr;
        r.max(1.0 / r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TrainConfig;

    #[test]
    fn every_row_resolves_to_a_valid_config_with_its_rate() {
        let rows = [
            (TaskKind::Classification, Method::Full, 5e-5),
            (TaskKind::Classification, Method::Freeze, 5e-5),
            (TaskKind::Seq2seq, Method::Full, 1e-4),
            (TaskKind::CausalLm, Method::Full, 2e-5),
            (TaskKind::CausalLm, Method::Lora, 2e-4),
        ];
        for (task, method, lr) in rows {
            let d = for_run(task, method);
            let mut c = TrainConfig {
                task,
                method,
                best_metric: task.default_best_metric(),
                ..TrainConfig::default()
            };
            d.layer().apply(&mut c);
            c.validate().unwrap();
            assert_eq!(c.lr, lr, "{}", d.row);
            assert_eq!((c.epochs, c.batch * c.accum), (3, 16), "{}", d.row);
            assert!(d.row.starts_with(task.name()), "{}", d.row);
        }
    }

    #[test]
    fn the_warm_up_is_a_share_of_the_run() {
        let mut c = TrainConfig::default();
        for_run(TaskKind::Classification, Method::Full)
            .layer()
            .apply(&mut c);
        // 6% of 1,000 steps: the rate climbs for 60 steps, then decays
        let s = c.schedule(1000);
        assert!(s.lr_at(30) < s.lr_at(59) && s.lr_at(59) < 5e-5);
        assert!((s.lr_at(60) - 5e-5).abs() < 1e-18);
        assert!(s.lr_at(500) < 5e-5);
    }

    #[test]
    fn an_order_of_magnitude_either_way_is_a_factor_of_ten() {
        let d = for_run(TaskKind::Classification, Method::Full);
        assert!((d.lr_factor(5e-4) - 10.0).abs() < 1e-9);
        assert!((d.lr_factor(5e-6) - 10.0).abs() < 1e-9);
        assert!(d.lr_factor(3e-3) > 10.0 && d.lr_factor(2e-5) < 10.0);
    }
}
