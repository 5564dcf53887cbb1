//! Evaluations in the loop: when they are due, how many rows they use, their cost in the logs, and
//! `best/`.

use super::memory::DEVICE_OUT_OF_MEMORY;
use super::{LoopError, State, Trainer};
use crate::checkpoint::{BestRecord, SaveOutcome};
use crate::engine::Engine;
use crate::eval::sizing::eval_size;
use crate::eval::{EvalPlan, EvalReport};
use crate::task::Task;
use serde_json::json;

/// How an evaluation due ended.
pub(super) enum Evaluated {
    Done,
    /// A stop was requested: abandoned, still pending.
    Abandoned,
    /// The device ran out of memory at an evaluation batch of one row: still pending.
    OutOfMemory,
}

/// One try at an evaluation.
enum Attempt {
    Done(EvalReport),
    Abandoned,
    OutOfMemory { batch: usize, message: String },
}

impl<E: Engine, T: Task<E>> Trainer<'_, E, T> {
    /// At each epoch end, every `eval_steps` and at the last step (when there is validation data).
    pub(super) fn eval_due(&self, s: &State, epoch_end: bool) -> bool {
        self.valid.is_some()
            && (epoch_end
                || s.p.step == s.total
                || self
                    .config
                    .eval_steps
                    .is_some_and(|n| n > 0 && s.p.step.is_multiple_of(n)))
    }

    /// Runs the evaluation due at this step (marked pending until it is done) and updates `best/`.
    /// Where the device runs out of memory, the evaluation batch is halved and the evaluation run
    /// again; at one row the evaluation stays pending ([`Evaluated::OutOfMemory`]).
    pub(super) fn evaluate_due(&mut self, s: &mut State) -> Result<Evaluated, LoopError> {
        s.p.eval_pending = true;
        let report = loop {
            match self.evaluate(s)? {
                Attempt::Done(report) => break report,
                Attempt::Abandoned => return Ok(Evaluated::Abandoned),
                Attempt::OutOfMemory { batch, message } if batch > 1 => {
                    self.halve_eval_batch(s, batch, &message)?;
                }
                Attempt::OutOfMemory { .. } => return Ok(Evaluated::OutOfMemory),
            }
        };
        s.p.eval_pending = false;
        if s.p.step == 0 {
            s.p.score_before = report.score(self.task.headline());
        }
        self.update_best(s, &report)?;
        s.l.last_eval = Some(report);
        Ok(Evaluated::Done)
    }

    /// The evaluation batch of this run halved (for the rest of the process: a resume starts from
    /// the planned one again), and the event that says so.
    fn halve_eval_batch(
        &mut self,
        s: &mut State,
        batch: usize,
        message: &str,
    ) -> Result<(), LoopError> {
        let halved = crate::batches::halve(batch);
        s.l.eval_batch_cap = Some(halved);
        self.run.event(
            s.p.step,
            "downgrade",
            json!({
                "reason": DEVICE_OUT_OF_MEMORY,
                "phase": "evaluation",
                "old_eval_batch": batch,
                "new_eval_batch": halved,
                "message": message,
            }),
        )?;
        self.observer.on_message(&format!(
            "the device ran out of memory evaluating at step {}; evaluation batch {batch} → {halved}, evaluation redone",
            s.p.step
        ));
        Ok(())
    }

    /// Validation at the current micro-batch size, or the planned evaluation batch where smaller (a
    /// guard downgrade applies to evaluation too; the loss is token-weighted, so the size does not
    /// change it), or less after the device ran out of memory evaluating.
    fn evaluate(&mut self, s: &State) -> Result<Attempt, LoopError> {
        let Some(valid) = self.valid else {
            unreachable!("evaluate is only called with validation data")
        };
        let step = s.p.step;
        let c = self.config;
        let size = eval_size(c.eval_loss_rows, c.eval_rows, valid.len());
        let batch = (s.p.micro)
            .min(c.eval_batch.unwrap_or(usize::MAX))
            .min(s.l.eval_batch_cap.unwrap_or(usize::MAX));
        let plan = EvalPlan {
            batch,
            loss_rows: size.loss_rows,
            generate_rows: size.generate_rows,
            stop: Some(&self.stop),
            guard: self.guard,
        };
        let observer = &mut *self.observer;
        let mut progress = |phase, done, total| observer.on_eval_progress(step, phase, done, total);
        let report = match self
            .task
            .evaluate(&*self.engine, valid, &plan, &mut progress)
        {
            Ok(report) => report,
            Err(e)
                if e.downcast_ref::<E::Error>()
                    .is_some_and(E::is_out_of_memory) =>
            {
                let message = e.to_string();
                return Ok(Attempt::OutOfMemory { batch, message });
            }
            Err(e) => {
                return Err(LoopError::Engine {
                    step,
                    message: format!("evaluation: {e}"),
                });
            }
        };
        let Some(mut report) = report else {
            self.run.log(&format!(
                "eval at step {step}: abandoned (stop requested); --resume runs it"
            ))?;
            return Ok(Attempt::Abandoned);
        };
        report.rows_valid = valid.len();
        self.run.event(step, "eval", eval_event(&report))?;
        let share = if s.l.train_seconds > 0.0 {
            format!(
                " ({:.0}% of the {:.1} s of training so far)",
                100.0 * report.seconds / s.l.train_seconds,
                s.l.train_seconds
            )
        } else {
            String::new()
        };
        self.run
            .log(&format!("eval at step {step}: {}{share}", report.cost()))?;
        self.observer.on_eval(step, &report);
        Ok(Attempt::Done(report))
    }

    fn update_best(&mut self, s: &mut State, report: &EvalReport) -> Result<(), LoopError> {
        let metric = self.config.best_metric.key();
        let higher_is_better = self.config.best_metric.higher_is_better();
        let Some(value) = report.score(metric).filter(|v| v.is_finite()) else {
            return Ok(());
        };
        let better =
            s.p.best
                .as_ref()
                .is_none_or(|b| b.replaced_by(value, report.valid_loss, higher_is_better));
        if !better {
            return Ok(());
        }
        let candidate = BestRecord {
            metric: metric.into(),
            value,
            step: s.p.step,
            valid_loss: Some(report.valid_loss),
        };
        let previous = s.p.best.replace(candidate);
        let state = self.state(s);
        match self.checkpointer.save_best(&mut *self.engine, &state)? {
            SaveOutcome::Saved { path, bytes } => {
                self.run.event(
                    s.p.step,
                    "best",
                    json!({"path": path, "bytes": bytes, "metric": metric, "value": value}),
                )?;
            }
            SaveOutcome::Skipped { path, needed, free } => {
                s.p.best = previous;
                self.skipped(s, &path, needed, free)?;
            }
        }
        Ok(())
    }
}

/// The `eval` event: the loss, every score by name, the per-class scores, the cost and samples.
fn eval_event(report: &EvalReport) -> serde_json::Value {
    let mut event = json!({
        "valid_loss": report.valid_loss,
        "rows_loss": report.rows_loss,
        "rows_generated": report.rows_generated,
        "seconds": report.seconds,
        "samples": report.samples,
    });
    for score in &report.scores {
        event[score.name.as_str()] = json!(score.value);
    }
    if !report.classes.is_empty() {
        event["classes"] = json!(report.classes);
    }
    event
}
