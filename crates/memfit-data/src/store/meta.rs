//! `meta.json`: what a token store holds and how it was made. Written last, so a directory without
//! it (or with a different `format_version`) is not a store.

use serde::{Deserialize, Serialize};

/// Bumped whenever the layout of `tokens.bin`, `index.bin`, `labels.bin` or this file changes.
/// Still 1 with sentence pairs and causal-LM stores: those are new tasks and segment lists in the
/// same layout; every store written before them opens as it did, and the new fields of this file
/// are optional (an older memfit refuses the new stores with "segment names do not match the
/// task" or a parse error naming `causal-lm`).
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// Two segments per row: source (prompt) and target (response), each ending in EOS.
    Seq2seq,
    /// Two segments per row: source (instruction + input) and target (output), each ending in EOS.
    Chat,
    /// One segment per row (the text, with the tokenizer's own specials) and a label; sentence
    /// pairs have two segments, split where the token type id becomes 1 (the second is empty when
    /// the tokenizer gives every token type 0, as RoBERTa's does).
    Classification,
    /// Decoder-only training: two segments per row, the prompt (masked out of the loss; empty for
    /// plain text) and the response (ending in EOS), read as one sequence.
    #[serde(rename = "causal-lm")]
    CausalLm,
}

impl Task {
    /// Every task, for parsing and messages.
    pub const ALL: [Task; 4] = [
        Task::Seq2seq,
        Task::Chat,
        Task::Classification,
        Task::CausalLm,
    ];

    /// The names of a row's token sequences; `pair` for classification with a `text_pair`.
    pub fn segment_names(self, pair: bool) -> &'static [&'static str] {
        match self {
            Task::Seq2seq | Task::Chat => &["source", "target"],
            Task::Classification if pair => &["text", "text_pair"],
            Task::Classification => &["text"],
            Task::CausalLm => &["prompt", "response"],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Task::Seq2seq => "seq2seq",
            Task::Chat => "chat",
            Task::Classification => "classification",
            Task::CausalLm => "causal-lm",
        }
    }

    /// The task called `name` (as [`Task::name`] writes it).
    pub fn from_name(name: &str) -> Option<Task> {
        Task::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// A source file by content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFile {
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizerRef {
    pub path: String,
    pub sha256: String,
    pub vocab_size: usize,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
}

/// The options that shape the store's content (part of its fingerprint).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContentOptions {
    pub task: Task,
    pub columns: Vec<String>,
    pub max_len: Option<usize>,
    pub max_target_len: Option<usize>,
    pub on_invalid: String,
    /// Classification: the label names given up front (they fix the ids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_names: Option<Vec<String>>,
    /// Causal-LM: SHA-256 of the chat template and the special tokens it is rendered with
    /// (`None`: the plain format).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_sha256: Option<String>,
    /// The row limit rows over which were left out, when the policy leaves rows out (`skip`,
    /// `keep`); under `fail` a row over it stops the prepare, so it changes nothing written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_row_bytes: Option<u64>,
}

/// What happened to the source rows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowCounts {
    /// Rows read from all sources.
    pub read: u64,
    /// Rows in the store.
    pub written: u64,
    /// Rows with at least one segment cut to the maximum length.
    pub truncated: u64,
    /// Rows with an empty (or whitespace-only) text in a required column.
    pub empty: u64,
    /// Rows with a null, a wrong type, bad UTF-8 or an unparsable line.
    pub invalid: u64,
    /// Empty or invalid rows left out (`--on-invalid skip`).
    pub skipped: u64,
}

/// Token counts of one segment, EOS included.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LengthStats {
    pub min: u64,
    pub max: u64,
    pub mean: f64,
    /// Rows per bucket: bucket `k` counts lengths `≤ le` and above the previous bucket's `le`.
    pub histogram: Vec<HistogramBucket>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistogramBucket {
    pub le: u64,
    pub rows: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreMeta {
    pub format_version: u32,
    pub created_by: String,
    /// SHA-256 over sources, tokenizer and content options: equal fingerprints, equal stores.
    pub fingerprint: String,
    pub task: Task,
    /// Names of the token sequences of a row, e.g. `["source", "target"]`.
    pub segments: Vec<String>,
    /// Bytes per token in `tokens.bin`: 2 when every id fits in u16, else 4.
    pub token_width: u8,
    pub rows: u64,
    pub tokens: u64,
    pub eos_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub sources: Vec<SourceFile>,
    pub tokenizer: TokenizerRef,
    pub options: ContentOptions,
    pub counts: RowCounts,
    /// Per segment, in the order of `segments`.
    pub lengths: Vec<LengthStats>,
    /// Classification: label names by id when the source labels were strings (or names were
    /// given); empty for integer labels (see [`StoreMeta::label_names_by_id`]).
    pub label_names: Vec<String>,
    /// Classification: the number of classes (names given or found, else the largest integer
    /// label + 1). Absent in stores written before it: [`crate::TokenStore::num_labels`] then
    /// reads `labels.bin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_labels: Option<u32>,
    /// Causal-LM: how chat rows became text ("chat template FILE" or "plain (Alpaca)").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_format: Option<String>,
}

impl StoreMeta {
    /// Label names by id for `num_labels` classes: the store's names, else transformers' default
    /// `LABEL_0`, `LABEL_1`, … for integer labels.
    pub fn label_names_by_id(&self, num_labels: u32) -> Vec<String> {
        if self.label_names.is_empty() {
            (0..num_labels).map(|i| format!("LABEL_{i}")).collect()
        } else {
            self.label_names.clone()
        }
    }
}
