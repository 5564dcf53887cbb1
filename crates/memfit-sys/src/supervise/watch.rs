//! Watching one attempt: each sample reads the job's process tree, passes memfit's signals on, feeds the
//! guard, carries out its action and writes the time series.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::interval::{Growth, MIN_INTERVAL, NEAR_INTERVAL, next_interval};
use super::members::{Member, Members};
use super::peak::PeakTracker;
use super::ranks::{self, RankUsage, Ranks};
use super::{ActionRecord, Context, ProcessPeak, StopSignal, SuperviseError};
use crate::guard::{Action, Guard, GuardConfig, KillReason, Reading, Stage};
use crate::probe::cgroup::CgroupMemory;
use crate::probe::psi;
use crate::sample::{self, ProcMem, SystemMem};
use crate::series::SampleRecord;

/// A re-read between samples above the guard's projection by this share of the limit (1/50) brings
/// the next full sample forward; a burst seen through the high-water marks above the sample by this
/// share of it shortens the period.
const POLL_MARGIN: u64 = 50;

/// NVML per-process queries take milliseconds; once every half second is enough for the record.
const GPU_PERIOD: Duration = Duration::from_millis(500);

/// What one attempt has seen and done so far.
pub(super) struct Watch {
    pub(super) attempt: u32,
    guard: Guard,
    growth: Growth,
    pub(super) actions: Vec<ActionRecord>,
    pub(super) stopped_by_guard: bool,
    /// When a signal asking the job to stop went out (guard or forwarded), if one did.
    pub(super) stop_sent: Option<Instant>,
    /// Live processes of the job at the last sample.
    pub(super) processes: usize,
    /// The last signal passed on to the job (0: none yet).
    forwarded_done: usize,
    pub(super) peak: PeakTracker,
    /// A full sample is taken before its time when a re-read between samples finds more than this.
    poll_trigger: u64,
    pub(super) peak_gpu: Option<u64>,
    gpu_last: Option<Instant>,
    gpu_by_pid: HashMap<u32, u64>,
    ranks: Ranks,
}

impl Watch {
    pub(super) fn new(ctx: &Context, attempt: u32) -> Self {
        Self {
            attempt,
            guard: Guard::new(GuardConfig {
                expect_exit: ctx.cfg.guard.expect_exit && ctx.cfg.signal.asks_to_exit(),
                ..ctx.cfg.guard.clone()
            }),
            growth: Growth {
                last: None,
                bytes_per_s: 0.0,
            },
            actions: Vec::new(),
            stopped_by_guard: false,
            stop_sent: None,
            processes: 0,
            forwarded_done: 0,
            peak: PeakTracker::default(),
            poll_trigger: u64::MAX,
            peak_gpu: None,
            gpu_last: None,
            gpu_by_pid: HashMap::new(),
            ranks: Ranks::default(),
        }
    }

    /// Takes one sample and acts on it; returns the period until the next.
    pub(super) fn sample(
        &mut self,
        ctx: &mut Context,
        members: &mut Members,
    ) -> Result<Duration, SuperviseError> {
        let live = members.sample();
        let now = Instant::now();
        self.forward_signal(ctx, members, &live);
        let procs: Vec<ProcMem> = live.iter().map(|m| m.mem.clone()).collect();
        self.processes = procs.len();

        let pids: Vec<i32> = procs.iter().map(|p| p.pid).collect();
        let beyond = Beyond::read(ctx, members, &pids);
        let tree: u64 = procs.iter().map(ProcMem::charged).sum();
        // The cgroup sees what the tree cannot (cleared environments, files written and closed); the
        // tree sees what the v1 cgroup may charge elsewhere (pages first touched by another group).
        let job = (tree + beyond.shm_files).max(beyond.cgroup_charged.unwrap_or(0));
        let keyed = live.iter().map(|m| ((m.mem.pid, m.start), &m.mem));
        let between = self.peak.sample(job, keyed, beyond.shm_files);
        if let (Some(current), Some(charged)) = (beyond.cgroup_current, beyond.cgroup_charged) {
            self.peak.cgroup_sample(current, charged);
        }
        let system = sample::system();
        let limit = job_limit(ctx, job, system);
        self.refresh_gpu(ctx, now);
        self.update_peaks(ctx, &procs);
        let rank_usage = self.rank_usage(ctx, &live)?;

        let (reading, period) = self.reading(ctx, now, job, limit);
        self.act(ctx, members, &live, reading, rank_usage)?;
        self.poll_trigger = reading.projected + limit / POLL_MARGIN;

        // An action just taken moves the guard out of `Normal`, and a burst seen only through the
        // kernel's high-water marks may come again: watch closely from now on.
        let burst = between > job + job / POLL_MARGIN;
        let period = if self.guard.stage() == Stage::Normal && !burst {
            period
        } else {
            period.min(NEAR_INTERVAL)
        };
        self.record_sample(ctx, &procs, beyond, reading, system, period)?;
        Ok(period)
    }

