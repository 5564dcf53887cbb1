//! `memfit tokenizer`: train a BPE/Unigram tokenizer from parquet/JSONL, encode text (or a sentence
//! pair) with one, or show how a chat row is rendered and masked for causal-LM training.

use super::data::{data_error, parse_row_limit};
use crate::exit::{Outcome, bad_input};
use clap::{Subcommand, ValueEnum};
use memfit_data::chat::Conversation;
use memfit_data::source::Message;
use memfit_data::tokenizer::train::{TokenizerModel, TrainOptions, train};
use memfit_data::{CausalRow, EncodeSettings, Mode, RowEncoder, RowTexts, Task, Tokenizer};
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
    /// Token ids of a text (or, with --pair, a sentence pair) as classification encodes it: with the
    /// specials the tokenizer's post-processor adds.
    Encode(EncodeArgs),
    /// A conversation as causal-LM training sees it: the tokenizer's chat template (or the plain
    /// Alpaca format), the prompt, the response and the token ids with the prompt's length.
    Chat(ChatArgs),
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
    /// The largest row (a JSONL line; a parquet row's columns): a larger one stops training with
    /// an error naming it, never held whole (as `memfit data prepare --max-row-bytes`).
    #[arg(long, value_name = "SIZE", default_value = "1MiB")]
    max_row_bytes: String,
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
    /// A second text: the pair is encoded with the tokenizer's post-processor (its specials and
    /// token type ids), as `memfit data prepare --task classification` encodes `text,text_pair`.
    #[arg(long)]
    pair: Option<String>,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct ChatArgs {
    /// A tokenizer.json or a directory holding one (and its chat template).
    #[arg(long)]
    tokenizer: PathBuf,
    /// The conversation: a JSON list of {"role", "content"} messages. Ending with an assistant
    /// message, it is a training row; otherwise, a prompt to generate from.
    #[arg(long)]
    messages: String,
    /// A Jinja chat template file to use instead of the tokenizer's own.
    #[arg(long)]
    chat_template: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Outcome {
    match args.command {
        TokenizerCommand::Train(a) => run_train(a),
        TokenizerCommand::Encode(a) => encode(a),
        TokenizerCommand::Chat(a) => chat(a),
    }
}

fn run_train(a: TrainArgs) -> Outcome {
    let requested = a.vocab_size;
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
    opts.max_row_bytes = parse_row_limit(&a.max_row_bytes)?;
    let report = train(&opts).map_err(data_error)?;
    let over = over_vocab_size(report.vocab_size, requested, a.model);
    if a.json {
        let mut v = serde_json::to_value(&report)?;
        v["requested_vocab_size"] = requested.into();
        v["over_requested"] = over.clone().into();
        println!("{}", serde_json::to_string_pretty(&v)?);
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
        if let Some(why) = over {
            println!("{why}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Why a tokenizer has more tokens than `--vocab-size` asked for, if it has.
fn over_vocab_size(got: usize, requested: usize, model: Model) -> Option<String> {
    let why = match model {
        Model::Bpe => {
            "BPE keeps every character of the training texts as a token (its alphabet) and \
             merges only above it: text with many distinct characters (Chinese) needs a larger \
             --vocab-size for any merges"
        }
        Model::Unigram => "the specials and every character the texts need are kept",
    };
    (got > requested).then(|| format!("{got} tokens, more than --vocab-size {requested}: {why}"))
}

/// Ids as the tokenizer encodes the text for a model (transformers' `tokenizer(text)`): with its
/// post-processor's specials, as classification training encodes a row.
fn encode(a: EncodeArgs) -> Outcome {
    let tok = Tokenizer::load(&a.tokenizer).map_err(data_error)?;
    let encoded = match &a.pair {
        Some(pair) => tok.inner().encode((a.text.as_str(), pair.as_str()), true),
        None => tok.inner().encode(a.text.as_str(), true),
    }
    .map_err(|e| bad_input(format!("{}: {e}", tok.path().display())))?;
    let (ids, types) = (encoded.get_ids(), encoded.get_type_ids());
    match (a.json, a.pair.is_some()) {
        (true, true) => println!(
            "{}",
            serde_json::json!({ "ids": ids, "token_type_ids": types })
        ),
        (true, false) => println!("{}", serde_json::json!({ "ids": ids })),
        (false, true) => {
            println!("ids:   {}", joined(ids));
            println!("types: {}", joined(types));
        }
        (false, false) => println!("{}", joined(ids)),
    }
    Ok(ExitCode::SUCCESS)
}

fn joined(values: &[u32]) -> String {
    let text: Vec<String> = values.iter().map(u32::to_string).collect();
    text.join(" ")
}

fn chat(a: ChatArgs) -> Outcome {
    let json: serde_json::Value = serde_json::from_str(&a.messages)
        .map_err(|e| bad_input(format!("--messages is not JSON: {e}")))?;
    let messages = json
        .as_array()
        .ok_or_else(|| bad_input("--messages is not a JSON list of messages"))?
        .iter()
        .enumerate()
        .map(|(k, m)| Message::from_json(k, m))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad_input(format!("--messages: {e}")))?;
    let training = messages.last().is_some_and(|m| m.role() == "assistant");
    let mode = if training { Mode::Train } else { Mode::Predict };
    let tokenizer = Tokenizer::load(&a.tokenizer).map_err(data_error)?;
    let mut settings = EncodeSettings::new(mode);
    settings.chat_template = a.chat_template;
    let encoder = RowEncoder::new(tokenizer, Task::CausalLm, settings).map_err(data_error)?;
    let row = RowTexts::Chat(Conversation::Messages(messages));
    let encoded = encoder.encode(&row).map_err(data_error)?;
    let causal = encoded.causal().unwrap_or(CausalRow {
        ids: Vec::new(),
        prompt_len: 0,
    });
    let decode = |ids: &[u32]| {
        encoder
            .tokenizer()
            .inner()
            .decode(ids, false)
            .unwrap_or_default()
    };
    let prompt = decode(&causal.ids[..causal.prompt_len]);
    let response = decode(&causal.ids[causal.prompt_len..]);
    let format = encoder
        .prompt_format()
        .map(|f| f.describe())
        .unwrap_or_default();
    if a.json {
        let v = serde_json::json!({"format": format, "training": training, "prompt": prompt,
            "response": response, "ids": causal.ids, "prompt_len": causal.prompt_len});
        println!("{v}");
    } else {
        println!("format: {format}");
        println!(
            "prompt ({} tokens, not trained):\n{prompt}",
            causal.prompt_len
        );
        if training {
            let n = causal.ids.len() - causal.prompt_len;
            println!("response ({n} tokens, trained):\n{response}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
