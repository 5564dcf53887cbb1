//! `memfit calibrate`: run the user's command briefly at a few micro-batches under `memfit run`'s guard,
//! fit `peak = fixed + per_sample × batch`, print the largest batch that fits each budget and write
//! profiles for `memfit run`. The arithmetic lives in `memfit_sys::calibrate`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use comfy_table::Table;
use memfit_sys::calibrate::{
    self as cal, Limit, Line, MaxBatch, PROFILES_MARKER, Point, Report, Template,
};
use memfit_sys::supervise::{Outcome as RunOutcome, RunConfig};
use memfit_sys::units::{SizeOrPercent, human_bytes as h, parse_size};

use crate::cmd::plan::parse_headroom;
use crate::cmd::run::{log_to_stderr, supervise};
use crate::exit::{Outcome, bad_input, does_not_fit};

/// Samples at least this often during a trial: a few steps of a small batch can be over in seconds,
/// and the guard's usual 1 s period far from the limit could miss their peak.
const TRIAL_SAMPLE_PERIOD: Duration = Duration::from_millis(20);
/// Lines of a failed trial's stderr shown.
const STDERR_TAIL_LINES: usize = 15;

/// Boxed: the options are many strings, and `main`'s command enum should stay small.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    options: Box<CalibrateArgs>,
}

#[derive(clap::Args)]
struct CalibrateArgs {
    /// Micro-batch sizes to measure, at least two; three check that the peak is linear in the batch.
    #[arg(long, default_value = "1,2,4")]
    batches: String,
    /// Steps per trial, put where the command has {steps} (default 5 when it has {steps}); a command
    /// without {steps} must keep its trial short itself.
    #[arg(long)]
    steps: Option<u64>,
    /// Host budget, the guard's hard limit for every trial: a size (12GiB) or a share of RAM (or of the
    /// cgroup limit if lower), e.g. 90%.
    #[arg(long, default_value = "90%")]
    budget_ram: String,
    /// GPU budget (a size); default: the memory of the smallest GPU NVML reports.
    #[arg(long)]
    budget_gpu: Option<String>,
    /// Share of each budget kept free: the peak may reach budget × (1 − headroom).
    #[arg(long, default_value = "10%", value_parser = parse_headroom)]
    headroom: f64,
    /// Also predict the peaks at this micro-batch.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    at: Option<u64>,
    /// Directory for profiles.toml (created if missing).
    #[arg(long, default_value = ".")]
    out: PathBuf,
    /// Print the result as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// The command, after `--`, with {batch} where the micro-batch size goes.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// Everything resolved before the first trial.
struct Setup {
    template: Template,
    batches: Vec<u64>,
    budget_ram: SizeOrPercent,
    /// As typed, for messages.
    budget_ram_text: String,
    budget_gpu: Option<u64>,
    headroom: f64,
    at: Option<u64>,
    /// profiles.toml and the flag it overrides; `None` when {batch} is not a flag's value.
    profiles: Option<(PathBuf, String)>,
    /// glibc malloc variables every trial and every profile runs with (`cal::malloc_pins`).
    malloc: Vec<(String, String)>,
    logs: tempfile::TempDir,
}

fn setup(args: &CalibrateArgs) -> anyhow::Result<Setup> {
    let bad = |e: cal::CalibrateError| bad_input(e.to_string());
    let template = Template::new(args.command.clone(), args.steps).map_err(bad)?;
    let batches = cal::parse_batches(&args.batches).map_err(bad)?;
    let budget_ram = SizeOrPercent::parse(&args.budget_ram)
        .map_err(|e| bad_input(format!("--budget-ram: {e}")))?;
    let budget_gpu = match &args.budget_gpu {
        Some(text) => Some(parse_size(text).map_err(|e| bad_input(format!("--budget-gpu: {e}")))?),
        None => memfit_sys::probe::gpu::gpus_with_driver()
            .ok()
            .and_then(|(gpus, _)| gpus.iter().map(|g| g.total_bytes).min()),
    };
    let profiles = match template.batch_flag() {
        Some(flag) => Some((profiles_path(&args.out)?, flag)),
        None => {
            eprintln!(
                "memfit calibrate: no profiles.toml: {{batch}} is not the value of a flag \
                 (--batch {{batch}} or --batch={{batch}}), so no profile could override it"
            );
            None
        }
    };
    let logs = tempfile::Builder::new()
        .prefix("memfit-calibrate-")
        .tempdir()
        .context("memfit calibrate: a temporary directory for the trials' output")?;
    let malloc = cal::malloc_pins(|k| std::env::var(k).ok());
    if !malloc.is_empty() {
        let vars: Vec<String> = malloc.iter().map(|(k, v)| format!("{k}={v}")).collect();
        eprintln!(
            "memfit calibrate: every trial runs with {} (glibc's mmap threshold pinned, so the RSS \
             follows live memory; the profiles set it too: run your job with it)",
            vars.join(" ")
        );
    }
    Ok(Setup {
        template,
        batches,
        budget_ram,
        budget_ram_text: args.budget_ram.clone(),
        budget_gpu,
        headroom: args.headroom,
        at: args.at,
        profiles,
        malloc,
        logs,
    })
}

/// `DIR/profiles.toml`, refused before any trial when it exists and calibrate did not write it.
fn profiles_path(dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| bad_input(format!("--out {}: {e}", dir.display())))?;
    let path = dir.join("profiles.toml");
    if let Ok(text) = std::fs::read_to_string(&path)
        && !text.starts_with(PROFILES_MARKER)
    {
        return Err(bad_input(format!(
            "{} exists and memfit calibrate did not write it; move it or give --out DIR",
            path.display()
        )));
    }
    Ok(path)
}

