//! The demo tasks: data, a tokenizer and a tiny model written into one directory, which training
//! then reads like any user's data (JSONL → memfit-data token store). `memfit train` with no
//! arguments runs the seq2seq demo; `--demo classification` the classification one.
//!
//! - [`seq2seq`]        — Arabic numbers → Chinese numerals, a tiny T5.
//! - [`classification`] — short sentences → positive / negative / neutral, where "not" before a
//!   sentiment word flips it, a tiny BERT.

pub mod classification;
pub mod seq2seq;

use serde_json::Value;
use std::path::{Path, PathBuf};

/// Where a demo put its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoFiles {
    pub train: PathBuf,
    pub valid: PathBuf,
    pub tokenizer_dir: PathBuf,
    pub model_config: PathBuf,
}

impl DemoFiles {
    /// The file names inside `dir` (which is created, with its `tokenizer/`).
    fn in_dir(dir: &Path) -> std::io::Result<Self> {
        let tokenizer_dir = dir.join("tokenizer");
        std::fs::create_dir_all(&tokenizer_dir)?;
        Ok(Self {
            train: dir.join("train.jsonl"),
            valid: dir.join("valid.jsonl"),
            tokenizer_dir,
            model_config: dir.join("config.json"),
        })
    }
}

/// Writes `text` to `path` atomically.
fn write_text(path: &Path, text: String) -> std::io::Result<()> {
    crate::run_dir::write_atomic(path, text.as_bytes())
        .map_err(|e| std::io::Error::other(e.to_string()))
}

/// Writes `value` to `path` as pretty JSON, atomically.
fn write_json(path: &Path, value: Value) -> std::io::Result<()> {
    write_text(
        path,
        serde_json::to_string_pretty(&value).unwrap_or_default(),
    )
}
