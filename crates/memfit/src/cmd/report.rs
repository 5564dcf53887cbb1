//! `memfit report RUN_DIR [--guard TIMELINE.jsonl]`: loss, learning rate and memory over the steps of
//! a run (its `metrics.jsonl`), and a `memfit run` guard timeline (job memory and its limit over time),
//! drawn to `report.svg` and `report.png` with plotters.
//!
//! plotters is built without its font backend (it needs fontconfig/freetype C libraries), so the charts
//! carry no text: each panel is a line chart with a light frame, panels stacked in a fixed order
//! (loss, learning rate, RSS, guard), and the ranges are printed to the terminal (and `--json`).

use crate::exit::{Outcome, bad_input};
use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;
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

/// One line of a panel: points and a colour.
struct Series {
    name: &'static str,
    points: Vec<(f64, f64)>,
    color: RGBColor,
}

/// One chart: its x axis name and its lines.
struct Panel {
    title: &'static str,
    x: &'static str,
    series: Vec<Series>,
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

fn column(rows: &[Value], x: &str, y: &str, scale: f64) -> Vec<(f64, f64)> {
    // Only finite points (a NaN y would split a line).
    rows.iter()
        .filter_map(|r| Some((r.get(x)?.as_f64()?, r.get(y)?.as_f64()? * scale)))
        .filter(|(a, b)| a.is_finite() && b.is_finite())
        .collect()
}

const GIB: f64 = (1u64 << 30) as f64;

fn metrics_panels(metrics: &[Value]) -> Vec<Panel> {
    vec![
        Panel {
            title: "loss",
            x: "step",
            series: vec![Series {
                name: "loss",
                points: column(metrics, "step", "loss", 1.0),
                color: RED,
            }],
        },
        Panel {
            title: "learning rate",
            x: "step",
            series: vec![Series {
                name: "lr",
                points: column(metrics, "step", "lr", 1.0),
                color: BLUE,
            }],
        },
        Panel {
            title: "memory (GiB)",
            x: "step",
            series: vec![
                Series {
                    name: "rss",
                    points: column(metrics, "step", "rss_bytes", 1.0 / GIB),
                    color: GREEN,
                },
                Series {
                    name: "peak rss",
                    points: column(metrics, "step", "peak_rss_bytes", 1.0 / GIB),
                    color: BLACK,
                },
            ],
        },
    ]
}

/// docs/guard.md: records tagged by `type`; `sample` records carry `t_s`, `job_bytes`, `limit_bytes`.
fn guard_panel(records: &[Value]) -> Panel {
    let samples: Vec<Value> = records
        .iter()
        .filter(|r| r.get("type").and_then(Value::as_str) == Some("sample"))
        .cloned()
        .collect();
    let job = column(&samples, "t_s", "job_bytes", 1.0 / GIB);
    // Guard actions (warn, graceful_stop, kill, …) as vertical orange marks spanning the job's range.
    let top = job.iter().map(|p| p.1).fold(0.0, f64::max);
    let actions: Vec<(f64, f64)> = records
        .iter()
        .filter(|r| r.get("type").and_then(Value::as_str) == Some("action"))
        .filter_map(|r| r.get("t_s")?.as_f64())
        .flat_map(|t| [(t, 0.0), (t, top), (t, f64::NAN)])
        .collect();
    Panel {
        title: "guard: job memory and limit (GiB) over seconds",
        x: "t_s",
        series: vec![
            Series {
                name: "job",
                points: job,
                color: MAGENTA,
            },
            Series {
                name: "limit",
                points: column(&samples, "t_s", "limit_bytes", 1.0 / GIB),
                color: BLACK,
            },
            Series {
                name: "actions",
                points: actions,
                color: RGBColor(255, 140, 0),
            },
        ],
    }
}

fn bounds(panel: &Panel) -> Option<((f64, f64), (f64, f64))> {
    let pts = panel.series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    let mut any = false;
    for &(x, y) in pts.filter(|p| p.0.is_finite() && p.1.is_finite()) {
        any = true;
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if !any {
        return None;
    }
    // A flat series still gets a visible range.
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + y0.abs().max(1e-9);
    }
    let pad = (y1 - y0) * 0.05;
    Some(((x0, x1), (y0 - pad, y1 + pad)))
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, panels: &[Panel]) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)
        .map_err(|e| anyhow::anyhow!("drawing: {e}"))?;
    let areas = root.split_evenly((panels.len(), 1));
    for (panel, area) in panels.iter().zip(areas) {
        let area = area.margin(12, 12, 16, 16);
        let Some(((x0, x1), (y0, y1))) = bounds(panel) else {
            continue;
        };
        let mut chart = ChartBuilder::on(&area)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(|e| anyhow::anyhow!("drawing: {e}"))?;
        // Grid lines without labels (no font backend): 10 divisions per axis.
        chart
            .configure_mesh()
            .x_labels(10)
            .y_labels(6)
            .x_label_formatter(&|_| String::new())
            .y_label_formatter(&|_| String::new())
            .light_line_style(WHITE)
            .bold_line_style(RGBColor(225, 225, 225))
            .axis_style(RGBColor(120, 120, 120))
            .draw()
            .map_err(|e| anyhow::anyhow!("drawing: {e}"))?;
        for s in &panel.series {
            // A NaN point separates segments (the action marks).
            for segment in s.points.split(|p| !p.1.is_finite()) {
                chart
                    .draw_series(LineSeries::new(
                        segment.iter().copied(),
                        s.color.stroke_width(2),
                    ))
                    .map_err(|e| anyhow::anyhow!("drawing: {e}"))?;
            }
        }
    }
    root.present()
        .map_err(|e| anyhow::anyhow!("writing the chart: {e}"))?;
    Ok(())
}

