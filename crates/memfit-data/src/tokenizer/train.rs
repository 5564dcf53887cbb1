//! `memfit tokenizer train`: a BPE or Unigram tokenizer trained from text columns of parquet/JSONL
//! files, streamed chunk by chunk into the trainer (which keeps word counts, not the corpus).
//!
//! The pipeline mirrors the ChatLM tokenizer the seed used (`../shared/fixtures/chatlm/tokenizer`):
//! pre-tokenizers Whitespace → Punctuation (isolated) → Digits (one per token) → Metaspace ("▁",
//! prepended always), a Metaspace decoder, and the special tokens [`DEFAULT_SPECIALS`] first, so
//! their ids are 0..=6 as in the seed.

use crate::error::{DataError, Result};
use crate::fsutil::write_atomic;
use crate::source::{self, ColumnSpec, RecordProblem, Value};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::models::unigram::{Unigram, UnigramTrainerBuilder};
use tokenizers::models::{ModelWrapper, TrainerWrapper};
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::punctuation::Punctuation;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::whitespace::Whitespace;
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

/// The seed's special tokens, in id order: [PAD]=0 [EOS]=1 [SEP]=2 [BOS]=3 [CLS]=4 [MASK]=5 [UNK]=6.
pub const DEFAULT_SPECIALS: &[&str] = &[
    "[PAD]", "[EOS]", "[SEP]", "[BOS]", "[CLS]", "[MASK]", "[UNK]",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenizerModel {
    Bpe,
    Unigram,
}

#[derive(Debug, Clone)]
pub struct TrainOptions {
    pub inputs: Vec<PathBuf>,
    /// Text columns to learn from; every one that exists in a file must be a string column.
    pub columns: Vec<String>,
    pub vocab_size: usize,
    pub model: TokenizerModel,
    pub specials: Vec<String>,
    /// Name of the unknown token (must be one of `specials`).
    pub unk: String,
    pub eos: String,
    pub pad: String,
    /// Rows read per chunk.
    pub chunk_rows: usize,
    /// A row over this many bytes stops training with an error naming it, unread.
    pub max_row_bytes: u64,
    pub out: PathBuf,
}

impl TrainOptions {
    /// Options with the seed's special tokens and the `prompt`/`response` columns.
    pub fn new(inputs: Vec<PathBuf>, vocab_size: usize, out: PathBuf) -> Self {
        TrainOptions {
            inputs,
            columns: vec!["prompt".into(), "response".into()],
            vocab_size,
            model: TokenizerModel::Bpe,
            specials: DEFAULT_SPECIALS.iter().map(|s| s.to_string()).collect(),
            unk: "[UNK]".into(),
            eos: "[EOS]".into(),
            pad: "[PAD]".into(),
            chunk_rows: 4096,
            max_row_bytes: source::DEFAULT_MAX_ROW_BYTES,
            out,
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct TrainReport {
    pub out: PathBuf,
    pub model: TokenizerModel,
    pub vocab_size: usize,
    pub rows: u64,
    pub texts: u64,
    /// Cells that were null, empty or not text, left out of training.
    pub skipped_cells: u64,
}

/// Texts of all inputs, one chunk of rows in memory at a time. The trainer pulls from it; an error
/// stops the stream and is kept for the caller.
struct TextStream {
    inputs: Vec<(PathBuf, Vec<ColumnSpec>)>,
    limits: source::ReadLimits,
    next_input: usize,
    reader: Option<Box<dyn source::RecordReader>>,
    buffered: VecDeque<String>,
    error: Option<DataError>,
    rows: u64,
    texts: u64,
    skipped: u64,
}

impl TextStream {
    fn refill(&mut self) -> Result<bool> {
        loop {
            if self.reader.is_none() {
                let Some((path, columns)) = self.inputs.get(self.next_input) else {
                    return Ok(false);
                };
                self.next_input += 1;
                self.reader = Some(source::open(path, columns, self.limits)?);
            }
            let Some(reader) = self.reader.as_mut() else {
                return Ok(false);
            };
            match reader.next_chunk()? {
                None => self.reader = None,
                Some(chunk) => {
                    for rec in chunk {
                        if let Some(problem @ RecordProblem::TooLarge { .. }) = rec.problem {
                            let (path, _) = &self.inputs[self.next_input - 1];
                            return Err(DataError::RowTooLarge {
                                path: path.clone(),
                                location: rec.location,
                                reason: problem.to_string(),
                            });
                        }
                        self.rows += 1;
                        for v in rec.values {
                            match v {
                                Value::Text(t) if !t.trim().is_empty() => {
                                    self.texts += 1;
                                    self.buffered.push_back(t);
                                }
                                _ => self.skipped += 1,
                            }
                        }
                    }
                    if !self.buffered.is_empty() {
                        return Ok(true);
                    }
                }
            }
        }
    }
}

impl Iterator for TextStream {
    type Item = String;
    fn next(&mut self) -> Option<String> {
        if self.error.is_some() {
            return None;
        }
        if self.buffered.is_empty() {
            match self.refill() {
                Ok(true) => {}
                Ok(false) => return None,
                Err(e) => {
                    self.error = Some(e);
                    return None;
                }
            }
        }
        self.buffered.pop_front()
    }
}

fn pipeline(model: ModelWrapper) -> tokenizers::Tokenizer {
    let mut tok = tokenizers::Tokenizer::new(model);
    let metaspace = Metaspace::new('▁', PrependScheme::Always, true);
    tok.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
        PreTokenizerWrapper::Whitespace(Whitespace),
        PreTokenizerWrapper::Punctuation(Punctuation::new(SplitDelimiterBehavior::Isolated)),
        PreTokenizerWrapper::Digits(Digits::new(true)),
        PreTokenizerWrapper::Metaspace(metaspace.clone()),
    ]))));
    tok.with_decoder(Some(DecoderWrapper::Metaspace(metaspace)));
    tok
}

