//! The fit of memfit's host model ([`HostFit`]): half of the measured grid fits its four
//! constants, the other half is held out to test them.
//!
//! The split is fixed by the CSV: within each family (T5, BERT, decoder), in file order, the
//! first point fits, the second is held out, and so on ([`is_fit_point`]). [`fit`] searches round
//! values of the four constants ([`CANDIDATES`]) for the smallest largest |error| over the fit
//! half; the committed [`crate::memory::memfit_host::FITTED`] is what it finds (a test checks), and
//! only the held-out half stands as validation.

use super::{family, field, number, row_arch, row_setup};
use crate::memory::memfit_host::{self, HostFit};
use crate::memory::setup::Setup;
use crate::validation::{Record, parse_csv};

/// The round values searched, per constant: runtime RSS (MB), block scale, recomputed block's
/// retention, logits copies.
pub const CANDIDATES: ([u64; 11], [f64; 13], [f64; 11], [f64; 9]) = (
    [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100],
    [
        0.90, 0.95, 1.00, 1.05, 1.10, 1.15, 1.20, 1.25, 1.30, 1.35, 1.40, 1.45, 1.50,
    ],
    [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0],
    [1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0],
);

/// For each row of the grid (in file order): whether it belongs to the fit half — every other
/// point of its family, starting with the first.
pub fn is_fit_point(rows: &[Record]) -> Vec<bool> {
    let mut seen: Vec<(&str, usize)> = Vec::new();
    rows.iter()
        .map(|r| {
            let f = family(r);
            let n = match seen.iter_mut().find(|(g, _)| *g == f) {
                Some((_, n)) => {
                    *n += 1;
                    *n
                }
                None => {
                    seen.push((f, 0));
                    0
                }
            };
            n % 2 == 0
        })
        .collect()
}

/// A point prepared once: its architecture, setup and measured peak.
struct Prepared {
    arch: crate::arch::Arch,
    setup: Setup,
    measured: f64,
}

fn prepare(r: &Record) -> Result<Prepared, String> {
    let arch = row_arch(r)?;
    let setup = row_setup(r, &arch)?;
    let measured = number(r, "peak_rss_bytes")? as f64;
    if measured == 0.0 {
        return Err(format!("{}: peak_rss_bytes is 0", field(r, "id")));
    }
    // as `memory::estimate` runs it: the grid's rows use the default stack (no model view)
    Ok(Prepared {
        arch,
        setup,
        measured,
    })
}

fn worst(points: &[Prepared], fit: &HostFit) -> f64 {
    points
        .iter()
        .map(|p| {
            let predicted = memfit_host::host_with(&p.arch, &p.setup, fit).train_rss_bytes;
            ((predicted as f64 - p.measured) / p.measured).abs()
        })
        .fold(0.0, f64::max)
}

/// The constants among [`CANDIDATES`] with the smallest largest |error| over the fit half of
/// `text` (the grid CSV), and that error. Ties keep the first found (smaller values first).
pub fn fit(text: &str) -> Result<(HostFit, f64), String> {
    let rows = parse_csv(text)?;
    let fit_half = is_fit_point(&rows);
    let points: Vec<Prepared> = rows
        .iter()
        .zip(&fit_half)
        .filter(|(_, f)| **f)
        .map(|(r, _)| prepare(r))
        .collect::<Result<_, _>>()?;
    let (runtimes, scales, retained, copies) = CANDIDATES;
    let mut best: Option<(HostFit, f64)> = None;
    for &mb in &runtimes {
        for &block_scale in &scales {
            for &recompute_retained in &retained {
                for &logits_copies in &copies {
                    let candidate = HostFit {
                        runtime_rss: mb * 1_000_000,
                        block_scale,
                        recompute_retained,
                        logits_copies,
                    };
                    let e = worst(&points, &candidate);
                    if best.as_ref().is_none_or(|(_, b)| e < *b) {
                        best = Some((candidate, e));
                    }
                }
            }
        }
    }
    best.ok_or_else(|| "the grid has no fit points".to_string())
}
