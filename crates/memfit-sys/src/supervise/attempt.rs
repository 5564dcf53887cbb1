//! One attempt: launch the command (with a profile's overrides), watch it until its leader exits, then
//! stop what it left behind.

use std::os::fd::OwnedFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::group::{JobGroup, wait_exit};
use super::watch::Watch;
use super::{ActionRecord, AttemptSummary, Context, RunConfig, SuperviseError};
use crate::profiles::{Profile, apply_overrides};

/// Poll period while waiting for leftover group members after the leader exited.
const LEFTOVER_POLL: Duration = Duration::from_millis(50);

/// The job of one attempt, as launched.
struct Launched {
    child: Child,
    pid: i32,
    group: JobGroup,
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
    let mut watch = Watch::new(ctx, attempt, job.pid);
    let status = loop {
        if let Some(status) = job.child.try_wait().map_err(SuperviseError::Wait)? {
            break status;
        }
        let period = watch.sample(ctx, &job.group)?;
        wait_exit(job.pidfd.as_ref(), period);
    };
    finish(ctx, profile, argv, &job, status, watch)
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

/// Starts the job in its own process group and records the launch.
fn launch(
    ctx: &mut Context,
    attempt: u32,
    profile: Option<&Profile>,
    argv: &[String],
) -> Result<Launched, SuperviseError> {
    let child = spawn(ctx.cfg, argv, profile)?;
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
    Ok(Launched {
        child,
        pid,
        group,
        pidfd,
        started_s,
    })
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

/// After the leader exited: stops leftover group members, records the exit and sums the attempt up.
fn finish(
    ctx: &mut Context,
    profile: Option<&Profile>,
    argv: Vec<String>,
    job: &Launched,
    status: ExitStatus,
    watch: Watch,
) -> Result<AttemptSummary, SuperviseError> {
    let attempt = watch.attempt;
    let mut actions = watch.actions;
    let signal = status.signal();
    let exit_code = status.code().unwrap_or_else(|| 128 + signal.unwrap_or(0));
    let ended_s = ctx.t();
    tracing::info!(attempt, exit_code, "the job's leader ended");
    if let Some(cleanup) = stop_leftovers(ctx, &job.group, attempt) {
        ctx.series.record("action", &cleanup)?;
        actions.push(cleanup);
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
        peak_job_bytes: watch.peak_job,
        peak_gpu_bytes: watch.peak_gpu,
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
