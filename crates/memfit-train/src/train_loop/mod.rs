//! The training loop, generic over [`Engine`]: one effective batch of seeded rows per optimizer step
//! from a cursor, cut into micro-batches (gradient accumulation, each micro-batch's loss scaled once, in
//! the engine, by its share of the step's target tokens), one optimizer step at the scheduled rate,
//! metrics, evaluation, `best/`, checkpoints with retention, a stop on request, and the memory guard's
//! actions (halve the micro-batch at the soft limit; checkpoint and stop at the hard one).
//!
//! Everything that decides the weights is a function of (config, step, cursor), all saved in
//! `trainer_state.json`, so a run resumed from a checkpoint computes what the uninterrupted run would have.
//! The micro-batch size is saved too; it changes how a step's rows are cut, not which rows or their
//! gradient (up to summation order and dropout masks).
//!
//! A stop (SIGINT/SIGTERM, [`StopFlag`]) is acted on within one micro-batch, one evaluation batch or
//! one generated token, or after the checkpoint being written: the loop writes the checkpoint of its
//! last completed step (unless it just did) and reports [`Finish::Stopped`]. An evaluation cut short is
//! recorded as pending in that checkpoint and run first by `--resume`.
//!
//! The pieces: `step` (one optimizer step), `evaluation` (when, how much, `best/`), `saving`
//! (checkpoints, the signal stop), `memory` (the guard at step boundaries).

mod evaluation;
mod memory;
mod read_ahead;
mod saving;
mod step;

use crate::batches;
use crate::checkpoint::{BestRecord, CheckpointError, Checkpointer, TrainerState};
use crate::config::TrainConfig;
use crate::engine::Engine;
use crate::eval::{EvalPhase, EvalReport};
use crate::memory_guard::MemoryGuard;
use crate::metrics::{self, StepMetrics};
use crate::run_dir::{RunDir, RunDirError};
use crate::schedule::Schedule;
use crate::signals::StopFlag;
use crate::task::{RowSource, Task};
use memfit_data::{Batching, Cursor, Sampler, SamplerConfig};
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

pub use memory::ALLOCATION_FAILURE;
use memory::MemoryAction;
pub use saving::RANK_FAILED;
use step::StepOutcome;

#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    #[error("the training data has no rows")]
    EmptyData,
    #[error("the training data cannot be sampled: {0}")]
    Data(String),
    #[error("at step {step}: the engine failed: {message}")]
    Engine { step: u64, message: String },
    #[error(
        "at step {step}: the loss is {loss} (not finite); stopping — lower --lr or check the data"
    )]
    NonFinite { step: u64, loss: f64 },
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

/// Tags that keep derived seeds of different purposes apart.
const DROPOUT_SEED_TAG: u64 = 0x4452_4f50; // "DROP"

/// The seed handed to `Engine::accumulate` for micro-batch `micro` of optimizer step `step` (0-based).
pub fn micro_batch_seed(run_seed: u64, step: u64, micro: u64) -> u64 {
    batches::derive_seed(run_seed, &[DROPOUT_SEED_TAG, step, micro])
}

/// Hooks for a progress display; every method has a no-op default.
pub trait Observer {
    fn on_start(&mut self, _total_steps: u64, _start_step: u64) {}
    fn on_step(&mut self, _metrics: &StepMetrics) {}
    /// An evaluation at `step` has done `done` of `total` rows of `phase` (called with 0 before its
    /// first batch, then after each).
    fn on_eval_progress(&mut self, _step: u64, _phase: EvalPhase, _done: usize, _total: usize) {}
    fn on_eval(&mut self, _step: u64, _report: &EvalReport) {}
    /// A line worth showing the user (checkpoint skipped, stop requested, …).
    fn on_message(&mut self, _message: &str) {}
}

/// An observer that shows nothing.
pub struct Silent;
impl Observer for Silent {}

/// How a loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// All steps done.
    Completed,
    /// A stop was requested (SIGINT/SIGTERM) or the memory guard's hard limit was crossed; the state
    /// is checkpointed (`events.jsonl` `stop` names the reason): exit 75.
    Stopped,
}

