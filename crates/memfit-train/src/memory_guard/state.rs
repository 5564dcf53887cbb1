//! The guard's state behind its lock: the watches, the latest and peak readings, the budget override.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{GuardNote, GuardSettings, MemoryReading, MemorySampler, Verdict, Watch};

/// The guard's state behind the lock (taken by the thread every period and by the loop once per step).
pub(super) struct Core {
    pub(super) settings: GuardSettings,
    pub(super) sampler: Box<dyn MemorySampler>,
    pub(super) host: Option<Watch>,
    pub(super) gpu: Option<Watch>,
    /// The override file's last text (so a change is noticed and a bad line reported once).
    pub(super) override_text: Option<String>,
    pub(super) last: MemoryReading,
    /// Highest readings since the loop last acted (reset by a downgrade).
    pub(super) peak: MemoryReading,
    pub(super) notes: Vec<GuardNote>,
}

impl Core {
    fn refresh_budget(&mut self) {
        let Some(path) = self.settings.override_file.clone() else {
            return;
        };
        let text = std::fs::read_to_string(&path)
            .ok()
            .map(|t| t.trim().to_owned());
        if text == self.override_text {
            return;
        }
        self.override_text = text.clone();
        let (budget, source) = match text {
            None => (self.settings.budget_bytes, "config".to_owned()),
            Some(t) => match memfit_sys::units::parse_size(&t) {
                Ok(b) if b > 0 => (Some(b), path.display().to_string()),
                Ok(_) => {
                    self.notes.push(GuardNote::OverrideInvalid {
                        path,
                        message: "a budget of 0 bytes".into(),
                    });
                    return;
                }
                Err(e) => {
                    self.notes.push(GuardNote::OverrideInvalid {
                        path,
                        message: e.to_string(),
                    });
                    return;
                }
            },
        };
        let current = self.host.map(|w| w.limits.budget_bytes);
        if current != budget {
            // A new budget is new information: its watch starts armed at its own soft limit.
            self.host = budget.map(|b| Watch::new(self.settings.limits(b)));
            self.notes.push(GuardNote::BudgetChanged {
                budget_bytes: budget,
                source,
            });
        }
    }

    pub(super) fn tick(&mut self) -> Verdict {
        self.refresh_budget();
        self.last = self.sampler.sample();
        self.peak = MemoryReading {
            host_bytes: self.peak.host_bytes.max(self.last.host_bytes),
            gpu_bytes: self.peak.gpu_bytes.max(self.last.gpu_bytes),
        };
        let host = self
            .host
            .as_mut()
            .map_or(Verdict::Fine, |w| w.observe(self.last.host_bytes));
        let gpu = match (self.gpu.as_mut(), self.last.gpu_bytes) {
            (Some(w), Some(used)) => w.observe(used),
            _ => Verdict::Fine,
        };
        host.max(gpu)
    }
}

pub(super) struct Shared {
    pub(super) core: Mutex<Core>,
    /// The worst verdict since the loop last acted (a [`Verdict`] as u8).
    pub(super) verdict: AtomicU8,
    /// The latest host reading, for a look without the lock.
    pub(super) host_bytes: AtomicU64,
    /// Set once a hard verdict is latched (it is never cleared): what generation polls between
    /// tokens ([`super::MemoryGuard::hard_signal`]).
    pub(super) hard: Arc<AtomicBool>,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, Core> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn tick(&self) -> Verdict {
        let mut core = self.lock();
        let v = core.tick();
        self.host_bytes
            .store(core.last.host_bytes, Ordering::Relaxed);
        self.latch(v);
        v
    }

    /// Latches `v` into the worst verdict (and the hard flag).
    pub(super) fn latch(&self, v: Verdict) {
        self.verdict.fetch_max(v as u8, Ordering::SeqCst);
        if v == Verdict::Hard {
            self.hard.store(true, Ordering::SeqCst);
        }
    }
}
