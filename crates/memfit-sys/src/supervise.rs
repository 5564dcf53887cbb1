//! The supervisor behind `memfit run`: launch the command in its own process group, sample its tree,
//! feed the guard, signal the group, relaunch with the next lower-memory profile.
//!
//! Safety rules: signals go only to the job's process group (whose ID is the leader's PID, fixed while
//! the leader is unreaped) and to verified descendants of the leader that left it; never to PID ≤ 1,
//! never to memfit's own group.

use std::collections::HashMap;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::{Pid, getpgrp, getpid};

use crate::guard::{Action, Guard, GuardConfig, KillReason, Reading, Stage};
use crate::probe::cgroup::{self, CgroupMemory};
use crate::probe::{gpu::GpuSampler, psi};
use crate::profiles::{Profile, apply_overrides};
use crate::sample::{self, ProcMem, TreeWalker};
use crate::series::{SCHEMA, SampleRecord, SeriesError, SeriesWriter};
use crate::units::SizeOrPercent;

/// Sampling period when far from every limit (the "about 1 s").
pub const FAR_INTERVAL: Duration = Duration::from_secs(1);
/// Sampling period once usage passes `NEAR_FRACTION` of the limit or the guard has left `Normal`.
pub const NEAR_INTERVAL: Duration = Duration::from_millis(100);
/// The shortest period, used when memory grows fast: reading /proc/PID/status of a few processes costs
/// tens of microseconds, so 10 ms stays well under 1% of a core.
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);
/// "Near a limit": half of it.
const NEAR_FRACTION: f64 = 0.5;
/// Sample this many times before the soft level is reached at the current growth rate.
const SAMPLES_BEFORE_SOFT: f64 = 4.0;
/// The fastest growth assumed for memory that looks idle, bytes/s: fresh anonymous pages fault in at
/// about 0.8 GiB/s per thread on the development VM (memfit-memhog: 8 MiB touched in ~10 ms); 4 GiB/s
/// covers a burst from several threads. It only shortens the period when the soft level is less than
/// 4 GiB/s × 4 samples × 1 s = 16 GiB away.
const WORST_CASE_GROWTH: f64 = 4.0 * (1u64 << 30) as f64;
/// NVML per-process queries take milliseconds; once every half second is enough for the record.
const GPU_PERIOD: Duration = Duration::from_millis(500);
/// Poll period while waiting for leftover group members after the leader exited.
const LEFTOVER_POLL: Duration = Duration::from_millis(50);

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
        }
    }
}

/// The smallest budget a job is started under. Below it the guard would stop nearly any real job
/// as it starts: measured here, `python3 -c pass` peaks at 13 MiB RSS and `memfit train`'s demo at
/// 26 MiB, while `sleep` (0.7 MiB anonymous memory) still fits.
pub const MIN_BUDGET_BYTES: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    #[error("no command given")]
    EmptyCommand,
    #[error(
        "the budget ({budget}) is below {floor}, the least a job is started under: the guard \
         would stop it as it starts; give a size such as 512MiB or 8GiB"
    )]
    BudgetBelowFloor { budget: String, floor: String },
    #[error("cannot open {path} for the job's output: {source}")]
    Output {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot start {program:?}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("cannot read /proc/meminfo: the guard needs it")]
    NoMeminfo,
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error(transparent)]
    Series(#[from] SeriesError),
    #[error("waiting for the job failed: {0}")]
    Wait(std::io::Error),
}

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
    pub peak_job_bytes: u64,
    /// The largest GPU memory of the whole tree in one sample (NVML); `None` without NVML.
    pub peak_gpu_bytes: Option<u64>,
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
    /// What `memfit run` exits with (DESIGN.md §3): the command's own code when it ran to its end,
    /// 75 when the guard stopped it and it was not relaunched.
    pub exit_code: i32,
    pub budget_bytes: u64,
    pub keep_free_bytes: u64,
    pub peak_job_bytes: u64,
    pub attempts: Vec<AttemptSummary>,
    /// The processes with the largest peaks, largest first (at most `TOP_PROCESSES`).
    pub peak_by_process: Vec<ProcessPeak>,
    pub samples: u64,
    /// How children were found: `children-files` or `proc-scan`.
    pub tree_discovery: &'static str,
    /// memfit's own peak RSS (VmHWM) when the run ended.
    pub guard_peak_rss_bytes: Option<u64>,
    /// CPU time memfit itself used (user + system), the cost of sampling.
    pub guard_cpu_s: Option<f64>,
}

