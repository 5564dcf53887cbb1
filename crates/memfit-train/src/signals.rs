//! SIGINT/SIGTERM: the first one asks the loop to finish its current optimizer step, checkpoint and
//! exit 75; a second one ends the process at once (exit 130: checkpoint writes are atomic, so nothing
//! is corrupted). Never prompts, TTY or not.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A flag the loop polls between optimizer steps.
#[derive(Debug, Clone, Default)]
pub struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    pub fn new() -> Self {
        Self::default()
    }

    /// A flag set by SIGINT or SIGTERM.
    pub fn from_signals() -> std::io::Result<Self> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let flag = Self::new();
        for sig in [SIGINT, SIGTERM] {
            // Registered first, so it sees the flag before the second handler sets it: a second
            // signal finds it set and exits (128 + SIGINT = 130, the shell's convention).
            signal_hook::flag::register_conditional_shutdown(sig, 130, Arc::clone(&flag.0))?;
            signal_hook::flag::register(sig, Arc::clone(&flag.0))?;
        }
        Ok(flag)
    }

    pub fn request(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}
