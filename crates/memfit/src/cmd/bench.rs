//! `memfit bench`: token-store random access (`data`), trainer throughput (`train`), the step's
//! matrix products (`matmul`).

use super::data::data_error;
use crate::exit::Outcome;
use anyhow::Context;
use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Read N random rows from a token store; median time per row and peak RSS.
    Data(DataArgs),
    /// Train on synthetic tokens; seconds per step, tokens/s, peak RSS (docs/architecture.md §3).
    Train(Box<super::bench_train::Args>),
    /// Time each matrix product of a model's training step alone on the device (against
    /// `torch.matmul`: scripts/gpu/matmul_torch.py).
    Matmul(super::bench_matmul::Args),
    /// Measure the host-memory grid of the trainer (one `bench train` process per point) and
    /// compare each peak RSS with memfit-plan's model (`--runtime memfit --device cpu`).
    MemoryGrid(GridArgs),
}

#[derive(clap::Args)]
struct GridArgs {
    /// Write the measurements as CSV here (validation/memfit_grid.csv is the committed one); an
    /// existing file keeps the rows of the points not measured this time.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Only these points (comma-separated ids; default: all).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Only the points of these families (comma-separated: t5, bert, decoder).
    #[arg(long, value_delimiter = ',', value_parser = ["t5", "bert", "decoder"])]
    family: Vec<String>,
    /// Print the compared rows as JSON lines.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct DataArgs {
    /// The token store directory (from `memfit data prepare`).
    #[arg(long)]
    store: PathBuf,
    /// Rows to read, uniformly at random.
    #[arg(long)]
    random: usize,
    /// Seed of the row choice.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print {"rows", "ns_per_row_median", "peak_rss_bytes"}.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Outcome {
    match args.command {
        BenchCommand::Data(a) => data(a),
        BenchCommand::Train(a) => super::bench_train::run(*a),
        BenchCommand::Matmul(a) => super::bench_matmul::run(a),
        BenchCommand::MemoryGrid(a) => memory_grid(a),
    }
}

fn memory_grid(a: GridArgs) -> Outcome {
    use memfit_plan::grid;
    let points: Vec<&grid::Point> = grid::POINTS
        .iter()
        .filter(|p| a.only.is_empty() || a.only.iter().any(|o| o == p.id))
        .filter(|p| a.family.is_empty() || a.family.iter().any(|f| f == grid::family_of(p)))
        .collect();
    if let Some(unknown) = a
        .only
        .iter()
        .find(|o| !grid::POINTS.iter().any(|p| p.id == o.as_str()))
    {
        return Err(crate::exit::bad_input(format!(
            "--only {unknown:?}: no such point; the points are {}",
            grid::POINTS
                .iter()
                .map(|p| p.id)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let exe = std::env::current_exe().context("locating the memfit binary")?;
    let bar = indicatif::ProgressBar::new(points.len() as u64);
    let mut measured = Vec::new();
    for p in points {
        bar.set_message(p.id);
        measured.push(memfit_train::bench::measure_grid_point(&exe, p)?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let text = match a.out.as_ref().filter(|o| o.exists()) {
        Some(out) => {
            let existing = std::fs::read_to_string(out)
                .with_context(|| format!("reading {}", out.display()))?;
            grid::merge(&existing, &measured).map_err(anyhow::Error::msg)?
        }
        None => grid::csv(&measured),
    };
    if let Some(out) = &a.out {
        let tmp = out.with_extension("csv.tmp");
        std::fs::write(&tmp, &text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, out).with_context(|| format!("writing {}", out.display()))?;
    }
    let rows = grid::compare(&text).map_err(anyhow::Error::msg)?;
    if a.json {
        for r in &rows {
            println!(
                "{}",
                serde_json::json!({"id": r.id, "setup": r.setup, "measured_bytes": r.measured_bytes,
                    "predicted_bytes": r.predicted_bytes, "error": r.error, "fit_point": r.fit_point})
            );
        }
    } else {
        print!("{}", grid::markdown_table(&rows));
        let held_out = grid::held_out(&rows);
        println!(
            "worst |error| {:.1}% over {} held-out points ({:.1}% over all {}, the fit half included)",
            100.0 * grid::worst_abs_error(&held_out),
            held_out.len(),
            100.0 * grid::worst_abs_error(&rows),
            rows.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn data(a: DataArgs) -> Outcome {
    let report =
        memfit_data::bench::random_access(&a.store, a.random, a.seed).map_err(data_error)?;
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} random rows: median {:.0} ns/row, peak RSS {:.1} MiB",
            report.rows,
            report.ns_per_row_median,
            report.peak_rss_bytes as f64 / (1u64 << 20) as f64
        );
    }
    Ok(ExitCode::SUCCESS)
}
