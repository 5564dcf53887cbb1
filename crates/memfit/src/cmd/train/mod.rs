//! `memfit train`: the Rust trainer. With no arguments, the seq2seq demo (`--demo classification`
//! for the other); `--data/--valid/--tokenizer` (and `--model`/`--init`/`--preset`/`--profile`)
//! for real runs; `--resume RUN_DIR` to continue one exactly.
//!
//! The flags are resolved once (`setup`), the run's directory, data and model config prepared
//! (`start`), the task's engine built here, and the run driven to its end (`launch`).

mod args;
pub(crate) mod budget;
mod fit;
mod launch;
mod output;
mod ranks;
pub(crate) mod setup;
mod start;

pub use args::Args;

use crate::exit::{Outcome, bad_input};
use anyhow::Context;
use launch::{Run, launch};
use memfit_nn::ModelError;
use memfit_nn::families;
use memfit_nn::families::Training;
use memfit_nn::layers::lora::LoraSettings;
use memfit_train::config::{Method, Precision, TaskKind};
use memfit_train::engine_setup;
use memfit_train::task::RowSource;
use memfit_train::task::causal_lm::{CausalLmTask, LmCollate};
use memfit_train::task::classification::labels::{Relabeled, label_map, store_labels};
use memfit_train::task::classification::{ClassificationTask, ClsCollate, ClsRow};
use memfit_train::task::seq2seq::{Collate, Seq2SeqTask};
use memfit_train::text;
use setup::{Mode, Setup};
use start::Start;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub fn run(args: Args) -> Outcome {
    // First thing: from here on SIGINT/SIGTERM is a stop request the loop honours (exit 75, a run that
    // --resume continues), never a death halfway through making the run directory.
    memfit_train::signals::StopFlag::from_signals()
        .context("installing the SIGINT/SIGTERM handlers")?;
    // a training step reuses what the last one freed (memfit_train::malloc_tuning)
    memfit_train::malloc_tuning::keep_freed_memory();
    let setup = Setup::resolve(&args)?;
    if args.plan_only {
        setup.plan_lines.iter().for_each(|l| eprintln!("{l}"));
        if let (true, Some(planning)) = (args.json, &setup.planning) {
            println!("{planning}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    // Compute threads first: the data preparation below already starts the shared thread pool.
    engine_setup::set_threads(&setup.config).map_err(|e| bad_input(e.to_string()))?;
    let start = Start::prepare(setup)?;
    match start.setup.config.task {
        TaskKind::Classification => classification(&args, start),
        TaskKind::CausalLm => causal_lm(&args, start),
        TaskKind::Seq2seq => seq2seq(&args, start),
    }
}

/// The `--init` directory the model is built from: a new run's; on a resume, a LoRA run's (its
/// checkpoints hold the adapters, the base is the init's), else none (the checkpoint holds all).
/// A memfit checkpoint's files are checked against its `SHA256SUMS` first (exit 2 when damaged).
fn init_dir(setup: &Setup) -> anyhow::Result<Option<PathBuf>> {
    let lora = setup.config.method == Method::Lora;
    let init = || setup.config.init.as_deref().map(PathBuf::from);
    let dir = match setup.mode {
        Mode::New => init(),
        Mode::Resume if lora => init(),
        // Stopped before its first checkpoint, the run starts over from its own --init.
        Mode::Resume if no_checkpoint(&setup.root) => init(),
        Mode::Resume => None,
    };
    if let Some(dir) = &dir {
        memfit_train::checkpoint::checksums::verify(dir)
            .map_err(|why| bad_input(format!("--init {}: {why}", dir.display())))?;
    }
    Ok(dir)
}

fn no_checkpoint(root: &Path) -> bool {
    memfit_train::checkpoint::checkpoint_steps(&root.join("checkpoints")).is_empty()
}

fn model_error(e: ModelError) -> anyhow::Error {
    bad_input(e.to_string())
}

fn seq2seq(args: &Args, start: Start) -> Outcome {
    let (data, prepared) = start.split();
    let config = &prepared.setup.config.clone();
    let need = |r: Result<&memfit_data::tokenizer::SpecialToken, memfit_data::DataError>| {
        r.map(|t| t.id).map_err(|e| bad_input(e.to_string()))
    };
    let eos = need(data.tokenizer.require_eos("seq2seq training"))?;
    let pad = need(data.tokenizer.require_pad("seq2seq training"))?;
    let init = init_dir(&prepared.setup)?;
    let (model, loaded) = families::seq2seq(
        &prepared.model_json,
        &config.model,
        init.as_deref(),
        config.seed,
    )
    .map_err(model_error)?;
    if let (Some(report), Some(dir)) = (&loaded, &init) {
        eprintln!("{}", init_line(dir, report));
    }
    let engine = ranks::engine(
        (config, &prepared.setup.device, args.shard_optimizer),
        model,
        |_| {
            families::seq2seq(
                &prepared.model_json,
                &config.model,
                init.as_deref(),
                config.seed,
            )
            .map(|(m, _)| m)
        },
    )?;
    let task = Seq2SeqTask {
        collate: Collate {
            max_src: config.seq,
            max_tgt: config.tgt_seq,
            pad_id: pad,
            eos_id: eos,
        },
        decoder: &data.tokenizer,
        max_new_tokens: config.gen_max_tokens,
    };
    let tokenizer_files = text::checkpoint_tokenizer_files(&data.tokenizer, eos)
        .map_err(|e| bad_input(e.to_string()))?;
    let run = Run {
        engine,
        task: &task,
        train: &data.train,
        valid: data.valid_source(),
        tokenizer_files,
    };
    launch(args, prepared, run)
}

fn classification(args: &Args, start: Start) -> Outcome {
    let (data, prepared) = start.split();
    let config = &prepared.setup.config.clone();
    let pad = data
        .tokenizer
        .require_pad("classification training")
        .map_err(|e| bad_input(e.to_string()))?
        .id;
    let labels = store_labels(&data.train).map_err(|e| bad_input(e.to_string()))?;
    let init = init_dir(&prepared.setup)?;
    let (model, loaded) = families::classifier(
        &prepared.model_json,
        &config.model,
        &labels,
        init.as_deref(),
        config.seed,
    )
    .map_err(model_error)?;
    if let (Some(report), Some(dir)) = (&loaded, &init) {
        eprintln!("{}", init_line(dir, report));
    }
    let engine = ranks::engine(
        (config, &prepared.setup.device, args.shard_optimizer),
        model,
        |_| {
            let json = &prepared.model_json;
            families::classifier(json, &config.model, &labels, init.as_deref(), config.seed)
                .map(|(m, _)| m)
        },
    )?;
    let model_labels = memfit_train::engine::Classify::labels(&engine);
    let source = match &init {
        Some(dir) => format!("--init {}", dir.display()),
        None => "the training data".into(),
    };
    let map = label_map(&labels, &model_labels, &source).map_err(bad_input)?;
    let train = Relabeled {
        rows: &data.train,
        map,
    };
    // the validation store named its labels on its own: map them by name too, against the labels
    // the model has — the training data's, unless an --init head brought others
    let valid_source = if model_labels == labels {
        "the training data"
    } else {
        &source
    };
    let valid_file = config.valid.as_deref().unwrap_or("");
    let valid = match &data.valid {
        Some(v) => {
            let names = store_labels(v).map_err(|e| bad_input(e.to_string()))?;
            let map = label_map(&names, &model_labels, valid_source)
                .map_err(|e| bad_input(format!("--valid {valid_file}: {e}")))?;
            Some(Relabeled { rows: v, map })
        }
        None => None,
    };
    let task = ClassificationTask {
        collate: ClsCollate {
            max_len: config.seq,
            pad_id: pad,
        },
    };
    let tokenizer_files =
        text::unchanged_tokenizer_files(&data.tokenizer).map_err(|e| bad_input(e.to_string()))?;
    let run = Run {
        engine,
        task: &task,
        train: &train as &dyn RowSource<ClsRow>,
        valid: valid.as_ref().map(|v| v as &dyn RowSource<ClsRow>),
        tokenizer_files,
    };
    launch(args, prepared, run)
}

fn causal_lm(args: &Args, start: Start) -> Outcome {
    let (data, prepared) = start.split();
    let config = &prepared.setup.config.clone();
    let eos = data
        .tokenizer
        .require_eos("causal-lm training")
        .map_err(|e| bad_input(e.to_string()))?
        .id;
    // padding is never trained or attended to: a tokenizer without a pad token pads with EOS
    let pad = data.tokenizer.pad().map_or(eos, |p| p.id);
    let init = init_dir(&prepared.setup)?;
    let training = match config.method {
        Method::Lora => Training::Lora {
            settings: LoraSettings {
                r: config.lora_r.unwrap_or(16),
                alpha: config.lora_alpha.unwrap_or(32.0),
                dropout: config.lora_dropout.unwrap_or(0.05),
                use_rslora: false,
            },
            targets: config.lora_targets.clone().unwrap_or_else(|| {
                ["q", "k", "v", "o", "gate", "up", "down"]
                    .map(String::from)
                    .to_vec()
            }),
            base_bf16: config.base_precision == Some(Precision::Bf16),
        },
        Method::Full | Method::Freeze => Training::Full,
    };
    let (model, loaded) = families::causal_lm(
        &prepared.model_json,
        &config.model,
        init.as_deref(),
        &training,
        (config.seed, prepared.setup.device.backend.device()),
    )
    .map_err(model_error)?;
    if let (Some(report), Some(dir), Mode::New) = (&loaded, &init, &prepared.setup.mode) {
        eprintln!("{}", init_line(dir, report));
    }
    let engine = ranks::engine(
        (config, &prepared.setup.device, args.shard_optimizer),
        model,
        |backend| {
            let json = &prepared.model_json;
            let at = (config.seed, backend.device());
            families::causal_lm(json, &config.model, init.as_deref(), &training, at).map(|(m, _)| m)
        },
    )?;
    let task = CausalLmTask {
        collate: LmCollate {
            max_len: config.seq,
            pad_id: pad,
        },
        decoder: &data.tokenizer,
        eos_id: eos,
        max_new_tokens: config.gen_max_tokens,
    };
    let tokenizer_files =
        text::unchanged_tokenizer_files(&data.tokenizer).map_err(|e| bad_input(e.to_string()))?;
    let run = Run {
        engine,
        task: &task,
        train: &data.train,
        valid: data.valid_source(),
        tokenizer_files,
    };
    launch(args, prepared, run)
}

/// Paths in the resolved config are absolute, so a resume from another directory finds them.
fn absolute(p: &str) -> String {
    std::path::absolute(p).map_or_else(|_| p.to_string(), |a| a.display().to_string())
}

fn default_out() -> PathBuf {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's days_from_civil, inverted).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    PathBuf::from(format!(
        "runs/{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    ))
}

/// What `--init` loaded, as transformers reports missing and unexpected keys.
fn init_line(init: &Path, report: &memfit_nn::weights::LoadReport) -> String {
    let mut line = format!("init: weights from {}", init.display());
    if !report.initialised.is_empty() {
        line += &format!("; newly initialised: {}", report.initialised.join(", "));
    }
    if !report.unused.is_empty() {
        line += &format!("; unused: {}", report.unused.join(", "));
    }
    line
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}
