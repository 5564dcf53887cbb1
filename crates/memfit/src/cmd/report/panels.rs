//! What `memfit report` draws, before any drawing: panels of named series built from a run's
//! `metrics.jsonl`, its evaluations (`eval` lines of `events.jsonl`) and budget, or from a `memfit run`
//! guard timeline, with each panel's axis ranges and units. chart.rs turns them into pixels.

use plotters::chart::SeriesLabelPosition;
use plotters::style::RGBColor;
use serde_json::Value;

const MIB: f64 = (1u64 << 20) as f64;
const GIB: f64 = (1u64 << 30) as f64;

/// How a line is drawn; the width is in pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stroke {
    Solid(u32),
    Dashed(u32),
    /// A solid line with a dot at each point: evaluations are few, and one alone is still seen.
    Dotted(u32),
}

/// One line of a panel. A NaN y separates segments (the guard's action marks).
pub struct Series {
    /// Stable name for `--json`: loss, valid_loss, lr, rss, peak_rss, budget, accuracy, macro_f1,
    /// bleu4, bleu4_standard, job, limit, actions.
    pub key: &'static str,
    /// The legend's text.
    pub label: String,
    pub points: Vec<(f64, f64)>,
    pub color: RGBColor,
    pub stroke: Stroke,
}

/// One chart. Its series are drawn in order, so the last one lies on top.
pub struct Panel {
    pub title: String,
    pub x_label: &'static str,
    pub y_label: String,
    /// The unit of the y values when they are memory (MiB or GiB), for `--json`.
    pub unit: Option<&'static str>,
    /// Memory and learning rate are shown from zero: a 1 MiB creep must not fill the panel.
    pub y_from_zero: bool,
    pub series: Vec<Series>,
}

pub const LOSS_RED: RGBColor = RGBColor(200, 40, 40);
pub const LR_BLUE: RGBColor = RGBColor(31, 90, 180);
pub const RSS_BLUE: RGBColor = RGBColor(20, 60, 160);
pub const PEAK_ORANGE: RGBColor = RGBColor(255, 170, 60);
pub const BUDGET_RED: RGBColor = RGBColor(210, 30, 30);
pub const ACTION_PURPLE: RGBColor = RGBColor(140, 60, 170);
pub const VALID_GREEN: RGBColor = RGBColor(20, 140, 70);

/// The scores of an evaluation the report draws (`eval` events carry them by these names), with
/// their legend and colour. Perplexity is left out: it is exp(valid loss), drawn already.
const SCORES: [(&str, &str, RGBColor); 4] = [
    ("accuracy", "accuracy", VALID_GREEN),
    ("macro_f1", "macro-F1", RGBColor(120, 70, 170)),
    ("bleu4", "BLEU-4 (seed's)", VALID_GREEN),
    (
        "bleu4_standard",
        "BLEU-4 (standard)",
        RGBColor(120, 70, 170),
    ),
];

/// The late part of training a second loss panel zooms into: the last half of the steps …
const LATE_SHARE: f64 = 0.5;
/// … drawn when the loss there spans less than this share of the whole run's loss axis (the fall of
/// the first steps flattens the rest into a line along the bottom).
const LATE_ZOOM_BELOW: f64 = 1.0 / 3.0;

fn column(rows: &[Value], x: &str, y: &str, scale: f64) -> Vec<(f64, f64)> {
    // Only finite points (a NaN y would split a line).
    rows.iter()
        .filter_map(|r| Some((r.get(x)?.as_f64()?, r.get(y)?.as_f64()? * scale)))
        .filter(|(a, b)| a.is_finite() && b.is_finite())
        .collect()
}

fn finite_ys(points: &[(f64, f64)]) -> impl Iterator<Item = f64> + '_ {
    points.iter().map(|p| p.1).filter(|y| y.is_finite())
}

fn max_y(points: &[(f64, f64)]) -> Option<f64> {
    finite_ys(points).fold(None, |m, y| Some(m.map_or(y, |m: f64| m.max(y))))
}

