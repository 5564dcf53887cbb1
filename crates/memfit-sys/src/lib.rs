//! memfit-sys: the machine.
//!
//! - `probe`  — CPU, RAM, swap, cgroup v2 limits, PSI, disk, GPUs (NVML), OOM daemons.
//! - `sample` — process-tree memory sampling from /proc and cgroup files.
//! - `guard`  — the guard state machine (warn → graceful stop → kill) with hysteresis.
//! - `supervise` — the supervisor behind `memfit run`: launch, watch, stop, relaunch with profiles.

pub mod probe;
