//! `memfit predict --model CHECKPOINT --input FILE [--out FILE.jsonl]`: one JSON line per row
//! (memfit_train::predict); this parses, calls it, and writes the output atomically.

use crate::exit::{Outcome, bad_input};
use memfit_train::engine::Precision;
use memfit_train::predict::{PredictOptions, predict};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A checkpoint directory (RUN/best, RUN/checkpoints/step-N, or an exported one).
    #[arg(long)]
    model: PathBuf,
    /// Rows to run: parquet or JSONL.
    #[arg(long)]
    input: PathBuf,
    /// Where the JSON lines go (default: standard output). Written whole or not at all.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Input columns: TEXT[,PAIR] for a classifier (default text), SOURCE for seq2seq (default
    /// prompt).
    #[arg(long, value_delimiter = ',')]
    columns: Option<Vec<String>>,
    /// Rows per forward pass (and held in memory at once).
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Longest input in tokens (a longer one is cut, its closing token kept).
    #[arg(long, default_value_t = 512)]
    max_len: usize,
    /// Tokens generated per row (seq2seq).
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    #[arg(long, value_parser = ["fp32", "bf16"], default_value = "fp32")]
    precision: String,
    /// How text is generated: greedy (plain greedy, as transformers' generate(do_sample=False)) or
    /// seed (the seed's evaluation decoding: no-repeat 4-grams, repetition penalty 1.3).
    #[arg(long, value_parser = ["greedy", "seed"], default_value = "greedy")]
    decoding: String,
}

pub fn run(args: Args) -> Outcome {
    if args.batch == 0 || args.max_len < 2 {
        return Err(bad_input(
            "--batch must be at least 1 and --max-len at least 2",
        ));
    }
    let options = PredictOptions {
        batch: args.batch,
        max_len: args.max_len,
        max_new_tokens: args.max_new_tokens,
        columns: args.columns.clone(),
        precision: match args.precision.as_str() {
            "bf16" => Precision::Bf16,
            _ => Precision::Fp32,
        },
        seed_decoding: args.decoding == "seed",
    };
    let fail = |e: memfit_train::predict::PredictError| {
        if e.is_bad_input() {
            bad_input(e.to_string())
        } else {
            anyhow::Error::new(e)
        }
    };
    let report = match &args.out {
        None => {
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let report = predict(&args.model, &args.input, &mut out, &options).map_err(fail)?;
            out.flush()?;
            report
        }
        Some(path) => {
            // the lines go to a sibling file renamed over --out at the end: a failed run leaves
            // no half-written predictions
            let tmp = path.with_file_name(format!(
                ".{}.partial-{}",
                path.file_name()
                    .map_or("predictions".into(), |n| n.to_string_lossy()),
                std::process::id()
            ));
            let file = std::fs::File::create(&tmp)
                .map_err(|e| bad_input(format!("--out {}: {e}", path.display())))?;
            let mut out = std::io::BufWriter::new(file);
            let result = predict(&args.model, &args.input, &mut out, &options)
                .map_err(fail)
                .and_then(|r| {
                    out.flush()?;
                    out.get_ref().sync_all()?;
                    std::fs::rename(&tmp, path)?;
                    Ok(r)
                });
            if result.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
            result?
        }
    };
    eprintln!(
        "predicted {} rows ({}) with {}",
        report.rows,
        report.task,
        args.model.display()
    );
    Ok(ExitCode::SUCCESS)
}