/// EX_TEMPFAIL from sysexits.h: stopped by the guard, try again (DESIGN.md §3).
pub const EXIT_STOPPED: i32 = 75;
const TOP_PROCESSES: usize = 10;

/// Fixed facts of a run shared by its attempts.
struct Context<'a> {
    cfg: &'a RunConfig,
    start: Instant,
    budget_bytes: u64,
    keep_free_bytes: u64,
    cgroup: Option<CgroupMemory>,
    gpu: Option<GpuSampler>,
    forwarded: Arc<AtomicUsize>,
    series: SeriesWriter,
    peaks: HashMap<(u32, i32), ProcessPeak>,
    samples: u64,
    tree_discovery: &'static str,
}

impl Context<'_> {
    fn t(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}

/// Signal handlers installed for forwarding; removed however `run` returns.
struct Handlers(Vec<signal_hook::SigId>);

impl Drop for Handlers {
    fn drop(&mut self) {
        for id in self.0.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// Runs the command under the guard until it ends, relaunching it with the next profile after each guard
/// stop while profiles and restarts remain.
pub fn run(cfg: &RunConfig) -> Result<RunSummary, SuperviseError> {
    if cfg.command.is_empty() {
        return Err(SuperviseError::EmptyCommand);
    }
    let system = sample::system().ok_or(SuperviseError::NoMeminfo)?;
    let cgroup = cgroup::own_cgroup();
    let effective_limit = cgroup
        .as_ref()
        .and_then(CgroupMemory::limit_bytes)
        .map_or(system.total_bytes, |l| l.min(system.total_bytes));
    let budget_bytes = cfg.budget.resolve(effective_limit);
    if budget_bytes.min(effective_limit) < MIN_BUDGET_BYTES {
        return Err(SuperviseError::BudgetBelowFloor {
            budget: crate::units::human_bytes(budget_bytes),
            floor: crate::units::human_bytes(MIN_BUDGET_BYTES),
        });
    }
    if budget_bytes > effective_limit {
        tracing::warn!(
            "the budget {} is above what this machine allows ({}); the lower one applies",
            crate::units::human_bytes(budget_bytes),
            crate::units::human_bytes(effective_limit)
        );
    }
    let forwarded = Arc::new(AtomicUsize::new(0));
    let mut handlers = Handlers(Vec::new());
    if cfg.forward_signals {
        for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            let id =
                signal_hook::flag::register_usize(sig as i32, Arc::clone(&forwarded), sig as usize)
                    .map_err(SuperviseError::Signals)?;
            handlers.0.push(id);
        }
    }
    let mut ctx = Context {
        cfg,
        start: Instant::now(),
        budget_bytes: budget_bytes.min(effective_limit),
        keep_free_bytes: cfg.keep_free.resolve(system.total_bytes),
        cgroup,
        gpu: GpuSampler::new(),
        forwarded,
        series: SeriesWriter::new(cfg.jsonl.as_deref(), cfg.csv.as_deref())?,
        peaks: HashMap::new(),
        samples: 0,
        tree_discovery: if TreeWalker::new(std::process::id() as i32).uses_children_files() {
            "children-files"
        } else {
            "proc-scan"
        },
    };
    write_header(&mut ctx, effective_limit, system.total_bytes)?;
    let h = crate::units::human_bytes;
    tracing::info!(
        "guarding with a hard limit of {} (warn at {:.0}%, graceful {} at {:.0}%, SIGKILL {:.0} s later), \
         keeping {} of RAM free",
        h(ctx.budget_bytes),
        cfg.guard.warn * 100.0,
        cfg.signal.signal().as_str(),
        cfg.guard.soft * 100.0,
        cfg.guard.grace.as_secs_f64(),
        h(ctx.keep_free_bytes)
    );

    let mut attempts = Vec::new();
    let mut interrupted = false;
    for attempt in 0..=cfg.max_restarts.min(cfg.profiles.len() as u32) {
        let profile = attempt.checked_sub(1).map(|i| &cfg.profiles[i as usize]);
        let summary = run_attempt(&mut ctx, attempt, profile)?;
        let stopped = summary.stopped_by_guard;
        interrupted = ctx.forwarded.load(Ordering::SeqCst) != 0;
        attempts.push(summary);
        if !stopped || interrupted {
            break;
        }
    }
    drop(handlers);

    let last = attempts.last().expect("at least one attempt runs");
    let (outcome, exit_code) = if interrupted {
        (Outcome::Interrupted, last.exit_code)
    } else if last.stopped_by_guard {
        (Outcome::StoppedByGuard, EXIT_STOPPED)
    } else {
        (Outcome::Completed, last.exit_code)
    };
    let mut peak_by_process: Vec<ProcessPeak> = ctx.peaks.values().cloned().collect();
    peak_by_process.sort_by(|a, b| b.peak_bytes.cmp(&a.peak_bytes).then(a.pid.cmp(&b.pid)));
    peak_by_process.truncate(TOP_PROCESSES);
    let summary = RunSummary {
        outcome,
        exit_code,
        budget_bytes: ctx.budget_bytes,
        keep_free_bytes: ctx.keep_free_bytes,
        peak_job_bytes: attempts.iter().map(|a| a.peak_job_bytes).max().unwrap_or(0),
        attempts,
        peak_by_process,
        samples: ctx.samples,
        tree_discovery: ctx.tree_discovery,
        guard_peak_rss_bytes: own_peak_rss(),
        guard_cpu_s: own_cpu_seconds(),
    };
    ctx.series.record("summary", &summary)?;
    Ok(summary)
}

fn write_header(ctx: &mut Context, effective_limit: u64, total: u64) -> Result<(), SeriesError> {
    let unix_s = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let g = &ctx.cfg.guard;
    let header = serde_json::json!({
        "schema": SCHEMA,
        "started_unix_s": unix_s,
        "command": ctx.cfg.command,
        "mem_total_bytes": total,
        "effective_limit_bytes": effective_limit,
        "cgroup": ctx.cgroup,
        "budget_bytes": ctx.budget_bytes,
        "keep_free_bytes": ctx.keep_free_bytes,
        "warn_fraction": g.warn,
        "soft_fraction": g.soft,
        "hysteresis_fraction": g.hysteresis,
        "grace_s": g.grace.as_secs_f64(),
        "cooldown_s": g.cooldown.as_secs_f64(),
        "signal": ctx.cfg.signal,
        "profiles": ctx.cfg.profiles,
        "max_restarts": ctx.cfg.max_restarts,
        "tree_discovery": ctx.tree_discovery,
        "gpu_sampling": ctx.gpu.is_some(),
    });
    ctx.series.record("header", &header)
}

/// The job's process group; refuses anything that could be memfit's own group or init.
struct JobGroup {
    pgid: i32,
}

impl JobGroup {
    fn new(pid: i32) -> Self {
        assert!(
            pid > 1,
            "job PID {pid} cannot lead a group memfit may signal"
        );
        assert_ne!(
            Pid::from_raw(pid),
            getpgrp(),
            "the job must not share memfit's group"
        );
        assert_ne!(Pid::from_raw(pid), getpid());
        Self { pgid: pid }
    }

