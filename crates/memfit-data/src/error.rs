//! One error type for the crate. Every message names the file, row, column or value at fault.
//!
//! [`DataError::is_bad_input`] separates the user's mistakes (exit 2 in the binary) from failures of
//! the machine (a full disk, a failed write: exit 1).

use std::path::{Path, PathBuf};

/// Where in a source a problem sits: parquet rows are 0-based (as pandas/pyarrow number them),
/// JSONL lines are 1-based (as editors number them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    Row(u64),
    Line(u64),
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Row(r) => write!(f, "row {r}"),
            Location::Line(l) => write!(f, "line {l}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: cannot write: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a readable {kind} file: {reason}", path.display())]
    Corrupt {
        path: PathBuf,
        kind: &'static str,
        reason: String,
    },
    #[error("{}: has no rows", path.display())]
    EmptySource { path: PathBuf },
    #[error("{}: no column `{column}` (columns: {available})", path.display())]
    MissingColumn {
        path: PathBuf,
        column: String,
        available: String,
    },
    #[error("{}: column `{column}` has type {found}, expected {expected}", path.display())]
    ColumnType {
        path: PathBuf,
        column: String,
        found: String,
        expected: &'static str,
    },
    #[error("{}: {location}, column `{column}`: {reason} (see --on-invalid)", path.display())]
    InvalidRow {
        path: PathBuf,
        location: Location,
        column: String,
        reason: String,
    },
    /// A row over the row limit where no policy can leave it out (tokenizer training, the
    /// columns of a first line).
    #[error("{}: {location}: {reason}", path.display())]
    RowTooLarge {
        path: PathBuf,
        location: Location,
        reason: String,
    },
    #[error("tokenizer {}: {reason}", path.display())]
    Tokenizer { path: PathBuf, reason: String },
    #[error("tokenizer {}: has no {role} token (tried {tried}); the {format} format needs one", path.display())]
    MissingSpecialToken {
        path: PathBuf,
        role: &'static str,
        tried: String,
        format: &'static str,
    },
    #[error("chat template {}: {reason}", path.display())]
    ChatTemplate { path: PathBuf, reason: String },
    /// A row the encoder refuses, encoded outside a source file (a source's rows become
    /// [`DataError::InvalidRow`], naming the file, row and column).
    #[error("{0}")]
    Row(crate::encode::RowProblem),
    #[error("token store {}: {reason}", path.display())]
    Store { path: PathBuf, reason: String },
    #[error("{0}")]
    Options(String),
    #[error("tokenizer training failed: {0}")]
    Training(String),
    /// Stopped from outside between two chunks (the memory guard); nothing was written.
    #[error("stopped: {0}")]
    Stopped(String),
}

impl DataError {
    /// True for problems with what the user handed us (exit 2); false for failures at run time.
    pub fn is_bad_input(&self) -> bool {
        !matches!(
            self,
            DataError::Write { .. } | DataError::Training(_) | DataError::Stopped(_)
        )
    }

    pub(crate) fn read(path: &Path, source: std::io::Error) -> Self {
        DataError::Read {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn write(path: &Path, source: std::io::Error) -> Self {
        DataError::Write {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn store(path: &Path, reason: impl Into<String>) -> Self {
        DataError::Store {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = DataError> = std::result::Result<T, E>;
