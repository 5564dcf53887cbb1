//! `memfit predict`: a trained checkpoint run over the rows of a parquet/JSONL file, one JSON line
//! per row — `label` and `scores` (probabilities in label-id order) for a classifier, `text` (the
//! greedy generation) for a seq2seq model. Rows stream through a chunk at a time, so memory is
//! bounded by the batch, not the file. Texts are encoded by the checkpoint's own tokenizer with its
//! post-processor, which adds what training added ([CLS]/[SEP] for a classifier, EOS for seq2seq:
//! memfit saves checkpoints so that it does).

use crate::engine::{
    ClassificationBatch, Classify, Generate, GenerateConfig, ModelEngine, Precision, TokenRows,
};
use crate::task::classification::metrics::probabilities;
use crate::task::classification::{ClsCollate, ClsRow};
use crate::task::seq2seq::{NO_REPEAT_NGRAM, REPETITION_PENALTY};
use memfit_data::source::{self, ColumnSpec, Value};
use memfit_nn::ModelError;
use memfit_nn::families;
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum PredictError {
    #[error("{0}: not a checkpoint (no config.json and tokenizer.json in it)")]
    NotACheckpoint(String),
    #[error("{path}, {row}: column {column:?} {reason}")]
    Row {
        path: String,
        row: String,
        column: String,
        reason: String,
    },
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
            _ => true,
        }
    }
}

/// How to run the rows.
#[derive(Debug, Clone)]
pub struct PredictOptions {
    /// Rows per forward pass (and per chunk read from the file).
    pub batch: usize,
    /// Longest input in tokens; a longer one is cut, its closing token kept.
    pub max_len: usize,
    /// Tokens generated per row (seq2seq).
    pub max_new_tokens: usize,
    /// Input columns: classification `TEXT[,PAIR]` (default `text`), seq2seq `SOURCE` (default
    /// `prompt`).
    pub columns: Option<Vec<String>>,
    pub precision: Precision,
}

/// What a prediction run did.
#[derive(Debug, Clone, PartialEq)]
pub struct PredictReport {
    pub task: &'static str,
    pub rows: u64,
}

/// A checkpoint's parts: its model config and its tokenizer.
struct Checkpoint {
    dir: PathBuf,
    config: serde_json::Value,
    tokenizer: tokenizers::Tokenizer,
}

impl Checkpoint {
    fn open(dir: &Path) -> Result<Self, PredictError> {
        let not = || PredictError::NotACheckpoint(dir.display().to_string());
        let text = std::fs::read_to_string(dir.join("config.json")).map_err(|_| not())?;
        let config = serde_json::from_str(&text)
            .map_err(|e| ModelError::Config(format!("{}/config.json: {e}", dir.display())))?;
        let tokenizer =
            tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).map_err(|_| not())?;
        Ok(Self {
            dir: dir.to_path_buf(),
            config,
            tokenizer,
        })
    }

    fn name(&self) -> String {
        self.dir.display().to_string()
    }

    /// Token ids (and segment ids) of `text` (and `pair`) with the tokenizer's specials.
    fn encode(&self, text: &str, pair: Option<&str>) -> Result<(Vec<u32>, Vec<u32>), PredictError> {
        let input = match pair {
            Some(p) => tokenizers::EncodeInput::Dual(text.into(), p.into()),
            None => tokenizers::EncodeInput::Single(text.into()),
        };
        let e = self.tokenizer.encode(input, true).map_err(|e| {
            ModelError::Input(format!(
                "{}/tokenizer.json: encoding failed: {e}",
                self.name()
            ))
        })?;
        Ok((e.get_ids().to_vec(), e.get_type_ids().to_vec()))
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
    match families::task_of(&ckpt.config) {
        Some("classification") => classify(&ckpt, input, out, options),
        Some("seq2seq") => generate(&ckpt, input, out, options),
        _ => Err(ModelError::Config(format!(
            "{}/config.json: model_type {:?} is not a family memfit predict runs",
            ckpt.name(),
            families::model_type(&ckpt.config)
        ))
        .into()),
    }
}

/// The texts of one row, in the order of `columns`; an empty or invalid cell is an error naming it.
fn texts(
    path: &Path,
    rec: source::Record,
    columns: &[String],
) -> Result<Vec<String>, PredictError> {
    let row = rec.location.to_string();
    let fail = |column: &str, reason: String| PredictError::Row {
        path: path.display().to_string(),
        row: row.clone(),
        column: column.to_string(),
        reason,
    };
    if let Some(problem) = &rec.problem {
        return Err(fail("(whole row)", problem.clone()));
    }
    rec.values
        .into_iter()
        .zip(columns)
        .map(|(v, column)| match v {
            Value::Text(t) => Ok(t),
            Value::Null => Err(fail(column, "is missing or null".into())),
            Value::Int(i) => Ok(i.to_string()),
            Value::Invalid { reason, .. } => Err(fail(column, reason)),
        })
        .collect()
}