    /// Sends `sig` to the group; false when the group is empty.
    fn signal(&self, sig: Option<Signal>) -> bool {
        killpg(Pid::from_raw(self.pgid), sig).is_ok()
    }

    /// Sends `sig` to the group and to live descendants of `leader` that left the group.
    fn signal_all(&self, sig: Signal, procs: &[ProcMem]) -> Vec<i32> {
        self.signal(Some(sig));
        procs
            .iter()
            .filter(|p| p.pid != self.pgid)
            .filter_map(|p| signal_outside_member(p.pid, self.pgid, sig).then_some(p.pid))
            .collect()
    }
}

/// Signals `pid` through a pidfd when it is outside `pgid` and still a descendant of `leader` (= pgid):
/// the pidfd pins the process between the check and the signal, so a reused PID is never hit.
fn signal_outside_member(pid: i32, leader: i32, sig: Signal) -> bool {
    let Some(rpid) = rustix::process::Pid::from_raw(pid) else {
        return false;
    };
    let Ok(fd) = rustix::process::pidfd_open(rpid, rustix::process::PidfdFlags::empty()) else {
        return false;
    };
    let stat = |p: i32| std::fs::read_to_string(format!("/proc/{p}/stat")).ok();
    let Some((pgrp, _)) = stat(pid).as_deref().and_then(sample::parse_stat_pgrp_start) else {
        return false;
    };
    if pgrp == leader {
        return false; // the group signal reached it
    }
    let mut cur = pid;
    // A tree deeper than this is not a real job; give up rather than loop.
    for _ in 0..4096 {
        match stat(cur).as_deref().and_then(sample::parse_stat_ppid) {
            Some(ppid) if ppid == leader => {
                let Some(s) = rustix::process::Signal::from_named_raw(sig as i32) else {
                    return false;
                };
                return rustix::process::pidfd_send_signal(&fd, s).is_ok();
            }
            Some(ppid) if ppid > 1 => cur = ppid,
            _ => return false,
        }
    }
    false
}

/// Waits up to `timeout` for the leader to exit (pidfd becomes readable) or a signal to arrive.
fn wait_exit(pidfd: Option<&std::os::fd::OwnedFd>, timeout: Duration) {
    match pidfd {
        Some(fd) => {
            let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
            let ts = rustix::event::Timespec {
                tv_sec: timeout.as_secs() as i64,
                tv_nsec: timeout.subsec_nanos() as i64,
            };
            // EINTR (a forwarded signal) simply ends the wait early.
            let _ = rustix::event::poll(&mut fds, Some(&ts));
        }
        None => std::thread::sleep(timeout),
    }
}

fn build_argv(cfg: &RunConfig, profile: Option<&Profile>) -> Vec<String> {
    match profile {
        None => cfg.command.clone(),
        Some(p) => {
            let argv = apply_overrides(&cfg.command, &p.args);
            apply_overrides(&argv, &p.resume_args)
        }
    }
}

fn spawn(
    cfg: &RunConfig,
    argv: &[String],
    profile: Option<&Profile>,
) -> Result<Child, SuperviseError> {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).process_group(0);
    if let Some(p) = profile {
        cmd.envs(&p.env);
    }
    let append = |path: &PathBuf| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| SuperviseError::Output {
                path: path.display().to_string(),
                source,
            })
    };
    if let Some(path) = &cfg.stdout {
        cmd.stdout(append(path)?);
    }
    if let Some(path) = &cfg.stderr {
        cmd.stderr(append(path)?);
    }
    cmd.spawn().map_err(|source| SuperviseError::Spawn {
        program: argv[0].clone(),
        source,
    })
}