/// The run's last checkpoint could not be written for lack of disk space: its model is not saved.
#[derive(Debug, Clone, PartialEq)]
pub struct Unsaved {
    /// The checkpoint that was skipped, the bytes it needed and those free on its disk.
    pub path: PathBuf,
    pub needed: u64,
    pub free: u64,
    /// Checkpoints skipped in this process, this one included.
    pub skipped: u64,
    /// The newest complete checkpoint on disk, if any.
    pub newest: Option<PathBuf>,
}

impl std::fmt::Display for Unsaved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no model was saved: checkpoint {} was skipped for lack of disk space ({} bytes needed, {} free); {} checkpoint(s) skipped in this run; ",
            self.path.display(),
            self.needed,
            self.free,
            self.skipped
        )?;
        match &self.newest {
            Some(p) => write!(f, "the newest saved checkpoint is {}", p.display()),
            None => write!(f, "no checkpoint of this run exists"),
        }
    }
}

/// What the summary prints.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub finish: Finish,
    pub start_step: u64,
    pub steps: u64,
    pub total_steps: u64,
    pub first_loss: Option<f64>,
    pub last_loss: Option<f64>,
    /// The task's headline score (`Task::headline`) before any training, when evaluated then.
    pub score_before: Option<f64>,
    /// Which score that is (`bleu4`, `accuracy`).
    pub headline: &'static str,
    pub last_eval: Option<EvalReport>,
    pub best: Option<BestRecord>,
    pub peak_rss_bytes: u64,
    pub tokens: u64,
    /// Wall time of the whole loop (evaluations and checkpoints included).
    pub seconds: f64,
    /// Wall time of the optimizer steps alone (what tokens/s divides by).
    pub train_seconds: f64,
    pub last_checkpoint: Option<PathBuf>,
    /// Set when a completed run's final checkpoint was skipped for lack of disk: a failure (exit 1).
    /// (A stop says in its `stop` event where `--resume` continues; it exits 75.)
    pub unsaved: Option<Unsaved>,
}

impl Summary {
    /// Training throughput: tokens of the optimizer steps over their time (evaluation excluded).
    pub fn tokens_per_s(&self) -> f64 {
        if self.train_seconds > 0.0 {
            self.tokens as f64 / self.train_seconds
        } else {
            0.0
        }
    }
}

/// Everything one loop needs. `resume` is the state of the checkpoint the engine was loaded from.
pub struct Trainer<'a, E: Engine, T: Task<E>> {
    pub engine: &'a mut E,
    pub task: &'a T,
    pub config: &'a TrainConfig,
    pub run: &'a mut RunDir,
    pub checkpointer: &'a mut Checkpointer,
    pub train: &'a dyn RowSource<T::Row>,
    pub valid: Option<&'a dyn RowSource<T::Row>>,
    pub stop: StopFlag,
    pub observer: &'a mut dyn Observer,
    pub resume: Option<TrainerState>,
    pub vocab_size: Option<usize>,
    /// The in-process memory guard (`None`: no memory limits are acted on).
    pub guard: Option<&'a MemoryGuard>,
}

/// The state a checkpoint records.
struct Progress {
    step: u64,
    cursor: Cursor,
    best: Option<BestRecord>,
    first_loss: Option<f64>,
    last_loss: Option<f64>,
    score_before: Option<f64>,
    /// Micro-batch rows in force (the configured `batch`, or less after a guard downgrade).
    micro: usize,
    /// An evaluation of this step is due and not done.
    eval_pending: bool,
}

/// What the loop tallies for the summary, and what its checkpoints did.
#[derive(Default)]
struct Ledger {
    tokens: u64,
    train_seconds: f64,
    last_checkpoint: Option<PathBuf>,
    last_eval: Option<EvalReport>,
    warned_budget: bool,
    /// The evaluation batch after the device ran out of memory evaluating (this process only).
    eval_batch_cap: Option<usize>,
    /// The step whose exact state the newest checkpoint holds.
    saved_step: Option<u64>,
    /// The last step checkpoint attempted was skipped for lack of disk (path, needed, free).
    skipped_last: Option<(PathBuf, u64, u64)>,
    skips: u64,
}

