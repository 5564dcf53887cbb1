//! Drawing report panels with plotters, one below the other under a title: each with its caption,
//! axes with tick numbers and descriptions, grid lines, its lines (dashed where the series says so) and,
//! with more than one line, a legend. PNG text comes from the DejaVu Sans subset the binary embeds
//! (`assets/`, plotters' ab_glyph feature); the SVG names the sans-serif family and lets the viewer draw it.

use super::panels::{Panel, Series, Stroke};
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use std::sync::OnceLock;

/// DejaVu Sans cut to the characters charts print (assets/FONT-LICENSE.txt says how and its licence).
static FONT: &[u8] = include_bytes!("../../../assets/DejaVuSans-subset.ttf");

pub const WIDTH: u32 = 1000;
const PANEL_HEIGHT: u32 = 320;
const TITLE_HEIGHT: u32 = 44;
const FONT_FAMILY: &str = "sans-serif";

/// The picture's size for `panels` panels.
pub fn size(panels: usize) -> (u32, u32) {
    (WIDTH, TITLE_HEIGHT + PANEL_HEIGHT * panels as u32)
}

/// Registers the embedded font as plotters' sans-serif family (once per process).
fn register_font() -> anyhow::Result<()> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font(FONT_FAMILY, FontStyle::Normal, FONT).is_ok()
    });
    anyhow::ensure!(
        ok,
        "the embedded chart font (DejaVuSans-subset.ttf) did not load"
    );
    Ok(())
}

fn drawing<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("drawing the chart: {e}")
}

/// Draws `title` and the panels onto `root` and writes it out.
pub fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    panels: &[Panel],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    register_font()?;
    root.fill(&WHITE).map_err(drawing)?;
    let (head, body) = root.split_vertically(TITLE_HEIGHT);
    head.draw(&Text::new(
        title.to_string(),
        (16, 12),
        (FONT_FAMILY, 22).into_font().color(&BLACK),
    ))
    .map_err(drawing)?;
    for (panel, area) in panels.iter().zip(body.split_evenly((panels.len(), 1))) {
        draw_panel(&area, panel)?;
    }
    root.present()
        .map_err(|e| anyhow::anyhow!("writing the chart: {e}"))
}

type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &Panel,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let Some(((x0, x1), (y0, y1))) = panel.ranges() else {
        return Ok(());
    };
    let mut chart = ChartBuilder::on(&area.margin(4, 8, 12, 24))
        .caption(&panel.title, (FONT_FAMILY, 18))
        .x_label_area_size(44)
        .y_label_area_size(80)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(drawing)?;
    let (fx, fy) = (tick_format(x0, x1), tick_format(y0, y1));
    chart
        .configure_mesh()
        .x_desc(panel.x_label)
        .y_desc(&panel.y_label)
        .x_labels(10)
        .y_labels(6)
        .x_label_formatter(&fx)
        .y_label_formatter(&fy)
        .label_style((FONT_FAMILY, 14))
        .axis_desc_style((FONT_FAMILY, 15))
        .light_line_style(RGBColor(244, 244, 244))
        .bold_line_style(RGBColor(222, 222, 222))
        .axis_style(RGBColor(90, 90, 90))
        .draw()
        .map_err(drawing)?;
    for s in &panel.series {
        draw_series(&mut chart, s)?;
    }
    if panel.series.len() > 1 {
        chart
            .configure_series_labels()
            .position(panel.legend_position())
            .label_font((FONT_FAMILY, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .draw()
            .map_err(drawing)?;
    }
    Ok(())
}

/// One series, split at NaN points; the first segment carries the legend entry.
fn draw_series<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    s: &Series,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let (width, dashed) = match s.stroke {
        Stroke::Solid(w) | Stroke::Dotted(w) => (w, false),
        Stroke::Dashed(w) => (w, true),
    };
    let style = s.color.stroke_width(width);
    let segments = s
        .points
        .split(|p| !p.1.is_finite())
        .filter(|g| !g.is_empty());
    let runs: Vec<_> = segments
        .flat_map(|segment| strokes(chart, segment, width))
        .collect();
    if let Stroke::Dotted(w) = s.stroke {
        let dots = s.points.iter().filter(|p| p.1.is_finite());
        chart
            .draw_series(dots.map(|&p| Circle::new(p, w + 2, s.color.filled())))
            .map_err(drawing)?;
    }
    for (i, pts) in runs.into_iter().enumerate() {
        let drawn = if dashed {
            chart.draw_series(DashedLineSeries::new(pts, 10, 6, style))
        } else {
            chart.draw_series(LineSeries::new(pts, style))
        }
        .map_err(drawing)?;
        if i == 0 {
            drawn.label(s.label.as_str()).legend(move |(x, y)| {
                let dash = if dashed { 8 } else { 20 };
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (dash, 0)], style)
                    + PathElement::new(vec![(20 - dash, 0), (20, 0)], style)
            });
        }
    }
    Ok(())
}

/// `points` as the runs of a line `width` pixels wide. plotters widens a path by joining its
/// segments' offset edges; where the path turns back by more than a right angle (a drop to a
/// lower value and a one-pixel rise in the same column, as RSS does after a resume), the inner
/// edges meet far from the line and the PNG showed a spike up the whole panel. So a wide line is
/// split there into runs that start at the turning point; a 1-pixel line is drawn segment by
/// segment and needs no split.
fn strokes<DB: DrawingBackend>(
    chart: &Chart<'_, DB>,
    points: &[(f64, f64)],
    width: u32,
) -> Vec<Vec<(f64, f64)>> {
    let mut runs = vec![Vec::new()];
    let mut last: Option<((i32, i32), (i32, i32))> = None; // pixel and direction into it
    for &p in points {
        let pixel = chart.backend_coord(&p);
        let Some((at, into)) = last else {
            last = Some((pixel, (0, 0)));
            runs[0].push(p);
            continue;
        };
        if pixel == at {
            continue;
        }
        let out = (pixel.0 - at.0, pixel.1 - at.1);
        let turns_back = into.0 * out.0 + into.1 * out.1 < 0;
        let run = runs.last_mut().expect("runs starts with one");
        if width > 1 && turns_back {
            let start = *run.last().expect("a run holds the turning point");
            runs.push(vec![start, p]);
        } else {
            run.push(p);
        }
        last = Some((pixel, out));
    }
    runs
}

