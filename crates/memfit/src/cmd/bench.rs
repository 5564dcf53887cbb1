//! `memfit bench`: token-store random access (`data`) and trainer throughput (`train`).

use super::data::data_error;
use crate::exit::Outcome;
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
    /// Train on synthetic tokens; seconds per step, tokens/s, peak RSS (DESIGN.md §3).
    Train(super::bench_train::Args),
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
        BenchCommand::Train(a) => super::bench_train::run(a),
    }
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
