//! From source records to texts: which columns a task reads ([`Columns`]), the per-row rules and
//! the `--on-invalid` policy ([`RowRules`]), and the texts of a row ([`RowTexts`]) that the
//! [`crate::encode::RowEncoder`] turns into tokens.

mod columns;
mod rules;

pub use columns::{Columns, RowForm};
pub use rules::{MAX_LABELS, RowRules};

use crate::chat::Conversation;

/// What rows are read for: training rows carry their response (target, output, label);
/// prediction rows are only the model's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    #[default]
    Train,
    Predict,
}

/// What to do with a row that is empty (a blank required text) or invalid (null, wrong type,
/// bad UTF-8, unparsable line, bad label, a conversation without a response or that its chat
/// template refuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InvalidPolicy {
    /// Stop with an error naming the file, row and column (the default: nothing is dropped
    /// silently).
    #[default]
    Fail,
    /// Leave the row out; it is counted in meta.json.
    Skip,
    /// Keep the row with what it has (a null or bad text becomes its lossy text or empty); rows
    /// without a usable label, or that cannot be encoded at all, are still left out.
    Keep,
}

impl InvalidPolicy {
    pub fn name(self) -> &'static str {
        match self {
            InvalidPolicy::Fail => "fail",
            InvalidPolicy::Skip => "skip",
            InvalidPolicy::Keep => "keep",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Clean,
    Empty,
    Invalid,
}

/// A row ready to encode.
#[derive(Debug, Clone, PartialEq)]
pub enum RowTexts {
    /// seq2seq: the source and its target (`None` for prediction).
    Seq2seq {
        source: String,
        target: Option<String>,
    },
    /// Classification: a text or a pair, and the label id (`None` for prediction).
    Classification {
        text: String,
        text_pair: Option<String>,
        label: Option<u32>,
    },
    /// A chat row: seq2seq `chat` (instruction rows) or causal-LM (instruction rows or messages).
    Chat(Conversation),
    /// Causal-LM pretraining text: no prompt, every token trained.
    Text(String),
}
