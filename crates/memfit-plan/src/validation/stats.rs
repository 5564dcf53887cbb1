//! Error statistics of the compared rows: median, p90 and worst |error|, per mode and per
//! source, and the uncertainty bands derived from them (`memory::band`).

use super::Compared;
use crate::memory::band::{ANY, Band, MIN_ROWS};
use crate::memory::setup::Setup;

/// The band class of a setup (`memory::band::class_of`).
pub fn band_class(setup: &Setup) -> String {
    crate::memory::band::class_of(setup)
}

/// The q-quantile (nearest rank) of the rows' |error|; 0 for no rows.
pub fn abs_error_quantile(rows: &[&Compared], q: f64) -> f64 {
    quantile(rows.iter().map(|r| r.error.abs()).collect(), q)
}

/// The q-quantile (nearest rank) of `x`; 0 when empty.
fn quantile(mut x: Vec<f64>, q: f64) -> f64 {
    x.sort_by(f64::total_cmp);
    if x.is_empty() {
        return 0.0;
    }
    let rank = ((q * x.len() as f64).ceil() as usize).clamp(1, x.len());
    x[rank - 1]
}

/// Median of |error| over the rows (the mean of the two middle ones for an even count).
pub fn median_abs_error(rows: &[Compared]) -> f64 {
    median(rows.iter().map(|r| r.error.abs()).collect())
}

/// Median, p90 and worst |error| of a set of rows.
#[derive(Debug, Clone)]
pub struct Summary {
    pub rows: usize,
    pub median: f64,
    pub p90: f64,
    /// The row with the largest |error|: id and signed error.
    pub worst: Option<(String, f64)>,
    /// Rows beyond ±35% (issue 17's limit for a single row).
    pub beyond_35: usize,
    /// Rows estimated low by more than 25% (issue 31's limit: a plan that does not fit).
    pub low_beyond_25: Vec<String>,
}

/// The summary of `rows`.
pub fn summarize(rows: &[&Compared]) -> Summary {
    let owned: Vec<Compared> = rows.iter().map(|r| (*r).clone()).collect();
    Summary {
        rows: rows.len(),
        median: median_abs_error(&owned),
        p90: abs_error_quantile(rows, 0.9),
        worst: rows
            .iter()
            .max_by(|a, b| a.error.abs().total_cmp(&b.error.abs()))
            .map(|r| (r.id.clone(), r.error)),
        beyond_35: rows.iter().filter(|r| r.error.abs() > 0.35).count(),
        low_beyond_25: rows
            .iter()
            .filter(|r| r.error < -0.25)
            .map(|r| r.id.clone())
            .collect(),
    }
}

/// One summary per source over its scored rows, in the order sources first appear.
pub fn by_source(rows: &[Compared]) -> Vec<(&'static str, Summary)> {
    let mut sources: Vec<&'static str> = Vec::new();
    for r in rows.iter().filter(|r| r.is_scored()) {
        if !sources.contains(&r.source) {
            sources.push(r.source);
        }
    }
    sources
        .into_iter()
        .map(|s| {
            let of: Vec<&Compared> = rows
                .iter()
                .filter(|r| r.source == s && r.is_scored())
                .collect();
            (s, summarize(&of))
        })
        .collect()
}

/// The band of one class of setups, as `memory/band/table.rs` stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassBand {
    pub class: String,
    /// Scored GPU rows of the class.
    pub rows: usize,
    /// Sources whose bias enters the width: those with at least [`MIN_ROWS`] scored GPU rows.
    pub sources: usize,
    /// p90 |error| of the class's rows, pooled (what the band was before issue 31).
    pub p90_abs_error: f64,
    /// The band: 90th percentile of the shortfall −(bias of a source + deviation of a row within
    /// its own source), over every such pair ([`band_width`]).
    pub width: f64,
}

