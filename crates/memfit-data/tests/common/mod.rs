//! Test data the tests generate themselves: a word-level tokenizer with known ids, JSONL and
//! parquet sources.
#![allow(dead_code)]

pub mod shared;
pub mod special_tokenizers;

use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, GzipLevel};
use parquet::file::properties::WriterProperties;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Word `wK` has id `FIRST_WORD_ID + K`.
pub const FIRST_WORD_ID: u32 = 3;
pub const PAD: u32 = 0;
pub const EOS: u32 = 1;

/// A whitespace-split word-level tokenizer: [PAD]=0, [EOS]=1, [UNK]=2, then w0..w{words-1};
/// `specials` lets a test leave some out.
pub fn word_tokenizer(dir: &Path, words: usize, specials: &[&str]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, s) in ["[PAD]", "[EOS]", "[UNK]"].iter().enumerate() {
        if specials.contains(s) || *s == "[UNK]" {
            vocab.insert(s.to_string(), (id as u32).into());
            added.push(
                serde_json::json!({"id": id, "content": s, "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true}),
            );
        }
    }
    for k in 0..words {
        vocab.insert(format!("w{k}"), (FIRST_WORD_ID + k as u32).into());
    }
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    });
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, json.to_string()).unwrap();
    dir.to_path_buf()
}

/// The standard test tokenizer (all specials, 100 words).
pub fn tokenizer(dir: &Path) -> PathBuf {
    word_tokenizer(&dir.join("tok"), 100, &["[PAD]", "[EOS]"])
}

/// Text of words `ks`, e.g. [1, 2] → "w1 w2".
pub fn words(ks: &[u32]) -> String {
    ks.iter()
        .map(|k| format!("w{k}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Ids of `words(ks)`.
pub fn ids(ks: &[u32]) -> Vec<u32> {
    ks.iter().map(|k| FIRST_WORD_ID + k).collect()
}

pub fn write_jsonl(path: &Path, rows: &[serde_json::Value]) -> PathBuf {
    let text: Vec<String> = rows.iter().map(|r| r.to_string()).collect();
    std::fs::write(path, text.join("\n") + "\n").unwrap();
    path.to_path_buf()
}

/// Seq2seq rows whose prompt is words [i % 50, (i+1) % 50, ...] of length 1 + i % 7 and whose
/// response is 1 + i % 11 words.
pub fn seq2seq_row(i: usize) -> (Vec<u32>, Vec<u32>) {
    let src: Vec<u32> = (0..1 + i % 7).map(|k| ((i + k) % 50) as u32).collect();
    let tgt: Vec<u32> = (0..1 + i % 11).map(|k| ((i * 3 + k) % 97) as u32).collect();
    (src, tgt)
}

pub fn seq2seq_jsonl(path: &Path, n: usize) -> PathBuf {
    let rows: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            let (s, t) = seq2seq_row(i);
            serde_json::json!({"prompt": words(&s), "response": words(&t)})
        })
        .collect();
    write_jsonl(path, &rows)
}

/// A GZIP parquet file (like the ChatLM fixtures) with the given columns, `row_group` rows per
/// row group.
pub fn write_parquet(path: &Path, columns: Vec<(&str, ArrayRef)>, row_group: usize) -> PathBuf {
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let props = WriterProperties::builder()
        .set_compression(Compression::GZIP(GzipLevel::default()))
        .set_max_row_group_row_count(Some(row_group))
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    path.to_path_buf()
}

pub fn seq2seq_parquet(path: &Path, n: usize, row_group: usize) -> PathBuf {
    let (p, r): (Vec<String>, Vec<String>) = (0..n)
        .map(|i| {
            let (s, t) = seq2seq_row(i);
            (words(&s), words(&t))
        })
        .unzip();
    write_parquet(
        path,
        vec![
            ("prompt", Arc::new(StringArray::from(p)) as ArrayRef),
            ("response", Arc::new(StringArray::from(r)) as ArrayRef),
        ],
        row_group,
    )
}

pub fn string_array(v: Vec<Option<&str>>) -> ArrayRef {
    Arc::new(StringArray::from(v))
}

pub fn binary_array(v: Vec<Option<&[u8]>>) -> ArrayRef {
    Arc::new(BinaryArray::from(v))
}

pub fn int_array(v: Vec<Option<i64>>) -> ArrayRef {
    Arc::new(Int64Array::from(v))
}

/// Entries of `dir` whose names start with `.` (temporary build directories).
pub fn hidden_entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect()
}

/// A row read out of a store, owned (tests compare whole rows).
pub struct OwnedRow {
    pub source: Vec<u32>,
    pub target: Option<Vec<u32>>,
    pub label: Option<u32>,
}

impl OwnedRow {
    pub fn source(&self) -> Vec<u32> {
        self.source.clone()
    }
    pub fn target(&self) -> Option<Vec<u32>> {
        self.target.clone()
    }
    pub fn label(&self) -> Option<u32> {
        self.label
    }
    pub fn total_tokens(&self) -> usize {
        self.source.len() + self.target.as_ref().map_or(0, Vec::len)
    }
}

pub fn row(store: &memfit_data::TokenStore, i: usize) -> OwnedRow {
    let mut buf = memfit_data::RowBuf::default();
    let r = store.read_row(i, &mut buf).unwrap();
    OwnedRow {
        source: r.source().to_vec(),
        target: r.target().map(|t| t.to_vec()),
        label: r.label(),
    }
}