/// Growth of the job's memory, smoothed over samples.
struct Growth {
    last: Option<(Instant, u64)>,
    bytes_per_s: f64,
}

impl Growth {
    fn update(&mut self, now: Instant, used: u64) -> Option<f64> {
        let known = self.last.is_some();
        if let Some((t, u)) = self.last {
            let dt = now.duration_since(t).as_secs_f64();
            if dt > 0.0 {
                let rate = (used as f64 - u as f64) / dt;
                // Half-life of one sample; the larger of the two so a sudden climb is not averaged away.
                self.bytes_per_s = (0.5 * self.bytes_per_s + 0.5 * rate).max(rate);
            }
        }
        self.last = Some((now, used));
        known.then_some(self.bytes_per_s)
    }
}

/// The next sampling period: 1 s far from limits, 100 ms near them, shorter when the soft level would be
/// reached sooner at the current growth rate.
/// `growth` is `None` until two samples give a rate: a job that just started is watched closely.
pub fn next_interval(
    used: u64,
    limit: u64,
    soft: f64,
    stage_normal: bool,
    growth: Option<f64>,
) -> Duration {
    let fraction = if limit == 0 {
        1.0
    } else {
        used as f64 / limit as f64
    };
    let Some(growth) = growth else {
        return NEAR_INTERVAL;
    };
    let mut period = if fraction >= NEAR_FRACTION || !stage_normal {
        NEAR_INTERVAL
    } else {
        FAR_INTERVAL
    };
    let to_soft = soft * limit as f64 - used as f64;
    // Even memory that looks idle cannot reach the soft level faster than the fastest plausible growth:
    // with a small budget this keeps the period short enough to see a sudden burst coming.
    // A tiny growth rate gives an ETA too long for a Duration: then it does not shorten the period.
    for rate in [growth, WORST_CASE_GROWTH] {
        if rate > 0.0
            && to_soft > 0.0
            && let Ok(eta) = Duration::try_from_secs_f64(to_soft / rate / SAMPLES_BEFORE_SOFT)
        {
            period = period.min(eta);
        }
    }
    period.max(MIN_INTERVAL)
}

