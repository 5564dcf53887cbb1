//! `trainer_state.json`: everything besides the tensors that an exact resume needs.

use memfit_data::Cursor;
use serde::{Deserialize, Serialize};

/// The best evaluation so far (what `best/` holds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BestRecord {
    /// The score's name (`bleu4`, `valid_loss`, `accuracy`, `macro_f1`).
    pub metric: String,
    pub value: f64,
    pub step: u64,
    /// The validation loss of that evaluation: it breaks a tie of `value` (absent in states
    /// written before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_loss: Option<f64>,
}

impl BestRecord {
    /// Whether an evaluation scoring `value` (with `valid_loss`) replaces this best: a better
    /// score, or the same score at a validation loss no higher — a later checkpoint wins a tie, so a
    /// saturated metric (accuracy 1.0 from early on) does not freeze `best/` at its first step.
    pub fn replaced_by(&self, value: f64, valid_loss: f64, higher_is_better: bool) -> bool {
        let better = if higher_is_better {
            value > self.value
        } else {
            value < self.value
        };
        better || (value == self.value && self.valid_loss.is_none_or(|l| valid_loss <= l))
    }
}

/// How random draws are made. Every draw is derived from the run seed and its coordinates (epoch for
/// the shuffle; step and micro-batch for dropout), so the state to restore is the seed itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RngState {
    pub seed: u64,
    pub scheme: String,
}

/// The schedule is a pure function of the step; this records where it stands, for a reader.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedulerState {
    pub kind: String,
    pub total_steps: u64,
    /// Completed optimizer steps (the schedule's position).
    pub step: u64,
    /// The rate of the next step.
    pub next_lr: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    pub format: u32,
    /// Epoch the next micro-batch belongs to.
    pub epoch: u64,
    /// Optimizer steps completed.
    pub step: u64,
    /// Data cursor at this step boundary. Format 2: `position` counts optimizer steps (the sampler
    /// draws one effective batch per step); format 1 counted micro-batches of the configured size.
    pub cursor: Cursor,
    pub rng: RngState,
    pub scheduler: SchedulerState,
    pub best: Option<BestRecord>,
    /// `TrainConfig::hash` of the run that wrote this.
    pub config_hash: String,
    /// The model this checkpoint belongs to (config `model`) and its vocabulary size.
    pub model: String,
    pub vocab_size: Option<usize>,
    /// Loss of the last step and the first (for the summary of a resumed run).
    pub first_loss: Option<f64>,
    pub last_loss: Option<f64>,
    /// The task's headline score before any training (the summary's "before"; BLEU-4 for
    /// seq2seq, the name it had in format 2).
    #[serde(alias = "bleu_before")]
    pub score_before: Option<f64>,
    /// Micro-batch rows for the next step: the configured `batch`, or less after the memory guard
    /// halved it (the effective batch, `batch × accum` of the config, is unchanged, so this is not a
    /// config change and does not enter the config hash). Absent before format 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batch: Option<usize>,
    /// Micro-batches per full step at that size: ⌈effective batch / micro_batch⌉ (for a reader).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accum: Option<usize>,
    /// An evaluation of this step was due but abandoned by a stop: a resume runs it first.
    #[serde(default, skip_serializing_if = "is_false")]
    pub eval_pending: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl TrainerState {
    pub const FILE: &'static str = "trainer_state.json";
    /// 2: cursor positions count optimizer steps; `micro_batch`/`accum` record the guard's downgrades.
    pub const FORMAT: u32 = 2;
}

#[cfg(test)]
mod best_tests {
    use super::BestRecord;

    #[test]
    fn a_tie_goes_to_the_later_evaluation_unless_its_loss_is_higher() {
        let best = BestRecord {
            metric: "accuracy".into(),
            value: 1.0,
            step: 875,
            valid_loss: Some(0.01),
        };
        assert!(best.replaced_by(1.0, 0.005, true));
        assert!(best.replaced_by(1.0, 0.01, true));
        assert!(!best.replaced_by(1.0, 0.02, true));
        assert!(!best.replaced_by(0.99, 0.001, true));
        // the loss as the metric: lower wins, a tie is the later one
        let loss = BestRecord {
            metric: "valid_loss".into(),
            value: 0.5,
            valid_loss: Some(0.5),
            ..best.clone()
        };
        assert!(loss.replaced_by(0.4, 0.4, false) && loss.replaced_by(0.5, 0.5, false));
        assert!(!loss.replaced_by(0.6, 0.6, false));
        // a state written before the loss was kept: a tie goes to the later one
        let old = BestRecord {
            valid_loss: None,
            ..best
        };
        assert!(old.replaced_by(1.0, 9.0, true));
    }
}