/// The bands: per class of the scored GPU rows, and [`ANY`] over all of them, from `rows` (the
/// leave-one-source-out comparison). Sorted by class. A class with fewer than [`MIN_ROWS`] rows
/// takes its within-source spread from every GPU row (the `any` band's).
pub fn bands(rows: &[Compared]) -> Vec<ClassBand> {
    let gpu: Vec<&Compared> = rows
        .iter()
        .filter(|r| r.is_gpu() && r.is_scored())
        .collect();
    let bias = source_biases(&gpu);
    let mut classes: Vec<String> = gpu.iter().map(|r| r.class.clone()).collect();
    classes.sort();
    classes.dedup();
    classes.push(ANY.to_string());
    classes
        .into_iter()
        .map(|c| {
            let of: Vec<&Compared> = gpu
                .iter()
                .copied()
                .filter(|r| r.class == c || c == ANY)
                .collect();
            let spread = if of.len() >= MIN_ROWS { &of } else { &gpu };
            ClassBand {
                rows: of.len(),
                sources: bias.iter().filter(|b| b.rows >= MIN_ROWS).count(),
                p90_abs_error: abs_error_quantile(&of, 0.9),
                width: band_width(spread, &bias),
                class: c,
            }
        })
        .collect()
}

/// A source's bias: the median signed error of its scored GPU rows, over every class.
#[derive(Debug, Clone, Copy)]
pub struct SourceBias {
    pub source: &'static str,
    pub rows: usize,
    pub median: f64,
}

/// Every source's bias, sorted by source.
pub fn source_biases(gpu: &[&Compared]) -> Vec<SourceBias> {
    let mut sources: Vec<&'static str> = gpu.iter().map(|r| r.source).collect();
    sources.sort();
    sources.dedup();
    sources
        .into_iter()
        .map(|source| {
            let e: Vec<f64> = gpu
                .iter()
                .filter(|r| r.source == source)
                .map(|r| r.error)
                .collect();
            SourceBias {
                source,
                rows: e.len(),
                median: median(e),
            }
        })
        .collect()
}

/// The band width over `rows`: a fresh source's row is modelled as the bias of one of the known
/// sources plus the deviation of one of `rows` from its own source's median. Every pair of a
/// source with at least [`MIN_ROWS`] rows (a bias from fewer is noise) and a row counts once; the
/// width is the 90th percentile (nearest rank) of their shortfall −(bias + deviation), at least 0,
/// so that the measurement stays under predicted / (1 − width) in 90% of the pairs.
pub fn band_width(rows: &[&Compared], bias: &[SourceBias]) -> f64 {
    let own = |source: &str| {
        bias.iter()
            .find(|b| b.source == source)
            .map_or(0.0, |b| b.median)
    };
    let mut known: Vec<f64> = bias
        .iter()
        .filter(|b| b.rows >= MIN_ROWS)
        .map(|b| b.median)
        .collect();
    if known.is_empty() {
        known.push(0.0);
    }
    let shortfall: Vec<f64> = known
        .iter()
        .flat_map(|b| rows.iter().map(move |r| -(b + r.error - own(r.source))))
        .collect();
    quantile(shortfall, 0.9).max(0.0)
}

/// The band as a fresh source meets it: for each source with at least [`MIN_ROWS`] scored GPU
/// rows, how many of them the bands computed without that source's rows hold (measured ≤
/// predicted / (1 − width of the row's class, or of `any` for a class under [`MIN_ROWS`] rows)).
/// Returns (source, rows held, rows).
pub fn held_out_coverage(rows: &[Compared]) -> Vec<(&'static str, usize, usize)> {
    let gpu: Vec<&Compared> = rows
        .iter()
        .filter(|r| r.is_gpu() && r.is_scored())
        .collect();
    source_biases(&gpu)
        .into_iter()
        .filter(|b| b.rows >= MIN_ROWS)
        .map(|b| {
            let others: Vec<Compared> = rows
                .iter()
                .filter(|r| r.source != b.source)
                .cloned()
                .collect();
            let own: Vec<&&Compared> = gpu.iter().filter(|r| r.source == b.source).collect();
            let others_bands = bands(&others);
            let held = own
                .iter()
                .filter(|r| {
                    r.measured_bytes
                        <= r.predicted_bytes / (1.0 - width_for(&others_bands, &r.class))
                })
                .count();
            (b.source, held, own.len())
        })
        .collect()
}

/// The width a setup of `class` carries among `bands`: its class's with at least [`MIN_ROWS`]
/// rows, else [`ANY`]'s (as `memory::band::for_setup` picks from the compiled table).
pub fn width_for(bands: &[ClassBand], class: &str) -> f64 {
    bands
        .iter()
        .find(|b| b.class == class && b.rows >= MIN_ROWS)
        .or_else(|| bands.iter().find(|b| b.class == ANY))
        .map_or(0.0, |b| b.width)
}