/// How one trial ended.
enum TrialEnd {
    Measured(Point),
    /// The guard stopped it: this batch does not fit the host budget.
    Stopped {
        peak: u64,
    },
    Failed {
        code: i32,
        argv: String,
        tail: String,
    },
}

/// Runs the command at `batch` under the guard; also returns the host budget the guard resolved.
fn trial(s: &Setup, batch: u64) -> anyhow::Result<(TrialEnd, u64)> {
    let argv = s.template.render(batch);
    // env(1) sets the malloc pins for the command and execs it (same process)
    let pinned: Vec<String> = if s.malloc.is_empty() {
        argv.clone()
    } else {
        let vars = s.malloc.iter().map(|(k, v)| format!("{k}={v}"));
        ["env".to_string()]
            .into_iter()
            .chain(vars)
            .chain(argv.iter().cloned())
            .collect()
    };
    let mut cfg = RunConfig::new(pinned);
    cfg.budget = s.budget_ram;
    cfg.max_interval = TRIAL_SAMPLE_PERIOD;
    cfg.forward_signals = true;
    let err_path = s.logs.path().join(format!("batch-{batch}.stderr"));
    cfg.stdout = Some(s.logs.path().join(format!("batch-{batch}.stdout")));
    cfg.stderr = Some(err_path.clone());
    let flag = format!("--budget-ram {}", s.budget_ram_text);
    let summary = supervise(&cfg, &flag, "memfit calibrate")?;
    let attempt = summary
        .attempts
        .last()
        .context("a trial without an attempt")?;
    if summary.outcome == RunOutcome::Interrupted {
        anyhow::bail!("memfit calibrate was interrupted during the trial at batch {batch}");
    }
    eprintln!(
        "memfit calibrate: batch {batch}: host peak {}, GPU peak {}, {:.1} s",
        h(attempt.peak_job_bytes),
        attempt.peak_gpu_bytes.map_or("-".into(), h),
        attempt.ended_s - attempt.started_s
    );
    if attempt.peak_job_bytes == 0 && attempt.exit_code == 0 {
        anyhow::bail!(
            "the trial at batch {batch} ended before memfit could sample it ({:.3} s): a trial must \
             run long enough to be measured (a few training steps)",
            attempt.ended_s - attempt.started_s
        );
    }
    let end = if attempt.stopped_by_guard {
        TrialEnd::Stopped {
            peak: attempt.peak_job_bytes,
        }
    } else if attempt.exit_code != 0 {
        TrialEnd::Failed {
            code: attempt.exit_code,
            argv: argv.join(" "),
            tail: tail(&err_path),
        }
    } else {
        TrialEnd::Measured(Point {
            batch,
            peak_rss_bytes: attempt.peak_job_bytes,
            peak_gpu_bytes: attempt.peak_gpu_bytes,
        })
    };
    Ok((end, summary.budget_bytes))
}

