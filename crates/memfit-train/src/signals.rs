//! SIGINT/SIGTERM: the first one asks the loop to stop within seconds with a resumable checkpoint of
//! its last completed step and exit 75 — between two micro-batches of a step (the unfinished step is
//! dropped), between two batches of an evaluation or two tokens of a generation (the evaluation is
//! abandoned and done again by `--resume`), or after the checkpoint being written. A second signal ends
//! the process at once (exit 130: checkpoint writes are atomic, so nothing is corrupted). Never
//! prompts, TTY or not.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A flag the loop, the evaluation and generation poll. Clones share one flag; two handles are equal
/// when they are the same flag.
#[derive(Debug, Clone, Default)]
pub struct StopFlag(Arc<AtomicBool>);

impl PartialEq for StopFlag {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl StopFlag {
    pub fn new() -> Self {
        Self::default()
    }

    /// The process's flag set by SIGINT or SIGTERM; the handlers are installed by the first call, and
    /// later calls return the same flag. `memfit train` calls it first thing, so a signal that comes
    /// while the run directory is being made is a stop request (exit 75 with a resumable run), not the
    /// default death (exit 143) that left a half-made directory.
    pub fn from_signals() -> std::io::Result<Self> {
        static INSTALLED: std::sync::Mutex<Option<StopFlag>> = std::sync::Mutex::new(None);
        let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(flag) = installed.as_ref() {
            return Ok(flag.clone());
        }
        use signal_hook::consts::{SIGINT, SIGTERM};
        let flag = Self::new();
        for sig in [SIGINT, SIGTERM] {
            // Registered first, so it sees the flag before the second handler sets it: a second
            // signal finds it set and exits (128 + SIGINT = 130, the shell's convention).
            signal_hook::flag::register_conditional_shutdown(sig, 130, Arc::clone(&flag.0))?;
            signal_hook::flag::register(sig, Arc::clone(&flag.0))?;
        }
        *installed = Some(flag.clone());
        Ok(flag)
    }

    pub fn request(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// The same flag as memfit-nn's generation polls it.
    pub fn signal(&self) -> memfit_nn::decoding::StopSignal {
        memfit_nn::decoding::StopSignal(Arc::clone(&self.0))
    }

    /// Forgets a request that has been acted on, so that one process can run several loops under the
    /// same handlers (the next signal is again a first one).
    pub fn clear(&self) {
        self.0.store(false, Ordering::SeqCst);
    }
}
