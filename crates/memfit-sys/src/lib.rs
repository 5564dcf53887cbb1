//! memfit-sys: the machine.
//!
//! - [`probe`] — what the machine has: CPU ([`probe::cpu`]), RAM and swap, the memory cgroup v1/v2 and its
//!   tightest limit ([`probe::cgroup`]), PSI ([`probe::psi`]), disk and /dev/shm ([`probe::disk`]), GPUs
//!   through NVML ([`probe::gpu`], feature `nvml`), OOM daemons ([`probe::daemons`]); [`probe::machine`]
//!   gathers it all with warnings for `memfit check`.
//! - [`sample`] — process-tree memory from /proc (children files, /proc/PID/status) and MemAvailable.
//! - [`calibrate`] — `memfit calibrate`: a line fitted to measured peaks, the largest batch under a budget.
//! - [`guard`] — the pure state machine: warn → graceful stop → kill, with hysteresis and cooldown.
//! - [`profiles`] — lower-memory variants of a command (TOML) and argument overrides.
//! - [`series`] — the JSONL/CSV time series of a guarded run (documented in docs/guard.md).
//! - [`supervise`] — `memfit run`: launch in a process group, sample, act, relaunch, summarise.
//! - [`units`] — sizes, percentages, durations as users type them.
//!
//! The `memfit-memhog` binary (src/bin) allocates memory in steps; the integration tests drive it.

pub mod calibrate;
pub mod guard;
pub mod probe;
pub mod profiles;
pub mod sample;
pub mod series;
pub mod supervise;
pub mod units;