pub fn run(args: Args) -> Outcome {
    let mut panels = Vec::new();
    let mut guard = args.guard.clone();
    let default_out = if args.path.is_dir() {
        let metrics_path = args.path.join("metrics.jsonl");
        if !metrics_path.is_file() {
            return Err(bad_input(format!(
                "{}: no metrics.jsonl (not a memfit train run)",
                args.path.display()
            )));
        }
        panels.extend(metrics_panels(&read_jsonl(&metrics_path)?));
        args.path.join("report")
    } else {
        // A guard timeline on its own.
        guard.get_or_insert_with(|| args.path.clone());
        args.path.with_extension("report")
    };
    if let Some(g) = &guard {
        let records = read_jsonl(g)?;
        let panel = guard_panel(&records);
        if panel.series.iter().all(|s| s.points.is_empty()) {
            return Err(bad_input(format!(
                "{}: no `sample` records with t_s and job_bytes",
                g.display()
            )));
        }
        panels.push(panel);
    }
    let out = args.out.clone().unwrap_or(default_out);
    let (svg, png) = (out.with_extension("svg"), out.with_extension("png"));
    let height = 260 * panels.len() as u32;
    draw(
        SVGBackend::new(&svg, (900, height)).into_drawing_area(),
        &panels,
    )?;
    draw(
        BitMapBackend::new(&png, (900, height)).into_drawing_area(),
        &panels,
    )?;

    let ranges: Vec<Value> = panels
        .iter()
        .flat_map(|p| {
            p.series.iter().map(move |s| {
                let ys = s.points.iter().map(|p| p.1).filter(|y| y.is_finite());
                serde_json::json!({
                    "panel": p.title, "series": s.name, "x": p.x, "points": s.points.len(),
                    "first": s.points.iter().map(|p| p.1).find(|y| y.is_finite()),
                    "last": s.points.iter().map(|p| p.1).rfind(|y| y.is_finite()),
                    "min": ys.clone().fold(None, |m: Option<f64>, y| Some(m.map_or(y, |m| m.min(y)))),
                    "max": ys.fold(None, |m: Option<f64>, y| Some(m.map_or(y, |m| m.max(y)))),
                    "color": format!("#{:02x}{:02x}{:02x}", s.color.0, s.color.1, s.color.2),
                })
            })
        })
        .collect();
    if args.json {
        println!(
            "{}",
            serde_json::json!({"svg": svg, "png": png, "series": ranges})
        );
    } else {
        println!("wrote {} and {}", svg.display(), png.display());
        println!(
            "panels, top to bottom (no text in the charts: plotters has no font backend here):"
        );
        for r in &ranges {
            let f = |k: &str| r[k].as_f64().map_or("-".into(), |v| format!("{v:.6}"));
            println!(
                "  {:<45} {:<9} {} over {}: first {} last {} min {} max {}",
                r["panel"].as_str().unwrap_or(""),
                r["series"].as_str().unwrap_or(""),
                r["color"].as_str().unwrap_or(""),
                r["x"].as_str().unwrap_or(""),
                f("first"),
                f("last"),
                f("min"),
                f("max")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
