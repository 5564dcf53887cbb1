//! One optimizer step: its rows cut into micro-batches, each accumulated unless memory or a stop
//! request cuts the step short, then the optimizer update and the step's metrics.

use super::{LoopError, State, Trainer, micro_batch_seed};
use crate::engine::Engine;
use crate::metrics::{self, StepMetrics};
use crate::task::{self, Task};
use memfit_data::Sampler;
use serde_json::json;
use std::time::Instant;

/// How a step ended.
pub(super) enum StepOutcome {
    /// Done: the weights, the cursor and the metrics moved on.
    Done { epoch_end: bool },
    /// Cut short by a stop request after `done` of `of` micro-batches; nothing moved on.
    Signal { done: usize, of: u64 },
    /// Cut short for memory (hard limit or a failed allocation); nothing moved on.
    Memory { done: usize, of: u64 },
    /// The device ran out of memory at micro-batch 1; nothing moved on.
    DeviceMemory { done: usize, of: u64 },
}

/// How the micro-batches of one step went.
enum Accumulated {
    All {
        loss_sum: f64,
        tokens: u64,
    },
    /// Stopped before micro-batch `done` (a stop request or host memory).
    Cut(StepOutcome),
    /// Micro-batch `done` ran the device out of memory.
    OutOfMemory {
        done: usize,
        message: String,
    },
}

impl<E: Engine, T: Task<E>> Trainer<'_, E, T> {
    pub(super) fn train_step(
        &mut self,
        sampler: &mut Sampler,
        s: &mut State,
    ) -> Result<StepOutcome, LoopError> {
        let step_rows = sampler.next_batch();
        let (epoch, epoch_end) = (sampler.cursor().epoch, sampler.epoch_finished());
        let t0 = Instant::now();
        // The step's rows are fixed; a device out of memory cuts them finer and starts over.
        let (loss_sum, tokens, k) = loop {
            let micro_batches = self.collate_step(&step_rows, s.p.micro)?;
            let of = micro_batches.len() as u64;
            match self.accumulate_step(&micro_batches, s)? {
                Accumulated::All { loss_sum, tokens } => break (loss_sum, tokens, of),
                Accumulated::Cut(outcome) => return Ok(outcome),
                Accumulated::OutOfMemory { done, message } => {
                    self.engine.discard_gradients();
                    if s.p.micro == 1 {
                        return Ok(StepOutcome::DeviceMemory { done, of });
                    }
                    self.downgrade_for_device_memory(s, &message)?;
                }
            }
        };
        let lr = s.schedule.lr_at(s.p.step);
        let stats = self
            .engine
            .step(lr, self.config.max_grad_norm)
            .map_err(|e| LoopError::Engine {
                step: s.p.step + 1,
                message: e.to_string(),
            })?;
        s.p.step += 1;
        let loss = loss_sum;
        if !loss.is_finite() {
            self.run
                .event(s.p.step, "error", json!({"loss": loss.to_string()}))?;
            return Err(LoopError::NonFinite {
                step: s.p.step,
                loss,
            });
        }
        s.p.first_loss.get_or_insert(loss);
        s.p.last_loss = Some(loss);
        s.p.cursor = sampler.cursor();
        let step_s = t0.elapsed().as_secs_f64();
        s.l.tokens += tokens;
        s.l.train_seconds += step_s;
        let rss = metrics::rss();
        let m = StepMetrics {
            step: s.p.step,
            epoch,
            micro_batch: s.p.micro as u64,
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
        self.warn_over_budget(s, rss.peak)?;
        Ok(StepOutcome::Done { epoch_end })
    }

    /// Forward and backward of every micro-batch of a step, unless a stop, host memory or the
    /// device's memory cuts it short.
    fn accumulate_step(
        &mut self,
        micro_batches: &[E::Batch],
        s: &State,
    ) -> Result<Accumulated, LoopError> {
        let weights: Vec<usize> = micro_batches
            .iter()
            .map(|b| self.task.loss_weight(b))
            .collect();
        let scales = task::shares(&weights);
        let of = micro_batches.len() as u64;
        let (mut loss_sum, mut tokens) = (0.0f64, 0u64);
        for (i, (batch, scale)) in micro_batches.iter().zip(&scales).enumerate() {
            if self.memory_exhausted() {
                return Ok(Accumulated::Cut(StepOutcome::Memory { done: i, of }));
            }
            if self.stop.is_requested() {
                return Ok(Accumulated::Cut(StepOutcome::Signal { done: i, of }));
            }
            tokens += self.task.tokens(batch);
            let seed = micro_batch_seed(self.config.seed, s.p.step, i as u64);
            match self.engine.accumulate(batch, *scale as f32, seed) {
                Ok(loss) => loss_sum += f64::from(loss) * scale,
                Err(e) if E::is_out_of_memory(&e) => {
                    let message = e.to_string();
                    return Ok(Accumulated::OutOfMemory { done: i, message });
                }
                Err(e) => {
                    return Err(LoopError::Engine {
                        step: s.p.step + 1,
                        message: e.to_string(),
                    });
                }
            }
        }
        Ok(Accumulated::All { loss_sum, tokens })
    }

    /// The step's rows as padded micro-batches of `micro` rows.
    fn collate_step(&self, rows: &[usize], micro: usize) -> Result<Vec<E::Batch>, LoopError> {
        rows.chunks(micro)
            .map(|chunk| {
                let rows = task::read_rows(self.train, chunk)
                    .map_err(|e| LoopError::Data(e.to_string()))?;
                Ok(self.task.collate(&rows))
            })
            .collect()
    }

    /// Once per run: the peak RSS went over the configured budget.
    fn warn_over_budget(&mut self, s: &mut State, peak: u64) -> Result<(), LoopError> {
        let Some(budget) = self.config.memory_budget_bytes else {
            return Ok(());
        };
        if peak <= budget || s.l.warned_budget {
            return Ok(());
        }
        s.l.warned_budget = true;
        self.run.event(
            s.p.step,
            "over_budget",
            json!({"peak_rss_bytes": peak, "budget_bytes": budget}),
        )?;
        self.observer.on_message(&format!(
            "warning: peak RSS {peak} B is over the memory budget {budget} B"
        ));
        Ok(())
    }
}
