//! `meta.json`: what a token store holds and how it was made. Written last, so a directory without
//! it (or with a different `format_version`) is not a store.

use serde::{Deserialize, Serialize};

/// Bumped whenever the layout of `tokens.bin`, `index.bin`, `labels.bin` or this file changes.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// Two segments per row: source (prompt) and target (response), each ending in EOS.
    Seq2seq,
    /// Two segments per row: source (instruction + input) and target (output), each ending in EOS.
    Chat,
    /// One segment per row (the text, with the tokenizer's own specials) and a label.
    Classification,
}

impl Task {
    /// Token sequences per row.
    pub fn segments(self) -> usize {
        match self {
            Task::Seq2seq | Task::Chat => 2,
            Task::Classification => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Task::Seq2seq => "seq2seq",
            Task::Chat => "chat",
            Task::Classification => "classification",
        }
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
    /// Classification: label names by id when the source labels were strings; empty for integers.
    pub label_names: Vec<String>,
}
