//! `memfit report RUN_DIR [--guard TIMELINE.jsonl]`: loss, learning rate and memory over the steps of
//! a run (its `metrics.jsonl`, against the budget in its `config.toml`), its evaluations (validation
//! loss and scores from `events.jsonl`), and a `memfit run` guard timeline (job memory and its limit
//! over time), drawn to `report.svg` and `report.png`.
//!
//! [`panels`] decides what each chart shows (series, units, axis ranges); [`chart`] draws them with
//! plotters; this module reads the files and prints what it wrote.

mod chart;
mod panels;

use crate::exit::{Outcome, bad_input};
use memfit_train::config::TrainConfig;
use memfit_train::run_lock::RunLock;
use panels::Panel;
use plotters::prelude::*;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// A run directory (with metrics.jsonl), or a guard timeline JSONL of `memfit run`.
    path: PathBuf,
    /// Also draw this `memfit run` guard timeline (JSONL).
    #[arg(long, value_name = "TIMELINE")]
    guard: Option<PathBuf>,
    /// Output path without extension (default: RUN_DIR/report, or beside the timeline).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the chart paths and ranges as one JSON object.
    #[arg(long)]
    json: bool,
}

fn read_jsonl(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(path).map_err(|e| bad_input(format!("{}: {e}", path.display())))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| {
                bad_input(format!("{}: line {}: not JSON: {e}", path.display(), i + 1))
            })
        })
        .collect()
}

/// The run's memory budget from its `config.toml`, or why there is none (the chart then has no budget
/// line; the reason is printed).
fn run_budget(run: &Path) -> Result<u64, String> {
    let path = run.join("config.toml");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let config = TrainConfig::from_toml(&text, &path).map_err(|e| e.to_string())?;
    config
        .memory_budget_bytes
        .ok_or_else(|| format!("{}: no memory_budget_bytes", path.display()))
}

/// The `eval` events of the run's `events.jsonl` (none without the file: a run that never evaluated).
fn run_evals(run: &Path) -> anyhow::Result<Vec<Value>> {
    let path = run.join("events.jsonl");
    if !path.is_file() {
        return Ok(Vec::new());
    }
    let is_eval = |e: &Value| e.get("kind").and_then(Value::as_str) == Some("eval");
    Ok(read_jsonl(&path)?.into_iter().filter(is_eval).collect())
}

/// What the report draws and where, before drawing.
struct Report {
    title: String,
    panels: Vec<Panel>,
    out: PathBuf,
    budget: Result<u64, String>,
}

fn collect(args: &Args) -> anyhow::Result<Report> {
    let mut panels = Vec::new();
    let mut guard = args.guard.clone();
    let mut budget = Err("no run directory".to_string());
    let default_out = if args.path.is_dir() {
        let metrics_path = args.path.join("metrics.jsonl");
        if !metrics_path.is_file() {
            return Err(bad_input(format!(
                "{}: no metrics.jsonl (not a memfit train run)",
                args.path.display()
            )));
        }
        budget = run_budget(&args.path);
        let metrics = read_jsonl(&metrics_path)?;
        let evals = run_evals(&args.path)?;
        panels.extend(panels::metrics_panels(
            &metrics,
            &evals,
            budget.clone().ok(),
        ));
        args.path.join("report")
    } else {
        // A guard timeline on its own.
        guard.get_or_insert_with(|| args.path.clone());
        args.path.with_extension("report")
    };
    if let Some(g) = &guard {
        let panel = panels::guard_panel(&read_jsonl(g)?);
        if panel.is_empty() {
            return Err(bad_input(format!(
                "{}: no `sample` records with t_s and job_bytes",
                g.display()
            )));
        }
        panels.push(panel);
    }
    let name = std::fs::canonicalize(&args.path).unwrap_or_else(|_| args.path.clone());
    Ok(Report {
        title: format!("memfit report: {}", name.display()),
        panels,
        out: args.out.clone().unwrap_or(default_out),
        budget,
    })
}

