//! `memfit run`: guard any command's memory; stop it gracefully, relaunch it smaller.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use comfy_table::Table;
use memfit_sys::guard::GuardConfig;
use memfit_sys::profiles;
use memfit_sys::supervise::{self, RunConfig, RunSummary, StopSignal, SuperviseError};
use memfit_sys::units::{SizeOrPercent, human_bytes as h, parse_duration, parse_percent};

use crate::exit::{Outcome, bad_input};

/// Boxed: the options are many strings, and `main`'s command enum should stay small.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    options: Box<RunArgs>,
}

#[derive(clap::Args)]
struct RunArgs {
    /// The job's hard limit: a size (12GiB) or a share of the effective limit (RAM, or the cgroup limit
    /// if lower), e.g. 90%.
    #[arg(long, default_value = "90%")]
    budget: String,
    /// Share of the hard limit at which the graceful signal goes out.
    #[arg(long, default_value = "90%")]
    soft: String,
    /// Share of the hard limit at which a warning is logged.
    #[arg(long, default_value = "75%")]
    warn: String,
    /// Time between the graceful signal and SIGKILL (500ms, 30s, 2m).
    #[arg(long, default_value = "30s")]
    grace: String,
    /// Minimum time between two warnings, or between two graceful signals.
    #[arg(long, default_value = "10s")]
    cooldown: String,
    /// The graceful signal: TERM, INT or USR1 (USR1: the job may shed memory and keep running).
    #[arg(long, default_value = "TERM")]
    signal: String,
    /// MemAvailable the machine keeps whatever the budget: a size or a share of RAM.
    #[arg(long, default_value = "5%")]
    keep_free: String,
    /// Lower-memory variants of the command to relaunch with after a guard stop (TOML, see docs/guard.md).
    #[arg(long)]
    profiles: Option<PathBuf>,
    /// Relaunches allowed after guard stops (default: one per profile).
    #[arg(long)]
    max_restarts: Option<u32>,
    /// Write the time series here as JSON Lines.
    #[arg(long)]
    log: Option<PathBuf>,
    /// Also write the samples here as CSV.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Print the final summary as JSON on stdout (after the command's own output).
    #[arg(long)]
    json: bool,
    /// Put the job in a memory cgroup of its own (cgroup v1, or v2 with the memory controller
    /// delegated) and read the kernel's figures; where none can be created, say why and guard the
    /// process tree.
    #[arg(long)]
    cgroup: bool,
    /// The command to guard, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

fn config(args: &RunArgs) -> anyhow::Result<RunConfig> {
    let size_or_pct = |flag: &str, v: &str| {
        SizeOrPercent::parse(v).map_err(|e| bad_input(format!("--{flag}: {e}")))
    };
    let pct =
        |flag: &str, v: &str| parse_percent(v).map_err(|e| bad_input(format!("--{flag}: {e}")));
    let dur =
        |flag: &str, v: &str| parse_duration(v).map_err(|e| bad_input(format!("--{flag}: {e}")));
    let (warn, soft) = (pct("warn", &args.warn)?, pct("soft", &args.soft)?);
    if warn >= soft || soft >= 1.0 {
        return Err(bad_input(format!(
            "--warn {} must be below --soft {}, and --soft below 100%",
            args.warn, args.soft
        )));
    }
    let signal = StopSignal::parse(&args.signal).ok_or_else(|| {
        bad_input(format!(
            "--signal {:?}: expected TERM, INT or USR1",
            args.signal
        ))
    })?;
    let profiles = match &args.profiles {
        Some(path) => profiles::load(path).map_err(|e| bad_input(e.to_string()))?,
        None => Vec::new(),
    };
    for (flag, path) in [("log", &args.log), ("csv", &args.csv)] {
        if let Some(path) = path {
            let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
            if parent.is_some_and(|p| !p.is_dir()) {
                return Err(bad_input(format!(
                    "--{flag} {}: the directory does not exist",
                    path.display()
                )));
            }
        }
    }
    let mut cfg = RunConfig::new(args.command.clone());
    cfg.budget = size_or_pct("budget", &args.budget)?;
    cfg.keep_free = size_or_pct("keep-free", &args.keep_free)?;
    cfg.guard = GuardConfig {
        warn,
        soft,
        grace: dur("grace", &args.grace)?,
        cooldown: dur("cooldown", &args.cooldown)?,
        ..GuardConfig::default()
    };
    cfg.signal = signal;
    cfg.max_restarts = args.max_restarts.unwrap_or(profiles.len() as u32);
    cfg.profiles = profiles;
    cfg.jsonl = args.log.clone();
    cfg.csv = args.csv.clone();
    cfg.forward_signals = true;
    cfg.cgroup = args.cgroup;
    Ok(cfg)
}

/// The supervisor's log lines on stderr, at `default_level` unless RUST_LOG says otherwise.
pub(crate) fn log_to_stderr(default_level: &str) {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .without_time()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .try_init();
}

/// `supervise::run` with bad input reported as such (exit 2): a program that does not exist, or a budget
/// below the floor (`budget_flag` names the option it came from); other errors say `what` failed.
pub(crate) fn supervise(
    cfg: &RunConfig,
    budget_flag: &str,
    what: &'static str,
) -> anyhow::Result<RunSummary> {
    match supervise::run(cfg) {
        Err(SuperviseError::Spawn { program, source })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Err(bad_input(format!(
                "cannot start {program:?}: no such program"
            )))
        }
        Err(e @ SuperviseError::BudgetBelowFloor { .. }) => {
            Err(bad_input(format!("{budget_flag}: {e}")))
        }
        other => other.context(what),
    }
}

