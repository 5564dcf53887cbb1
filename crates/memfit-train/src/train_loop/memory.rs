//! The memory guard at step boundaries and mid-step: budget changes, halving the micro-batch at the
//! soft limit (at micro-batch 1, handing malloc's free pages back instead), and the checkpoint and
//! stop at the hard one (or after a failed allocation).

use super::{LoopError, State, Trainer};
use crate::alloc_reserve;
use crate::batches;
use crate::engine::Engine;
use crate::memory_guard::{GuardNote, GuardStatus, MemoryGuard, Verdict};
use crate::metrics;
use crate::task::Task;
use memfit_sys::units::human_bytes;
use serde_json::json;
use std::path::Path;

/// The `stop` event's reason when an allocation failed and the memory reserve was given back for it
/// ([`alloc_reserve`]).
pub const ALLOCATION_FAILURE: &str = "allocation_failure";

/// The `downgrade` and `stop` events' reason when the device (a GPU) ran out of memory.
pub const DEVICE_OUT_OF_MEMORY: &str = "device_out_of_memory";

/// The `stop` event's reason for a stop for memory: a failed allocation first, else the hard limit.
fn memory_stop_reason(allocation_failed: bool) -> &'static str {
    if allocation_failed {
        ALLOCATION_FAILURE
    } else {
        "memory_hard_limit"
    }
}

/// What the guard's step-boundary reading asks for (the micro-batch is already halved).
pub(super) enum MemoryAction {
    /// Continue at the halved micro-batch, from the old one.
    Downgrade {
        old_micro: usize,
        status: GuardStatus,
    },
    /// The soft limit at micro-batch 1: nothing left to halve. Continue, with malloc's free pages
    /// handed back and the soft trigger moved up as after a downgrade; the hard limit stops the run
    /// if memory keeps growing. (Stopping here stopped runs that peaked within the budget: at
    /// micro-batch 1 the tiny T5's peak varies by ±4% between identical runs.)
    Relieve { status: GuardStatus },
    /// Checkpoint and stop.
    Stop {
        status: Option<GuardStatus>,
        reason: &'static str,
    },
}

impl MemoryAction {
    /// Whether the last completed step is checkpointed first (the micro-batch changes or the run stops).
    pub(super) fn needs_checkpoint(&self) -> bool {
        !matches!(self, Self::Relieve { .. })
    }
}