fn median(mut e: Vec<f64>) -> f64 {
    e.sort_by(f64::total_cmp);
    match e.len() {
        0 => 0.0,
        n if n % 2 == 1 => e[n / 2],
        n => (e[n / 2 - 1] + e[n / 2]) / 2.0,
    }
}

/// Rounded to 0.1% as the table stores it.
fn milli(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The Rust source of `memory/band/table.rs` for these bands (fractions rounded to 0.1%).
pub fn band_table_source(bands: &[ClassBand]) -> String {
    let mut s = String::from(
        "//! Generated by `cargo run --release -p memfit-plan --example accuracy` from validation/\n\
         //! (leave-one-source-out, GPU rows); do not edit.\n\n// measured fractions that may land near a named constant (0.318 ≈ 1/π)\n#![allow(clippy::approx_constant)]\n\nuse super::Band;\n\npub const BANDS: &[Band] = &[\n",
    );
    for b in bands {
        s += &format!(
            "    Band {{\n        class: {:?},\n        rows: {},\n        sources: {},\n        p90_abs_error: {:.3},\n        width: {:.3},\n    }},\n",
            b.class,
            b.rows,
            b.sources,
            milli(b.p90_abs_error),
            milli(b.width)
        );
    }
    s += "];\n";
    s
}

/// Whether the compiled-in table equals `bands` (as [`band_table_source`] rounds them).
pub fn bands_match_table(bands: &[ClassBand]) -> bool {
    let table: &[Band] = crate::memory::band::BANDS;
    table.len() == bands.len()
        && table.iter().zip(bands).all(|(t, b)| {
            t.class == b.class
                && t.rows == b.rows
                && t.sources == b.sources
                && (t.p90_abs_error - milli(b.p90_abs_error)).abs() < 1e-9
                && (t.width - milli(b.width)).abs() < 1e-9
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(source: &'static str, class: &str, error: f64) -> Compared {
        Compared {
            id: format!("{source}{error}"),
            source,
            class: class.into(),
            grade: "B".into(),
            metric: "RES".into(),
            measured_bytes: 1e9,
            predicted_bytes: 1e9 * (1.0 + error),
            error,
            needs_feature: false,
            unscored: None,
        }
    }

    /// A source estimated 20% low on every row, beside one estimated exactly: the pooled p90
    /// |error| of the class is 20% only while the low source has over a tenth of the rows; the
    /// width counts each source's bias once, whatever its row count: 20% with 5 low rows of 50.
    /// A source under 5 rows brings no bias of its own.
    #[test]
    fn width_counts_each_sources_bias_once() {
        let mut rows: Vec<Compared> = (0..45).map(|_| row("exact", "lora", 0.0)).collect();
        rows.extend((0..5).map(|_| row("low", "lora", -0.2)));
        let b = bands(&rows);
        let lora = b.iter().find(|b| b.class == "lora").unwrap();
        assert_eq!((lora.rows, lora.sources), (50, 2));
        assert!(lora.p90_abs_error.abs() < 1e-12, "{}", lora.p90_abs_error);
        assert!((lora.width - 0.2).abs() < 1e-12, "{}", lora.width);
        // a third source of 4 rows, 50% low: no bias of its own, its rows' deviation is 0
        rows.extend((0..4).map(|_| row("few", "lora", -0.5)));
        let lora = bands(&rows)
            .into_iter()
            .find(|b| b.class == "lora")
            .unwrap();
        assert_eq!(lora.sources, 2);
        assert!((lora.width - 0.2).abs() < 1e-12, "{}", lora.width);
    }

    /// The spread within a source adds to the biases: a source whose rows scatter ±10% around
    /// its median widens the band of a class by that scatter.
    #[test]
    fn width_adds_the_spread_within_sources() {
        let errors = [-0.1, 0.1, -0.1, 0.1, 0.0];
        let mut rows: Vec<Compared> = errors.iter().map(|e| row("a", "full", *e)).collect();
        rows.extend(errors.iter().map(|e| row("b", "full", *e - 0.05)));
        let full = bands(&rows)
            .into_iter()
            .find(|b| b.class == "full")
            .unwrap();
        // pairs: biases {0, −0.05} × deviations {−0.1, 0.1, −0.1, 0.1, 0} twice
        assert!((full.width - 0.15).abs() < 1e-12, "{}", full.width);
    }
}