/// The last lines of a file, indented.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(STDERR_TAIL_LINES);
    lines[from..].iter().map(|l| format!("  | {l}\n")).collect()
}

/// The trials, smallest batch first, until one does not fit (measured or predicted).
fn measure(s: &Setup) -> anyhow::Result<(Vec<Point>, Limit)> {
    let mut points: Vec<Point> = Vec::new();
    let mut host = Limit {
        budget: 0,
        headroom: s.headroom,
    };
    for &batch in &s.batches {
        if points.len() >= 2 {
            let (h_line, g_line) = cal::fit_points(&points)?;
            let gpu = g_line.as_ref().zip(gpu_limit(s));
            if let Err(skip) = cal::next_trial(batch, (&h_line, host), gpu) {
                eprintln!(
                    "memfit calibrate: batch {} not run: its predicted {} peak {} is over the usable {}",
                    skip.batch,
                    skip.memory,
                    h(skip.predicted),
                    h(skip.usable)
                );
                break;
            }
        }
        let (end, budget) = trial(s, batch)?;
        host.budget = budget;
        match end {
            TrialEnd::Measured(p) => points.push(p),
            TrialEnd::Stopped { peak } if points.len() < 2 => {
                return Err(does_not_fit(format!(
                    "the guard stopped the trial at batch {batch} at a peak of {} (budget {}): \
                     too little room to measure two batch sizes; raise --budget-ram or lower --batches",
                    h(peak),
                    h(budget)
                )));
            }
            TrialEnd::Stopped { peak } => {
                eprintln!(
                    "memfit calibrate: the guard stopped batch {batch} at {}: it does not fit",
                    h(peak)
                );
                break;
            }
            TrialEnd::Failed { code, argv, tail } => {
                let msg = format!(
                    "the command failed at batch {batch} (exit code {code}): {argv}\nits last lines on stderr:\n{tail}"
                );
                if points.len() < 2 {
                    anyhow::bail!(msg);
                }
                eprintln!("memfit calibrate: {msg}the fit uses the smaller batches");
                break;
            }
        }
    }
    Ok((points, host))
}

fn gpu_limit(s: &Setup) -> Option<Limit> {
    s.budget_gpu.map(|budget| Limit {
        budget,
        headroom: s.headroom,
    })
}

pub fn run(args: Args) -> Outcome {
    let args = *args.options;
    log_to_stderr("error");
    let s = setup(&args)?;
    let (points, host_limit) = measure(&s)?;
    let lines = cal::fit_points(&points)?;
    let gpu_limit = lines.1.and(gpu_limit(&s));
    match (lines.1.is_some(), gpu_limit.is_some()) {
        (true, false) => eprintln!(
            "memfit calibrate: GPU memory measured but no GPU budget known: give --budget-gpu"
        ),
        (false, _) if args.budget_gpu.is_some() => eprintln!(
            "memfit calibrate: --budget-gpu is not used: no GPU memory was measured (no NVML)"
        ),
        _ => {}
    }
    let maxes = (
        lines.0.max_batch(host_limit.usable()),
        lines.1.zip(gpu_limit).map(|(l, m)| l.max_batch(m.usable())),
    );
    let report = Report::new(points, lines, s.at, maxes);
    let written = write_profiles(&s, &report, maxes, host_limit)?;
    if args.json {
        eprint!("{}", linearity_lines(&report));
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", render(&s, &report, host_limit, gpu_limit, maxes));
    }
    if let Some(path) = written {
        eprintln!(
            "memfit calibrate: wrote {}; use it as: memfit run --budget {} --profiles {} -- <your command>",
            path.display(),
            h(host_limit.budget).replace(' ', ""),
            path.display()
        );
    }
    check_fits(&report, maxes, host_limit, gpu_limit)
}