impl<E: Engine, T: Task<E>> Trainer<'_, E, T> {
    /// Whether the current micro-batch must not start for memory: over the hard limit, or an
    /// allocation failed.
    pub(super) fn memory_exhausted(&self) -> bool {
        self.guard.is_some_and(|g| g.verdict() == Verdict::Hard) || alloc_reserve::released()
    }

    /// The guard at a step boundary: one reading now, plus anything latched mid-step. Halves the
    /// micro-batch when it asks for a downgrade or a stop.
    pub(super) fn memory_boundary(
        &mut self,
        s: &mut State,
    ) -> Result<Option<MemoryAction>, LoopError> {
        let status = match self.guard {
            Some(g) => Some(self.guard_boundary(g, s.p.step)?),
            None => None,
        };
        let verdict = status.as_ref().map_or(Verdict::Fine, |st| st.verdict);
        let allocation_failed = alloc_reserve::released();
        let stop = allocation_failed || verdict == Verdict::Hard;
        let soft = verdict == Verdict::Soft && !stop;
        let old_micro = s.p.micro;
        if stop || (soft && old_micro > 1) {
            s.p.micro = batches::halve(s.p.micro);
        }
        Ok(match (stop, soft, status) {
            (true, _, status) => Some(MemoryAction::Stop {
                status,
                reason: memory_stop_reason(allocation_failed),
            }),
            (false, true, Some(status)) if old_micro > 1 => {
                Some(MemoryAction::Downgrade { old_micro, status })
            }
            (false, true, Some(status)) => Some(MemoryAction::Relieve { status }),
            _ => None,
        })
    }

    /// Carries out a boundary's action once the checkpoint (`saved`, where
    /// [`MemoryAction::needs_checkpoint`]) is written; `true`: the run stops.
    pub(super) fn act_on_memory(
        &mut self,
        s: &State,
        action: MemoryAction,
        saved: Option<std::path::PathBuf>,
    ) -> Result<bool, LoopError> {
        match action {
            MemoryAction::Downgrade { old_micro, status } => {
                self.shed_and_rearm();
                self.downgrade_event(s.p.step, old_micro, s.p.micro, &status, saved.as_deref())?;
                Ok(false)
            }
            MemoryAction::Relieve { status } => {
                self.shed_and_rearm();
                self.pressure_event(s.p.step, &status)?;
                Ok(false)
            }
            MemoryAction::Stop { status, reason } => {
                self.stop_for_memory(s, status.as_ref(), None, reason)?;
                Ok(true)
            }
        }
    }

    /// After the soft limit: gives back what malloc keeps free (a smaller micro-batch needs less;
    /// at micro-batch 1 the next reading is then what the step holds) and moves the guard's trigger
    /// up from the peak that raised it.
    fn shed_and_rearm(&self) {
        if let Some(g) = self.guard {
            crate::malloc_tuning::release_free();
            g.downgraded();
        }
    }

    /// Over the hard limit mid-step: the step's partial gradients are dropped; the checkpoint holds the
    /// state before it (weights, optimizer, cursor at its start). `done` of `of` micro-batches ran.
    pub(super) fn stop_mid_step_for_memory(
        &mut self,
        s: &mut State,
        done: usize,
        of: u64,
    ) -> Result<(), LoopError> {
        let status = self.guard.map(|g| g.check_now());
        s.p.micro = batches::halve(s.p.micro);
        s.l.saved_step = None; // the micro-batch changed: the state to record is new
        self.save_once(s)?;
        let reason = memory_stop_reason(alloc_reserve::released());
        self.stop_for_memory(s, status.as_ref(), Some((done, of)), reason)
    }

    /// The device ran out of memory in a step at micro-batch > 1: the last completed step is
    /// checkpointed and the step is redone at half the micro-batch (the effective batch kept).
    pub(super) fn downgrade_for_device_memory(
        &mut self,
        s: &mut State,
        message: &str,
    ) -> Result<(), LoopError> {
        let old_micro = s.p.micro;
        s.p.micro = batches::halve(old_micro);
        s.l.saved_step = None; // the micro-batch changed: the state to record is new
        let checkpoint = self.save_once(s)?;
        let effective = batches::effective_batch(self.config.batch, self.config.accum);
        let (old_accum, new_accum) = (
            batches::accum_for(effective, old_micro),
            batches::accum_for(effective, s.p.micro),
        );
        self.run.event(
            s.p.step,
            "downgrade",
            json!({
                "reason": DEVICE_OUT_OF_MEMORY,
                "old_micro_batch": old_micro,
                "new_micro_batch": s.p.micro,
                "old_accum": old_accum,
                "new_accum": new_accum,
                "effective_batch": effective,
                "checkpoint": checkpoint,
                "message": message,
            }),
        )?;
        self.observer.on_message(&format!(
            "the device ran out of memory in step {}; micro-batch {old_micro} × {old_accum} → {} × {new_accum} (effective batch {effective}), step {} redone",
            s.p.step + 1,
            s.p.micro,
            s.p.step + 1
        ));
        Ok(())
    }

    /// The device ran out of memory at micro-batch 1 (`abandoned`: the step cut short, its
    /// micro-batches done of all) or evaluating one row at a time (`None`: the evaluation stays
    /// pending, and a resume runs it): the last completed step is checkpointed and the run stops
    /// resumable (exit 75).
    pub(super) fn stop_for_device_memory(
        &mut self,
        s: &mut State,
        abandoned: Option<(usize, u64)>,
    ) -> Result<(), LoopError> {
        s.l.saved_step = None;
        self.save_once(s)?;
        self.stop_for_memory(s, None, abandoned, DEVICE_OUT_OF_MEMORY)
    }

    /// The guard's hard limit (or a failed allocation) while evaluating: the evaluation is
    /// abandoned, the last completed step checkpointed with it pending and the micro-batch halved
    /// (which halves the evaluation batch too), and the run stops resumable (exit 75); a resume
    /// runs the evaluation.
    pub(super) fn stop_for_memory_evaluating(&mut self, s: &mut State) -> Result<(), LoopError> {
        let status = self.guard.map(MemoryGuard::check_now);
        self.run.log(&format!(
            "eval at step {}: abandoned for memory; --resume runs it",
            s.p.step
        ))?;
        s.p.micro = batches::halve(s.p.micro);
        s.l.saved_step = None;
        self.save_once(s)?;
        let reason = memory_stop_reason(alloc_reserve::released());
        self.stop_for_memory(s, status.as_ref(), None, reason)
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
        checkpoint: Option<&Path>,
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

    /// Records the soft limit reached at micro-batch 1 (event `pressure`), where the run goes on.
    fn pressure_event(&mut self, step: u64, status: &GuardStatus) -> Result<(), LoopError> {
        self.run.event(
            step,
            "pressure",
            json!({
                "micro_batch": 1,
                "rss_bytes": status.peak.host_bytes,
                "rss_now_bytes": status.reading.host_bytes,
                "gpu_bytes": status.peak.gpu_bytes,
                "limits": status.limits,
                "gpu_limits": status.gpu_limits,
            }),
        )?;
        self.observer.on_message(&format!(
            "memory guard: {} reached the soft limit {} at micro-batch 1, nothing left to halve; \
             going on (the hard limit {} stops the run, resumable, if memory keeps growing)",
            human_bytes(status.peak.host_bytes),
            human_bytes(status.limits.map_or(0, |l| l.soft_bytes)),
            human_bytes(status.limits.map_or(0, |l| l.hard_bytes)),
        ));
        Ok(())
    }

    /// Records a stop by the guard: `abandoned` = (micro-batches done, of k) when the step was cut short.
    fn stop_for_memory(
        &mut self,
        s: &State,
        status: Option<&GuardStatus>,
        abandoned: Option<(usize, u64)>,
        reason: &str,
    ) -> Result<(), LoopError> {
        let p = &s.p;
        let rss = status.map(|st| st.peak.host_bytes);
        self.run.event(
            p.step,
            "stop",
            json!({
                "reason": reason,
                "exit": 75,
                "rss_bytes": rss,
                "rss_now_bytes": status.map(|st| st.reading.host_bytes),
                "gpu_bytes": status.and_then(|st| st.peak.gpu_bytes),
                "limits": status.and_then(|st| st.limits),
                "gpu_limits": status.and_then(|st| st.gpu_limits),
                "abandoned_step": abandoned.map(|(done, k)| json!({"step": p.step + 1, "micro_batches_done": done, "of": k})),
                "resume_micro_batch": p.micro,
            }),
        )?;
        let what = if reason == DEVICE_OUT_OF_MEMORY {
            "the device ran out of memory at micro-batch 1".to_string()
        } else if reason == ALLOCATION_FAILURE {
            format!(
                "an allocation failed at {} (the memory reserve was given back for it)",
                human_bytes(metrics::rss().current)
            )
        } else {
            format!(
                "{} against a hard limit of {}",
                human_bytes(rss.unwrap_or(0)),
                human_bytes(status.and_then(|st| st.limits).map_or(0, |l| l.hard_bytes))
            )
        };
        self.observer.on_message(&format!(
            "memory guard ({reason}): {what}; checkpointed at step {}, stopping (exit 75); --resume continues at micro-batch {}",
            p.step, p.micro
        ));
        Ok(())
    }
}
