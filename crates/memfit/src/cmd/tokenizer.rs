//! `memfit tokenizer`: train a BPE/Unigram tokenizer from parquet/JSONL, or encode text with one.

use super::data::data_error;
use crate::exit::Outcome;
use clap::{Subcommand, ValueEnum};
use memfit_data::Tokenizer;
use memfit_data::tokenizer::train::{TokenizerModel, TrainOptions, train};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: TokenizerCommand,
}

#[derive(Subcommand)]
enum TokenizerCommand {
    /// Train a tokenizer from text columns; writes tokenizer.json, tokenizer_config.json and
    /// special_tokens_map.json.
    Train(TrainArgs),
    /// Token ids of a text.
    Encode(EncodeArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum Model {
    Bpe,
    Unigram,
}

#[derive(clap::Args)]
struct TrainArgs {
    /// Parquet or JSONL files.
    #[arg(long, num_args = 1.., required = true)]
    input: Vec<PathBuf>,
    #[arg(long)]
    vocab_size: usize,
    #[arg(long, value_enum, default_value = "bpe")]
    model: Model,
    /// Text columns to learn from (a file may lack some, not all).
    #[arg(long, value_delimiter = ',', default_value = "prompt,response")]
    columns: Vec<String>,
    /// Special tokens, ids 0.. in this order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "[PAD],[EOS],[SEP],[BOS],[CLS],[MASK],[UNK]"
    )]
    specials: Vec<String>,
    #[arg(long, default_value = "[UNK]")]
    unk: String,
    #[arg(long, default_value = "[EOS]")]
    eos: String,
    #[arg(long, default_value = "[PAD]")]
    pad: String,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct EncodeArgs {
    /// A tokenizer.json or a directory holding one.
    #[arg(long)]
    tokenizer: PathBuf,
    /// The text to encode.
    text: String,
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Outcome {
    match args.command {
        TokenizerCommand::Train(a) => run_train(a),
        TokenizerCommand::Encode(a) => encode(a),
    }
}

fn run_train(a: TrainArgs) -> Outcome {
    let mut opts = TrainOptions::new(a.input, a.vocab_size, a.out);
    opts.model = match a.model {
        Model::Bpe => TokenizerModel::Bpe,
        Model::Unigram => TokenizerModel::Unigram,
    };
    opts.columns = a.columns;
    opts.specials = a.specials;
    opts.unk = a.unk;
    opts.eos = a.eos;
    opts.pad = a.pad;
    let report = train(&opts).map_err(data_error)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "tokenizer written to {} ({:?}, {} tokens) from {} texts in {} rows ({} empty/invalid cells left out)",
            report.out.display(),
            report.model,
            report.vocab_size,
            report.texts,
            report.rows,
            report.skipped_cells
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn encode(a: EncodeArgs) -> Outcome {
    let tok = Tokenizer::load(&a.tokenizer).map_err(data_error)?;
    let ids = tok.encode(&a.text).map_err(data_error)?;
    if a.json {
        println!("{}", serde_json::json!({ "ids": ids }));
    } else {
        let text: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("{}", text.join(" "));
    }
    Ok(ExitCode::SUCCESS)
}
