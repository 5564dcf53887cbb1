//! What `run` is given: the command, the budget, the guard's settings and the stop signal.

use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::interval::FAR_INTERVAL;
use crate::guard::GuardConfig;
use crate::profiles::Profile;
use crate::units::SizeOrPercent;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum StopSignal {
    #[serde(rename = "TERM")]
    Term,
    #[serde(rename = "INT")]
    Int,
    #[serde(rename = "USR1")]
    Usr1,
}

impl StopSignal {
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim().to_ascii_uppercase().trim_start_matches("SIG") {
            "TERM" => Some(Self::Term),
            "INT" => Some(Self::Int),
            "USR1" => Some(Self::Usr1),
            _ => None,
        }
    }

    pub fn signal(self) -> Signal {
        match self {
            Self::Term => Signal::SIGTERM,
            Self::Int => Signal::SIGINT,
            Self::Usr1 => Signal::SIGUSR1,
        }
    }

    /// TERM and INT ask the job to exit; USR1 only asks it to shed memory (see `GuardConfig::expect_exit`).
    pub fn asks_to_exit(self) -> bool {
        !matches!(self, Self::Usr1)
    }
}

#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Program and arguments.
    pub command: Vec<String>,
    /// The job's hard limit: bytes, or a share of the effective limit (RAM, or the cgroup limit if lower).
    pub budget: SizeOrPercent,
    /// MemAvailable the machine keeps whatever the budget says: bytes or a share of RAM.
    pub keep_free: SizeOrPercent,
    pub guard: GuardConfig,
    pub signal: StopSignal,
    pub profiles: Vec<Profile>,
    pub max_restarts: u32,
    pub jsonl: Option<PathBuf>,
    pub csv: Option<PathBuf>,
    /// Catch SIGINT/SIGTERM/SIGHUP sent to memfit and pass them to the job (the CLI does; a library
    /// caller such as a test harness may not want its handlers replaced).
    pub forward_signals: bool,
    /// The longest time between two samples (at most `FAR_INTERVAL`); `memfit calibrate` shortens it so
    /// a short run's peak is not missed between samples.
    pub max_interval: Duration,
    /// Append the job's standard output / error to these files instead of sharing memfit's.
    pub stdout: Option<PathBuf>,
    pub stderr: Option<PathBuf>,
    /// Put each attempt in a memory cgroup of its own where the machine allows (`--cgroup`).
    pub cgroup: bool,
}

impl RunConfig {
    pub fn new(command: Vec<String>) -> Self {
        Self {
            command,
            budget: SizeOrPercent::Fraction(0.9),
            // 5% of RAM: the kernel's watermarks and the page cache of running programs need some, and
            // earlyoom acts at 10% MemAvailable by default, so the guard acts while half of that remains.
            keep_free: SizeOrPercent::Fraction(0.05),
            guard: GuardConfig::default(),
            signal: StopSignal::Term,
            profiles: Vec::new(),
            max_restarts: 0,
            jsonl: None,
            csv: None,
            forward_signals: false,
            max_interval: FAR_INTERVAL,
            stdout: None,
            stderr: None,
            cgroup: false,
        }
    }
}

/// What `run` hands the job of its budget: the bytes below which the job is never asked to stop
/// (the budget × `--soft`). A memfit inside (`memfit train`, `memfit data prepare`) plans for it
/// when no budget of its own says less, so its own guard acts before this one does.
pub const BUDGET_ENV: &str = "MEMFIT_RUN_BUDGET_BYTES";

/// The smallest budget a job is started under. Below it the guard would stop nearly any real job
/// as it starts: measured here, `python3 -c pass` peaks at 13 MiB RSS and `memfit train`'s demo at
/// 26 MiB, while `sleep` (0.7 MiB anonymous memory) still fits.
pub const MIN_BUDGET_BYTES: u64 = 16 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_parse() {
        assert_eq!(StopSignal::parse("sigterm"), Some(StopSignal::Term));
        assert_eq!(StopSignal::parse("USR1"), Some(StopSignal::Usr1));
        assert_eq!(StopSignal::parse("KILL"), None);
        assert!(!StopSignal::Usr1.asks_to_exit());
    }
}
