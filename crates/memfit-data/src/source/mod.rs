//! Sources: parquet and JSONL files read one chunk (a batch of rows) at a time, so memory stays
//! bounded by the chunk, never the file.
//!
//! A reader is opened for a list of [`ColumnSpec`]s; it checks the columns exist with usable types
//! up front (a schema problem is an error before any row is read) and then yields [`Record`]s whose
//! `values` follow the order of the specs. Problems of a single row (a null, bad UTF-8, a JSON line
//! that does not parse) are not errors here: they come back as [`Value::Invalid`] or
//! [`Record::problem`], and the caller applies its `--on-invalid` policy.
//!
//! Rows are bounded ([`ReadLimits`]): a row over `max_row_bytes` is never held whole — a JSONL line
//! is read up to the limit and the rest skipped to its newline, a parquet value's length is checked
//! before it is copied — and comes back as [`RecordProblem::TooLarge`], naming its size and the
//! limit. A JSONL chunk also closes once its lines hold [`CHUNK_BYTES`], whatever its row count.

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

/// The largest row read by default (`--max-row-bytes`): 1 MiB of a JSONL line, or of a parquet
/// row's requested cells. Tokenizing a row costs up to ~180× its bytes (issue 29 measured a 50 MB
/// line at 9 GiB of RSS), so this bounds one row's tokenization to under ~200 MiB; rows of any task
/// memfit trains (a few thousand tokens) are far below it.
pub const DEFAULT_MAX_ROW_BYTES: u64 = 1 << 20;

/// A JSONL chunk closes once its lines hold this many bytes, even below `chunk_rows`: 2048 rows near
/// the row limit would otherwise be 2 GiB of text in flight.
pub const CHUNK_BYTES: u64 = 16 << 20;

/// How much a reader holds at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLimits {
    /// Rows per chunk.
    pub chunk_rows: usize,
    /// A row over this many bytes is refused ([`RecordProblem::TooLarge`]) without being held whole.
    pub max_row_bytes: u64,
}

impl ReadLimits {
    /// `chunk_rows` per chunk, rows up to [`DEFAULT_MAX_ROW_BYTES`].
    pub fn rows(chunk_rows: usize) -> Self {
        ReadLimits {
            chunk_rows,
            max_row_bytes: DEFAULT_MAX_ROW_BYTES,
        }
    }
}

/// What is wrong with a whole row; its `values` are then all `Null`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordProblem {
    /// A JSONL line that is not a JSON object (the text says why).
    Unreadable(String),
    /// A row over the row limit: it was skipped, not held.
    TooLarge { bytes: u64, limit: u64 },
}

impl std::fmt::Display for RecordProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordProblem::Unreadable(reason) => f.write_str(reason),
            RecordProblem::TooLarge { bytes, limit } => write!(
                f,
                "the row is {bytes} bytes ({}), over the row limit of {limit} bytes ({}; see \
                 --max-row-bytes)",
                mib(*bytes),
                mib(*limit)
            ),
        }
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// One row, its cells in the order of the requested columns.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub location: Location,
    pub values: Vec<Value>,
    /// A problem with the whole row; `values` are then all `Null`.
    pub problem: Option<RecordProblem>,
    /// The row's size as read: a JSONL line's bytes, a parquet row's requested cells' bytes.
    pub bytes: u64,
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

/// Opens `path` for the given columns; `limits` bound the rows held at once and each row's size.
pub fn open(
    path: &Path,
    columns: &[ColumnSpec],
    limits: ReadLimits,
) -> Result<Box<dyn RecordReader>> {
    let limits = ReadLimits {
        chunk_rows: limits.chunk_rows.max(1),
        ..limits
    };
    Ok(match SourceKind::detect(path)? {
        SourceKind::Parquet => Box::new(parquet::ParquetReader::open(path, columns, limits)?),
        SourceKind::Jsonl => Box::new(jsonl::JsonlReader::open(path, columns, limits)?),
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
