//! The training loop, generic over [`Engine`]: one effective batch of seeded rows per optimizer step
//! from a cursor, cut into micro-batches (gradient accumulation, each micro-batch's loss scaled once, in
//! the engine, by its share of the step's target tokens), one optimizer step at the scheduled rate,
//! metrics, evaluation, `best/`, checkpoints with retention, a graceful stop, and the memory guard's
//! actions (halve the micro-batch at the soft limit; checkpoint and stop at the hard one).
//!
//! Everything that decides the weights is a function of (config, step, cursor), all saved in
//! `trainer_state.json`, so a run resumed from a checkpoint computes what the uninterrupted run would have.
//! The micro-batch size is saved too; it changes how a step's rows are cut, not which rows or their
//! gradient (up to summation order and dropout masks).

use crate::alloc_reserve;
use crate::batches::{self, Collate, PairSource};
use crate::checkpoint::{
    BestRecord, CheckpointError, Checkpointer, RngState, SaveOutcome, SchedulerState, TrainerState,
};
use crate::config::{BestMetric, TrainConfig};
use crate::engine::Engine;
use crate::eval::{self, EvalReport, EvalSetup};
use crate::memory_guard::{GuardNote, GuardStatus, MemoryGuard, Verdict};
use crate::metrics::{self, StepMetrics};
use crate::run_dir::{RunDir, RunDirError};
use crate::schedule::Schedule;
use crate::signals::StopFlag;
use crate::text::TextDecoder;
use memfit_data::{Batching, Cursor, Sampler, SamplerConfig};
use memfit_sys::units::human_bytes;
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

/// The `stop` event's reason when an allocation failed and the memory reserve was given back for it
/// ([`alloc_reserve`]).
pub const ALLOCATION_FAILURE: &str = "allocation_failure";

/// The `stop` event's reason for a stop for memory: a failed allocation first, else the guard's
/// verdict (soft only when the micro-batch cannot be halved any more).
fn memory_stop_reason(allocation_failed: bool, verdict: Verdict) -> &'static str {
    if allocation_failed {
        ALLOCATION_FAILURE
    } else if verdict == Verdict::Hard {
        "memory_hard_limit"
    } else {
        "memory_soft_limit_at_micro_batch_1"
    }
}

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

/// The epoch the next step belongs to (a cursor at the end of an epoch points past it).
fn next_epoch(cursor: &Cursor, steps_per_epoch: u64) -> u64 {
    if cursor.position >= steps_per_epoch {
        cursor.epoch + 1
    } else {
        cursor.epoch
    }
}

/// Hooks for a progress display; every method has a no-op default.
pub trait Observer {
    fn on_start(&mut self, _total_steps: u64, _start_step: u64) {}
    fn on_step(&mut self, _metrics: &StepMetrics) {}
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

/// What the summary prints.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub finish: Finish,
    pub start_step: u64,
    pub steps: u64,
    pub total_steps: u64,
    pub first_loss: Option<f64>,
    pub last_loss: Option<f64>,
    pub bleu_before: Option<f64>,
    pub last_eval: Option<EvalReport>,
    pub best: Option<BestRecord>,
    pub peak_rss_bytes: u64,
    pub tokens: u64,
    /// Wall time of the whole loop (evaluations and checkpoints included).
    pub seconds: f64,
    /// Wall time of the optimizer steps alone (what tokens/s divides by).
    pub train_seconds: f64,
    pub last_checkpoint: Option<PathBuf>,
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
pub struct Trainer<'a, E: Engine> {
    pub engine: &'a mut E,
    pub config: &'a TrainConfig,
    pub run: &'a mut RunDir,
    pub checkpointer: &'a mut Checkpointer,
    pub train: &'a dyn PairSource,
    pub valid: Option<&'a dyn PairSource>,
    pub collate: Collate,
    pub decoder: &'a dyn TextDecoder,
    pub stop: StopFlag,
    pub observer: &'a mut dyn Observer,
    pub resume: Option<TrainerState>,
    pub vocab_size: Option<usize>,
    /// The in-process memory guard (`None`: no memory limits are acted on).
    pub guard: Option<&'a MemoryGuard>,
}

