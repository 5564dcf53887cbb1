//! `memfit data`: prepare a token store from parquet/JSONL, or show what a store holds.

mod guard;

use crate::exit::{Outcome, bad_input};
use clap::{Subcommand, ValueEnum};
use memfit_data::prepare::{PrepareOptions, Progress};
use memfit_data::{DataError, InvalidPolicy, Task, TokenStore};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: DataCommand,
}

#[derive(Subcommand)]
enum DataCommand {
    /// Tokenize parquet/JSONL files into a token store (tokens.bin, index.bin, meta.json).
    Prepare(Box<PrepareArgs>),
    /// Show a store's meta.json (rows, tokens, counts, length histogram).
    Info(InfoArgs),
}

/// The store's task (`--task`, or `--format` as earlier versions named it).
#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Seq2seq,
    Classification,
    Chat,
    /// Decoder-only training: chat rows with their prompt masked, or plain text.
    CausalLm,
}

#[derive(Clone, Copy, ValueEnum)]
enum OnInvalid {
    Fail,
    Skip,
    Keep,
}

#[derive(clap::Args)]
struct PrepareArgs {
    /// Parquet or JSONL files (by extension; otherwise parquet if it starts with PAR1).
    #[arg(long, num_args = 1.., required = true)]
    input: Vec<PathBuf>,
    /// A tokenizer.json, or a directory holding one (and tokenizer_config.json).
    #[arg(long)]
    tokenizer: PathBuf,
    #[arg(
        long = "task",
        alias = "format",
        value_name = "TASK",
        value_enum,
        default_value = "seq2seq"
    )]
    format: Format,
    /// Column names, comma-separated. Defaults: prompt,response (seq2seq); text,label or
    /// text,text_pair,label when the file has text_pair (classification);
    /// instruction,input,output (chat; input may be omitted); causal-lm: messages, else
    /// instruction[,input],output, else text — whichever the first input has.
    #[arg(long, value_delimiter = ',')]
    columns: Option<Vec<String>>,
    /// Maximum tokens of the source, EOS included (classification: of the text or pair with its
    /// specials, cut longest-first; causal-lm: of prompt + response, the prompt cut first);
    /// longer rows are cut and counted.
    #[arg(long)]
    max_len: Option<usize>,
    /// Maximum tokens of the target, EOS included (default: --max-len).
    #[arg(long)]
    max_target_len: Option<usize>,
    /// Rows with a null, a wrong type, bad UTF-8 or an empty text: stop (fail), leave out (skip)
    /// or keep what they have (keep). Counted in meta.json either way.
    #[arg(long, value_enum, default_value = "fail")]
    on_invalid: OnInvalid,
    /// Classification: label names by id, comma-separated (fixes the ids of string labels;
    /// names integer labels).
    #[arg(long, value_delimiter = ',')]
    label_names: Option<Vec<String>>,
    /// Causal-LM: a Jinja chat template file to use instead of the tokenizer's own
    /// (chat_template.jinja, or chat_template in tokenizer_config.json).
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// The store directory (default: ./<first input's name>.store).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Rows tokenized at once (bounds memory).
    #[arg(long, default_value_t = 2048)]
    chunk_rows: usize,
    /// The largest row (a JSONL line; a parquet row's columns), e.g. 1MiB, 8MiB: a larger one stops
    /// the prepare with an error naming it (or is left out under --on-invalid skip/keep), without
    /// ever being held or tokenized whole.
    #[arg(long, value_name = "SIZE", default_value = "1MiB")]
    max_row_bytes: String,
    /// RAM budget the prepare keeps (e.g. 2GiB, 60%; default: 80% of the effective available
    /// memory), watched by train's memory guard: past its hard limit (95%) the prepare stops,
    /// exit 75, nothing written. `--budget` is an alias.
    #[arg(long, alias = "budget", value_name = "SIZE|PCT")]
    budget_ram: Option<String>,
    /// Rebuild even if an up-to-date store exists.
    #[arg(long)]
    force: bool,
    /// Print the store's meta.json (plus "reused") instead of a summary.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct InfoArgs {
    /// The store directory.
    store: PathBuf,
    #[arg(long)]
    json: bool,
}

/// A library error with the exit code it deserves: 2 for the user's input, 75 for a memory guard
/// stop, 1 otherwise.
pub(crate) fn data_error(e: DataError) -> anyhow::Error {
    if e.is_bad_input() {
        bad_input(e.to_string())
    } else if let DataError::Stopped(reason) = e {
        guard::stopped(reason)
    } else {
        anyhow::Error::new(e)
    }
}