    /// A light re-read of the job's processes between full samples (for the peak); true when memory
    /// is above what the guard expects by the next sample, so that sample should come now.
    pub(super) fn poll(&mut self) -> bool {
        self.peak.poll() > self.poll_trigger
    }

    /// A signal sent to memfit goes to the job (once per distinct signal), and the guard stands down.
    fn forward_signal(&mut self, ctx: &Context, members: &Members, live: &[Member]) {
        let fwd = ctx.forwarded.load(Ordering::SeqCst);
        if fwd != 0 && fwd != self.forwarded_done {
            self.forwarded_done = fwd;
            if let Ok(sig) = Signal::try_from(fwd as i32) {
                let outside = members.signal(sig, live);
                self.stop_sent = Some(Instant::now());
                tracing::warn!("memfit received {sig}; passed it to the job");
                self.actions.push(ActionRecord {
                    t_s: ctx.t(),
                    attempt: self.attempt,
                    action: "forward".into(),
                    reason: Some("memfit was signalled".into()),
                    signal: Some(sig.as_str().into()),
                    job_bytes: 0,
                    limit_bytes: 0,
                    outside_group: outside,
                    ranks: Vec::new(),
                });
            }
        }
    }

    /// A distributed job's usage by rank, kept in the rank peaks and written to the time series as a
    /// `ranks` record beside each sample; empty (and nothing written) for a job without ranks.
    fn rank_usage(
        &mut self,
        ctx: &mut Context,
        live: &[Member],
    ) -> Result<Vec<RankUsage>, SuperviseError> {
        let gpu = ctx.gpu.as_ref().map(|_| &self.gpu_by_pid);
        let usage = self.ranks.usage(live, gpu);
        if !usage.is_empty() {
            ranks::update_peaks(&mut ctx.rank_peaks, self.attempt, &usage);
            ctx.series.record(
                "ranks",
                &serde_json::json!({"t_s": ctx.t(), "attempt": self.attempt, "ranks": usage}),
            )?;
        }
        Ok(usage)
    }

    /// Per-process GPU memory, queried at most once per `GPU_PERIOD`.
    fn refresh_gpu(&mut self, ctx: &Context, now: Instant) {
        if let Some(gpu) = &ctx.gpu
            && self
                .gpu_last
                .is_none_or(|t| now.duration_since(t) >= GPU_PERIOD)
        {
            self.gpu_by_pid = gpu.per_pid();
            self.gpu_last = Some(now);
        }
    }