/// Exit 3 when a budget allows no batch at all, with the shortfall.
fn check_fits(
    r: &Report,
    (host, gpu): (MaxBatch, Option<MaxBatch>),
    host_limit: Limit,
    gpu_limit: Option<Limit>,
) -> Outcome {
    let budgets = [(Some(host), Some(r.host), Some(host_limit), "host")];
    let gpu_row = [(gpu, r.gpu, gpu_limit, "GPU")];
    for (max, line, limit, what) in budgets.into_iter().chain(gpu_row) {
        if let (Some(MaxBatch::NoneFits { shortfall }), Some(line), Some(limit)) =
            (max, line, limit)
        {
            let fixed = line.fixed.max(0.0) as u64;
            let part = if fixed > limit.usable() {
                format!("its fixed part {} alone", h(fixed))
            } else {
                format!("batch 1 ({})", h(line.predict(1)))
            };
            return Err(does_not_fit(format!(
                "no micro-batch fits the {what} budget: {part} exceeds {} ({} less {:.0}% headroom) by {}",
                h(limit.usable()),
                h(limit.budget),
                limit.headroom * 100.0,
                h(shortfall)
            )));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes profiles.toml when a flag takes the batch and some batch fits every budget.
fn write_profiles(
    s: &Setup,
    r: &Report,
    (host, gpu): (MaxBatch, Option<MaxBatch>),
    host_limit: Limit,
) -> anyhow::Result<Option<PathBuf>> {
    let Some((path, flag)) = &s.profiles else {
        return Ok(None);
    };
    let Some(max) = cal::batch_that_fits(host, gpu) else {
        return Ok(None);
    };
    let smallest = r.points.first().map_or(1, |p| p.batch);
    let mut summary = vec![
        format!("command: {}", s.template.render(max).join(" ")),
        format!(
            "host: {} (budget {}, {:.0}% headroom)",
            line_text(&r.host),
            h(host_limit.budget),
            host_limit.headroom * 100.0
        ),
    ];
    if let Some(g) = &r.gpu {
        summary.push(format!("gpu: {}", line_text(g)));
    }
    let text = cal::profiles_toml(
        flag,
        &cal::profile_batches(max, smallest),
        &s.malloc,
        &summary,
    );
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(Some(path.clone()))
}

fn line_text(l: &Line) -> String {
    let fixed = if l.fixed < 0.0 {
        format!("-{}", h((-l.fixed) as u64))
    } else {
        h(l.fixed as u64)
    };
    format!(
        "peak = {fixed} + {} × batch",
        h(l.per_sample.max(0.0) as u64)
    )
}

/// What `--json` says on stderr about each fit: the host's, and the GPU's when measured.
fn linearity_lines(r: &cal::Report) -> String {
    let n = r.points.len();
    let mut out = format!("memfit calibrate: host: {}\n", linearity_text(&r.host, n));
    if let Some(g) = &r.gpu {
        out += &format!("memfit calibrate: gpu: {}\n", linearity_text(g, n));
    }
    out
}

fn linearity_text(l: &Line, points: usize) -> String {
    match (l.max_rel_residual, l.is_linear()) {
        (Some(r), Some(true)) => format!(
            "linear: largest residual {:.1}% over {points} points",
            r * 100.0
        ),
        (Some(r), _) if l.bent => format!(
            "NOT LINEAR: bent upward, the largest batch lies over {:.0}% above the line of the \
             smaller ones (a phase that barely grows with the batch, the optimizer step say, sets \
             their peak); the line is the one through the two largest batches, which the smaller \
             lie up to {:.1}% above; measure larger batches to confirm its slope",
            cal::LINEARITY_TOLERANCE * 100.0,
            r * 100.0
        ),
        (Some(r), _) => format!(
            "NOT LINEAR: a point is {:.1}% off the line (over {:.0}%); predictions beyond the measured batches are rough",
            r * 100.0,
            cal::LINEARITY_TOLERANCE * 100.0
        ),
        (None, _) => "two points: linearity not checked (give three --batches)".into(),
    }
}

fn max_text(m: MaxBatch, line: &Line, limit: Limit, what: &str) -> String {
    let usable = format!(
        "{what} budget {} less {:.0}% headroom = {}",
        h(limit.budget),
        limit.headroom * 100.0,
        h(limit.usable())
    );
    match m {
        MaxBatch::Batch(b) => format!(
            "{usable}: largest micro-batch {b} (predicted peak {})",
            h(line.predict(b))
        ),
        MaxBatch::NoneFits { shortfall } => {
            format!(
                "{usable}: no micro-batch fits (batch 1 is {} over)",
                h(shortfall)
            )
        }
        MaxBatch::Unbounded => {
            format!("{usable}: the peak does not grow with the batch over the measured range")
        }
    }
}

fn render(
    s: &Setup,
    r: &Report,
    host_limit: Limit,
    gpu_limit: Option<Limit>,
    (host_max, gpu_max): (MaxBatch, Option<MaxBatch>),
) -> String {
    let mut table = Table::new();
    table.set_header(vec![
        "batch",
        "peak host",
        "fit host",
        "peak GPU",
        "fit GPU",
    ]);
    for p in &r.points {
        let gpu_fit = r.gpu.map_or("-".into(), |g| h(g.predict(p.batch)));
        table.add_row(vec![
            p.batch.to_string(),
            h(p.peak_rss_bytes),
            h(r.host.predict(p.batch)),
            p.peak_gpu_bytes.map_or("-".into(), h),
            gpu_fit,
        ]);
    }
    let steps = s
        .template
        .steps()
        .map_or(String::new(), |n| format!(", {n} steps each"));
    let mut out = format!(
        "memfit calibrate: {} trials{steps}\n{table}\nhost: {} ({})\n",
        r.points.len(),
        line_text(&r.host),
        linearity_text(&r.host, r.points.len())
    );
    match &r.gpu {
        Some(g) => {
            out += &format!(
                "gpu: {} ({})\n",
                line_text(g),
                linearity_text(g, r.points.len())
            )
        }
        None => out += "gpu: not measured (no NVML)\n",
    }
    out += &max_text(host_max, &r.host, host_limit, "host");
    out.push('\n');
    if let (Some(m), Some(g), Some(l)) = (gpu_max, &r.gpu, gpu_limit) {
        out += &max_text(m, g, l, "GPU");
        out.push('\n');
    }
    if let Some(at) = &r.at {
        let gpu = at
            .peak_gpu_bytes
            .map_or(String::new(), |g| format!(", GPU {}", h(g)));
        out += &format!(
            "at batch {}: predicted peak host {}{gpu}\n",
            at.batch,
            h(at.peak_rss_bytes)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GPU points of an H200 trial (docs/benchmarks.md): `--json` says the GPU line bent.
    #[test]
    fn json_mode_reports_the_gpu_fit_too() {
        let gib = |g: f64| (g * (1u64 << 30) as f64) as u64;
        let points: Vec<cal::Point> = [(1, 12.07), (2, 15.16), (4, 23.21)]
            .into_iter()
            .map(|(batch, g)| cal::Point {
                batch,
                peak_rss_bytes: gib(1.01),
                peak_gpu_bytes: Some(gib(g)),
            })
            .collect();
        let lines = cal::fit_points(&points).unwrap();
        let maxes = (lines.0.max_batch(u64::MAX), None);
        let text = linearity_lines(&cal::Report::new(points, lines, None, maxes));
        assert!(text.contains("host: linear"), "{text}");
        assert!(text.contains("gpu: NOT LINEAR: bent upward"), "{text}");
    }
}