/// `--max-row-bytes` as typed → bytes; exit 2 naming the value.
pub(crate) fn parse_row_limit(text: &str) -> anyhow::Result<u64> {
    match memfit_sys::units::parse_size(text) {
        Ok(0) => Err(bad_input(format!(
            "--max-row-bytes {text:?}: must be more than 0 bytes"
        ))),
        Ok(bytes) => Ok(bytes),
        Err(e) => Err(bad_input(format!("--max-row-bytes {text:?}: {e}"))),
    }
}

pub fn run(args: Args) -> Outcome {
    match args.command {
        DataCommand::Prepare(a) => prepare(*a),
        DataCommand::Info(a) => info(a),
    }
}

fn prepare(a: PrepareArgs) -> Outcome {
    let out = match a.out {
        Some(o) => o,
        None => {
            let stem = a.input[0]
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "data".into());
            PathBuf::from(format!("{stem}.store"))
        }
    };
    let task = match a.format {
        Format::Seq2seq => Task::Seq2seq,
        Format::Classification => Task::Classification,
        Format::Chat => Task::Chat,
        Format::CausalLm => Task::CausalLm,
    };
    let mut opts = PrepareOptions::new(a.input, a.tokenizer, task, out);
    opts.columns = a.columns;
    opts.max_len = a.max_len;
    opts.max_target_len = a.max_target_len;
    opts.on_invalid = match a.on_invalid {
        OnInvalid::Fail => InvalidPolicy::Fail,
        OnInvalid::Skip => InvalidPolicy::Skip,
        OnInvalid::Keep => InvalidPolicy::Keep,
    };
    opts.label_names = a.label_names;
    opts.chat_template = a.chat_template;
    opts.chunk_rows = a.chunk_rows;
    opts.force = a.force;
    let guard = guard::start(a.budget_ram.as_deref())?;
    opts.max_row_bytes = guard.row_limit(parse_row_limit(&a.max_row_bytes)?, &a.max_row_bytes);

    let bar = indicatif::ProgressBar::new_spinner();
    if a.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let mut on_progress = |p: Progress| {
        if let Some(total) = p.rows_total
            && bar.length() != Some(total)
        {
            bar.set_length(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{elapsed_precise} [{wide_bar}] {pos}/{len} rows ({per_sec}, eta {eta})",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
        }
        bar.set_position(p.rows_read);
    };
    let stop = || guard.stop_reason();
    let report = memfit_data::prepare_until(&opts, &mut on_progress, &stop).map_err(data_error);
    bar.finish_and_clear();
    let report = report?;
    let m = &report.meta;
    if a.json {
        let mut v = serde_json::to_value(m)?;
        if let Some(obj) = v.as_object_mut() {
            obj.insert("reused".into(), report.reused.into());
            obj.insert("store".into(), report.store.display().to_string().into());
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let verb = if report.reused {
            "up to date, reused"
        } else {
            "written"
        };
        println!("store {} {verb}", report.store.display());
        print_summary(m);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_summary(m: &memfit_data::StoreMeta) {
    let c = &m.counts;
    println!(
        "  {} rows, {} tokens ({}-bit ids), task {}",
        m.rows,
        m.tokens,
        m.token_width as u32 * 8,
        m.task.name()
    );
    println!(
        "  read {}, truncated {}, empty {}, invalid {}, skipped {} (--on-invalid {})",
        c.read, c.truncated, c.empty, c.invalid, c.skipped, m.options.on_invalid
    );
    if let Some(n) = m.num_labels {
        // The first names only: a store may hold up to memfit_data::MAX_LABELS of them.
        const SHOWN: u32 = 20;
        let names = m.label_names_by_id(n.min(SHOWN));
        let more = n.saturating_sub(SHOWN);
        let rest = if more > 0 {
            format!(", … ({more} more)")
        } else {
            String::new()
        };
        println!(
            "  {n} labels: {}{rest}",
            names[..names.len().min(SHOWN as usize)].join(", ")
        );
    }
    if let Some(format) = &m.prompt_format {
        println!("  prompts: {format}");
    }
    for (name, l) in m.segments.iter().zip(&m.lengths) {
        println!(
            "  {name}: tokens min {} / mean {:.1} / max {}",
            l.min, l.mean, l.max
        );
    }
}

fn info(a: InfoArgs) -> Outcome {
    let store = TokenStore::open(&a.store).map_err(data_error)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(store.meta())?);
    } else {
        println!("store {}", a.store.display());
        print_summary(store.meta());
    }
    Ok(ExitCode::SUCCESS)
}
