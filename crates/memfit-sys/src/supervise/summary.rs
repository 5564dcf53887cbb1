//! What a run reports: its actions, attempts, per-process peaks and outcome.

/// One action taken, as recorded in the summary and the time series.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ActionRecord {
    pub t_s: f64,
    pub attempt: u32,
    /// warn | recover | graceful_stop | kill | cleanup | forward
    pub action: String,
    pub reason: Option<String>,
    pub signal: Option<String>,
    pub job_bytes: u64,
    pub limit_bytes: u64,
    /// PIDs signalled individually because they had left the job's process group.
    pub outside_group: Vec<i32>,
    /// A distributed job's ranks when the guard acted (`LOCAL_RANK`/`RANK` of its processes).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<super::RankUsage>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AttemptSummary {
    pub attempt: u32,
    pub profile: Option<String>,
    pub argv: Vec<String>,
    pub pid: i32,
    pub started_s: f64,
    pub ended_s: f64,
    /// The exit code, or 128 + signal when the leader was killed by a signal (as shells report it).
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub stopped_by_guard: bool,
    /// The job's peak: the largest of `peak_sources` (supervise/peak.rs).
    pub peak_job_bytes: u64,
    pub peak_sources: super::PeakSources,
    /// The largest GPU memory of the whole tree in one sample (NVML); `None` without NVML.
    pub peak_gpu_bytes: Option<u64>,
    /// With `--cgroup`: the job's cgroup, the kernel's high-water mark of its usage (page cache
    /// included) and the processes the kernel OOM-killed in it.
    pub cgroup: Option<String>,
    pub cgroup_peak_bytes: Option<u64>,
    pub cgroup_oom_kills: Option<u64>,
    pub actions: Vec<ActionRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ProcessPeak {
    pub attempt: u32,
    pub pid: i32,
    pub name: String,
    /// Largest RssAnon + RssShmem + VmSwap seen.
    pub peak_bytes: u64,
    pub peak_rss_anon_bytes: u64,
    pub peak_rss_file_bytes: u64,
    pub peak_rss_shmem_bytes: u64,
    pub peak_swap_bytes: u64,
    /// The kernel's high-water mark of the process's RSS (VmHWM, file pages included), last read.
    pub peak_hwm_bytes: u64,
    pub peak_gpu_bytes: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The last attempt ran to its end on its own.
    Completed,
    /// The guard stopped the last attempt and no profile was left to relaunch with.
    StoppedByGuard,
    /// memfit itself was interrupted and passed the signal on.
    Interrupted,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunSummary {
    pub outcome: Outcome,
    /// What `memfit run` exits with (docs/architecture.md §3): the command's own code when it ran to its end,
    /// 75 when the guard stopped it and it was not relaunched.
    pub exit_code: i32,
    pub budget_bytes: u64,
    pub keep_free_bytes: u64,
    pub peak_job_bytes: u64,
    pub attempts: Vec<AttemptSummary>,
    /// The processes with the largest peaks, largest first (at most `TOP_PROCESSES`).
    pub peak_by_process: Vec<ProcessPeak>,
    /// A distributed job's ranks (processes with `LOCAL_RANK`, with their children), each attempt's
    /// peaks by local rank; empty for a job without ranks.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub peak_by_rank: Vec<super::RankPeak>,
    pub samples: u64,
    /// Why `--cgroup` was asked for but the process tree alone was guarded.
    pub cgroup_unavailable: Option<String>,
    /// How children were found: `children-files` or `proc-scan`.
    pub tree_discovery: &'static str,
    /// memfit's own peak RSS (VmHWM) when the run ended.
    pub guard_peak_rss_bytes: Option<u64>,
    /// CPU time memfit itself used (user + system), the cost of sampling.
    pub guard_cpu_s: Option<f64>,
}

/// EX_TEMPFAIL from sysexits.h: stopped by the guard, try again (docs/architecture.md §3).
pub const EXIT_STOPPED: i32 = 75;
pub(super) const TOP_PROCESSES: usize = 10;
