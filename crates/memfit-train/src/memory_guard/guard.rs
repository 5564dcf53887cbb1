//! The running guard the loop holds: its sampling thread, the latched verdict, step-boundary checks.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::state::{Core, Shared};
use super::{GuardSettings, GuardStatus, MemoryReading, MemorySampler, Verdict, Watch};

/// The running guard: its thread stops when this is dropped.
pub struct MemoryGuard {
    shared: Arc<Shared>,
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl MemoryGuard {
    /// Starts the sampling thread (first sample at once, then every `settings.period`).
    pub fn start(
        settings: GuardSettings,
        sampler: impl MemorySampler + 'static,
    ) -> std::io::Result<Self> {
        let mut guard = Self::manual(settings, sampler);
        let (tx, rx) = mpsc::channel::<()>();
        let shared = Arc::clone(&guard.shared);
        let period = shared.lock().settings.period;
        let thread = std::thread::Builder::new()
            .name("memfit-memory-guard".into())
            .spawn(move || {
                loop {
                    shared.tick();
                    match rx.recv_timeout(period) {
                        Err(RecvTimeoutError::Timeout) => continue,
                        // The guard was dropped (sender gone) or asked to stop.
                        _ => break,
                    }
                }
            })?;
        guard.stop = Some(tx);
        guard.thread = Some(thread);
        Ok(guard)
    }

    /// A guard without a thread: readings are taken only by [`Self::check_now`] and [`Self::sample_now`].
    pub fn manual(settings: GuardSettings, sampler: impl MemorySampler + 'static) -> Self {
        let host = settings
            .budget_bytes
            .map(|b| Watch::new(settings.limits(b)));
        let gpu = settings
            .gpu_budget_bytes
            .map(|b| Watch::new(settings.limits(b)));
        let core = Core {
            settings,
            sampler: Box::new(sampler),
            host,
            gpu,
            override_text: None,
            last: MemoryReading::default(),
            peak: MemoryReading::default(),
            notes: Vec::new(),
        };
        Self {
            shared: Arc::new(Shared {
                core: Mutex::new(core),
                verdict: AtomicU8::new(Verdict::Fine as u8),
                host_bytes: AtomicU64::new(0),
                hard: Arc::default(),
            }),
            stop: None,
            thread: None,
        }
    }

    /// The worst verdict since the loop last acted: one atomic load (the loop's between-micro-batch check).
    pub fn verdict(&self) -> Verdict {
        Verdict::from_u8(self.shared.verdict.load(Ordering::SeqCst))
    }

    /// A flag set once the hard limit is reached, for work that polls between small pieces
    /// (generation, between tokens) and is not the loop.
    pub fn hard_signal(&self) -> memfit_nn::decoding::StopSignal {
        memfit_nn::decoding::StopSignal(Arc::clone(&self.shared.hard))
    }

    /// The latest host reading (bytes), without the lock.
    pub fn last_host_bytes(&self) -> u64 {
        self.shared.host_bytes.load(Ordering::Relaxed)
    }

    /// Takes one reading now, in the caller's thread, and latches its verdict.
    pub fn sample_now(&self) -> Verdict {
        self.shared.tick()
    }

    /// A reading now plus everything the loop needs at a step boundary (verdict, limits, queued notes).
    pub fn check_now(&self) -> GuardStatus {
        let mut core = self.shared.lock();
        let v = core.tick();
        self.shared
            .host_bytes
            .store(core.last.host_bytes, Ordering::Relaxed);
        self.shared.latch(v);
        GuardStatus {
            verdict: Verdict::from_u8(self.shared.verdict.load(Ordering::SeqCst)),
            reading: core.last,
            peak: core.peak,
            limits: core.host.map(|w| w.limits),
            gpu_limits: core.gpu.map(|w| w.limits),
            notes: std::mem::take(&mut core.notes),
        }
    }

    /// The loop halved the micro-batch: ratchet the soft triggers from the peak that raised the
    /// verdict, start a new peak, and clear the soft verdict (a hard verdict latched meanwhile stays).
    pub fn downgraded(&self) {
        let mut core = self.shared.lock();
        let peak = core.peak;
        if let Some(w) = core.host.as_mut() {
            w.downgraded(peak.host_bytes);
        }
        if let (Some(w), Some(used)) = (core.gpu.as_mut(), peak.gpu_bytes) {
            w.downgraded(used);
        }
        core.peak = core.last;
        let _ = self.shared.verdict.compare_exchange(
            Verdict::Soft as u8,
            Verdict::Fine as u8,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }

    /// True while the sampling thread runs.
    pub fn is_threaded(&self) -> bool {
        self.thread.is_some()
    }
}

impl Drop for MemoryGuard {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{DEFAULT_HARD_FRACTION, DEFAULT_SOFT_FRACTION, GuardNote, OVERRIDE_FILE};
    use super::*;
    use std::time::Duration;

    use std::sync::atomic::AtomicU64;

    const MIB: u64 = 1 << 20;

    fn settings(budget: Option<u64>) -> GuardSettings {
        GuardSettings {
            budget_bytes: budget,
            gpu_budget_bytes: None,
            soft_fraction: DEFAULT_SOFT_FRACTION,
            hard_fraction: DEFAULT_HARD_FRACTION,
            period: Duration::from_secs(3600),
            override_file: None,
        }
    }

    /// A sampler reading a value the test sets.
    fn fed(value: &Arc<AtomicU64>) -> impl MemorySampler + 'static {
        let v = Arc::clone(value);
        move || MemoryReading {
            host_bytes: v.load(Ordering::SeqCst),
            gpu_bytes: None,
        }
    }

    #[test]
    fn verdicts_latch_until_the_loop_acts() {
        let value = Arc::new(AtomicU64::new(100 * MIB));
        let g = MemoryGuard::manual(settings(Some(1000 * MIB)), fed(&value));
        assert_eq!(g.sample_now(), Verdict::Fine);
        value.store(900 * MIB, Ordering::SeqCst);
        assert_eq!(g.sample_now(), Verdict::Soft);
        value.store(100 * MIB, Ordering::SeqCst);
        assert_eq!(g.sample_now(), Verdict::Fine);
        // The spike is remembered until the loop downgrades, and so is its size.
        assert_eq!(g.verdict(), Verdict::Soft);
        let s = g.check_now();
        assert_eq!(
            (s.reading.host_bytes, s.peak.host_bytes),
            (100 * MIB, 900 * MIB)
        );
        g.downgraded();
        assert_eq!(g.verdict(), Verdict::Fine);
        // The ratchet starts from the spike: halfway from 900 to 950 MiB.
        value.store(920 * MIB, Ordering::SeqCst);
        assert_eq!(g.sample_now(), Verdict::Fine);
        value.store(925 * MIB, Ordering::SeqCst);
        assert_eq!(g.sample_now(), Verdict::Soft);
        g.downgraded();
        value.store(960 * MIB, Ordering::SeqCst);
        g.sample_now();
        g.downgraded();
        assert_eq!(
            g.verdict(),
            Verdict::Hard,
            "a hard verdict is never cleared"
        );
    }

    /// What generation polls between tokens: set by the reading that crosses the hard limit (the
    /// thread's or the loop's), not by a soft one.
    #[test]
    fn the_hard_signal_is_set_by_the_reading_past_the_hard_limit() {
        let value = Arc::new(AtomicU64::new(900 * MIB));
        let g = MemoryGuard::manual(settings(Some(1000 * MIB)), fed(&value));
        let signal = g.hard_signal();
        assert_eq!(g.sample_now(), Verdict::Soft);
        assert!(!signal.is_set());
        value.store(960 * MIB, Ordering::SeqCst);
        g.check_now();
        assert!(signal.is_set() && g.hard_signal().is_set());
    }

    #[test]
    fn no_budget_means_no_verdict() {
        let value = Arc::new(AtomicU64::new(u64::MAX / 2));
        let g = MemoryGuard::manual(settings(None), fed(&value));
        let s = g.check_now();
        assert_eq!((s.verdict, s.limits), (Verdict::Fine, None));
    }

    #[test]
    fn gpu_readings_are_judged_against_their_own_budget() {
        let g = MemoryGuard::manual(
            GuardSettings {
                gpu_budget_bytes: Some(100),
                ..settings(Some(1000))
            },
            || MemoryReading {
                host_bytes: 10,
                gpu_bytes: Some(96),
            },
        );
        let s = g.check_now();
        assert_eq!(s.verdict, Verdict::Hard);
        assert_eq!(s.gpu_limits.map(|l| l.hard_bytes), Some(95));
    }

    #[test]
    fn the_override_file_replaces_the_budget_and_its_removal_restores_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(OVERRIDE_FILE);
        let value = Arc::new(AtomicU64::new(500 * MIB));
        let g = MemoryGuard::manual(
            GuardSettings {
                override_file: Some(file.clone()),
                ..settings(Some(2000 * MIB))
            },
            fed(&value),
        );
        assert_eq!(g.check_now().verdict, Verdict::Fine);
        std::fs::write(&file, "560MiB\n").unwrap();
        let s = g.check_now();
        assert_eq!(s.verdict, Verdict::Soft, "500 MiB ≥ 85 % of 560 MiB");
        assert_eq!(s.limits.unwrap().budget_bytes, 560 * MIB);
        assert_eq!(
            s.notes,
            vec![GuardNote::BudgetChanged {
                budget_bytes: Some(560 * MIB),
                source: file.display().to_string()
            }]
        );
        std::fs::write(&file, "lots").unwrap();
        let s = g.check_now();
        assert!(matches!(&s.notes[..], [GuardNote::OverrideInvalid { .. }]));
        assert_eq!(
            s.limits.unwrap().budget_bytes,
            560 * MIB,
            "a bad line is ignored"
        );
        assert!(g.check_now().notes.is_empty(), "reported once");
        std::fs::remove_file(&file).unwrap();
        let s = g.check_now();
        assert_eq!(s.limits.unwrap().budget_bytes, 2000 * MIB);
        assert_eq!(s.notes.len(), 1);
    }

    #[test]
    fn the_thread_samples_on_its_own_and_stops_when_dropped() {
        let value = Arc::new(AtomicU64::new(990));
        let count = Arc::new(AtomicU64::new(0));
        let (v, c) = (Arc::clone(&value), Arc::clone(&count));
        let g = MemoryGuard::start(
            GuardSettings {
                period: Duration::from_millis(5),
                ..settings(Some(1000))
            },
            move || {
                c.fetch_add(1, Ordering::SeqCst);
                MemoryReading {
                    host_bytes: v.load(Ordering::SeqCst),
                    gpu_bytes: None,
                }
            },
        )
        .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while g.verdict() != Verdict::Hard && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(g.verdict(), Verdict::Hard);
        assert!(g.is_threaded());
        drop(g);
        let after = count.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(count.load(Ordering::SeqCst), after, "no samples after drop");
    }
}