/// Which columns of a file to read: the requested ones it has (a file may lack some, e.g. a
/// classification file has no `response`), but at least one.
fn columns_for(path: &Path, wanted: &[String]) -> Result<Vec<ColumnSpec>> {
    // Opening with no columns reads only the schema / first line; then keep those present.
    let mut present = Vec::new();
    let mut last_err = None;
    for name in wanted {
        match source::open(path, &[ColumnSpec::text(name)], source::ReadLimits::rows(1)) {
            Ok(_) => present.push(ColumnSpec::text(name)),
            Err(e @ DataError::MissingColumn { .. }) => last_err = Some(e),
            Err(e) => return Err(e),
        }
    }
    match (present.is_empty(), last_err) {
        (true, Some(e)) => Err(e),
        _ => Ok(present),
    }
}

/// Trains a tokenizer and writes `tokenizer.json`, `tokenizer_config.json` and
/// `special_tokens_map.json` into `opts.out` (each file atomically).
pub fn train(opts: &TrainOptions) -> Result<TrainReport> {
    if opts.inputs.is_empty() {
        return Err(DataError::Options("no --input files given".into()));
    }
    for (role, name) in [("unk", &opts.unk), ("eos", &opts.eos), ("pad", &opts.pad)] {
        if !opts.specials.contains(name) {
            return Err(DataError::Options(format!(
                "the {role} token {name} is not among the special tokens ({})",
                opts.specials.join(", ")
            )));
        }
    }
    // The vocabulary must hold the specials plus some learned pieces.
    if opts.vocab_size <= opts.specials.len() + 1 {
        return Err(DataError::Options(format!(
            "--vocab-size {} is too small for {} special tokens",
            opts.vocab_size,
            opts.specials.len()
        )));
    }
    let specials: Vec<AddedToken> = opts
        .specials
        .iter()
        .map(|s| AddedToken::from(s.clone(), true))
        .collect();
    let (mut tokenizer, mut trainer) = match opts.model {
        TokenizerModel::Bpe => {
            let bpe = BPE::builder()
                .unk_token(opts.unk.clone())
                .build()
                .map_err(|e| DataError::Training(e.to_string()))?;
            let trainer = BpeTrainerBuilder::new()
                .vocab_size(opts.vocab_size)
                .special_tokens(specials)
                .show_progress(false)
                .build();
            (pipeline(bpe.into()), TrainerWrapper::BpeTrainer(trainer))
        }
        TokenizerModel::Unigram => {
            let trainer = UnigramTrainerBuilder::default()
                .vocab_size(u32::try_from(opts.vocab_size).unwrap_or(u32::MAX))
                .special_tokens(specials)
                .unk_token(Some(opts.unk.clone()))
                .show_progress(false)
                .build()
                .map_err(|e| DataError::Training(e.to_string()))?;
            (
                pipeline(Unigram::default().into()),
                TrainerWrapper::UnigramTrainer(trainer),
            )
        }
    };

    // Check every file and its columns before the (long) training starts.
    let mut plan = Vec::with_capacity(opts.inputs.len());
    for path in &opts.inputs {
        plan.push((path.clone(), columns_for(path, &opts.columns)?));
    }
    let mut stream = TextStream {
        inputs: plan,
        limits: source::ReadLimits {
            chunk_rows: opts.chunk_rows.max(1),
            max_row_bytes: opts.max_row_bytes,
        },
        next_input: 0,
        reader: None,
        buffered: VecDeque::new(),
        error: None,
        rows: 0,
        texts: 0,
        skipped: 0,
    };
    // One stream over every file: the trainers count words in `feed` and replace, not add, on a
    // second call.
    let trained = tokenizer.train(&mut trainer, &mut stream).map(|_| ());
    if let Some(e) = stream.error {
        return Err(e);
    }
    if stream.texts == 0 {
        return Err(DataError::Options(format!(
            "no text to learn from in columns {} of the inputs",
            opts.columns.join(", ")
        )));
    }
    trained.map_err(|e| DataError::Training(e.to_string()))?;

    std::fs::create_dir_all(&opts.out).map_err(|e| DataError::write(&opts.out, e))?;
    let json = tokenizer
        .to_string(true)
        .map_err(|e| DataError::Training(e.to_string()))?;
    write_atomic(&opts.out.join("tokenizer.json"), json.as_bytes())?;
    let (config, map) = transformers_configs(&opts.specials, &opts.eos, &opts.pad, &opts.unk);
    write_atomic(&opts.out.join("tokenizer_config.json"), config.as_bytes())?;
    write_atomic(&opts.out.join("special_tokens_map.json"), map.as_bytes())?;
    Ok(TrainReport {
        out: opts.out.clone(),
        model: opts.model,
        vocab_size: tokenizer.get_vocab_size(true),
        rows: stream.rows,
        texts: stream.texts,
        skipped_cells: stream.skipped,
    })
}

/// `tokenizer_config.json` and `special_tokens_map.json` as transformers' `PreTrainedTokenizerFast`
/// expects them (same shape as the ChatLM fixture's). Specials have ids 0.. in their given order.
fn transformers_configs(specials: &[String], eos: &str, pad: &str, unk: &str) -> (String, String) {
    let mut decoder = serde_json::Map::new();
    for (id, s) in specials.iter().enumerate() {
        decoder.insert(
            id.to_string(),
            serde_json::json!({"content": s, "lstrip": false, "normalized": false,
                "rstrip": false, "single_word": false, "special": true}),
        );
    }
    let config = serde_json::json!({
        "added_tokens_decoder": decoder,
        "clean_up_tokenization_spaces": true,
        "eos_token": eos,
        "pad_token": pad,
        "unk_token": unk,
        "tokenizer_class": "PreTrainedTokenizerFast",
    });
    let map = serde_json::json!({"eos_token": eos, "pad_token": pad, "unk_token": unk});
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default() + "\n";
    (pretty(&config), pretty(&map))
}