struct State {
    p: Progress,
    l: Ledger,
    total: u64,
    schedule: Schedule,
}

impl<'a, E: Engine, T: Task<E>> Trainer<'a, E, T> {
    /// Optimizer steps of the whole run: `--max-steps`, else epochs × steps per epoch.
    pub fn total_steps(config: &TrainConfig, train_rows: usize) -> u64 {
        config.max_steps.unwrap_or_else(|| {
            u64::from(config.epochs)
                * batches::steps_per_epoch(train_rows, config.batch, config.accum)
        })
    }

    pub fn run(mut self) -> Result<Summary, LoopError> {
        let rows = self.train.len();
        if rows == 0 {
            return Err(LoopError::EmptyData);
        }
        let total = Self::total_steps(self.config, rows);
        let fresh = self.resume.is_none();
        let mut s = State {
            p: self.initial_progress()?,
            l: Ledger::default(),
            total,
            schedule: self.config.schedule(total),
        };
        if !fresh {
            // the checkpoint just loaded holds this state
            s.l.saved_step = Some(s.p.step);
        }
        let start_step = s.p.step;
        self.observer.on_start(total, start_step);
        self.note_resumed_micro_batch(&s.p)?;
        let started = Instant::now();
        let finish = self.drive(&mut s, fresh)?;
        // A stop's own event says what its checkpoint came to and where --resume continues (exit 75);
        // only a completed run whose end state found no room has lost its model.
        let unsaved = if finish == Finish::Completed {
            self.unsaved(&s)
        } else {
            None
        };
        if let Some(u) = &unsaved {
            self.run.event(
                s.p.step,
                "error",
                json!({"reason": "checkpoint_skipped", "path": u.path, "needed_bytes": u.needed, "free_bytes": u.free, "message": u.to_string()}),
            )?;
        } else if finish == Finish::Completed {
            self.run
                .event(s.p.step, "finish", json!({"steps": s.p.step}))?;
        }
        Ok(Summary {
            finish,
            start_step,
            steps: s.p.step,
            total_steps: total,
            first_loss: s.p.first_loss,
            last_loss: s.p.last_loss,
            score_before: s.p.score_before,
            headline: self.task.headline(),
            last_eval: s.l.last_eval,
            best: s.p.best,
            peak_rss_bytes: metrics::rss().peak,
            tokens: s.l.tokens,
            seconds: started.elapsed().as_secs_f64(),
            train_seconds: s.l.train_seconds,
            last_checkpoint: s.l.last_checkpoint,
            unsaved,
        })
    }

    /// Runs the evaluation due; where it cannot finish (a stop requested, the device out of memory
    /// at one row), the run stops with it pending, checkpointed.
    fn evaluation_stops(&mut self, s: &mut State) -> Result<Option<Finish>, LoopError> {
        match self.evaluate_due(s)? {
            evaluation::Evaluated::Done => Ok(None),
            // abandoned for memory (the guard's hard limit, a failed allocation) or a stop request
            evaluation::Evaluated::Abandoned if self.memory_exhausted() => {
                self.stop_for_memory_evaluating(s)?;
                Ok(Some(Finish::Stopped))
            }
            evaluation::Evaluated::Abandoned => self.stop_on_signal(s, None).map(Some),
            evaluation::Evaluated::OutOfMemory => {
                self.stop_for_device_memory(s, None)?;
                Ok(Some(Finish::Stopped))
            }
        }
    }

