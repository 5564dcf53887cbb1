//! The fit: `peak = fixed + per_sample × batch` over the trials' points, its linearity check, and the
//! upward bend of a peak that is the larger of two phases.
//!
//! A training step's peak is the largest of its phases' peaks: the end of the forward pass grows with
//! the batch (activations), the optimizer step barely does (gradients, states and the step's
//! temporaries). At small batches the step can set the peak, so the peak follows a flat line first
//! and the activation line after: a convex, piecewise-linear curve. A least-squares line through
//! points on both pieces has the slope of neither and falls short beyond them (t5-small under
//! `bench_t5.py`, glibc's malloc pinned: 1465, 1518, 1819 MiB at batches 1, 2, 4, then 175 MiB per
//! sample from 4 to 16; docs/benchmarks.md). When the largest batch lies above the line through the
//! smaller ones by more than [`LINEARITY_TOLERANCE`], the fit is the line through the two largest
//! batches: on a convex curve the last secant is the closest to the slope beyond.

use serde::Serialize;
use serde::ser::SerializeStruct;

use super::{CalibrateError, LINEARITY_TOLERANCE, Point};

/// `peak = fixed + per_sample × batch`, with how well it matched the points it came from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Line {
    pub fixed: f64,
    pub per_sample: f64,
    /// The largest |measured − predicted| / measured over the points; `None` from two points (a line
    /// through two points has no residual, so nothing checked linearity).
    pub max_rel_residual: Option<f64>,
    /// The points bend upward (see the module doc): the line is the one through the two largest
    /// batches, and `max_rel_residual` says how far the smaller ones lie above it.
    pub bent: bool,
}

/// JSON: `{"fixed_bytes": i64, "per_sample_bytes": i64}` (whole bytes; the fixed part of a bent curve can
/// come out negative).
impl Serialize for Line {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Line", 2)?;
        st.serialize_field("fixed_bytes", &(self.fixed.round() as i64))?;
        st.serialize_field("per_sample_bytes", &(self.per_sample.round() as i64))?;
        st.end()
    }
}

/// The largest batch under a limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MaxBatch {
    Batch(u64),
    /// Not even batch 1 fits: it is predicted `shortfall` bytes over the limit.
    NoneFits {
        shortfall: u64,
    },
    /// The peak does not grow with the batch over the measured range: no bound can be predicted.
    Unbounded,
}

impl MaxBatch {
    /// JSON: the batch, 0 when none fits, null when unbounded.
    pub fn as_json(self) -> Option<u64> {
        match self {
            Self::Batch(b) => Some(b),
            Self::NoneFits { .. } => Some(0),
            Self::Unbounded => None,
        }
    }
}

impl Line {
    /// The line's value at `batch`, unrounded.
    fn value(&self, batch: u64) -> f64 {
        self.fixed + self.per_sample * batch as f64
    }

    /// The predicted peak at `batch`, in whole bytes (never below zero).
    pub fn predict(&self, batch: u64) -> u64 {
        (self.fixed + self.per_sample * batch as f64)
            .max(0.0)
            .ceil() as u64
    }

    /// `Some(false)` when a third point strays more than `LINEARITY_TOLERANCE` from the line, or
    /// the points bend upward.
    pub fn is_linear(&self) -> Option<bool> {
        self.max_rel_residual
            .map(|r| r <= LINEARITY_TOLERANCE && !self.bent)
    }

    /// The largest batch ≥ 1 whose predicted peak is at most `limit` bytes.
    pub fn max_batch(&self, limit: u64) -> MaxBatch {
        let first = self.predict(1);
        if first > limit {
            return MaxBatch::NoneFits {
                shortfall: first - limit,
            };
        }
        if self.per_sample <= 0.0 {
            return MaxBatch::Unbounded;
        }
        // Float rounding can put the floor one over the limit: step back until the prediction fits.
        let mut b = ((limit as f64 - self.fixed) / self.per_sample)
            .floor()
            .max(1.0) as u64;
        while b > 1 && self.predict(b) > limit {
            b -= 1;
        }
        MaxBatch::Batch(b)
    }
}