fn stage_name(stage: Stage) -> &'static str {
    match stage {
        Stage::Normal => "normal",
        Stage::Warned => "warned",
        Stage::Stopping { .. } => "stopping",
        Stage::Killed => "killed",
    }
}

fn run_attempt(
    ctx: &mut Context,
    attempt: u32,
    profile: Option<&Profile>,
) -> Result<AttemptSummary, SuperviseError> {
    let argv = build_argv(ctx.cfg, profile);
    let mut child = spawn(ctx.cfg, &argv, profile)?;
    let pid = child.id() as i32;
    let group = JobGroup::new(pid);
    let pidfd = rustix::process::Pid::from_raw(pid)
        .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok());
    let started_s = ctx.t();
    tracing::info!(
        attempt,
        pid,
        profile = profile.map(|p| p.name.as_str()),
        "started {}",
        argv.join(" ")
    );
    ctx.series.record(
        "launch",
        &serde_json::json!({"t_s": started_s, "attempt": attempt, "pid": pid, "argv": argv,
                            "profile": profile.map(|p| &p.name), "env": profile.map(|p| &p.env)}),
    )?;

    let walker = TreeWalker::new(pid);
    let mut guard = Guard::new(GuardConfig {
        expect_exit: ctx.cfg.guard.expect_exit && ctx.cfg.signal.asks_to_exit(),
        ..ctx.cfg.guard.clone()
    });
    let mut growth = Growth {
        last: None,
        bytes_per_s: 0.0,
    };
    let mut actions = Vec::new();
    let mut stopped_by_guard = false;
    let mut forwarded_done = 0usize;
    let mut peak_job = 0u64;
    let mut peak_gpu: Option<u64> = None;
    let mut gpu_last: Option<Instant> = None;
    let mut gpu_by_pid: HashMap<u32, u64> = HashMap::new();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(SuperviseError::Wait)? {
            break status;
        }
        let procs = walker.sample();
        let now = Instant::now();
        // A signal sent to memfit goes to the job (once per distinct signal), and the guard stands down.
        let fwd = ctx.forwarded.load(Ordering::SeqCst);
        if fwd != 0 && fwd != forwarded_done {
            forwarded_done = fwd;
            if let Ok(sig) = Signal::try_from(fwd as i32) {
                let outside = group.signal_all(sig, &procs);
                tracing::warn!("memfit received {sig}; passed it to the job");
                actions.push(ActionRecord {
                    t_s: ctx.t(),
                    attempt,
                    action: "forward".into(),
                    reason: Some("memfit was signalled".into()),
                    signal: Some(sig.as_str().into()),
                    job_bytes: 0,
                    limit_bytes: 0,
                    outside_group: outside,
                });
            }
        }

        let job: u64 = procs.iter().map(ProcMem::charged).sum();
        peak_job = peak_job.max(job);
        let system = sample::system();
        if let Some(cg) = &mut ctx.cgroup {
            cg.refresh_usage();
        }
        let mut limit = ctx.budget_bytes;
        if let Some(sys) = system {
            limit = limit.min(job + sys.available_bytes.saturating_sub(ctx.keep_free_bytes));
        }
        if let Some(room) = ctx.cgroup.as_ref().and_then(CgroupMemory::headroom_now) {
            limit = limit.min(job + room);
        }
        if let Some(gpu) = &ctx.gpu
            && gpu_last.is_none_or(|t| now.duration_since(t) >= GPU_PERIOD)
        {
            gpu_by_pid = gpu.per_pid();
            gpu_last = Some(now);
        }
        for p in &procs {
            let gpu_bytes = ctx
                .gpu
                .as_ref()
                .map(|_| gpu_by_pid.get(&(p.pid as u32)).copied().unwrap_or(0));
            let e = ctx
                .peaks
                .entry((attempt, p.pid))
                .or_insert_with(|| ProcessPeak {
                    attempt,
                    pid: p.pid,
                    name: p.name.clone(),
                    peak_bytes: 0,
                    peak_rss_anon_bytes: 0,
                    peak_rss_file_bytes: 0,
                    peak_rss_shmem_bytes: 0,
                    peak_swap_bytes: 0,
                    peak_gpu_bytes: None,
                });
            // the latest name: a child sampled between fork and exec still bears its parent's
            e.name.clone_from(&p.name);
            e.peak_bytes = e.peak_bytes.max(p.charged());
            e.peak_rss_anon_bytes = e.peak_rss_anon_bytes.max(p.rss_anon);
            e.peak_rss_file_bytes = e.peak_rss_file_bytes.max(p.rss_file);
            e.peak_rss_shmem_bytes = e.peak_rss_shmem_bytes.max(p.rss_shmem);
            e.peak_swap_bytes = e.peak_swap_bytes.max(p.swap);
            e.peak_gpu_bytes = gpu_bytes.map(|g| e.peak_gpu_bytes.unwrap_or(0).max(g));
        }

        // The period until the next sample, and where memory will be by then at the current rate.
        let rate = growth.update(now, job);
        let period = next_interval(
            job,
            limit,
            guard.config().soft,
            guard.stage() == Stage::Normal,
            rate,
        )
        .min(ctx.cfg.max_interval.max(MIN_INTERVAL));
        let projected = job + (rate.unwrap_or(0.0).max(0.0) * period.as_secs_f64()) as u64;
        let reading = Reading {
            at: ctx.start.elapsed(),
            used: job,
            projected,
            limit,
        };
        // After a forwarded signal the user is in charge: keep recording, take no guard action.
        let action = if forwarded_done == 0 {
            guard.step(reading)
        } else {
            None
        };
        if let Some(action) = action {
            let (name, reason, sig) = match action {
                Action::Warn => ("warn", None, None),
                Action::Recover => ("recover", None, None),
                Action::GracefulStop => ("graceful_stop", None, Some(ctx.cfg.signal.signal())),
                Action::Kill { reason } => (
                    "kill",
                    Some(match reason {
                        KillReason::HardLimit => "hard_limit",
                        KillReason::GraceExpired => "grace_expired",
                    }),
                    Some(Signal::SIGKILL),
                ),
            };
            let outside = sig.map(|s| group.signal_all(s, &procs)).unwrap_or_default();
            // A job that shed memory after a USR1-style request and recovered was not stopped.
            match action {
                Action::GracefulStop | Action::Kill { .. } => stopped_by_guard = true,
                Action::Recover => stopped_by_guard = false,
                Action::Warn => {}
            }
            let record = ActionRecord {
                // The time of the reading the guard decided on, so intervals between actions are
                // exactly what the guard measured (grace, cooldown).
                t_s: reading.at.as_secs_f64(),
                attempt,
                action: name.into(),
                reason: reason.map(Into::into),
                signal: sig.map(|s| s.as_str().into()),
                job_bytes: job,
                limit_bytes: limit,
                outside_group: outside,
            };
            tracing::warn!(
                "guard: {name}{} at {} of {} limit",
                sig.map(|s| format!(" ({s})")).unwrap_or_default(),
                crate::units::human_bytes(job),
                crate::units::human_bytes(limit)
            );
            ctx.series.record("action", &record)?;
            actions.push(record);
        }

        // An action just taken moves the guard out of `Normal`: watch closely from now on.
        let period = if guard.stage() == Stage::Normal {
            period
        } else {
            period.min(NEAR_INTERVAL)
        };
        let totals = procs.iter().fold((0, 0, 0, 0), |t, p| {
            (
                t.0 + p.rss_anon,
                t.1 + p.rss_file,
                t.2 + p.rss_shmem,
                t.3 + p.swap,
            )
        });
        let gpu_total = ctx.gpu.as_ref().map(|_| {
            procs
                .iter()
                .filter_map(|p| gpu_by_pid.get(&(p.pid as u32)))
                .sum()
        });
        if let Some(g) = gpu_total {
            peak_gpu = Some(peak_gpu.unwrap_or(0).max(g));
        }
        ctx.samples += 1;
        ctx.series.sample(&SampleRecord {
            t_s: ctx.t(),
            attempt,
            job_bytes: job,
            limit_bytes: limit,
            rss_anon_bytes: totals.0,
            rss_file_bytes: totals.1,
            rss_shmem_bytes: totals.2,
            swap_bytes: totals.3,
            processes: procs.len() as u32,
            mem_available_bytes: system.map(|s| s.available_bytes),
            swap_used_bytes: system.map(|s| s.swap_total_bytes.saturating_sub(s.swap_free_bytes)),
            psi_some_avg10: psi::memory_pressure().map(|p| p.some.avg10),
            cgroup_current_bytes: ctx.cgroup.as_ref().and_then(|c| c.current_bytes),
            cgroup_oom_kills: ctx.cgroup.as_ref().map(|c| c.events.oom_kill),
            gpu_bytes: gpu_total,
            stage: stage_name(guard.stage()),
            next_ms: period.as_millis() as u64,
        })?;
        wait_exit(pidfd.as_ref(), period);
    };

    let signal = status.signal();
    let exit_code = status.code().unwrap_or_else(|| 128 + signal.unwrap_or(0));
    let ended_s = ctx.t();
    tracing::info!(attempt, exit_code, "the job's leader ended");
    if let Some(cleanup) = stop_leftovers(ctx, &group, attempt) {
        ctx.series.record("action", &cleanup)?;
        actions.push(cleanup);
    }
    ctx.series.record(
        "exit",
        &serde_json::json!({"t_s": ended_s, "attempt": attempt, "exit_code": exit_code,
                            "signal": signal, "stopped_by_guard": stopped_by_guard}),
    )?;
    Ok(AttemptSummary {
        attempt,
        profile: profile.map(|p| p.name.clone()),
        argv,
        pid,
        started_s,
        ended_s,
        exit_code,
        signal,
        stopped_by_guard,
        peak_job_bytes: peak_job,
        peak_gpu_bytes: peak_gpu,
        actions,
    })
}