/// MiB below 2 GiB, else GiB: the unit and its size in bytes.
pub fn memory_unit(top_bytes: f64) -> (&'static str, f64) {
    if top_bytes < 2.0 * GIB {
        ("MiB", MIB)
    } else {
        ("GiB", GIB)
    }
}

/// `31.2 MiB` below 1 GiB, else `19.20 GiB`.
pub fn fmt_bytes(bytes: f64) -> String {
    if bytes < GIB {
        format!("{:.1} MiB", bytes / MIB)
    } else {
        format!("{:.2} GiB", bytes / GIB)
    }
}

/// A number for a title: 4 significant digits, scientific when small.
fn fmt_value(v: f64) -> String {
    if v != 0.0 && v.abs() < 0.01 {
        format!("{v:.1e}")
    } else {
        format!("{v:.4}")
    }
}

/// A peak RSS below this share of the budget is a line on the memory axis: a second memory panel
/// shows the run at its own scale (still from zero).
const ZOOM_BELOW_SHARE: f64 = 0.25;

/// Loss (training and validation), learning rate and memory over the optimizer steps of a run, in
/// that order; then, where they apply, memory at the run's own scale, the loss over the late part of
/// training, and the evaluations' scores. `evals` are the run's `eval` events (step, valid_loss and
/// scores by name).
pub fn metrics_panels(metrics: &[Value], evals: &[Value], budget_bytes: Option<u64>) -> Vec<Panel> {
    let mut panels = vec![
        loss_panel(metrics, evals),
        lr_panel(metrics),
        memory_panel(metrics, budget_bytes),
    ];
    let peak = peak_rss(metrics);
    if budget_bytes.is_some_and(|b| peak > 0.0 && peak < ZOOM_BELOW_SHARE * b as f64) {
        let mut own = memory_panel(metrics, None);
        own.title = format!(
            "Memory at the run's own scale: peak RSS {}",
            fmt_bytes(peak)
        );
        panels.push(own);
    }
    panels.extend(late_loss_panel(&panels[0]));
    panels.extend(scores_panel(evals));
    panels
}

fn peak_rss(metrics: &[Value]) -> f64 {
    let peak = max_y(&column(metrics, "step", "peak_rss_bytes", 1.0));
    peak.or(max_y(&column(metrics, "step", "rss_bytes", 1.0)))
        .unwrap_or(0.0)
}

/// `first → last` of a series' values, or nothing without points.
fn ends(points: &[(f64, f64)]) -> Option<String> {
    let (a, b) = (points.first()?, points.last()?);
    Some(format!("{} → {}", fmt_value(a.1), fmt_value(b.1)))
}

fn loss_panel(metrics: &[Value], evals: &[Value]) -> Panel {
    let points = column(metrics, "step", "loss", 1.0);
    let valid = column(evals, "step", "valid_loss", 1.0);
    let title = match (ends(&points), ends(&valid)) {
        (Some(t), Some(v)) => format!("Loss per optimizer step: training {t}, validation {v}"),
        (Some(t), None) => format!("Training loss per optimizer step: {t}"),
        _ => "Training loss per optimizer step".into(),
    };
    let mut series = vec![Series {
        key: "loss",
        label: "training loss".into(),
        points,
        color: LOSS_RED,
        // thin: a noisy loss of thousands of steps reads better 1 pixel wide
        stroke: Stroke::Solid(1),
    }];
    if !valid.is_empty() {
        series.push(Series {
            key: "valid_loss",
            label: "validation loss".into(),
            points: valid,
            color: VALID_GREEN,
            stroke: Stroke::Dotted(2),
        });
    }
    Panel {
        title,
        x_label: "optimizer step",
        y_label: "loss (cross-entropy)".into(),
        unit: None,
        y_from_zero: false,
        series,
    }
}