/// The line over `(batch, peak)` pairs, needs two different batches: least squares, or, when the
/// largest batch lies more than [`LINEARITY_TOLERANCE`] above the least-squares line of the smaller
/// ones (three or more batches), the line through the two largest batches.
pub fn fit(pairs: &[(u64, u64)]) -> Result<Line, CalibrateError> {
    let line = least_squares(pairs)?;
    let mut batches: Vec<u64> = pairs.iter().map(|p| p.0).collect();
    batches.sort_unstable();
    batches.dedup();
    if batches.len() < 3 {
        return Ok(line);
    }
    let (top, second) = (batches[batches.len() - 1], batches[batches.len() - 2]);
    let below: Vec<(u64, u64)> = pairs.iter().copied().filter(|p| p.0 < top).collect();
    let lower = least_squares(&below)?;
    let at_top: Vec<(u64, u64)> = pairs.iter().copied().filter(|p| p.0 == top).collect();
    let above = at_top
        .iter()
        .map(|&(x, y)| y as f64 / lower.value(x).max(1.0) - 1.0)
        .fold(f64::MIN, f64::max);
    if above <= LINEARITY_TOLERANCE {
        return Ok(line);
    }
    let last: Vec<(u64, u64)> = pairs.iter().copied().filter(|p| p.0 >= second).collect();
    let upper = least_squares(&last)?;
    Ok(Line {
        max_rel_residual: Some(max_residual(pairs, &upper)),
        bent: true,
        ..upper
    })
}

/// Least squares over `(batch, peak)` pairs; needs two different batches.
fn least_squares(pairs: &[(u64, u64)]) -> Result<Line, CalibrateError> {
    let batches: Vec<u64> = pairs.iter().map(|p| p.0).collect();
    let n = pairs.len() as f64;
    let mean = |f: &dyn Fn(&(u64, u64)) -> f64| pairs.iter().map(f).sum::<f64>() / n;
    let (xm, ym) = (mean(&|p| p.0 as f64), mean(&|p| p.1 as f64));
    let sxx: f64 = pairs.iter().map(|p| (p.0 as f64 - xm).powi(2)).sum();
    if pairs.len() < 2 || sxx == 0.0 {
        return Err(CalibrateError::TooFewPoints(batches));
    }
    let sxy: f64 = pairs
        .iter()
        .map(|p| (p.0 as f64 - xm) * (p.1 as f64 - ym))
        .sum();
    let per_sample = sxy / sxx;
    let mut line = Line {
        fixed: ym - per_sample * xm,
        per_sample,
        max_rel_residual: None,
        bent: false,
    };
    let distinct = {
        let mut b = batches;
        b.sort_unstable();
        b.dedup();
        b.len()
    };
    if distinct > 2 {
        line.max_rel_residual = Some(max_residual(pairs, &line));
    }
    Ok(line)
}

/// The largest |measured − predicted| / measured over the pairs.
fn max_residual(pairs: &[(u64, u64)], line: &Line) -> f64 {
    pairs
        .iter()
        .map(|&(x, y)| (y as f64 - line.value(x)).abs() / (y as f64).max(1.0))
        .fold(0.0, f64::max)
}

/// The host line, and the GPU line when every point has a GPU figure.
pub fn fit_points(points: &[Point]) -> Result<(Line, Option<Line>), CalibrateError> {
    let host: Vec<(u64, u64)> = points.iter().map(|p| (p.batch, p.peak_rss_bytes)).collect();
    let gpu: Option<Vec<(u64, u64)>> = points
        .iter()
        .map(|p| p.peak_gpu_bytes.map(|g| (p.batch, g)))
        .collect();
    Ok((fit(&host)?, gpu.map(|g| fit(&g)).transpose()?))
}
