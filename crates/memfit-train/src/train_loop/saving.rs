//! Step checkpoints from the loop: when one is written, what it records, a disk too full for it, and
//! the stop on a signal or a failed data-parallel rank (the checkpoint of the last completed step,
//! then exit 75).

use super::{Finish, LoopError, State, Trainer, Unsaved};
use crate::batches;
use crate::checkpoint::{self, RngState, SaveOutcome, SchedulerState, TrainerState};
use crate::engine::Engine;
use crate::task::Task;
use serde_json::json;
use std::path::{Path, PathBuf};

/// The `stop` event's reason when a data-parallel rank or a collective between ranks failed.
pub const RANK_FAILED: &str = "rank_failed";

impl<E: Engine, T: Task<E>> Trainer<'_, E, T> {
    /// Writes `checkpoints/step-N/` unless the newest checkpoint already holds this exact state.
    /// Returns the checkpoint's path, `None` when it was skipped for lack of disk.
    pub(super) fn save_once(&mut self, s: &mut State) -> Result<Option<PathBuf>, LoopError> {
        if s.l.saved_step == Some(s.p.step) {
            return Ok(s.l.last_checkpoint.clone());
        }
        let state = self.state(s);
        match self.checkpointer.save_step(&mut *self.engine, &state)? {
            SaveOutcome::Saved { path, bytes } => {
                self.run.event(
                    s.p.step,
                    "checkpoint",
                    json!({"path": path, "bytes": bytes}),
                )?;
                s.l.saved_step = Some(s.p.step);
                s.l.skipped_last = None;
                s.l.last_checkpoint = Some(path.clone());
                Ok(Some(path))
            }
            SaveOutcome::Skipped { path, needed, free } => {
                self.skipped(s, &path, needed, free)?;
                s.l.skipped_last = Some((path, needed, free));
                Ok(None)
            }
        }
    }

    /// A checkpoint (step or `best/`) skipped for lack of disk: an event each time, the cause on the
    /// screen the first time and a short line after.
    pub(super) fn skipped(
        &mut self,
        s: &mut State,
        path: &Path,
        needed: u64,
        free: u64,
    ) -> Result<(), LoopError> {
        s.l.skips += 1;
        self.run.event(
            s.p.step,
            "checkpoint_skipped",
            json!({"path": path, "needed_bytes": needed, "free_bytes": free}),
        )?;
        self.observer.on_message(&if s.l.skips == 1 {
            format!(
                "warning: checkpoint {} skipped: {needed} bytes needed, {free} free on its disk",
                path.display()
            )
        } else {
            format!(
                "warning: checkpoint {} skipped too (disk still short: {free} bytes free)",
                path.display()
            )
        });
        Ok(())
    }

    /// A data-parallel rank (or a collective) failed mid-step: every rank stops, the last completed
    /// step is checkpointed (the ranks agree on it: no optimizer saw the failed step's gradients).
    pub(super) fn stop_for_rank_failure(
        &mut self,
        s: &mut State,
        done: usize,
        of: u64,
        message: &str,
    ) -> Result<(), LoopError> {
        self.engine.discard_gradients();
        s.l.saved_step = None;
        let saved = self.save_once(s)?;
        self.run.event(
            s.p.step,
            "stop",
            json!({
                "reason": RANK_FAILED,
                "exit": 75,
                "message": message,
                "abandoned_step": json!({"step": s.p.step + 1, "micro_batches_done": done, "of": of}),
                "checkpoint": saved,
            }),
        )?;
        self.observer.on_message(&format!(
            "a data-parallel rank failed in step {}: {message}; every rank stopped, step {} checkpointed, \
             stopping (exit 75); --resume continues from it",
            s.p.step + 1,
            s.p.step
        ));
        Ok(())
    }

    /// A stop was requested: the checkpoint of the last completed step (unless the newest already holds
    /// it), a `stop` event, and [`Finish::Stopped`]. `abandoned`: micro-batches (done, of) of the step
    /// that was cut short.
    pub(super) fn stop_on_signal(
        &mut self,
        s: &mut State,
        abandoned: Option<(usize, u64)>,
    ) -> Result<Finish, LoopError> {
        let saved = self.save_once(s)?;
        // Without room for this checkpoint the run still resumes: from its newest one, or from step 0
        // (session::resume); the event, the message and the exit code all say so.
        let resumes_from = match &saved {
            Some(_) => s.p.step,
            None => {
                checkpoint::latest_checkpoint(&self.run.checkpoints()).map_or(0, |(step, _)| step)
            }
        };
        self.run.event(
            s.p.step,
            "stop",
            json!({
                "reason": "signal",
                "exit": 75,
                "abandoned_step": abandoned.map(|(done, k)| json!({"step": s.p.step + 1, "micro_batches_done": done, "of": k})),
                "eval_pending": s.p.eval_pending,
                "checkpoint": saved,
                "resumes_from_step": resumes_from,
            }),
        )?;
        let pending = if s.p.eval_pending {
            "; the evaluation it cut short runs first on --resume"
        } else {
            ""
        };
        self.observer.on_message(&match saved {
            Some(_) => format!(
                "stop requested: checkpointed step {}, stopping (exit 75){pending}",
                s.p.step
            ),
            None => format!(
                "stop requested: no room to checkpoint step {} (see the warning above); --resume \
                 continues from step {resumes_from}, stopping (exit 75)",
                s.p.step
            ),
        });
        Ok(Finish::Stopped)
    }

    /// The run's end state was not written: its last step checkpoint was skipped for lack of disk.
    pub(super) fn unsaved(&self, s: &State) -> Option<Unsaved> {
        let (path, needed, free) = s.l.skipped_last.clone()?;
        Some(Unsaved {
            path,
            needed,
            free,
            skipped: s.l.skips,
            newest: checkpoint::latest_checkpoint(&self.run.checkpoints()).map(|(_, p)| p),
        })
    }

    fn steps_per_epoch(&self) -> u64 {
        batches::steps_per_epoch(self.train.len(), self.config.batch, self.config.accum)
    }

    /// What `trainer_state.json` records of the loop now.
    pub(super) fn state(&self, s: &State) -> TrainerState {
        let p = &s.p;
        // The epoch the next step belongs to (a cursor at the end of an epoch points past it).
        let epoch = if p.cursor.position >= self.steps_per_epoch() {
            p.cursor.epoch + 1
        } else {
            p.cursor.epoch
        };
        TrainerState {
            format: TrainerState::FORMAT,
            epoch,
            step: p.step,
            cursor: p.cursor,
            rng: RngState {
                seed: self.config.seed,
                scheme: "memfit-data sampler shuffle per (seed, epoch); splitmix64 dropout seeds per (seed, step, micro-batch)"
                    .into(),
            },
            scheduler: SchedulerState {
                kind: format!("{:?}", self.config.schedule).to_lowercase(),
                total_steps: s.total,
                step: p.step,
                next_lr: s.schedule.lr_at(p.step),
            },
            best: p.best.clone(),
            config_hash: self.config.hash(),
            model: self.config.model.clone(),
            vocab_size: self.vocab_size,
            first_loss: p.first_loss,
            last_loss: p.last_loss,
            score_before: p.score_before,
            micro_batch: Some(p.micro),
            accum: Some(batches::accum_for(
                batches::effective_batch(self.config.batch, self.config.accum),
                p.micro,
            )),
            eval_pending: p.eval_pending,
        }
    }
}