    /// The steps, evaluations, checkpoints and stops of the run, up to its end.
    fn drive(&mut self, s: &mut State, fresh: bool) -> Result<Finish, LoopError> {
        let start_eval = fresh && self.config.eval_at_start;
        if self.valid.is_some() && (s.p.eval_pending || start_eval) {
            let resumed_pending = s.p.eval_pending;
            if let Some(finish) = self.evaluation_stops(s)? {
                return Ok(finish);
            }
            if resumed_pending {
                // the checkpoint still says "pending": record the evaluation's outcome
                s.l.saved_step = None;
                self.save_once(s)?;
            }
        }
        // One draw per optimizer step: the step's rows, cut into micro-batches. The rows of a step do
        // not depend on the micro-batch size, so a downgrade changes only how they are cut.
        let effective = batches::effective_batch(self.config.batch, self.config.accum);
        let sampler_config = SamplerConfig::new(self.config.seed, Batching::Samples(effective));
        let lengths = self
            .train
            .lengths()
            .map_err(|e| LoopError::Data(e.to_string()))?;
        let mut sampler = Sampler::resume(sampler_config, lengths, s.p.cursor)
            .map_err(|e| LoopError::Data(e.to_string()))?;
        let mut ahead = None;
        while s.p.step < s.total {
            if self.stop.is_requested() {
                return self.stop_on_signal(s, None);
            }
            let epoch_end = match self.train_step(&mut sampler, s, &mut ahead)? {
                StepOutcome::Done { epoch_end } => epoch_end,
                StepOutcome::Signal { done, of } => {
                    return self.stop_on_signal(s, Some((done, of)));
                }
                StepOutcome::Memory { done, of } => {
                    self.stop_mid_step_for_memory(s, done, of)?;
                    return Ok(Finish::Stopped);
                }
                StepOutcome::DeviceMemory { done, of } => {
                    self.stop_for_device_memory(s, Some((done, of)))?;
                    return Ok(Finish::Stopped);
                }
                StepOutcome::RankFailed { done, of, message } => {
                    self.stop_for_rank_failure(s, done, of, &message)?;
                    return Ok(Finish::Stopped);
                }
            };
            if self.eval_due(s, epoch_end)
                && let Some(finish) = self.evaluation_stops(s)?
            {
                return Ok(finish);
            }
            let action = self.memory_boundary(s)?;
            let save_due = epoch_end
                || s.p.step == s.total
                || action.as_ref().is_some_and(MemoryAction::needs_checkpoint)
                || self
                    .config
                    .save_steps
                    .is_some_and(|n| n > 0 && s.p.step.is_multiple_of(n));
            let saved = if save_due { self.save_once(s)? } else { None };
            if let Some(action) = action
                && self.act_on_memory(s, action, saved)?
            {
                return Ok(Finish::Stopped);
            }
        }
        Ok(Finish::Completed)
    }

    /// The loop's bookkeeping at its start: a fresh run, or a checkpoint's state (format-1 cursors,
    /// micro-batch positions, are converted to step positions; a recorded micro-batch is kept if it
    /// still divides this config's effective batch into at most `batch` rows).
    fn initial_progress(&mut self) -> Result<Progress, LoopError> {
        let config = self.config;
        let Some(s) = self.resume.take() else {
            return Ok(Progress {
                step: 0,
                cursor: Cursor {
                    epoch: 0,
                    position: 0,
                    seed: config.seed,
                },
                best: None,
                first_loss: None,
                last_loss: None,
                score_before: None,
                micro: config.batch,
                eval_pending: false,
            });
        };
        if s.format > TrainerState::FORMAT {
            return Err(LoopError::Data(format!(
                "trainer_state.json format {} is newer than this memfit ({})",
                s.format,
                TrainerState::FORMAT
            )));
        }
        let mut cursor = s.cursor;
        if s.format < 2 {
            cursor.position = cursor.position.div_ceil(config.accum as u64);
        }
        let micro = match s.micro_batch {
            Some(m) if (1..=config.batch).contains(&m) => m,
            _ => config.batch,
        };
        Ok(Progress {
            step: s.step,
            cursor,
            best: s.best,
            first_loss: s.first_loss,
            last_loss: s.last_loss,
            score_before: s.score_before,
            micro,
            eval_pending: s.eval_pending,
        })
    }

    fn note_resumed_micro_batch(&mut self, p: &Progress) -> Result<(), LoopError> {
        if p.micro == self.config.batch {
            return Ok(());
        }
        let effective = batches::effective_batch(self.config.batch, self.config.accum);
        let line = format!(
            "continuing at micro-batch {} × accumulation {} (lowered by the memory guard; effective batch {effective})",
            p.micro,
            batches::accum_for(effective, p.micro)
        );
        self.run.log(&line)?;
        self.observer.on_message(&line);
        Ok(())
    }
}
