//! The supervisor behind `memfit run`: launch the command in its own process group, sample its tree,
//! feed the guard, signal the group, relaunch with the next lower-memory profile.
//!
//! The job is every process it starts (`members`): memfit is a child subreaper, so orphans stay its
//! children. Safety rules: signals go to the job's process group only while its leader is unreaped (the
//! group ID is reserved until then), and to each member by PID through a pidfd after checking its start
//! time; never to PID ≤ 1, never to memfit's own group.

mod attempt;
mod config;
mod error;
mod interval;
mod job_cgroup;
mod members;
mod own_usage;
mod peak;
mod ranks;
mod shm_files;
mod summary;
mod watch;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Instant, SystemTime};

use nix::sys::signal::Signal;

pub use config::{BUDGET_ENV, MIN_BUDGET_BYTES, RunConfig, StopSignal};
pub use error::SuperviseError;
pub use interval::{FAR_INTERVAL, MIN_INTERVAL, NEAR_INTERVAL, next_interval};
pub use members::JOB_ENV;
pub use own_usage::{own_cpu_seconds, own_peak_rss};
pub use peak::{PEAK_POLL, PeakSources};
pub use ranks::{RankPeak, RankUsage};
pub use summary::{ActionRecord, AttemptSummary, EXIT_STOPPED, Outcome, ProcessPeak, RunSummary};

use crate::probe::cgroup::{self, CgroupMemory};
use crate::probe::gpu::GpuSampler;
use crate::sample::{self, TreeWalker};
use crate::series::{SCHEMA, SeriesError, SeriesWriter};
use summary::TOP_PROCESSES;

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
    /// Each rank's peaks by (attempt, local rank), for a distributed job.
    rank_peaks: HashMap<(u32, u32), RankPeak>,
    /// /dev/shm as the run found it: files created later are the job's.
    shm: shm_files::ShmFiles,
    /// Why `--cgroup` could not be honoured, once known.
    cgroup_unavailable: Option<String>,
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
    let budget_bytes = resolve_budget(cfg, effective_limit)?;
    members::become_subreaper();
    let forwarded = Arc::new(AtomicUsize::new(0));
    let handlers = install_forwarding(cfg, &forwarded)?;
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
        rank_peaks: HashMap::new(),
        shm: shm_files::ShmFiles::snapshot(),
        cgroup_unavailable: None,
        samples: 0,
        tree_discovery: if TreeWalker::new(std::process::id() as i32).uses_children_files() {
            "children-files"
        } else {
            "proc-scan"
        },
    };
    write_header(&mut ctx, effective_limit, system.total_bytes)?;
    log_guarding(&ctx);

    let (attempts, interrupted) = run_attempts(&mut ctx)?;
    drop(handlers);

    let summary = summarise(&ctx, attempts, interrupted);
    ctx.series.record("summary", &summary)?;
    Ok(summary)
}

/// The budget in bytes; refused below `MIN_BUDGET_BYTES`, and a warning when the machine allows less.
fn resolve_budget(cfg: &RunConfig, effective_limit: u64) -> Result<u64, SuperviseError> {
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
    Ok(budget_bytes)
}

/// With `forward_signals`, SIGINT/SIGTERM/SIGHUP sent to memfit are stored in `forwarded` for the
/// attempt to pass on.
fn install_forwarding(
    cfg: &RunConfig,
    forwarded: &Arc<AtomicUsize>,
) -> Result<Handlers, SuperviseError> {
    let mut handlers = Handlers(Vec::new());
    if cfg.forward_signals {
        for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            let id =
                signal_hook::flag::register_usize(sig as i32, Arc::clone(forwarded), sig as usize)
                    .map_err(SuperviseError::Signals)?;
            handlers.0.push(id);
        }
    }
    Ok(handlers)
}

fn log_guarding(ctx: &Context) {
    let cfg = ctx.cfg;
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
}

/// Runs attempts until one ends on its own, memfit is interrupted, or profiles or restarts run out;
/// also says whether memfit was interrupted.
fn run_attempts(ctx: &mut Context) -> Result<(Vec<AttemptSummary>, bool), SuperviseError> {
    let cfg = ctx.cfg;
    let mut attempts = Vec::new();
    let mut interrupted = false;
    for attempt in 0..=cfg.max_restarts.min(cfg.profiles.len() as u32) {
        let profile = attempt.checked_sub(1).map(|i| &cfg.profiles[i as usize]);
        let summary = attempt::run_attempt(ctx, attempt, profile)?;
        let stopped = summary.stopped_by_guard;
        interrupted = ctx.forwarded.load(Ordering::SeqCst) != 0;
        attempts.push(summary);
        if !stopped || interrupted {
            break;
        }
    }
    Ok((attempts, interrupted))
}

fn summarise(ctx: &Context, attempts: Vec<AttemptSummary>, interrupted: bool) -> RunSummary {
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
    let mut peak_by_rank: Vec<RankPeak> = ctx.rank_peaks.values().cloned().collect();
    peak_by_rank.sort_by_key(|p| (p.attempt, p.local_rank));
    RunSummary {
        outcome,
        exit_code,
        budget_bytes: ctx.budget_bytes,
        keep_free_bytes: ctx.keep_free_bytes,
        peak_job_bytes: attempts.iter().map(|a| a.peak_job_bytes).max().unwrap_or(0),
        attempts,
        peak_by_process,
        peak_by_rank,
        samples: ctx.samples,
        cgroup_unavailable: ctx.cgroup_unavailable.clone(),
        tree_discovery: ctx.tree_discovery,
        guard_peak_rss_bytes: own_peak_rss(),
        guard_cpu_s: own_cpu_seconds(),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