    fn update_peaks(&self, ctx: &mut Context, procs: &[ProcMem]) {
        let attempt = self.attempt;
        for p in procs {
            let gpu_bytes = ctx
                .gpu
                .as_ref()
                .map(|_| self.gpu_by_pid.get(&(p.pid as u32)).copied().unwrap_or(0));
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
                    peak_hwm_bytes: 0,
                    peak_gpu_bytes: None,
                });
            // the latest name: a child sampled between fork and exec still bears its parent's
            e.name.clone_from(&p.name);
            e.peak_bytes = e.peak_bytes.max(p.charged());
            e.peak_rss_anon_bytes = e.peak_rss_anon_bytes.max(p.rss_anon);
            e.peak_rss_file_bytes = e.peak_rss_file_bytes.max(p.rss_file);
            e.peak_rss_shmem_bytes = e.peak_rss_shmem_bytes.max(p.rss_shmem);
            e.peak_swap_bytes = e.peak_swap_bytes.max(p.swap);
            e.peak_hwm_bytes = e.peak_hwm_bytes.max(p.hwm);
            e.peak_gpu_bytes = gpu_bytes.map(|g| e.peak_gpu_bytes.unwrap_or(0).max(g));
        }
    }

    /// The period until the next sample, and where memory will be by then at the current rate.
    fn reading(
        &mut self,
        ctx: &Context,
        now: Instant,
        job: u64,
        limit: u64,
    ) -> (Reading, Duration) {
        let rate = self.growth.update(now, job);
        let period = next_interval(
            job,
            limit,
            self.guard.config().soft,
            self.guard.stage() == Stage::Normal,
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
        (reading, period)
    }

    /// Feeds the guard the reading and carries out its action: signal the job, log and record it.
    fn act(
        &mut self,
        ctx: &mut Context,
        members: &Members,
        live: &[Member],
        reading: Reading,
        rank_usage: Vec<RankUsage>,
    ) -> Result<(), SuperviseError> {
        // After a forwarded signal the user is in charge: keep recording, take no guard action.
        let action = if self.forwarded_done == 0 {
            self.guard.step(reading)
        } else {
            None
        };
        if let Some(action) = action {
            let (name, reason, sig) = describe_action(action, ctx.cfg.signal);
            let outside = sig.map(|s| members.signal(s, live)).unwrap_or_default();
            // A job that shed memory after a USR1-style request and recovered was not stopped.
            match action {
                Action::GracefulStop | Action::Kill { .. } => {
                    self.stopped_by_guard = true;
                    self.stop_sent.get_or_insert_with(Instant::now);
                }
                Action::Recover => {
                    self.stopped_by_guard = false;
                    self.stop_sent = None;
                }
                Action::Warn => {}
            }
            let record = ActionRecord {
                // The time of the reading the guard decided on, so intervals between actions are
                // exactly what the guard measured (grace, cooldown).
                t_s: reading.at.as_secs_f64(),
                attempt: self.attempt,
                action: name.into(),
                reason: reason.map(Into::into),
                signal: sig.map(|s| s.as_str().into()),
                job_bytes: reading.used,
                limit_bytes: reading.limit,
                outside_group: outside,
                ranks: rank_usage,
            };
            tracing::warn!(
                "guard: {name}{} at {} of {} limit{}",
                sig.map(|s| format!(" ({s})")).unwrap_or_default(),
                crate::units::human_bytes(reading.used),
                crate::units::human_bytes(reading.limit),
                if record.ranks.is_empty() {
                    String::new()
                } else {
                    format!(", every rank signalled; {}", ranks::describe(&record.ranks))
                }
            );
            ctx.series.record("action", &record)?;
            self.actions.push(record);
        }
        Ok(())
    }

    /// Writes the sample to the time series and keeps the tree's peak GPU memory.
    fn record_sample(
        &mut self,
        ctx: &mut Context,
        procs: &[ProcMem],
        beyond: Beyond,
        reading: Reading,
        system: Option<SystemMem>,
        period: Duration,
    ) -> Result<(), SuperviseError> {
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
                .filter_map(|p| self.gpu_by_pid.get(&(p.pid as u32)))
                .sum()
        });
        if let Some(g) = gpu_total {
            self.peak_gpu = Some(self.peak_gpu.unwrap_or(0).max(g));
        }
        ctx.samples += 1;
        ctx.series.sample(&SampleRecord {
            t_s: ctx.t(),
            attempt: self.attempt,
            job_bytes: reading.used,
            limit_bytes: reading.limit,
            rss_anon_bytes: totals.0,
            rss_file_bytes: totals.1,
            rss_shmem_bytes: totals.2,
            shm_files_bytes: beyond.shm_files,
            swap_bytes: totals.3,
            processes: procs.len() as u32,
            mem_available_bytes: system.map(|s| s.available_bytes),
            swap_used_bytes: system.map(|s| s.swap_total_bytes.saturating_sub(s.swap_free_bytes)),
            psi_some_avg10: psi::memory_pressure().map(|p| p.some.avg10),
            cgroup_current_bytes: ctx.cgroup.as_ref().and_then(|c| c.current_bytes),
            cgroup_oom_kills: ctx.cgroup.as_ref().map(|c| c.events.oom_kill),
            job_cgroup_bytes: beyond.cgroup_charged,
            job_cgroup_current_bytes: beyond.cgroup_current,
            gpu_bytes: gpu_total,
            stage: stage_name(self.guard.stage()),
            next_ms: period.as_millis() as u64,
        })?;
        Ok(())
    }
}

/// What the job holds beyond its processes' RSS: /dev/shm files it created, and with `--cgroup` the
/// kernel's figures for its group.
#[derive(Clone, Copy)]
struct Beyond {
    shm_files: u64,
    cgroup_charged: Option<u64>,
    cgroup_current: Option<u64>,
}

impl Beyond {
    fn read(ctx: &mut Context, members: &Members, pids: &[i32]) -> Self {
        let cg = members.cgroup.as_ref();
        Self {
            shm_files: ctx.shm.job_bytes(pids),
            cgroup_charged: cg.and_then(|c| c.charged_bytes()),
            cgroup_current: cg.and_then(|c| c.current_bytes()),
        }
    }
}

/// The job's limit now: the budget, lowered to what the machine (keeping `keep_free` available) and the
/// cgroup still have room for.
fn job_limit(ctx: &mut Context, job: u64, system: Option<SystemMem>) -> u64 {
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
    limit
}

/// The action's name, reason and signal as recorded.
fn describe_action(
    action: Action,
    stop: StopSignal,
) -> (&'static str, Option<&'static str>, Option<Signal>) {
    match action {
        Action::Warn => ("warn", None, None),
        Action::Recover => ("recover", None, None),
        Action::GracefulStop => ("graceful_stop", None, Some(stop.signal())),
        Action::Kill { reason } => (
            "kill",
            Some(match reason {
                KillReason::HardLimit => "hard_limit",
                KillReason::GraceExpired => "grace_expired",
            }),
            Some(Signal::SIGKILL),
        ),
    }
}

fn stage_name(stage: Stage) -> &'static str {
    match stage {
        Stage::Normal => "normal",
        Stage::Warned => "warned",
        Stage::Stopping { .. } => "stopping",
        Stage::Killed => "killed",
    }
}