/// Each panel's axes and each series' first, last, minimum and maximum, for the terminal and `--json`.
fn summary(panels: &[Panel]) -> Vec<Value> {
    panels
        .iter()
        .map(|p| {
            let ranges = p.ranges();
            let series: Vec<Value> = p.series.iter().map(|s| {
                let ys = s.points.iter().map(|p| p.1).filter(|y| y.is_finite());
                json!({
                    "key": s.key, "label": s.label, "points": s.points.len(),
                    "first": ys.clone().next(), "last": ys.clone().next_back(),
                    "min": ys.clone().reduce(f64::min), "max": ys.reduce(f64::max),
                    "color": format!("#{:02x}{:02x}{:02x}", s.color.0, s.color.1, s.color.2),
                })
            }).collect();
            json!({
                "title": p.title, "x": p.x_label, "y": p.y_label, "unit": p.unit,
                "x_range": ranges.map(|r| [r.0.0, r.0.1]), "y_range": ranges.map(|r| [r.1.0, r.1.1]),
                "series": series,
            })
        })
        .collect()
}

fn print_summary(report: &Report, svg: &Path, png: &Path, panels: &[Value]) {
    println!("wrote {} and {}", svg.display(), png.display());
    if let Err(why) = &report.budget {
        println!("no budget line: {why}");
    }
    let f = |v: &Value| v.as_f64().map_or("-".into(), |v| format!("{v:.6}"));
    for p in panels {
        println!(
            "{} ({} over {})",
            p["title"].as_str().unwrap_or(""),
            p["y"],
            p["x"]
        );
        for s in p["series"].as_array().into_iter().flatten() {
            println!(
                "  {:<16} first {} last {} min {} max {}",
                s["label"].as_str().unwrap_or(""),
                f(&s["first"]),
                f(&s["last"]),
                f(&s["min"]),
                f(&s["max"])
            );
        }
    }
}

/// RGB pixels as a PNG file, written atomically (plotters' own PNG writer would build the `image`
/// crate and its decoders for this one call).
fn write_png(path: &Path, (width, height): (u32, u32), rgb: &[u8]) -> anyhow::Result<()> {
    let mut bytes = Vec::new();
    let mut encoder = png::Encoder::new(&mut bytes, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let encode = |e: png::EncodingError| anyhow::anyhow!("encoding {}: {e}", path.display());
    let mut writer = encoder.write_header().map_err(encode)?;
    writer.write_image_data(rgb).map_err(encode)?;
    writer.finish().map_err(encode)?;
    memfit_train::run_dir::write_atomic(path, &bytes)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))
}

/// The lock of the run directory the report is written into, if it is written into one: a trainer or
/// resume that owns the run refuses the report (exit 2), and the report keeps them out while it writes.
fn lock_if_writing_into_a_run(args: &Args, out: &Path) -> anyhow::Result<Option<RunLock>> {
    if !args.path.join("config.toml").is_file() {
        return Ok(None);
    }
    let run = std::fs::canonicalize(&args.path)?;
    let out_dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let inside = std::fs::canonicalize(out_dir).is_ok_and(|d| d.starts_with(&run));
    if !inside {
        return Ok(None);
    }
    // A live run is read without its lock: only writing into it waits for its owner.
    RunLock::acquire(&args.path).map(Some).map_err(|e| {
        bad_input(format!(
            "memfit report: {e}; a report of a live run can be written outside it: \
             memfit report {} --out FILE.svg",
            args.path.display()
        ))
    })
}

pub fn run(args: Args) -> Outcome {
    let report = collect(&args)?;
    let _lock = lock_if_writing_into_a_run(&args, &report.out)?;
    let (svg, png) = (
        report.out.with_extension("svg"),
        report.out.with_extension("png"),
    );
    let size = chart::size(report.panels.len());
    chart::draw(
        SVGBackend::new(&svg, size).into_drawing_area(),
        &report.title,
        &report.panels,
    )?;
    let mut pixels = vec![0u8; size.0 as usize * size.1 as usize * 3];
    chart::draw(
        BitMapBackend::with_buffer(&mut pixels, size).into_drawing_area(),
        &report.title,
        &report.panels,
    )?;
    write_png(&png, size, &pixels)?;
    let panels = summary(&report.panels);
    if args.json {
        let budget = report.budget.as_ref().ok();
        println!(
            "{}",
            json!({"svg": svg, "png": png, "width": size.0, "height": size.1,
                   "budget_bytes": budget, "panels": panels})
        );
    } else {
        print_summary(&report, &svg, &png, &panels);
    }
    Ok(ExitCode::SUCCESS)
}
