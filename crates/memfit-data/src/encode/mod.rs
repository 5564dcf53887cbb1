//! Rows to tokens, for every task: the one place that decides what a row's token ids are, used by
//! `prepare` for the store and by `memfit predict` for a model's input, so the two cannot drift.
//!
//! ```no_run
//! use memfit_data::encode::{EncodeSettings, EncodedChunks, RowEncoder};
//! use memfit_data::rows::{Columns, InvalidPolicy, Mode};
//! use memfit_data::{Task, Tokenizer};
//! # fn main() -> Result<(), memfit_data::DataError> {
//! let input = std::path::PathBuf::from("valid.jsonl");
//! let tokenizer = Tokenizer::load("checkpoint/".as_ref())?;
//! let mut settings = EncodeSettings::new(Mode::Predict);
//! settings.max_len = Some(512);
//! let encoder = RowEncoder::new(tokenizer, Task::CausalLm, settings)?;
//! // Default columns for the task, chosen by what the file holds; `Mode::Predict` leaves out the
//! // response (output, label, target).
//! let columns = Columns::resolve(Task::CausalLm, Mode::Predict, None, Some(&input))?;
//! let limits = memfit_data::source::ReadLimits::rows(256);
//! let mut chunks = EncodedChunks::open(&encoder, &[input], columns, InvalidPolicy::Fail, None, limits)?;
//! while let Some(rows) = chunks.next_chunk()? {
//!     for (location, row) in rows {
//!         let prompt = row.causal().map(|r| r.ids); // the prompt, generation prompt included
//!         # let _ = (location, prompt);
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! What each task's row becomes:
//! - seq2seq / chat: source ids + EOS and target ids + EOS, each cut to its maximum with EOS kept
//!   last; no post-processor ([`seq2seq`]).
//! - classification: the tokenizer's own encoding of the text or pair, specials included, cut by
//!   the tokenizer's longest-first truncation ([`classification`]).
//! - causal-lm: prompt + response (+ EOS) as one sequence with the prompt's length; prompts cut
//!   from the left to fit ([`causal`]).

mod causal;
mod chunks;
mod classification;
mod seq2seq;

pub use chunks::{EncodedChunks, TOKENIZE_BYTES_PER_TEXT_BYTE};

use crate::chat::PromptFormat;
use crate::error::{DataError, Result};
use crate::rows::{Mode, RowTexts};
use crate::store::{CausalRow, Task, token_types};
use crate::tokenizer::Tokenizer;
use std::path::PathBuf;

/// How rows are encoded, beyond the task.
#[derive(Debug, Clone, Default)]
pub struct EncodeSettings {
    pub mode: Mode,
    /// Maximum tokens of a row (seq2seq: of the source, EOS included; classification: of the text
    /// or pair, specials included; causal-lm: of prompt + response + EOS). `None`: no limit.
    pub max_len: Option<usize>,
    /// Seq2seq/chat: maximum tokens of the target, EOS included; defaults to `max_len`.
    pub max_target_len: Option<usize>,
    /// Causal-LM: a chat template file to use instead of the tokenizer's own.
    pub chat_template: Option<PathBuf>,
}

impl EncodeSettings {
    pub fn new(mode: Mode) -> Self {
        EncodeSettings {
            mode,
            ..Default::default()
        }
    }
}

/// A row's tokens, by task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowTokens {
    /// Source and target (`None` in prediction), each ending in EOS.
    Seq2seq {
        source: Vec<u32>,
        target: Option<Vec<u32>>,
    },
    /// The text or pair with the tokenizer's specials; `second` is where the token type id becomes
    /// 1 (`ids.len()` when every type is 0); `pair` says whether the row is a pair; `label` is
    /// `None` in prediction.
    Classification {
        ids: Vec<u32>,
        second: usize,
        pair: bool,
        label: Option<u32>,
    },
    /// Prompt + response + EOS with the prompt's length; in prediction, the prompt alone (with
    /// the generation prompt) and `prompt_len == ids.len()`.
    CausalLm(CausalRow),
}

/// One encoded row, and whether it was cut to fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedRow {
    pub tokens: RowTokens,
    pub truncated: bool,
}

impl EncodedRow {
    /// The segments as the token store holds them (see [`crate::store`]).
    pub fn segments(&self) -> Vec<&[u32]> {
        match &self.tokens {
            RowTokens::Seq2seq { source, target } => {
                let mut s = vec![source.as_slice()];
                s.extend(target.as_deref());
                s
            }
            RowTokens::Classification {
                ids, second, pair, ..
            } if *pair => vec![&ids[..*second], &ids[*second..]],
            RowTokens::Classification { ids, .. } => vec![ids.as_slice()],
            RowTokens::CausalLm(r) => vec![&r.ids[..r.prompt_len], &r.ids[r.prompt_len..]],
        }
    }