/// The mutable bookkeeping of a loop.
struct Progress {
    step: u64,
    cursor: Cursor,
    best: Option<BestRecord>,
    first_loss: Option<f64>,
    last_loss: Option<f64>,
    bleu_before: Option<f64>,
    /// Micro-batch rows in force (the configured `batch`, or less after a guard downgrade).
    micro: usize,
}

impl<'a, E: Engine> Trainer<'a, E> {
    /// Optimizer steps of the whole run: `--max-steps`, else epochs × steps per epoch.
    pub fn total_steps(config: &TrainConfig, train_rows: usize) -> u64 {
        config.max_steps.unwrap_or_else(|| {
            u64::from(config.epochs)
                * batches::steps_per_epoch(train_rows, config.batch, config.accum)
        })
    }

    pub fn run(mut self) -> Result<Summary, LoopError> {
        let config = self.config;
        let rows = self.train.len();
        if rows == 0 {
            return Err(LoopError::EmptyData);
        }
        let effective = batches::effective_batch(config.batch, config.accum);
        let total = Self::total_steps(config, rows);
        let schedule = config.schedule(total);
        let mut p = match self.resume.take() {
            Some(s) => self.progress_from(s)?,
            None => Progress {
                step: 0,
                cursor: Cursor {
                    epoch: 0,
                    position: 0,
                    seed: config.seed,
                },
                best: None,
                first_loss: None,
                last_loss: None,
                bleu_before: None,
                micro: config.batch,
            },
        };
        let start_step = p.step;
        self.observer.on_start(total, start_step);
        if p.micro != config.batch {
            let line = format!(
                "continuing at micro-batch {} × accumulation {} (lowered by the memory guard; effective batch {effective})",
                p.micro,
                batches::accum_for(effective, p.micro)
            );
            self.run.log(&line)?;
            self.observer.on_message(&line);
        }
        let started = Instant::now();
        let mut tokens_total = 0u64;
        let mut train_seconds = 0.0f64;
        let mut last_checkpoint = None;
        let mut last_eval = None;
        let mut warned_budget = false;

        if start_step == 0 && self.valid.is_some() {
            let report = self.evaluate(0, p.micro)?;
            p.bleu_before = Some(report.bleu4);
            last_eval = Some(report);
        }

        // One draw per optimizer step: the step's rows, cut into micro-batches below. The rows of a
        // step do not depend on the micro-batch size, so a downgrade changes only how they are cut.
        let sampler_config = SamplerConfig::new(config.seed, Batching::Samples(effective));
        let mut sampler = Sampler::resume(
            sampler_config,
            self.train
                .lengths()
                .map_err(|e| LoopError::Data(e.to_string()))?,
            p.cursor,
        )
        .map_err(|e| LoopError::Data(e.to_string()))?;
        let mut finish = Finish::Completed;
        while p.step < total {
            let step_rows = sampler.next_batch();
            let epoch = sampler.cursor().epoch;
            let epoch_end = sampler.epoch_finished();
            let t0 = Instant::now();
            let micro_batches = step_rows
                .chunks(p.micro)
                .map(|chunk| {
                    let pairs = chunk
                        .iter()
                        .map(|&r| self.train.pair(r))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| LoopError::Data(e.to_string()))?;
                    Ok(self.collate.batch(&pairs))
                })
                .collect::<Result<Vec<_>, LoopError>>()?;
            let scales = batches::token_weights(&micro_batches);
            let k = micro_batches.len() as u64;
            let (mut loss_sum, mut tokens) = (0.0f64, 0u64);
            let mut abandoned = None;
            for (i, (batch, scale)) in micro_batches.iter().zip(&scales).enumerate() {
                if self.guard.is_some_and(|g| g.verdict() == Verdict::Hard)
                    || alloc_reserve::released()
                {
                    abandoned = Some(i);
                    break;
                }
                tokens += batches::real_tokens(batch);
                let seed = micro_batch_seed(config.seed, p.step, i as u64);
                let loss = self
                    .engine
                    .accumulate(batch, *scale as f32, seed)
                    .map_err(|e| LoopError::Engine {
                        step: p.step + 1,
                        message: e.to_string(),
                    })?;
                loss_sum += f64::from(loss) * scale;
            }
            if let Some(done) = abandoned {
                // Over the hard limit mid-step: the step's partial gradients are dropped; the
                // checkpoint holds the state before it (weights, optimizer, cursor at its start).
                let status = self.guard.map(|g| g.check_now());
                p.micro = batches::halve(p.micro);
                if let Some(path) = self.save(&p, &schedule, total)? {
                    last_checkpoint = Some(path);
                }
                let reason = memory_stop_reason(alloc_reserve::released(), Verdict::Hard);
                self.stop_for_memory(&p, status.as_ref(), Some((done, k)), reason)?;
                finish = Finish::Stopped;
                break;
            }
            let lr = schedule.lr_at(p.step);
            let stats =
                self.engine
                    .step(lr, config.max_grad_norm)
                    .map_err(|e| LoopError::Engine {
                        step: p.step + 1,
                        message: e.to_string(),
                    })?;
            p.step += 1;
            let loss = loss_sum;
            if !loss.is_finite() {
                self.run
                    .event(p.step, "error", json!({"loss": loss.to_string()}))?;
                return Err(LoopError::NonFinite { step: p.step, loss });
            }
            p.first_loss.get_or_insert(loss);
            p.last_loss = Some(loss);
            p.cursor = sampler.cursor();
            let step_s = t0.elapsed().as_secs_f64();
            tokens_total += tokens;
            train_seconds += step_s;
            let rss = metrics::rss();
            let m = StepMetrics {
                step: p.step,
                epoch,
                micro_batch: p.micro as u64,
                accum: k,
                loss,
                lr,
                grad_norm: stats.grad_norm,
                tokens,
                tokens_per_s: if step_s > 0.0 {
                    tokens as f64 / step_s
                } else {
                    0.0
                },
                step_s,
                rss_bytes: rss.current,
                peak_rss_bytes: rss.peak,
                gpu_bytes: None,
            };
            self.run.append_metrics(&m)?;
            self.observer.on_step(&m);
            if let Some(budget) = config.memory_budget_bytes
                && rss.peak > budget
                && !warned_budget
            {
                warned_budget = true;
                self.run.event(
                    p.step,
                    "over_budget",
                    json!({"peak_rss_bytes": rss.peak, "budget_bytes": budget}),
                )?;
                self.observer.on_message(&format!(
                    "warning: peak RSS {} B is over the memory budget {} B",
                    rss.peak, budget
                ));
            }
            let eval_due = self.valid.is_some()
                && (epoch_end
                    || p.step == total
                    || config.eval_steps.is_some_and(|n| n > 0 && p.step % n == 0));
            if eval_due {
                let report = self.evaluate(p.step, p.micro)?;
                self.update_best(&mut p, &schedule, total, &report)?;
                last_eval = Some(report);
            }

            // The memory guard at the step boundary: one reading now, plus anything latched mid-step.
            let status = match self.guard {
                Some(g) => Some(self.guard_boundary(g, p.step)?),
                None => None,
            };
            let verdict = status.as_ref().map_or(Verdict::Fine, |s| s.verdict);
            let old_micro = p.micro;
            let allocation_failed = alloc_reserve::released();
            let downgrade = verdict == Verdict::Soft && p.micro > 1 && !allocation_failed;
            // Soft with nothing left to halve is treated as hard.
            let memory_stop = allocation_failed
                || verdict == Verdict::Hard
                || (verdict == Verdict::Soft && !downgrade);
            if downgrade || memory_stop {
                p.micro = batches::halve(p.micro);
            }
            let signal_stop = self.stop.is_requested();
            let stop = signal_stop || memory_stop;
            let save_due = epoch_end
                || p.step == total
                || stop
                || downgrade
                || config.save_steps.is_some_and(|n| n > 0 && p.step % n == 0);
            let mut saved = None;
            if save_due && let Some(path) = self.save(&p, &schedule, total)? {
                saved = Some(path.clone());
                last_checkpoint = Some(path);
            }
            if downgrade && let (Some(g), Some(s)) = (self.guard, status.as_ref()) {
                // the smaller micro-batch needs less: give back what malloc keeps free
                crate::malloc_tuning::release_free();
                g.downgraded();
                self.downgrade_event(p.step, old_micro, p.micro, s, saved.as_deref())?;
            }
            if memory_stop {
                let reason = memory_stop_reason(allocation_failed, verdict);
                self.stop_for_memory(&p, status.as_ref(), None, reason)?;
                finish = Finish::Stopped;
                break;
            }
            if signal_stop {
                self.run
                    .event(p.step, "stop", json!({"reason": "signal", "exit": 75}))?;
                finish = Finish::Stopped;
                break;
            }
        }
        if finish == Finish::Completed {
            self.run.event(p.step, "finish", json!({"steps": p.step}))?;
        }
        Ok(Summary {
            finish,
            start_step,
            steps: p.step,
            total_steps: total,
            first_loss: p.first_loss,
            last_loss: p.last_loss,
            bleu_before: p.bleu_before,
            last_eval,
            best: p.best,
            peak_rss_bytes: metrics::rss().peak,
            tokens: tokens_total,
            seconds: started.elapsed().as_secs_f64(),
            train_seconds,
            last_checkpoint,
        })
    }

    /// The loop's bookkeeping from a checkpoint's state: format-1 cursors (micro-batch positions) are
    /// converted to step positions; a recorded micro-batch is kept if it still divides this config's
    /// effective batch into at most `batch` rows.
    fn progress_from(&self, s: TrainerState) -> Result<Progress, LoopError> {
        let config = self.config;
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
            bleu_before: s.bleu_before,
            micro,
        })
    }

    /// Takes the guard's step-boundary reading and records budget changes.
    fn guard_boundary(&mut self, guard: &MemoryGuard, step: u64) -> Result<GuardStatus, LoopError> {
        let status = guard.check_now();
        for note in &status.notes {
            match note {
                GuardNote::BudgetChanged {
                    budget_bytes,
                    source,
                } => {
                    self.run.event(
                        step,
                        "budget",
                        json!({"budget_bytes": budget_bytes, "source": source, "limits": status.limits}),
                    )?;
                    self.observer.on_message(&match budget_bytes {
                        Some(b) => format!(
                            "memory budget now {} ({source}): soft limit {}, hard limit {}",
                            human_bytes(*b),
                            human_bytes(status.limits.map_or(0, |l| l.soft_bytes)),
                            human_bytes(status.limits.map_or(0, |l| l.hard_bytes))
                        ),
                        None => format!("memory budget removed ({source})"),
                    });
                }
                GuardNote::OverrideInvalid { path, message } => {
                    self.run.event(
                        step,
                        "budget_invalid",
                        json!({"path": path, "message": message}),
                    )?;
                    self.observer
                        .on_message(&format!("warning: {} ignored: {message}", path.display()));
                }
            }
        }
        Ok(status)
    }

    fn downgrade_event(
        &mut self,
        step: u64,
        old_micro: usize,
        new_micro: usize,
        status: &GuardStatus,
        checkpoint: Option<&std::path::Path>,
    ) -> Result<(), LoopError> {
        let effective = batches::effective_batch(self.config.batch, self.config.accum);
        let (old_accum, new_accum) = (
            batches::accum_for(effective, old_micro),
            batches::accum_for(effective, new_micro),
        );
        self.run.event(
            step,
            "downgrade",
            json!({
                "old_micro_batch": old_micro,
                "new_micro_batch": new_micro,
                "old_accum": old_accum,
                "new_accum": new_accum,
                "effective_batch": effective,
                "rss_bytes": status.peak.host_bytes,
                "rss_now_bytes": status.reading.host_bytes,
                "gpu_bytes": status.peak.gpu_bytes,
                "limits": status.limits,
                "gpu_limits": status.gpu_limits,
                "checkpoint": checkpoint,
            }),
        )?;
        self.observer.on_message(&format!(
            "memory guard: {} reached the soft limit {}; micro-batch {old_micro} × {old_accum} → {new_micro} × {new_accum} (effective batch {effective})",
            human_bytes(status.peak.host_bytes),
            human_bytes(status.limits.map_or(0, |l| l.soft_bytes)),
        ));
        Ok(())
    }

    /// Records a stop by the guard: `abandoned` = (micro-batches done, of k) when the step was cut short.
    fn stop_for_memory(
        &mut self,
        p: &Progress,
        status: Option<&GuardStatus>,
        abandoned: Option<(usize, u64)>,
        reason: &str,
    ) -> Result<(), LoopError> {
        let rss = status.map(|s| s.peak.host_bytes);
        self.run.event(
            p.step,
            "stop",
            json!({
                "reason": reason,
                "exit": 75,
                "rss_bytes": rss,
                "rss_now_bytes": status.map(|s| s.reading.host_bytes),
                "gpu_bytes": status.and_then(|s| s.peak.gpu_bytes),
                "limits": status.and_then(|s| s.limits),
                "gpu_limits": status.and_then(|s| s.gpu_limits),
                "abandoned_step": abandoned.map(|(done, k)| json!({"step": p.step + 1, "micro_batches_done": done, "of": k})),
                "resume_micro_batch": p.micro,
            }),
        )?;
        let what = if reason == ALLOCATION_FAILURE {
            format!(
                "an allocation failed at {} (the memory reserve was given back for it)",
                human_bytes(metrics::rss().current)
            )
        } else {
            format!(
                "{} against a hard limit of {}",
                human_bytes(rss.unwrap_or(0)),
                human_bytes(status.and_then(|s| s.limits).map_or(0, |l| l.hard_bytes))
            )
        };
        self.observer.on_message(&format!(
            "memory guard ({reason}): {what}; checkpointed at step {}, stopping (exit 75); --resume continues at micro-batch {}",
            p.step, p.micro
        ));
        Ok(())
    }

    /// Validation at the current micro-batch size (a guard downgrade applies to evaluation too; the
    /// loss is token-weighted, so the size does not change it).
    fn evaluate(&mut self, step: u64, micro: usize) -> Result<EvalReport, LoopError> {
        let Some(valid) = self.valid else {
            unreachable!("evaluate is only called with validation data")
        };
        let setup = EvalSetup {
            collate: self.collate,
            batch: micro,
            generate_rows: self.config.eval_rows,
            max_new_tokens: self.config.gen_max_tokens,
            decoder: self.decoder,
        };
        let t0 = Instant::now();
        let report =
            eval::evaluate(&*self.engine, valid, &setup).map_err(|e| LoopError::Engine {
                step,
                message: format!("evaluation: {e}"),
            })?;
        self.run.event(
            step,
            "eval",
            json!({
                "valid_loss": report.valid_loss,
                "bleu4": report.bleu4,
                "bleu4_standard": report.bleu4_standard,
                "rows_loss": report.rows_loss,
                "rows_generated": report.rows_generated,
                "seconds": t0.elapsed().as_secs_f64(),
                "samples": report.samples,
            }),
        )?;
        self.observer.on_eval(step, &report);
        Ok(report)
    }

    fn update_best(
        &mut self,
        p: &mut Progress,
        schedule: &Schedule,
        total: u64,
        report: &EvalReport,
    ) -> Result<(), LoopError> {
        let (metric, value, higher_is_better) = match self.config.best_metric {
            BestMetric::Bleu4 => ("bleu4", report.bleu4, true),
            BestMetric::ValidLoss => ("valid_loss", report.valid_loss, false),
        };
        if !value.is_finite() {
            return Ok(());
        }
        let better = p.best.as_ref().is_none_or(|b| {
            if higher_is_better {
                value > b.value
            } else {
                value < b.value
            }
        });
        if !better {
            return Ok(());
        }
        let candidate = BestRecord {
            metric: metric.into(),
            value,
            step: p.step,
        };
        let previous = p.best.replace(candidate);
        let state = self.state(p, schedule, total);
        match self.checkpointer.save_best(&*self.engine, &state)? {
            SaveOutcome::Saved { path, bytes } => {
                self.run.event(
                    p.step,
                    "best",
                    json!({"path": path, "bytes": bytes, "metric": metric, "value": value}),
                )?;
            }
            SaveOutcome::Skipped { path, needed, free } => {
                p.best = previous;
                self.skipped(p.step, &path, needed, free)?;
            }
        }
        Ok(())
    }

    fn save(
        &mut self,
        p: &Progress,
        schedule: &Schedule,
        total: u64,
    ) -> Result<Option<PathBuf>, LoopError> {
        let state = self.state(p, schedule, total);
        match self.checkpointer.save_step(&*self.engine, &state)? {
            SaveOutcome::Saved { path, bytes } => {
                self.run
                    .event(p.step, "checkpoint", json!({"path": path, "bytes": bytes}))?;
                Ok(Some(path))
            }
            SaveOutcome::Skipped { path, needed, free } => {
                self.skipped(p.step, &path, needed, free)?;
                Ok(None)
            }
        }
    }

    fn skipped(
        &mut self,
        step: u64,
        path: &std::path::Path,
        needed: u64,
        free: u64,
    ) -> Result<(), LoopError> {
        self.run.event(
            step,
            "checkpoint_skipped",
            json!({"path": path, "needed_bytes": needed, "free_bytes": free}),
        )?;
        self.observer.on_message(&format!(
            "warning: checkpoint {} skipped: {needed} bytes needed, {free} free on its disk",
            path.display()
        ));
        Ok(())
    }

    fn steps_per_epoch(&self) -> u64 {
        batches::steps_per_epoch(self.train.len(), self.config.batch, self.config.accum)
    }

    fn state(&self, p: &Progress, schedule: &Schedule, total: u64) -> TrainerState {
        TrainerState {
            format: TrainerState::FORMAT,
            epoch: next_epoch(&p.cursor, self.steps_per_epoch()),
            step: p.step,
            cursor: p.cursor,
            rng: RngState {
                seed: self.config.seed,
                scheme: "memfit-data sampler shuffle per (seed, epoch); splitmix64 dropout seeds per (seed, step, micro-batch)"
                    .into(),
            },
            scheduler: SchedulerState {
                kind: format!("{:?}", self.config.schedule).to_lowercase(),
                total_steps: total,
                step: p.step,
                next_lr: schedule.lr_at(p.step),
            },
            best: p.best.clone(),
            config_hash: self.config.hash(),
            model: self.config.model.clone(),
            vocab_size: self.vocab_size,
            first_loss: p.first_loss,
            last_loss: p.last_loss,
            bleu_before: p.bleu_before,
            micro_batch: Some(p.micro),
            accum: Some(batches::accum_for(
                batches::effective_batch(self.config.batch, self.config.accum),
                p.micro,
            )),
        }
    }
}
