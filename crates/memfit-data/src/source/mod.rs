//! Sources: parquet and JSONL files read one chunk (a batch of rows) at a time, so memory stays
//! bounded by the chunk, never the file.
//!
//! A reader is opened for a list of [`ColumnSpec`]s; it checks the columns exist with usable types
//! up front (a schema problem is an error before any row is read) and then yields [`Record`]s whose
//! `values` follow the order of the specs. Problems of a single row (a null, bad UTF-8, a JSON line
//! that does not parse) are not errors here: they come back as [`Value::Invalid`] or
//! [`Record::problem`], and the caller applies its `--on-invalid` policy.

mod jsonl;
mod messages;
mod parquet;

pub use messages::Message;

use crate::error::{DataError, Location, Result};
use std::path::Path;

/// What a column must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    /// UTF-8 text (parquet string/binary; JSON string).
    Text,
    /// A class label: an integer (≥ 0) or a string naming the class.
    Label,
    /// Causal-LM rows: a text (pretraining) or a conversation, a list of `{role, content}`
    /// messages (JSONL array; parquet `list<struct<role, content>>`).
    TextOrMessages,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnSpec {
    pub name: String,
    pub kind: ColumnKind,
}

impl ColumnSpec {
    pub fn text(name: &str) -> Self {
        ColumnSpec {
            name: name.to_string(),
            kind: ColumnKind::Text,
        }
    }
    pub fn label(name: &str) -> Self {
        ColumnSpec {
            name: name.to_string(),
            kind: ColumnKind::Label,
        }
    }
    pub fn text_or_messages(name: &str) -> Self {
        ColumnSpec {
            name: name.to_string(),
            kind: ColumnKind::TextOrMessages,
        }
    }
}

/// One cell.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Text(String),
    Int(i64),
    /// A conversation (a [`ColumnKind::TextOrMessages`] column), each message checked.
    Messages(Vec<Message>),
    /// The cell exists but cannot be used; the text says why (and, for `keep`, a lossy stand-in).
    Invalid {
        reason: String,
        lossy: String,
    },
}

/// One row, its cells in the order of the requested columns.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub location: Location,
    pub values: Vec<Value>,
    /// A problem with the whole row (a JSONL line that is not a JSON object); `values` are then all
    /// `Null`.
    pub problem: Option<String>,
}

/// A source opened for reading, chunk by chunk.
pub trait RecordReader: Send {
    /// The next chunk of rows, `None` at the end. Errors are fatal problems with the file.
    fn next_chunk(&mut self) -> Result<Option<Vec<Record>>>;
    /// Rows in the file, when the format says so up front (parquet does, JSONL does not).
    fn total_rows(&self) -> Option<u64>;
}

/// The kind of file, by extension, else by the parquet magic bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    Parquet,
    Jsonl,
}

impl SourceKind {
    pub fn detect(path: &Path) -> Result<Self> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(|e| e.to_ascii_lowercase());
        match ext.as_deref() {
            Some("parquet") | Some("pq") => return Ok(SourceKind::Parquet),
            Some("jsonl") | Some("ndjson") | Some("json") => return Ok(SourceKind::Jsonl),
            _ => {}
        }
        // Parquet files start with the magic "PAR1" (parquet-format spec).
        let mut magic = [0u8; 4];
        let mut file = std::fs::File::open(path).map_err(|e| DataError::read(path, e))?;
        let n = std::io::Read::read(&mut file, &mut magic).map_err(|e| DataError::read(path, e))?;
        if n == 4 && &magic == b"PAR1" {
            Ok(SourceKind::Parquet)
        } else {
            Ok(SourceKind::Jsonl)
        }
    }
}

/// Opens `path` for the given columns; `chunk_rows` bounds the rows held at once.
pub fn open(
    path: &Path,
    columns: &[ColumnSpec],
    chunk_rows: usize,
) -> Result<Box<dyn RecordReader>> {
    let chunk_rows = chunk_rows.max(1);
    Ok(match SourceKind::detect(path)? {
        SourceKind::Parquet => Box::new(parquet::ParquetReader::open(path, columns, chunk_rows)?),
        SourceKind::Jsonl => Box::new(jsonl::JsonlReader::open(path, columns, chunk_rows)?),
    })
}

/// The column names of `path` (parquet: its schema; JSONL: the keys of its first object), for
/// choosing a task's default columns.
pub fn column_names(path: &Path) -> Result<Vec<String>> {
    match SourceKind::detect(path)? {
        SourceKind::Parquet => parquet::column_names(path),
        SourceKind::Jsonl => jsonl::column_names(path),
    }
}

/// Turns raw bytes into a text cell, or an invalid one naming the first bad byte.
pub(crate) fn text_from_bytes(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(s) => Value::Text(s.to_string()),
        Err(e) => Value::Invalid {
            reason: format!("not valid UTF-8 (bad byte at offset {})", e.valid_up_to()),
            lossy: String::from_utf8_lossy(bytes).into_owned(),
        },
    }
}
