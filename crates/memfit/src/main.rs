//! The `memfit` binary: parses arguments, calls the libraries, prints. It holds no logic of its own.

mod cmd;
mod exit;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "memfit",
    version,
    about = "Train transformer models inside a memory budget"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process; the size of the largest argument set does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// What this machine has (CPU, RAM, swap, cgroup limit, PSI, disk, GPUs) and what to run.
    Check(cmd::check::Args),
    /// Predicted peak GPU and host memory of a training setup, by component.
    Estimate(cmd::estimate::Args),
    /// The fastest setup that fits the budget, alternatives, tier tables and configs.
    Plan(cmd::plan::Args),
    /// Turn parquet/JSONL into a token store (read with positioned reads, not held in memory).
    Data(cmd::data::Args),
    /// Train or inspect a tokenizer.
    Tokenizer(cmd::tokenizer::Args),
    /// The Rust trainer.
    Train(cmd::train::Args),
    /// Run a trained checkpoint over rows: labels and scores, or generated text (JSON lines).
    Predict(cmd::predict::Args),
    /// A checkpoint as the Hugging Face directory its family loads from (LoRA merged with --merge).
    Export(cmd::export::Args),
    /// Guard any training command: watch its memory, stop it gracefully, relaunch it smaller.
    Run(cmd::run::Args),
    /// Measure a training command at a few micro-batches; the largest batch that fits each budget.
    Calibrate(cmd::calibrate::Args),
    /// Benchmarks: trainer throughput and memory, token-store random access.
    Bench(cmd::bench::Args),
    /// Charts of a run: loss, learning rate and memory over time (SVG and PNG).
    Report(cmd::report::Args),
}

/// The arguments, with a negative number taken as an option's value: `--batch -1` is then refused
/// naming the flag ("invalid value '-1' for '--batch <BATCH>'") rather than as "unexpected
/// argument '-1'".
fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    fn numbers_as_values(c: clap::Command) -> clap::Command {
        c.allow_negative_numbers(true)
            .mut_subcommands(numbers_as_values)
    }
    let matches = numbers_as_values(Cli::command()).get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// The system allocator with a memory reserve it gives back when an allocation fails, so that
/// `memfit train` can still checkpoint and stop (memfit_train::alloc_reserve).
#[global_allocator]
static ALLOCATOR: memfit_train::alloc_reserve::ReserveAllocator =
    memfit_train::alloc_reserve::ReserveAllocator;

fn main() -> ExitCode {
    memfit_train::malloc_tuning::use_one_arena();
    // Rust ignores SIGPIPE; restore the default so `memfit … | head` ends quietly, as Unix tools do,
    // instead of panicking in `println!`.
    // SAFETY: called first thing, before any thread exists; SIG_DFL installs no handler code.
    unsafe {
        let _ = nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigDfl,
        );
    }
    let cli = parse();
    let result = match cli.command {
        Command::Check(a) => cmd::check::run(a),
        Command::Estimate(a) => cmd::estimate::run(a),
        Command::Plan(a) => cmd::plan::run(a),
        Command::Data(a) => cmd::data::run(a),
        Command::Tokenizer(a) => cmd::tokenizer::run(a),
        Command::Train(a) => cmd::train::run(a),
        Command::Predict(a) => cmd::predict::run(a),
        Command::Export(a) => cmd::export::run(a),
        Command::Run(a) => cmd::run::run(a),
        Command::Calibrate(a) => cmd::calibrate::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Report(a) => cmd::report::run(a),
    };
    exit::finish(result)
}