pub fn run(args: Args) -> Outcome {
    let args = *args.options;
    log_to_stderr("info");
    let cfg = config(&args)?;
    let summary = supervise(&cfg, &format!("--budget {}", args.budget), "memfit run")?;
    eprint!("{}", render(&summary));
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    }
    Ok(ExitCode::from(summary.exit_code.clamp(0, 255) as u8))
}

fn secs(s: f64) -> String {
    format!("{:.1} s", Duration::from_secs_f64(s.max(0.0)).as_secs_f64())
}

fn render(s: &RunSummary) -> String {
    let mut attempts = Table::new();
    attempts.set_header(vec![
        "attempt",
        "profile",
        "exit",
        "stopped by guard",
        "peak",
        "duration",
        "actions",
    ]);
    for a in &s.attempts {
        let actions = a
            .actions
            .iter()
            .map(|x| {
                let what = x
                    .reason
                    .as_ref()
                    .map_or(x.action.clone(), |r| format!("{} ({r})", x.action));
                format!(
                    "{} at {} ({} of {})",
                    what,
                    secs(x.t_s),
                    h(x.job_bytes),
                    h(x.limit_bytes)
                )
            })
            .collect::<Vec<_>>()
            .join("\n");
        attempts.add_row(vec![
            a.attempt.to_string(),
            a.profile.clone().unwrap_or_else(|| "(as given)".into()),
            match a.signal {
                Some(sig) => format!("signal {sig}"),
                None => a.exit_code.to_string(),
            },
            if a.stopped_by_guard { "yes" } else { "no" }.to_owned(),
            h(a.peak_job_bytes),
            secs(a.ended_s - a.started_s),
            actions,
        ]);
    }
    let mut procs = Table::new();
    procs.set_header(vec![
        "attempt",
        "pid",
        "process",
        "peak (anon+shmem+swap)",
        "anon",
        "file",
        "shmem",
        "gpu",
    ]);
    for p in &s.peak_by_process {
        procs.add_row(vec![
            p.attempt.to_string(),
            p.pid.to_string(),
            p.name.clone(),
            h(p.peak_bytes),
            h(p.peak_rss_anon_bytes),
            h(p.peak_rss_file_bytes),
            h(p.peak_rss_shmem_bytes),
            p.peak_gpu_bytes.map_or("-".into(), h),
        ]);
    }
    let procs = if s.peak_by_process.is_empty() {
        String::new()
    } else {
        format!("{procs}\n")
    };
    let cgroup = match (&s.cgroup_unavailable, s.attempts.last()) {
        (Some(reason), _) => format!("--cgroup not used: {reason}\n"),
        (None, Some(a)) if a.cgroup.is_some() => format!(
            "job cgroup: kernel peak {} (page cache included), {} OOM kills\n",
            a.cgroup_peak_bytes.map_or("-".into(), h),
            a.cgroup_oom_kills.unwrap_or(0)
        ),
        _ => String::new(),
    };
    format!(
        "\nmemfit run: budget {}, peak {}; {} samples\n{attempts}\n{procs}{cgroup}exit {} ({})\n",
        h(s.budget_bytes),
        h(s.peak_job_bytes),
        s.samples,
        s.exit_code,
        serde_json::to_value(s.outcome)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
    )
}
