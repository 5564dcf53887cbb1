//! One attempt: launch the command (with a profile's overrides), watch it until its leader exits, then
//! stop what it left behind, still guarded.

use std::os::fd::OwnedFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::config::BUDGET_ENV;
use super::job_cgroup::JobCgroup;
use super::members::{JOB_ENV, Members};
use super::peak::PEAK_POLL;
use super::watch::Watch;
use super::{ActionRecord, AttemptSummary, Context, RunConfig, SuperviseError};
use crate::profiles::{Profile, apply_overrides};

/// Poll period while waiting for leftover processes after the leader exited.
const LEFTOVER_POLL: Duration = Duration::from_millis(20);
/// How long SIGKILLed processes may take to disappear before memfit gives up waiting (a process in
/// uninterruptible sleep dies only when its I/O ends).
const KILL_WAIT: Duration = Duration::from_secs(10);

/// The job of one attempt, as launched.
struct Launched {
    child: Child,
    pid: i32,
    members: Members,
    /// Readable once the leader exits; `None` where pidfds are not available.
    pidfd: Option<OwnedFd>,
    started_s: f64,
}

pub(super) fn run_attempt(
    ctx: &mut Context,
    attempt: u32,
    profile: Option<&Profile>,
) -> Result<AttemptSummary, SuperviseError> {
    let argv = build_argv(ctx.cfg, profile);
    let mut job = launch(ctx, attempt, profile, &argv)?;
    let mut watch = Watch::new(ctx, attempt);
    let status = loop {
        if let Some(status) = job.child.try_wait().map_err(SuperviseError::Wait)? {
            break status;
        }
        let period = watch.sample(ctx, &mut job.members)?;
        wait_polling(job.pidfd.as_ref(), &mut watch, period);
    };
    job.members.leader_reaped();
    finish(ctx, profile, argv, job, status, watch)
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

/// Starts the job in its own process group (and its own cgroup with `--cgroup`) and records the launch.
fn launch(
    ctx: &mut Context,
    attempt: u32,
    profile: Option<&Profile>,
    argv: &[String],
) -> Result<Launched, SuperviseError> {
    let cgroup = job_cgroup(ctx, attempt);
    let token = format!(
        "{}-{attempt}-{}",
        std::process::id(),
        ctx.start.elapsed().as_nanos()
    );
    let soft_bytes = (ctx.budget_bytes as f64 * ctx.cfg.guard.soft) as u64;
    let child = spawn(
        ctx.cfg,
        argv,
        (profile, soft_bytes),
        &token,
        cgroup.as_ref(),
    )?;
    let pid = child.id() as i32;
    let members = Members::new(pid, token, cgroup);
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
    let cgroup_dir = members.cgroup.as_ref().map(|c| c.dir.display().to_string());
    ctx.series.record(
        "launch",
        &serde_json::json!({"t_s": started_s, "attempt": attempt, "pid": pid, "argv": argv,
                            "profile": profile.map(|p| &p.name), "env": profile.map(|p| &p.env),
                            "cgroup": cgroup_dir}),
    )?;
    Ok(Launched {
        child,
        pid,
        members,
        pidfd,
        started_s,
    })
}

/// The job's own cgroup when `--cgroup` asked for one and the machine allows it; otherwise the reason
/// is kept for the summary (and logged once) and the process tree alone is used.
fn job_cgroup(ctx: &mut Context, attempt: u32) -> Option<JobCgroup> {
    if !ctx.cfg.cgroup {
        return None;
    }
    match JobCgroup::create(attempt) {
        Ok(cg) => Some(cg),
        Err(reason) => {
            if ctx.cgroup_unavailable.is_none() {
                tracing::warn!("--cgroup: {reason}; guarding the process tree only");
                ctx.cgroup_unavailable = Some(reason);
            }
            None
        }
    }
}

/// `soft_bytes`: the job's share of the budget, handed over as [`BUDGET_ENV`].
fn spawn(
    cfg: &RunConfig,
    argv: &[String],
    (profile, soft_bytes): (Option<&Profile>, u64),
    token: &str,
    cgroup: Option<&JobCgroup>,
) -> Result<Child, SuperviseError> {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .process_group(0)
        .env(JOB_ENV, token)
        .env(BUDGET_ENV, soft_bytes.to_string());
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
    if let Some(cg) = cgroup {
        cg.enter_on_spawn(&mut cmd)
            .map_err(|source| SuperviseError::Output {
                path: cg.dir.join("cgroup.procs").display().to_string(),
                source,
            })?;
    }
    cmd.spawn().map_err(|source| SuperviseError::Spawn {
        program: argv[0].clone(),
        source,
    })
}

/// After the leader exited: stops the processes it left, records the exit and sums the attempt up.
fn finish(
    ctx: &mut Context,
    profile: Option<&Profile>,
    argv: Vec<String>,
    mut job: Launched,
    status: ExitStatus,
    mut watch: Watch,
) -> Result<AttemptSummary, SuperviseError> {
    let attempt = watch.attempt;
    let signal = status.signal();
    let exit_code = status.code().unwrap_or_else(|| 128 + signal.unwrap_or(0));
    tracing::info!(attempt, exit_code, "the job's leader ended");
    if let Some(cleanup) = stop_leftovers(ctx, &mut job.members, &mut watch)? {
        ctx.series.record("action", &cleanup)?;
        watch.actions.push(cleanup);
    }
    let ended_s = ctx.t();
    let cgroup = job.members.cgroup.as_ref();
    let cgroup_peak = cgroup.and_then(|c| c.peak_bytes());
    if let Some(peak) = cgroup_peak {
        watch.peak.cgroup_peak(peak);
    }
    ctx.series.record(
        "exit",
        &serde_json::json!({"t_s": ended_s, "attempt": attempt, "exit_code": exit_code,
                            "signal": signal, "stopped_by_guard": watch.stopped_by_guard}),
    )?;
    Ok(AttemptSummary {
        attempt,
        profile: profile.map(|p| p.name.clone()),
        argv,
        pid: job.pid,
        started_s: job.started_s,
        ended_s,
        exit_code,
        signal,
        stopped_by_guard: watch.stopped_by_guard,
        peak_job_bytes: watch.peak.sources.peak(),
        peak_sources: watch.peak.sources,
        peak_gpu_bytes: watch.peak_gpu,
        cgroup: cgroup.map(|c| c.dir.display().to_string()),
        cgroup_peak_bytes: cgroup_peak,
        cgroup_oom_kills: cgroup.map(|c| c.oom_kills()),
        actions: watch.actions,
    })
}

/// Processes of the job still alive after the leader ended (workers, daemons) are sampled and guarded
/// as before, get the stop signal (unless one already went out), then SIGKILL when the grace period
/// since that signal ends, so the next attempt starts with their memory free and nothing is left.
fn stop_leftovers(
    ctx: &mut Context,
    members: &mut Members,
    watch: &mut Watch,
) -> Result<Option<ActionRecord>, SuperviseError> {
    let live = members.sample();
    if live.is_empty() && !members.undecided() {
        return Ok(None);
    }
    let stop = ctx.cfg.signal.signal();
    let mut last = stop;
    let sent = match watch.stop_sent {
        Some(t) => t,
        None => {
            members.signal(stop, &live);
            Instant::now()
        }
    };
    let deadline = sent + ctx.cfg.guard.grace;
    loop {
        watch.sample(ctx, members)?;
        if watch.processes == 0 && !members.undecided() {
            break;
        }
        if Instant::now() >= deadline {
            last = Signal::SIGKILL;
            kill_all(members);
            break;
        }
        std::thread::sleep(LEFTOVER_POLL);
    }
    tracing::warn!("the job's leader ended but other processes of the job remained; sent {last}");
    Ok(Some(ActionRecord {
        t_s: ctx.t(),
        attempt: watch.attempt,
        action: "cleanup".into(),
        reason: Some("processes of the job outlived the leader".into()),
        signal: Some(last.as_str().into()),
        job_bytes: 0,
        limit_bytes: 0,
        outside_group: Vec::new(),
        ranks: Vec::new(),
    }))
}

/// SIGKILL to every member until none is left (a process forked meanwhile is caught on the next
/// round), or `KILL_WAIT` passes.
fn kill_all(members: &mut Members) {
    let until = Instant::now() + KILL_WAIT;
    loop {
        let live = members.sample();
        if live.is_empty() {
            return;
        }
        if Instant::now() >= until {
            tracing::warn!(
                "{} processes of the job survived SIGKILL for {} s: {:?}",
                live.len(),
                KILL_WAIT.as_secs(),
                live.iter().map(|m| m.mem.pid).collect::<Vec<_>>()
            );
            return;
        }
        members.signal(Signal::SIGKILL, &live);
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits `period` until the next full sample, re-reading the job's processes every `PEAK_POLL` for
/// its peak; ends early when the leader exits, a signal arrives, or a re-read finds memory above what
/// the guard expects by the next sample.
fn wait_polling(pidfd: Option<&OwnedFd>, watch: &mut Watch, period: Duration) {
    let until = Instant::now() + period;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left <= PEAK_POLL {
            wait_exit(pidfd, left);
            return;
        }
        if wait_exit(pidfd, PEAK_POLL) || watch.poll() {
            return;
        }
    }
}

/// Waits up to `timeout` for the leader to exit (pidfd becomes readable) or a signal to arrive; true
/// when either ended the wait.
fn wait_exit(pidfd: Option<&OwnedFd>, timeout: Duration) -> bool {
    match pidfd {
        Some(fd) => {
            let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
            let ts = rustix::event::Timespec {
                tv_sec: timeout.as_secs() as i64,
                tv_nsec: timeout.subsec_nanos() as i64,
            };
            // EINTR (a forwarded signal) ends the wait early too.
            !matches!(rustix::event::poll(&mut fds, Some(&ts)), Ok(0))
        }
        None => {
            std::thread::sleep(timeout);
            false
        }
    }
}