/// Members of the job's group still alive after the leader ended (orphaned workers) get the stop signal,
/// then SIGKILL after the grace period, so the next attempt starts with their memory free.
fn stop_leftovers(ctx: &Context, group: &JobGroup, attempt: u32) -> Option<ActionRecord> {
    if !group.signal(None) {
        return None;
    }
    let sig = ctx.cfg.signal.signal();
    group.signal(Some(sig));
    let deadline = Instant::now() + ctx.cfg.guard.grace;
    let mut last = sig;
    while group.signal(None) {
        if Instant::now() >= deadline {
            group.signal(Some(Signal::SIGKILL));
            last = Signal::SIGKILL;
            break;
        }
        std::thread::sleep(LEFTOVER_POLL);
    }
    tracing::warn!("the job's leader ended but other processes of its group remained; sent {last}");
    Some(ActionRecord {
        t_s: ctx.t(),
        attempt,
        action: "cleanup".into(),
        reason: Some("group members outlived the leader".into()),
        signal: Some(last.as_str().into()),
        job_bytes: 0,
        limit_bytes: 0,
        outside_group: Vec::new(),
    })
}

/// /proc reports CPU times in USER_HZ ticks, which the kernel fixes at 100 per second for user space
/// (proc(5), "utime").
const USER_HZ: f64 = 100.0;

