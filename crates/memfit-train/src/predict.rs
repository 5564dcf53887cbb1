//! `memfit predict`: a trained checkpoint run over the rows of a parquet/JSONL file, one JSON line
//! per row — `label` and `scores` (probabilities in label-id order) for a classifier, `text` (the
//! plain greedy generation; `seed_decoding`: the seed's) for a seq2seq model or a causal LM (a full model or a LoRA adapter over its
//! base). Rows stream through a chunk at a time, so memory is bounded by the batch, not the file.
//! Each row is encoded by memfit-data's row encoder in prediction mode — the code that encoded the
//! training rows — with the checkpoint's tokenizer: the seq2seq source with EOS, the classifier's
//! text or pair with its specials, the causal LM's prompt rendered with its chat template and the
//! generation prompt.

use crate::engine::{
    Classify, Continue, Generate, GenerateConfig, ModelEngine, Precision, TokenRows,
};
use crate::task::classification::metrics::probabilities;
use crate::task::classification::{ClsCollate, ClsRow};
use crate::task::seq2seq::{NO_REPEAT_NGRAM, REPETITION_PENALTY};
use memfit_data::encode::{EncodeSettings, EncodedChunks, EncodedRow, RowEncoder, RowTokens};
use memfit_data::rows::{Columns, InvalidPolicy, Mode};
use memfit_data::{Task, Tokenizer};
use memfit_nn::ModelError;
use memfit_nn::families;
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum PredictError {
    #[error(
        "{0}: not a checkpoint (no config.json or adapter_config.json, and tokenizer.json, in it)"
    )]
    NotACheckpoint(String),
    #[error(transparent)]
    Data(#[from] memfit_data::DataError),
    #[error("{0}")]
    Model(#[from] ModelError),
    #[error("writing predictions: {0}")]
    Write(#[from] std::io::Error),
}

impl PredictError {
    /// Bad input (exit 2) rather than a failure at run time.
    pub fn is_bad_input(&self) -> bool {
        match self {
            PredictError::Data(e) => e.is_bad_input(),
            PredictError::Model(e) => !matches!(e, ModelError::Io(_)),
            PredictError::Write(_) => false,
            PredictError::NotACheckpoint(_) => true,
        }
    }
}

/// How to run the rows.
#[derive(Debug, Clone)]
pub struct PredictOptions {
    /// Rows per forward pass (and per chunk read from the file).
    pub batch: usize,
    /// Longest input in tokens (cut as training cut its rows).
    pub max_len: usize,
    /// Tokens generated per row (seq2seq, causal LM).
    pub max_new_tokens: usize,
    /// Input columns (default: the task's, chosen by what the file holds).
    pub columns: Option<Vec<String>>,
    pub precision: Precision,
    /// Generation as the seed's evaluation decodes (seq2seq: no-repeat n-gram 4, repetition penalty
    /// 1.3); otherwise plain greedy, as transformers' `generate(do_sample=False)` does.
    pub seed_decoding: bool,
}

/// What a prediction run did.
#[derive(Debug, Clone, PartialEq)]
pub struct PredictReport {
    pub task: &'static str,
    pub rows: u64,
}

/// A checkpoint: where it is, the config.json describing its model, and its tokenizer.
struct Checkpoint {
    dir: PathBuf,
    config: Value,
    tokenizer_dir: PathBuf,
}

impl Checkpoint {
    fn open(dir: &Path) -> Result<Self, PredictError> {
        let not = || PredictError::NotACheckpoint(dir.display().to_string());
        let has_model = ["config.json", "adapter_config.json"]
            .iter()
            .any(|f| dir.join(f).is_file());
        if !has_model || !dir.join("tokenizer.json").is_file() {
            return Err(not());
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            config: families::checkpoint_config(dir)?,
            tokenizer_dir: dir.to_path_buf(),
        })
    }

    fn name(&self) -> String {
        self.dir.display().to_string()
    }

    /// The model's pad id (`pad_token_id`: RoBERTa's positions count from it), else the
    /// tokenizer's, else 0.
    fn pad_id(&self, tokenizer: &Tokenizer) -> u32 {
        self.config["pad_token_id"]
            .as_u64()
            .map(|p| p as u32)
            .or_else(|| tokenizer.pad().map(|p| p.id))
            .unwrap_or(0)
    }
}

/// Runs `checkpoint` over `input`, writing one JSON line per row to `out`.
pub fn predict(
    checkpoint: &Path,
    input: &Path,
    out: &mut dyn Write,
    options: &PredictOptions,
) -> Result<PredictReport, PredictError> {
    let ckpt = Checkpoint::open(checkpoint)?;
    let task = match families::task_of(&ckpt.config) {
        Some("classification") => Task::Classification,
        Some("seq2seq") => Task::Seq2seq,
        Some("causal-lm") => Task::CausalLm,
        _ => {
            return Err(ModelError::Config(format!(
                "{}: model_type {:?} is not a family memfit predict runs",
                ckpt.name(),
                families::model_type(&ckpt.config)
            ))
            .into());
        }
    };
    let tokenizer = Tokenizer::load(&ckpt.tokenizer_dir)?;
    let mut settings = EncodeSettings::new(Mode::Predict);
    settings.max_len = Some(options.max_len);
    let encoder = RowEncoder::new(tokenizer, task, settings)?;
    let columns = Columns::resolve(task, Mode::Predict, options.columns.as_deref(), Some(input))?;
    let mut chunks = EncodedChunks::open(
        &encoder,
        &[input.to_path_buf()],
        columns,
        InvalidPolicy::Fail,
        None,
        memfit_data::source::ReadLimits::rows(options.batch.max(1)),
    )?;
    let mut next = || -> Result<Option<Vec<EncodedRow>>, PredictError> {
        Ok(chunks
            .next_chunk()?
            .map(|rows| rows.into_iter().map(|(_, row)| row).collect()))
    };
    let rows = match task {
        Task::Classification => classify(&ckpt, encoder.tokenizer(), &mut next, out, options)?,
        Task::CausalLm => continue_prompts(&ckpt, encoder.tokenizer(), &mut next, out, options)?,
        _ => generate(&ckpt, encoder.tokenizer(), &mut next, out, options)?,
    };
    Ok(PredictReport {
        task: task.name(),
        rows,
    })
}

/// The next chunk of encoded rows, `None` at the end.
type Chunks<'a> = &'a mut dyn FnMut() -> Result<Option<Vec<EncodedRow>>, PredictError>;

fn classify(
    ckpt: &Checkpoint,
    tokenizer: &Tokenizer,
    next: Chunks<'_>,
    out: &mut dyn Write,
    options: &PredictOptions,
) -> Result<u64, PredictError> {
    let placeholder = ["LABEL_0".to_string()];
    let (model, report) =
        families::classifier(&ckpt.config, &ckpt.name(), &placeholder, Some(&ckpt.dir), 0)?;
    if let Some(missing) = report.and_then(|r| r.initialised.first().cloned()) {
        return Err(ModelError::Format(format!(
            "{}: has no classification head ({missing} is missing): train it first",
            ckpt.name()
        ))
        .into());
    }
    let engine = ModelEngine::for_inference(model, options.precision)?;
    let labels = engine.labels();
    let collate = ClsCollate {
        max_len: options.max_len,
        pad_id: ckpt.pad_id(tokenizer),
    };
    let mut rows = 0;
    while let Some(chunk) = next()? {
        let cls: Vec<ClsRow> = chunk
            .iter()
            .filter_map(|r| r.classification_input())
            .map(|(ids, token_types)| ClsRow {
                ids: ids.to_vec(),
                token_types,
                label: 0,
            })
            .collect();
        let logits = engine.logits(&collate.batch(&cls))?;
        for row in logits.chunks_exact(labels.len()) {
            let best = memfit_nn::decoding::argmax(row) as usize;
            let line = json!({"label": labels[best], "scores": probabilities(row)});
            writeln!(out, "{line}")?;
        }
        rows += cls.len() as u64;
    }
    Ok(rows)
}

/// Plain greedy decoding, or (`seed`) the seed's seq2seq settings the evaluation uses.
fn generate_config(eos_id: u32, max_new_tokens: usize, seed: bool) -> GenerateConfig {
    GenerateConfig {
        max_new_tokens,
        no_repeat_ngram: if seed { NO_REPEAT_NGRAM } else { 0 },
        repetition_penalty: if seed { REPETITION_PENALTY } else { 1.0 },
        eos_id,
        stop: Vec::new(),
    }
}

/// Writes each generated row as `{"text": …}`.
fn write_texts(
    tokenizer: &Tokenizer,
    outputs: &[Vec<u32>],
    out: &mut dyn Write,
) -> Result<(), PredictError> {
    for ids in outputs {
        writeln!(out, "{}", json!({ "text": tokenizer.decode(ids)? }))?;
    }
    Ok(())
}

fn generate(
    ckpt: &Checkpoint,
    tokenizer: &Tokenizer,
    next: Chunks<'_>,
    out: &mut dyn Write,
    options: &PredictOptions,
) -> Result<u64, PredictError> {
    let (model, _) = families::seq2seq(&ckpt.config, &ckpt.name(), Some(&ckpt.dir), 0)?;
    let engine = ModelEngine::for_inference(model, options.precision)?;
    let eos = tokenizer.require_eos("seq2seq generation")?.id;
    let config = generate_config(eos, options.max_new_tokens, options.seed_decoding);
    let collate = ClsCollate {
        max_len: options.max_len,
        pad_id: ckpt.pad_id(tokenizer),
    };
    let mut rows = 0;
    while let Some(chunk) = next()? {
        let sources: Vec<ClsRow> = chunk
            .iter()
            .filter_map(|r| match &r.tokens {
                RowTokens::Seq2seq { source, .. } => Some(ClsRow {
                    ids: source.clone(),
                    token_types: None,
                    label: 0,
                }),
                _ => None,
            })
            .collect();
        let padded: TokenRows = collate.batch(&sources).input;
        write_texts(tokenizer, &engine.generate(&padded, &config)?, out)?;
        rows += sources.len() as u64;
    }
    Ok(rows)
}

fn continue_prompts(
    ckpt: &Checkpoint,
    tokenizer: &Tokenizer,
    next: Chunks<'_>,
    out: &mut dyn Write,
    options: &PredictOptions,
) -> Result<u64, PredictError> {
    let model = families::causal_lm_checkpoint(&ckpt.dir)?;
    let engine = ModelEngine::for_inference(model, options.precision)?;
    let eos = tokenizer.require_eos("causal-lm generation")?.id;
    let config = generate_config(eos, options.max_new_tokens, options.seed_decoding);
    let mut rows = 0;
    while let Some(chunk) = next()? {
        let prompts: Vec<Vec<u32>> = chunk
            .iter()
            .filter_map(|r| r.causal())
            .map(|r| r.ids)
            .collect();
        write_texts(tokenizer, &engine.continue_prompts(&prompts, &config)?, out)?;
        rows += prompts.len() as u64;
    }
    Ok(rows)
}
