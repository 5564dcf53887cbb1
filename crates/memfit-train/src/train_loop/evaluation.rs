//! Evaluations in the loop: when they are due, how many rows they use, their cost in the logs, and
//! `best/`.

use super::{LoopError, State, Trainer};
use crate::checkpoint::{BestRecord, SaveOutcome};
use crate::engine::Engine;
use crate::eval::sizing::eval_size;
use crate::eval::{EvalPlan, EvalReport};
use crate::task::Task;
use serde_json::json;

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
    /// `false`: a stop was requested and the evaluation abandoned; it stays pending.
    pub(super) fn evaluate_due(&mut self, s: &mut State) -> Result<bool, LoopError> {
        s.p.eval_pending = true;
        let Some(report) = self.evaluate(s)? else {
            return Ok(false);
        };
        s.p.eval_pending = false;
        if s.p.step == 0 {
            s.p.score_before = report.score(self.task.headline());
        }
        self.update_best(s, &report)?;
        s.l.last_eval = Some(report);
        Ok(true)
    }

    /// Validation at the current micro-batch size, or the planned evaluation batch where smaller (a
    /// guard downgrade applies to evaluation too; the loss is token-weighted, so the size does not
    /// change it).
    fn evaluate(&mut self, s: &State) -> Result<Option<EvalReport>, LoopError> {
        let Some(valid) = self.valid else {
            unreachable!("evaluate is only called with validation data")
        };
        let step = s.p.step;
        let c = self.config;
        let size = eval_size(c.eval_loss_rows, c.eval_rows, valid.len());
        let plan = EvalPlan {
            batch: s.p.micro.min(c.eval_batch.unwrap_or(usize::MAX)),
            loss_rows: size.loss_rows,
            generate_rows: size.generate_rows,
            stop: Some(&self.stop),
        };
        let observer = &mut *self.observer;
        let mut progress = |phase, done, total| observer.on_eval_progress(step, phase, done, total);
        let report = self
            .task
            .evaluate(&*self.engine, valid, &plan, &mut progress)
            .map_err(|e| LoopError::Engine {
                step,
                message: format!("evaluation: {e}"),
            })?;
        let Some(mut report) = report else {
            self.run.log(&format!(
                "eval at step {step}: abandoned (stop requested); --resume runs it"
            ))?;
            return Ok(None);
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
        Ok(Some(report))
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