/// This process's user + system CPU time (fields 14 and 15 of /proc/self/stat).
pub fn own_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After ")", field N sits at index N − 3.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / USER_HZ)
}

/// This process's peak RSS (VmHWM).
pub fn own_peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    crate::probe::meminfo_kib(&status, "VmHWM").map(|k| k * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_adapts() {
        let gib = 1u64 << 30;
        let big = 100 * gib;
        let ms = |p: Duration| p.as_millis() as i64;
        assert_eq!(next_interval(big / 10, big, 0.9, true, None), NEAR_INTERVAL);
        assert_eq!(
            next_interval(big / 10, big, 0.9, true, Some(0.0)),
            FAR_INTERVAL
        );
        assert_eq!(
            next_interval(big * 6 / 10, big, 0.9, true, Some(0.0)),
            NEAR_INTERVAL
        );
        assert_eq!(
            next_interval(big / 10, big, 0.9, false, Some(0.0)),
            NEAR_INTERVAL
        );
        assert_eq!(
            next_interval(big / 10, big, 0.9, true, Some(1e-300)),
            FAR_INTERVAL
        );
        // 80 GiB to the soft level at 80 GiB/s: 1 s away, so sample every 250 ms.
        let p = next_interval(big / 10, big, 0.9, true, Some(80.0 * gib as f64));
        assert!((ms(p) - 250).abs() <= 1, "{p:?}");
        assert_eq!(
            next_interval(big * 89 / 100, big, 0.9, true, Some(1e12)),
            MIN_INTERVAL
        );
        // A small budget is watched closely even when idle: 0.8 GiB to soft at 4 GiB/s → 50 ms.
        let p = next_interval(gib / 10, gib, 0.9, true, Some(0.0));
        assert!((ms(p) - 50).abs() <= 1, "{p:?}");
    }

    proptest::proptest! {
        #[test]
        fn interval_is_always_bounded(
            used: u64, limit: u64, soft in 0.01f64..1.0, normal: bool,
            growth in proptest::option::of(proptest::num::f64::ANY),
        ) {
            let p = next_interval(used, limit, soft, normal, growth);
            proptest::prop_assert!((MIN_INTERVAL..=FAR_INTERVAL).contains(&p));
        }
    }

    #[test]
    fn signals_parse() {
        assert_eq!(StopSignal::parse("sigterm"), Some(StopSignal::Term));
        assert_eq!(StopSignal::parse("USR1"), Some(StopSignal::Usr1));
        assert_eq!(StopSignal::parse("KILL"), None);
        assert!(!StopSignal::Usr1.asks_to_exit());
    }

    #[test]
    fn exit_code_passes_through_and_empty_is_refused() {
        let cfg = RunConfig::new(vec!["sh".into(), "-c".into(), "exit 7".into()]);
        let s = run(&cfg).unwrap();
        assert_eq!((s.exit_code, s.outcome), (7, Outcome::Completed));
        assert!(matches!(
            run(&RunConfig::new(vec![])),
            Err(SuperviseError::EmptyCommand)
        ));
        let missing = RunConfig::new(vec!["/nonexistent/memfit-no-such-program".into()]);
        assert!(matches!(run(&missing), Err(SuperviseError::Spawn { .. })));
    }

    #[test]
    fn job_output_goes_to_the_files_given() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (out, err) = (dir.join("out.txt"), dir.join("err.txt"));
        let mut cfg = RunConfig::new(vec![
            "sh".into(),
            "-c".into(),
            "echo to-stdout; echo to-stderr >&2; exit 4".into(),
        ]);
        cfg.stdout = Some(out.clone());
        cfg.stderr = Some(err.clone());
        let s = run(&cfg).unwrap();
        assert_eq!(s.exit_code, 4);
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "to-stdout\n");
        assert_eq!(std::fs::read_to_string(&err).unwrap(), "to-stderr\n");
        cfg.stdout = Some(dir.join("no-such-dir").join("out.txt"));
        let e = run(&cfg).unwrap_err();
        assert!(matches!(e, SuperviseError::Output { .. }), "{e}");
        assert!(e.to_string().contains("no-such-dir"), "{e}");
    }
}