/// `loss` (the first panel) over the last [`LATE_SHARE`] of its steps, with its axis fitted to those
/// values, where they would be a flat line on the whole run's axis.
fn late_loss_panel(loss: &Panel) -> Option<Panel> {
    let ((x0, x1), (y0, y1)) = loss.ranges()?;
    let from = x1 - LATE_SHARE * (x1 - x0);
    let series: Vec<Series> = loss
        .series
        .iter()
        .map(|s| Series {
            points: s.points.iter().copied().filter(|p| p.0 >= from).collect(),
            label: s.label.clone(),
            ..*s
        })
        .collect();
    let late = Panel {
        series,
        title: String::new(),
        y_label: loss.y_label.clone(),
        ..*loss
    };
    let (_, (l0, l1)) = late.ranges()?;
    if l1 - l0 >= LATE_ZOOM_BELOW * (y1 - y0) {
        return None;
    }
    let train = &late.series[0].points;
    let ends = ends(train).map_or(String::new(), |e| format!(": training {e}"));
    Some(Panel {
        title: format!(
            "Loss over the last half of training (steps {:.0}–{:.0}){ends}",
            from.ceil(),
            x1
        ),
        ..late
    })
}

/// The evaluations' scores over the steps (0 to 1), where the run's evaluations carry any.
fn scores_panel(evals: &[Value]) -> Option<Panel> {
    let series: Vec<Series> = SCORES
        .iter()
        .map(|&(key, label, color)| Series {
            key,
            label: label.into(),
            points: column(evals, "step", key, 1.0),
            color,
            stroke: Stroke::Dotted(2),
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    let first = series.first()?;
    let ends = ends(&first.points).unwrap_or_default();
    Some(Panel {
        title: format!("Validation scores: {} {ends}", first.label),
        x_label: "optimizer step",
        y_label: "score".into(),
        unit: None,
        y_from_zero: true,
        series,
    })
}

fn lr_panel(metrics: &[Value]) -> Panel {
    let points = column(metrics, "step", "lr", 1.0);
    let peak = max_y(&points).map_or(String::new(), |p| format!(" (peak {})", fmt_value(p)));
    Panel {
        title: format!("Learning rate{peak}"),
        x_label: "optimizer step",
        y_label: "learning rate".into(),
        unit: None,
        y_from_zero: true,
        series: vec![Series {
            key: "lr",
            label: "learning rate".into(),
            points,
            color: LR_BLUE,
            stroke: Stroke::Solid(2),
        }],
    }
}

fn memory_panel(metrics: &[Value], budget_bytes: Option<u64>) -> Panel {
    let rss = column(metrics, "step", "rss_bytes", 1.0);
    let peak = column(metrics, "step", "peak_rss_bytes", 1.0);
    let peak_max = peak_rss(metrics);
    let budget = budget_bytes.map(|b| b as f64);
    let (unit, size) = memory_unit(peak_max.max(budget.unwrap_or(0.0)));
    let scale = |pts: Vec<(f64, f64)>| pts.into_iter().map(|(x, y)| (x, y / size)).collect();
    let of_budget = budget.map_or(String::new(), |b| {
        let share = 100.0 * peak_max / b;
        let decimals = usize::from(share < 10.0);
        format!(" of a {} budget ({share:.decimals$}%)", fmt_bytes(b))
    });
    let mut series = Vec::new();
    if let Some(b) = budget {
        series.push(budget_line(&rss, b / size, b));
    }
    series.push(Series {
        key: "peak_rss",
        label: "peak RSS".into(),
        points: scale(peak),
        color: PEAK_ORANGE,
        stroke: Stroke::Solid(6),
    });
    series.push(Series {
        key: "rss",
        label: "RSS".into(),
        points: scale(rss),
        color: RSS_BLUE,
        stroke: Stroke::Solid(2),
    });
    Panel {
        title: format!("Memory: peak RSS {}{of_budget}", fmt_bytes(peak_max)),
        x_label: "optimizer step",
        y_label: format!("resident memory ({unit})"),
        unit: Some(unit),
        y_from_zero: true,
        series,
    }
}

/// A horizontal dashed line at the budget over the x range of `along`.
fn budget_line(along: &[(f64, f64)], y: f64, bytes: f64) -> Series {
    let xs = along.iter().map(|p| p.0);
    let x0 = xs.clone().fold(f64::INFINITY, f64::min);
    let x1 = xs.fold(f64::NEG_INFINITY, f64::max);
    let points = if x0.is_finite() {
        vec![(x0, y), (x1.max(x0 + 1.0), y)]
    } else {
        Vec::new()
    };
    Series {
        key: "budget",
        label: format!("budget {}", fmt_bytes(bytes)),
        points,
        color: BUDGET_RED,
        stroke: Stroke::Dashed(2),
    }
}

/// docs/guard.md: records tagged by `type`; `sample` records carry `t_s`, `job_bytes`, `limit_bytes`;
/// `action` records (warn, graceful_stop, kill, …) carry `t_s`.
pub fn guard_panel(records: &[Value]) -> Panel {
    let of_type = |t: &str| -> Vec<Value> {
        records
            .iter()
            .filter(|r| r.get("type").and_then(Value::as_str) == Some(t))
            .cloned()
            .collect()
    };
    let samples = of_type("sample");
    let job = column(&samples, "t_s", "job_bytes", 1.0);
    let limit = column(&samples, "t_s", "limit_bytes", 1.0);
    let top = max_y(&job).unwrap_or(0.0).max(max_y(&limit).unwrap_or(0.0));
    let (unit, size) = memory_unit(top);
    let scale = |pts: Vec<(f64, f64)>| pts.into_iter().map(|(x, y)| (x, y / size)).collect();
    // Each action is a vertical mark from zero to the panel's top, NaN-separated.
    let action_records = of_type("action");
    let actions: Vec<(f64, f64)> = action_records
        .iter()
        .filter_map(|r| r.get("t_s")?.as_f64())
        .flat_map(|t| [(t, 0.0), (t, top / size), (t, f64::NAN)])
        .collect();
    let mut kinds: Vec<&str> = Vec::new();
    for kind in action_records
        .iter()
        .filter_map(|r| r.get("action")?.as_str())
    {
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    Panel {
        title: format!(
            "memfit run guard: job memory (peak {}) and its limit",
            fmt_bytes(max_y(&job).unwrap_or(0.0))
        ),
        x_label: "time since launch (s)",
        y_label: format!("anon + shmem + swap ({unit})"),
        unit: Some(unit),
        y_from_zero: true,
        series: vec![
            Series {
                key: "limit",
                label: "limit".into(),
                points: scale(limit),
                color: BUDGET_RED,
                stroke: Stroke::Dashed(2),
            },
            Series {
                key: "actions",
                label: format!("guard action: {}", kinds.join(", ")),
                points: actions,
                color: ACTION_PURPLE,
                stroke: Stroke::Solid(1),
            },
            Series {
                key: "job",
                label: "job memory".into(),
                points: scale(job),
                color: RSS_BLUE,
                stroke: Stroke::Solid(2),
            },
        ],
    }
}

impl Panel {
    pub fn is_empty(&self) -> bool {
        self.series.iter().all(|s| s.points.is_empty())
    }

    /// Where the legend hides no line: the first of upper right, lower right, middle right, upper
    /// left, lower left whose region (a third of the width, 30% of the height) no point falls in;
    /// upper right when none is free.
    pub fn legend_position(&self) -> SeriesLabelPosition {
        use SeriesLabelPosition::*;
        let Some(((x0, x1), (y0, y1))) = self.ranges() else {
            return UpperRight;
        };
        let points: Vec<(f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| &s.points)
            .filter(|p| p.1.is_finite())
            .map(|&(x, y)| ((x - x0) / (x1 - x0), (y - y0) / (y1 - y0)))
            .collect();
        let free = |right: bool, (lo, hi): (f64, f64)| {
            !points
                .iter()
                .any(|&(x, y)| (if right { x >= 0.66 } else { x <= 0.34 }) && y >= lo && y <= hi)
        };
        let (upper, middle, lower) = ((0.7, 1.0), (0.35, 0.65), (0.0, 0.3));
        [
            (UpperRight, true, upper),
            (LowerRight, true, lower),
            (MiddleRight, true, middle),
            (UpperLeft, false, upper),
            (LowerLeft, false, lower),
        ]
        .into_iter()
        .find(|(_, right, band)| free(*right, *band))
        .map_or(UpperRight, |(p, _, _)| p)
    }

    /// The x and y ranges the axes show: x over the points; y from zero (or just below the lowest point)
    /// to 8% above the highest, so a flat line stays visible. `None` without a finite point.
    pub fn ranges(&self) -> Option<((f64, f64), (f64, f64))> {
        let (x0, mut x1, mut y0, mut y1) = self
            .series
            .iter()
            .flat_map(|s| &s.points)
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .fold(None, |acc: Option<(f64, f64, f64, f64)>, &(x, y)| {
                let (a, b, c, d) = acc.unwrap_or((x, x, y, y));
                Some((a.min(x), b.max(x), c.min(y), d.max(y)))
            })?;
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        if self.y_from_zero {
            y0 = y0.min(0.0);
        }
        if y1 <= y0 {
            y1 = y0 + y0.abs().max(1e-9);
        }
        let pad = (y1 - y0) * 0.08;
        if !self.y_from_zero {
            // Padding below, but not below zero for values that are never negative.
            y0 = if y0 >= 0.0 {
                (y0 - pad).max(0.0)
            } else {
                y0 - pad
            };
        }
        Some(((x0, x1), (y0, y1 + pad)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A run whose RSS creeps by 1 MiB around 500 MiB: the axis must still start at zero.
    fn creeping_run() -> Vec<Value> {
        (1..=50u64)
            .map(|s| {
                let rss = 500 * (1u64 << 20) + s * (1 << 20) / 50;
                json!({"step": s, "loss": 5.0 / s as f64, "lr": 1e-3,
                       "rss_bytes": rss, "peak_rss_bytes": rss})
            })
            .collect()
    }

    fn memory(panels: &[Panel]) -> &Panel {
        panels.iter().find(|p| p.unit.is_some()).unwrap()
    }

    #[test]
    fn memory_axis_starts_at_zero_and_covers_the_budget() {
        let budget = 3u64 << 30;
        let panels = metrics_panels(&creeping_run(), &[], Some(budget));
        let mem = memory(&panels);
        assert_eq!(mem.unit, Some("GiB"));
        let (_, (y0, y1)) = mem.ranges().unwrap();
        assert_eq!(y0, 0.0);
        assert!(
            y1 >= 3.0,
            "the budget line (3 GiB) is inside the axis: top {y1}"
        );
        let line = mem.series.iter().find(|s| s.key == "budget").unwrap();
        assert_eq!(line.points, vec![(1.0, 3.0), (50.0, 3.0)]);
        assert_eq!(line.stroke, Stroke::Dashed(2));
        assert!(
            mem.title.contains("of a 3.00 GiB budget (16%)"),
            "{}",
            mem.title
        );
    }

    #[test]
    fn a_creep_of_one_mib_stays_a_sliver_of_the_axis() {
        let panels = metrics_panels(&creeping_run(), &[], None);
        let mem = memory(&panels);
        assert_eq!(mem.unit, Some("MiB"));
        let (_, (y0, y1)) = mem.ranges().unwrap();
        assert_eq!(y0, 0.0);
        // 1 MiB of creep over an axis of ~540 MiB: under 0.2% of its height.
        assert!(1.0 / (y1 - y0) < 0.002, "axis 0..{y1}");
        assert!(mem.series.iter().all(|s| s.key != "budget"));
    }

    #[test]
    fn legend_names_each_line_and_rss_is_drawn_last() {
        let panels = metrics_panels(&creeping_run(), &[], Some(1 << 30));
        let mem = memory(&panels);
        let labels: Vec<&str> = mem.series.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["budget 1.00 GiB", "peak RSS", "RSS"]);
        let (peak, rss) = (&mem.series[1], &mem.series[2]);
        assert_ne!(peak.color, rss.color);
        // The peak is a wide band under the thin RSS line: where they are equal both stay visible.
        assert!(matches!((peak.stroke, rss.stroke), (Stroke::Solid(p), Stroke::Solid(r)) if p > r));
    }

    #[test]
    fn loss_axis_follows_the_values_and_titles_carry_numbers() {
        let panels = metrics_panels(&creeping_run(), &[], None);
        let (_, (y0, _)) = panels[0].ranges().unwrap();
        assert_eq!(y0, 0.0, "loss 5.0 → 0.1: padding stops at zero");
        let flat: Vec<Value> = (1..=3)
            .map(|s| json!({"step": s, "loss": 2.31 - 0.01 * s as f64}))
            .collect();
        let (_, (y0, y1)) = loss_panel(&flat, &[]).ranges().unwrap();
        assert!(
            y0 > 2.2 && y1 < 2.4,
            "a small change fills the loss axis: {y0}..{y1}"
        );
        assert_eq!(
            panels[0].title,
            "Training loss per optimizer step: 5.0000 → 0.1000"
        );
        assert_eq!(panels[1].title, "Learning rate (peak 1.0e-3)");
        assert_eq!(panels[1].ranges().unwrap().1.0, 0.0);
    }

    #[test]
    fn far_below_the_budget_a_second_panel_shows_the_run_from_zero() {
        let memory_panels = |panels: &[Panel]| panels.iter().filter(|p| p.unit.is_some()).count();
        let panels = metrics_panels(&creeping_run(), &[], Some(16 << 30));
        assert_eq!(memory_panels(&panels), 2);
        let own = &panels[3];
        assert!(
            own.title
                .starts_with("Memory at the run's own scale: peak RSS 501.0 MiB")
        );
        assert!(own.series.iter().all(|s| s.key != "budget"));
        assert_eq!(own.ranges().unwrap().1.0, 0.0);
        // Within a quarter of the budget one memory panel says it all.
        let panels = metrics_panels(&creeping_run(), &[], Some(1 << 30));
        assert_eq!(memory_panels(&panels), 1);
    }

    #[test]
    fn the_legend_goes_where_no_line_is() {
        let panels = metrics_panels(&creeping_run(), &[], Some(16 << 30));
        // Budget line along the top, RSS along the bottom: the middle right is free.
        assert_eq!(
            panels[2].legend_position(),
            SeriesLabelPosition::MiddleRight
        );
        // At its own scale the RSS runs along the top: the lower right is free.
        assert_eq!(panels[3].legend_position(), SeriesLabelPosition::LowerRight);
    }

    /// Evaluations every 10 steps of [`creeping_run`]: validation loss and classification scores.
    fn evals() -> Vec<Value> {
        (1..=5u64)
            .map(|i| {
                json!({"kind": "eval", "step": 10 * i, "valid_loss": 1.0 / i as f64,
                       "accuracy": 0.5 + 0.1 * i as f64, "macro_f1": 0.4 + 0.1 * i as f64,
                       "perplexity": (1.0 / i as f64).exp()})
            })
            .collect()
    }

    fn series<'a>(panel: &'a Panel, key: &str) -> &'a Series {
        panel.series.iter().find(|s| s.key == key).unwrap()
    }

    #[test]
    fn validation_loss_is_drawn_beside_the_training_loss() {
        let panels = metrics_panels(&creeping_run(), &evals(), None);
        let loss = &panels[0];
        let valid = series(loss, "valid_loss");
        assert_eq!(valid.points[0], (10.0, 1.0));
        assert_eq!(valid.points[4], (50.0, 0.2));
        assert_eq!(valid.stroke, Stroke::Dotted(2));
        assert_eq!(
            loss.title,
            "Loss per optimizer step: training 5.0000 → 0.1000, validation 1.0000 → 0.2000"
        );
        // Without evaluations the panel is what it was: the training loss alone.
        let plain = metrics_panels(&creeping_run(), &[], None);
        assert_eq!(plain[0].series.len(), 1);
    }

    #[test]
    fn scores_get_their_own_panel_from_zero() {
        let panels = metrics_panels(&creeping_run(), &evals(), None);
        let scores = panels.last().unwrap();
        let keys: Vec<&str> = scores.series.iter().map(|s| s.key).collect();
        assert_eq!(
            keys,
            ["accuracy", "macro_f1"],
            "perplexity is not a score drawn"
        );
        assert_eq!(series(scores, "accuracy").points.len(), 5);
        assert!((series(scores, "macro_f1").points[4].1 - 0.9).abs() < 1e-12);
        assert_eq!(scores.ranges().unwrap().1.0, 0.0);
        assert_eq!(scores.title, "Validation scores: accuracy 0.6000 → 1.0000");
        let bleu = [
            json!({"kind": "eval", "step": 3, "valid_loss": 2.0, "bleu4": 0.25,
                            "bleu4_standard": 0.2}),
        ];
        let seq2seq = metrics_panels(&creeping_run(), &bleu, None);
        let labels: Vec<&str> = seq2seq
            .last()
            .unwrap()
            .series
            .iter()
            .map(|s| s.label.as_str())
            .collect();
        assert_eq!(labels, ["BLEU-4 (seed's)", "BLEU-4 (standard)"]);
        // No scores, no panel.
        let only_loss = [json!({"kind": "eval", "step": 3, "valid_loss": 2.0})];
        let panels = metrics_panels(&creeping_run(), &only_loss, None);
        assert!(panels.iter().all(|p| p.y_label != "score"));
    }

    #[test]
    fn a_flattened_loss_gets_a_panel_at_the_scale_of_its_last_half() {
        let panels = metrics_panels(&creeping_run(), &evals(), None);
        let late = panels
            .iter()
            .find(|p| p.title.starts_with("Loss over the last half"))
            .unwrap();
        assert_eq!(
            late.title,
            "Loss over the last half of training (steps 26–50): training 0.1923 → 0.1000"
        );
        let ((x0, _), (y0, y1)) = late.ranges().unwrap();
        assert!(x0 >= 25.5, "x from the middle of the run: {x0}");
        // Training 0.19 → 0.10 and validation 0.33, 0.25, 0.2 fill the axis; the whole run's went to 5.
        assert!(y0 > 0.05 && y1 < 0.4, "{y0}..{y1}");
        assert_eq!(series(late, "valid_loss").points.len(), 3);
        // A loss that falls evenly to the end reads on the whole run's axis: no second panel.
        let linear: Vec<Value> = (1..=50u64)
            .map(|s| json!({"step": s, "loss": 5.0 - 0.1 * s as f64}))
            .collect();
        let panels = metrics_panels(&linear, &[], None);
        assert!(
            panels
                .iter()
                .all(|p| !p.title.starts_with("Loss over the last half"))
        );
    }

    #[test]
    fn guard_panel_marks_actions_up_to_the_limit() {
        let records = vec![
            json!({"type": "sample", "t_s": 0.0, "job_bytes": 1u64 << 30, "limit_bytes": 4u64 << 30}),
            json!({"type": "sample", "t_s": 2.0, "job_bytes": 3u64 << 30, "limit_bytes": 4u64 << 30}),
            json!({"type": "action", "t_s": 1.5, "action": "warn"}),
        ];
        let panel = guard_panel(&records);
        assert_eq!(panel.unit, Some("GiB"));
        let actions = panel.series.iter().find(|s| s.key == "actions").unwrap();
        assert_eq!(actions.points[..2], [(1.5, 0.0), (1.5, 4.0)]);
        assert_eq!(actions.label, "guard action: warn");
        assert_eq!(panel.ranges().unwrap().1.0, 0.0);
        assert_eq!(panel.series.last().unwrap().key, "job");
    }

    #[test]
    fn byte_sizes_read_in_the_unit_that_fits() {
        assert_eq!(fmt_bytes(31.25 * MIB), "31.2 MiB");
        assert_eq!(fmt_bytes(19.2 * GIB), "19.20 GiB");
        assert_eq!(fmt_bytes(GIB), "1.00 GiB");
        assert_eq!(memory_unit(1.9 * GIB).0, "MiB");
        assert_eq!(memory_unit(2.0 * GIB).0, "GiB");
    }
}