/// Streams `input`'s rows of `columns`, `batch` at a time, through `each`.
fn each_chunk(
    input: &Path,
    columns: &[String],
    batch: usize,
    mut each: impl FnMut(Vec<Vec<String>>) -> Result<(), PredictError>,
) -> Result<u64, PredictError> {
    let specs: Vec<ColumnSpec> = columns.iter().map(|c| ColumnSpec::text(c)).collect();
    let mut reader = source::open(input, &specs, batch.max(1))?;
    let mut rows = 0;
    while let Some(chunk) = reader.next_chunk()? {
        let texts = chunk
            .into_iter()
            .map(|r| texts(input, r, columns))
            .collect::<Result<Vec<_>, _>>()?;
        rows += texts.len() as u64;
        each(texts)?;
    }
    Ok(rows)
}

fn classify(
    ckpt: &Checkpoint,
    input: &Path,
    out: &mut dyn Write,
    options: &PredictOptions,
) -> Result<PredictReport, PredictError> {
    let placeholder = ["LABEL_0".to_string()];
    let (model, report) =
        families::classifier(&ckpt.config, &ckpt.name(), &placeholder, Some(&ckpt.dir), 0)?;
    if let Some(Some(missing)) = report.map(|r| r.initialised.first().cloned()) {
        return Err(ModelError::Format(format!(
            "{}: has no classification head ({missing} is missing): train it first",
            ckpt.name()
        ))
        .into());
    }
    let engine = ModelEngine::for_inference(model, options.precision)?;
    let labels = engine.labels();
    let columns = options
        .columns
        .clone()
        .unwrap_or_else(|| vec!["text".into()]);
    let collate = ClsCollate {
        max_len: options.max_len,
        pad_id: pad_id(ckpt),
    };
    let rows = each_chunk(input, &columns, options.batch, |chunk| {
        let cls_rows = chunk
            .iter()
            .map(|t| {
                let (ids, types) = ckpt.encode(&t[0], t.get(1).map(String::as_str))?;
                let typed = types.iter().any(|&t| t != 0);
                Ok(ClsRow {
                    ids,
                    token_types: typed.then_some(types),
                    label: 0,
                })
            })
            .collect::<Result<Vec<_>, PredictError>>()?;
        let batch: ClassificationBatch = collate.batch(&cls_rows);
        let logits = engine.logits(&batch)?;
        for row in logits.chunks_exact(labels.len()) {
            let scores = probabilities(row);
            let best = memfit_nn::decoding::argmax(row) as usize;
            writeln!(out, "{}", json!({"label": labels[best], "scores": scores}))?;
        }
        Ok(())
    })?;
    Ok(PredictReport {
        task: "classification",
        rows,
    })
}

/// The model's pad id (`pad_token_id`: RoBERTa's positions count from it), else the tokenizer's
/// `[PAD]`/`<pad>`, else 0.
fn pad_id(ckpt: &Checkpoint) -> u32 {
    ckpt.config["pad_token_id"]
        .as_u64()
        .map(|p| p as u32)
        .or_else(|| {
            ["[PAD]", "<pad>"]
                .iter()
                .find_map(|t| ckpt.tokenizer.token_to_id(t))
        })
        .unwrap_or(0)
}

fn generate(
    ckpt: &Checkpoint,
    input: &Path,
    out: &mut dyn Write,
    options: &PredictOptions,
) -> Result<PredictReport, PredictError> {
    let (model, _) = families::seq2seq(&ckpt.config, &ckpt.name(), Some(&ckpt.dir), 0)?;
    let engine = ModelEngine::for_inference(model, options.precision)?;
    let eos = ckpt.config["eos_token_id"].as_u64().unwrap_or(1) as u32;
    let pad = pad_id(ckpt);
    let config = GenerateConfig {
        max_new_tokens: options.max_new_tokens,
        no_repeat_ngram: NO_REPEAT_NGRAM,
        repetition_penalty: REPETITION_PENALTY,
        eos_id: eos,
        stop: None,
    };
    let columns = options
        .columns
        .clone()
        .unwrap_or_else(|| vec!["prompt".into()]);
    let rows = each_chunk(input, &columns, options.batch, |chunk| {
        let sources = chunk
            .iter()
            .map(|t| Ok(ckpt.encode(&t[0], None)?.0))
            .collect::<Result<Vec<_>, PredictError>>()?;
        let outputs = engine.generate(&pad_rows(&sources, options.max_len, pad), &config)?;
        for ids in outputs {
            let text = ckpt.tokenizer.decode(&ids, true).map_err(|e| {
                ModelError::Io(format!(
                    "{}/tokenizer.json: decoding failed: {e}",
                    ckpt.name()
                ))
            })?;
            writeln!(out, "{}", json!({ "text": text }))?;
        }
        Ok(())
    })?;
    Ok(PredictReport {
        task: "seq2seq",
        rows,
    })
}

/// Source rows padded to the longest (at most `max_len`, the last token kept when cut).
fn pad_rows(rows: &[Vec<u32>], max_len: usize, pad: u32) -> TokenRows {
    let cls: Vec<ClsRow> = rows
        .iter()
        .map(|ids| ClsRow {
            ids: ids.clone(),
            token_types: None,
            label: 0,
        })
        .collect();
    ClsCollate {
        max_len,
        pad_id: pad,
    }
    .batch(&cls)
    .input
}
