//! One optimizer step: its rows cut into micro-batches, each accumulated unless memory or a stop
//! request cuts the step short, then the optimizer update and the step's metrics.

use super::read_ahead::{self, Ahead, Drawn};
use super::{LoopError, State, Trainer, micro_batch_seed};
use crate::engine::{Engine, MicroBatch};
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
    /// A data-parallel rank or a collective between ranks failed; nothing moved on.
    RankFailed {
        done: usize,
        of: u64,
        message: String,
    },
}

/// When a step started, and its wait for input.
struct StepClock {
    start: Instant,
    /// Waited for the read-ahead before `start` (counted in the step's time).
    carried_s: f64,
    input_wait_s: f64,
    /// Each rank's wait, with data-parallel ranks.
    rank_input_wait_s: Option<Vec<f64>>,
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
    /// One step: its rows (read ahead during the previous step, or now), the next step's drawn and
    /// read on a helper thread while this one computes.
    pub(super) fn train_step(
        &mut self,
        sampler: &mut Sampler,
        s: &mut State,
        ahead: &mut Option<Ahead<E::Batch>>,
    ) -> Result<StepOutcome, LoopError> {
        let t0 = Instant::now();
        let ranks = self.engine.ranks();
        let (drawn, ready) = match ahead.take() {
            Some(a) if a.micro == s.p.micro => {
                (a.drawn, Some((a.batches?, a.waited_s, a.rank_waited_s)))
            }
            Some(a) => (a.drawn, None),
            None => (Drawn::from(sampler), None),
        };
        let (batches, waited_s, rank_waited_s) = match ready {
            Some(ready) => ready,
            // nothing read ahead at this micro-batch (the first step, or after a downgrade)
            None => (
                self.collate_step(&drawn.rows, s.p.micro)?,
                0.0,
                vec![0.0; ranks],
            ),
        };
        // the wait for what was read ahead came before `t0` and belongs to this step
        let now_s = t0.elapsed().as_secs_f64();
        let clock = StepClock {
            start: t0,
            carried_s: waited_s,
            input_wait_s: waited_s + now_s,
            rank_input_wait_s: (ranks > 1)
                .then(|| rank_waited_s.iter().map(|w| w + now_s).collect()),
        };
        let next = (s.p.step + 1 < s.total).then(|| Drawn::from(sampler));
        let sources = (self.task, self.train);
        let plan = (next, s.p.micro, ranks);
        let (outcome, read) = read_ahead::alongside::<E, T, _>(sources, plan, || {
            self.compute_step(&drawn, batches, s, clock)
        });
        let outcome = outcome?;
        if matches!(outcome, StepOutcome::Done { .. }) {
            *ahead = read;
        }
        Ok(outcome)
    }

    /// The micro-batches of a step accumulated (a device out of memory cuts the step's rows finer
    /// and starts over), the optimizer step, the metrics.
    fn compute_step(
        &mut self,
        drawn: &Drawn,
        batches: Vec<E::Batch>,
        s: &mut State,
        clock: StepClock,
    ) -> Result<StepOutcome, LoopError> {
        let mut micro_batches = batches;
        let (loss_sum, tokens, k) = loop {
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
                    micro_batches = self.collate_step(&drawn.rows, s.p.micro)?;
                }
            }
        };
        let lr = s.schedule.lr_at(s.p.step);
        let stats = match self.engine.step(lr, self.config.max_grad_norm) {
            Ok(stats) => stats,
            Err(e) if E::is_rank_failure(&e) => {
                // the gradients never reached an optimizer: the state is the last completed step's
                self.engine.discard_gradients();
                let message = e.to_string();
                return Ok(StepOutcome::RankFailed {
                    done: k as usize,
                    of: k,
                    message,
                });
            }
            Err(e) => {
                return Err(LoopError::Engine {
                    step: s.p.step + 1,
                    message: e.to_string(),
                });
            }
        };
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
        s.p.cursor = drawn.cursor;
        let step_s = clock.start.elapsed().as_secs_f64() + clock.carried_s;
        s.l.tokens += tokens;
        s.l.train_seconds += step_s;
        let rss = metrics::rss();
        let m = StepMetrics {
            step: s.p.step,
            epoch: drawn.epoch,
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
            input_wait_s: clock.input_wait_s,
            rank_input_wait_s: clock.rank_input_wait_s,
            rss_bytes: rss.current,
            peak_rss_bytes: rss.peak,
            gpu_bytes: None,
        };
        self.run.append_metrics(&m)?;
        self.observer.on_step(&m);
        self.warn_over_budget(s, rss.peak)?;
        Ok(StepOutcome::Done {
            epoch_end: drawn.epoch_end,
        })
    }

    /// Forward and backward of every micro-batch of a step, `ranks` side by side, unless a stop,
    /// host memory, the device's memory or a failed rank cuts it short.
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
        let ranks = self.engine.ranks().max(1);
        let groups = micro_batches.len().div_ceil(ranks);
        let (mut loss_sum, mut tokens) = (0.0f64, 0u64);
        for (g, chunk) in micro_batches.chunks(ranks).enumerate() {
            let first = g * ranks;
            if self.memory_exhausted() {
                return Ok(Accumulated::Cut(StepOutcome::Memory { done: first, of }));
            }
            if self.stop.is_requested() {
                return Ok(Accumulated::Cut(StepOutcome::Signal { done: first, of }));
            }
            let group: Vec<MicroBatch<'_, E::Batch>> = (chunk.iter().enumerate())
                .map(|(j, batch)| MicroBatch {
                    batch,
                    loss_scale: scales[first + j] as f32,
                    seed: micro_batch_seed(self.config.seed, s.p.step, (first + j) as u64),
                })
                .collect();
            tokens += chunk.iter().map(|b| self.task.tokens(b)).sum::<u64>();
            let accumulated = match g + 1 == groups {
                true => self.engine.accumulate_last_group(&group),
                false => self.engine.accumulate_group(&group),
            };
            match accumulated {
                Ok(losses) => {
                    for (loss, scale) in losses.iter().zip(&scales[first..]) {
                        loss_sum += f64::from(*loss) * scale;
                    }
                }
                Err(e) if E::is_out_of_memory(&e) => {
                    let message = e.to_string();
                    return Ok(Accumulated::OutOfMemory {
                        done: first,
                        message,
                    });
                }
                Err(e) if E::is_rank_failure(&e) => {
                    let message = e.to_string();
                    return Ok(Accumulated::Cut(StepOutcome::RankFailed {
                        done: first,
                        of,
                        message,
                    }));
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
        read_ahead::collate::<E, T>(self.task, self.train, rows, micro)
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