/// Tick labels with as many decimals as the axis' span needs (about 6 ticks), scientific for small
/// values such as learning rates.
fn tick_format(lo: f64, hi: f64) -> impl Fn(&f64) -> String {
    let step = (hi - lo).abs() / 6.0;
    let scientific = hi.abs().max(lo.abs()) < 0.01;
    let decimals = if step > 0.0 {
        (-step.log10().floor()).clamp(0.0, 6.0) as usize
    } else {
        0
    };
    move |v: &f64| {
        if *v == 0.0 {
            "0".into()
        } else if scientific {
            format!("{v:.1e}")
        } else {
            format!("{v:.decimals$}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::report::panels::{PEAK_ORANGE, RSS_BLUE, metrics_panels};
    use serde_json::json;

    #[test]
    fn tick_labels_fit_the_axis_span() {
        assert_eq!(tick_format(0.0, 3000.0)(&1500.0), "1500");
        assert_eq!(tick_format(0.0, 1.2)(&0.4), "0.4");
        assert_eq!(tick_format(0.0, 0.12)(&0.04), "0.04");
        assert_eq!(tick_format(0.0, 0.003)(&0.0015), "1.5e-3");
        assert_eq!(tick_format(0.0, 0.003)(&0.0), "0");
    }

    /// Renders a run whose RSS equals its peak at every step (the case that used to hide RSS).
    fn rendered() -> (u32, u32, Vec<u8>) {
        let rows: Vec<_> = (1..=40u64)
            .map(|s| {
                let b = (200 + s) << 20;
                json!({"step": s, "loss": 3.0 / s as f64, "lr": 1e-3, "rss_bytes": b, "peak_rss_bytes": b})
            })
            .collect();
        let panels = metrics_panels(&rows, &[], Some(512 << 20));
        let (w, h) = size(panels.len());
        let mut pixels = vec![0u8; (w * h * 3) as usize];
        let root = BitMapBackend::with_buffer(&mut pixels, (w, h)).into_drawing_area();
        draw(root, "memfit report: test", &panels).unwrap();
        (w, h, pixels)
    }

    fn count(pixels: &[u8], c: RGBColor) -> usize {
        pixels.chunks(3).filter(|p| *p == [c.0, c.1, c.2]).count()
    }

    #[test]
    fn rss_and_its_peak_both_show_where_they_are_equal() {
        let (_, _, pixels) = rendered();
        // The thin RSS line lies on the wide peak band: both colours are on the picture.
        assert!(count(&pixels, RSS_BLUE) > 200, "RSS line drawn");
        assert!(
            count(&pixels, PEAK_ORANGE) > 400,
            "peak band visible beside it"
        );
    }

    #[test]
    fn the_picture_carries_text() {
        let (w, h, pixels) = rendered();
        // loss, lr, memory and the late loss (3/s flattens): four panels.
        assert_eq!((w, h), (1000, 44 + 4 * 320));
        // The title row (above the first panel) holds dark glyph pixels only if the font drew text.
        let title_dark = pixels[..(w * 44 * 3) as usize]
            .chunks(3)
            .filter(|p| p.iter().all(|&c| c < 100))
            .count();
        assert!(
            title_dark > 300,
            "title text drawn: {title_dark} dark pixels"
        );
    }

    /// A wide line that drops, then rises a pixel in the same column (RSS after a resume), is
    /// drawn in two runs meeting at the turn, and nothing of it leaves the band of its values;
    /// drawn whole, the turn's inner edges met far above it.
    #[test]
    fn a_wide_line_turning_back_draws_no_spike() {
        let (w, h) = (200u32, 200u32);
        let series = [
            (10.0, 40.0),
            (100.0, 40.0),
            (101.0, 150.0),
            (101.3, 148.0),
            (190.0, 148.0),
        ];
        let mut pixels = vec![255u8; (w * h * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut pixels, (w, h)).into_drawing_area();
            let mut chart = ChartBuilder::on(&root)
                .build_cartesian_2d(0.0..200.0, 0.0..200.0)
                .unwrap();
            let runs = strokes(&chart, &series, 6);
            assert_eq!(runs.len(), 2, "{runs:?}");
            assert_eq!(
                runs[1][0],
                (101.0, 150.0),
                "the second run starts at the turn"
            );
            assert_eq!(
                strokes(&chart, &series, 1).len(),
                1,
                "a thin line is not split"
            );
            let style = PEAK_ORANGE.stroke_width(6);
            for run in runs {
                chart.draw_series(LineSeries::new(run, style)).unwrap();
            }
        }
        // values 40..150 lie on pixel rows 50..160 (y grows downwards); a half-width of margin
        let outside = pixels
            .chunks(3 * w as usize)
            .enumerate()
            .filter(|(row, _)| !(46..=164).contains(row))
            .map(|(_, line)| count(line, PEAK_ORANGE))
            .sum::<usize>();
        assert_eq!(outside, 0, "orange pixels outside the values' band");
    }
}
