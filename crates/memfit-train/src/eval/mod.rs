//! Evaluation as the loop sees it, whatever the task: a report of the validation loss and the task's
//! scores, its phases for progress lines, the plan of one evaluation (rows, micro-batch, stop flag),
//! and how many rows an evaluation uses by default ([`sizing`]). Each task computes its own scores
//! (`crate::task`); an evaluation reports its progress batch by batch and is abandoned between two
//! batches, or two generated tokens, once a stop is requested.

pub mod sizing;

use crate::memory_guard::{MemoryGuard, Verdict};
use crate::signals::StopFlag;
use memfit_nn::decoding::StopSignal;
use serde::{Deserialize, Serialize};

/// One named score of an evaluation (`bleu4`, `accuracy`, `macro_f1`, `perplexity`, …).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Score {
    pub name: String,
    pub value: f64,
}

/// Precision, recall and F1 of one class (classification).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassScore {
    pub label: String,
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    /// Validation rows of this class.
    pub support: usize,
    /// Validation rows predicted as this class (absent in reports written before it).
    #[serde(default)]
    pub predicted: usize,
}

/// One evaluation's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct EvalReport {
    /// Mean validation loss over the evaluated rows (weighted as training weighs them).
    pub valid_loss: f64,
    /// The task's scores, in the order they are shown.
    pub scores: Vec<Score>,
    /// Per-class scores (classification; empty otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<ClassScore>,
    pub rows_loss: usize,
    /// Rows of the validation set (more than `rows_loss` when `--eval-loss-rows` caps it).
    #[serde(default)]
    pub rows_valid: usize,
    /// Rows generated and scored by their text (0 for a task that generates nothing).
    pub rows_generated: usize,
    /// A few (reference, generated or predicted) pairs for the log.
    pub samples: Vec<(String, String)>,
    /// Wall time of the evaluation.
    #[serde(default)]
    pub seconds: f64,
}

impl EvalReport {
    /// The score named `name`; `valid_loss` is one too.
    pub fn score(&self, name: &str) -> Option<f64> {
        if name == "valid_loss" {
            return Some(self.valid_loss);
        }
        self.scores.iter().find(|s| s.name == name).map(|s| s.value)
    }

    /// What an evaluation cost: "128 rows, 8 generations, 3.1 s".
    pub fn cost(&self) -> String {
        let generations = if self.rows_generated > 0 {
            format!(", {} generations", self.rows_generated)
        } else {
            String::new()
        };
        let rows = if self.rows_valid > self.rows_loss {
            format!(
                "{} of {} rows (--eval-loss-rows)",
                self.rows_loss, self.rows_valid
            )
        } else {
            format!("{} rows", self.rows_loss)
        };
        format!("{rows}{generations}, {:.1} s", self.seconds)
    }

    /// "valid loss 1.2345, accuracy 0.9000, macro_f1 0.8800".
    pub fn describe(&self) -> String {
        let mut line = format!("valid loss {:.4}", self.valid_loss);
        for s in &self.scores {
            line += &format!(", {} {:.4}", s.name, s.value);
        }
        line
    }
}

/// The two parts of an evaluation, for progress reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvalPhase {
    Loss,
    Generate,
}

impl EvalPhase {
    pub fn name(self) -> &'static str {
        match self {
            EvalPhase::Loss => "loss",
            EvalPhase::Generate => "generation",
        }
    }
}

/// What one evaluation runs.
pub struct EvalPlan<'a> {
    /// Rows per forward pass.
    pub batch: usize,
    /// Rows whose loss (and, for classification, predictions) is computed, spread evenly over the
    /// validation set.
    pub loss_rows: usize,
    /// Rows (from the start of the validation set) that are generated and scored.
    pub generate_rows: usize,
    /// Polled between batches and between generated tokens.
    pub stop: Option<&'a StopFlag>,
    /// The run's memory guard: a reading is taken between batches, and its hard limit (or a failed
    /// allocation) abandons the evaluation as a stop request does; generation polls the hard limit
    /// between tokens.
    pub guard: Option<&'a MemoryGuard>,
}

impl EvalPlan<'_> {
    /// Whether the evaluation ends here, abandoned: a stop was requested or memory is exhausted.
    pub fn stopped(&self) -> bool {
        self.stop.is_some_and(StopFlag::is_requested)
            || self.guard.is_some_and(|g| g.sample_now() == Verdict::Hard)
            || crate::alloc_reserve::released()
    }

    /// What generation polls between tokens: the stop request, the guard's hard limit.
    pub fn stop_signals(&self) -> Vec<StopSignal> {
        let stop = self.stop.map(StopFlag::signal);
        stop.into_iter()
            .chain(self.guard.map(MemoryGuard::hard_signal))
            .collect()
    }

    /// The rows of the loss phase, `batch` at a time, as validation-set indices spread over
    /// `valid_len` rows.
    pub fn loss_batches(&self, valid_len: usize) -> Vec<Vec<usize>> {
        let n = self.loss_rows.min(valid_len);
        (0..n)
            .map(|i| sizing::spread(i, n, valid_len))
            .collect::<Vec<_>>()
            .chunks(self.batch.max(1))
            .map(<[usize]>::to_vec)
            .collect()
    }
}

pub type EvalError = Box<dyn std::error::Error + Send + Sync>;

/// Progress: (phase, rows done, rows in the phase), once before the first batch and after each.
pub type EvalProgress<'a> = &'a mut dyn FnMut(EvalPhase, usize, usize);