    /// The classification label (`None` for other tasks and in prediction).
    pub fn label(&self) -> Option<u32> {
        match &self.tokens {
            RowTokens::Classification { label, .. } => *label,
            _ => None,
        }
    }

    /// Classification: ids and token type ids (`None` when all 0), as a model takes them.
    pub fn classification_input(&self) -> Option<(&[u32], Option<Vec<u32>>)> {
        match &self.tokens {
            RowTokens::Classification { ids, second, .. } => {
                Some((ids, token_types(*second, ids.len())))
            }
            _ => None,
        }
    }

    /// Causal-LM: the sequence and its prompt length.
    pub fn causal(&self) -> Option<CausalRow> {
        match &self.tokens {
            RowTokens::CausalLm(r) => Some(r.clone()),
            _ => None,
        }
    }
}

/// Why one row cannot be encoded (no response, a template that refuses it, …): the caller adds
/// the file, row and column.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct RowProblem {
    pub reason: String,
}

impl RowProblem {
    pub(crate) fn new(reason: impl Into<String>) -> Self {
        RowProblem {
            reason: reason.into(),
        }
    }
}

/// A row's encoding or the problem that kept it from one.
pub type RowResult = std::result::Result<EncodedRow, RowProblem>;

enum TaskEncoder {
    Seq2seq(seq2seq::Seq2seqEncoder),
    Classification(Box<classification::ClassificationEncoder>),
    CausalLm(causal::CausalEncoder),
}

/// Encodes rows of one task with one tokenizer (see the module doc).
pub struct RowEncoder {
    tokenizer: Tokenizer,
    task: Task,
    mode: Mode,
    inner: TaskEncoder,
}

impl RowEncoder {
    /// Checks the tokenizer has what the task needs (EOS for seq2seq and causal-lm; classification
    /// specials its post-processor adds) and that the maxima leave room for them.
    pub fn new(tokenizer: Tokenizer, task: Task, settings: EncodeSettings) -> Result<Self> {
        let inner = match task {
            Task::Seq2seq | Task::Chat => {
                TaskEncoder::Seq2seq(seq2seq::Seq2seqEncoder::new(&tokenizer, task, &settings)?)
            }
            Task::Classification => TaskEncoder::Classification(Box::new(
                classification::ClassificationEncoder::new(&tokenizer, &settings)?,
            )),
            Task::CausalLm => {
                TaskEncoder::CausalLm(causal::CausalEncoder::new(&tokenizer, &settings)?)
            }
        };
        Ok(RowEncoder {
            tokenizer,
            task,
            mode: settings.mode,
            inner,
        })
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn task(&self) -> Task {
        self.task
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Causal-LM: how chat rows become text.
    pub fn prompt_format(&self) -> Option<&PromptFormat> {
        match &self.inner {
            TaskEncoder::CausalLm(c) => Some(c.format()),
            _ => None,
        }
    }

    /// The EOS id rows end with (seq2seq, chat, causal-lm).
    pub fn eos_id(&self) -> Option<u32> {
        match &self.inner {
            TaskEncoder::Seq2seq(s) => Some(s.eos()),
            TaskEncoder::CausalLm(c) => Some(c.eos()),
            TaskEncoder::Classification(_) => self.tokenizer.eos().map(|e| e.id),
        }
    }

    /// One row; a row problem becomes [`DataError::Row`].
    pub fn encode(&self, row: &RowTexts) -> Result<EncodedRow> {
        let mut out = self.encode_batch(std::slice::from_ref(row))?;
        out.pop()
            .unwrap_or_else(|| Err(RowProblem::new("nothing encoded")))
            .map_err(DataError::Row)
    }

    /// Many rows at once (tokenized in parallel); the outer error is a tokenizer failure, the
    /// inner ones are the rows' own problems, in order.
    pub fn encode_batch(&self, rows: &[RowTexts]) -> Result<Vec<RowResult>> {
        let wrong = |row: &RowTexts| {
            Err(RowProblem::new(format!(
                "a {} row cannot be encoded for {}",
                row_kind(row),
                self.task.name()
            )))
        };
        match &self.inner {
            TaskEncoder::Seq2seq(s) => s.encode_batch(&self.tokenizer, rows, self.mode, wrong),
            TaskEncoder::Classification(c) => c.encode_batch(&self.tokenizer, rows, wrong),
            TaskEncoder::CausalLm(c) => c.encode_batch(&self.tokenizer, rows, self.mode, wrong),
        }
    }
}

fn row_kind(row: &RowTexts) -> &'static str {
    match row {
        RowTexts::Seq2seq { .. } => "seq2seq",
        RowTexts::Classification { .. } => "classification",
        RowTexts::Chat(_) => "chat",
        RowTexts::Text(_) => "plain-text",
    }
}
