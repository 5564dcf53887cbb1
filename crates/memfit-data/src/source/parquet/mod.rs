//! Parquet through the `parquet` crate's column readers (no arrow: it doubled the build): only the
//! requested columns are decoded, `chunk_rows` rows at a time, pages read as they are reached (so
//! even a single huge row group — the ChatLM fixtures have one — never sits in memory whole). Every
//! codec the `parquet` crate is built with works, GZIP included.

mod columns;
mod schema;

use super::{ColumnSpec, ReadLimits, Record, RecordProblem, RecordReader, Value};
use crate::error::{DataError, Location, Result};
use columns::{Cell, ColumnCursor};
use parquet::errors::ParquetError;
use parquet::file::reader::{FileReader, SerializedFileReader};
use schema::ColumnPlan;
use std::fs::File;
use std::path::{Path, PathBuf};

pub struct ParquetReader {
    path: PathBuf,
    file: SerializedFileReader<File>,
    plans: Vec<ColumnPlan>,
    limits: ReadLimits,
    /// The row group being read and its columns' cursors (`None` before it is opened).
    group: usize,
    cursors: Option<Vec<ColumnCursor>>,
    total_rows: u64,
    next_row: u64,
}

fn open_file(path: &Path) -> Result<SerializedFileReader<File>> {
    let file = File::open(path).map_err(|e| DataError::read(path, e))?;
    SerializedFileReader::new(file).map_err(|e| corrupt(path, e.to_string()))
}

fn corrupt(path: &Path, reason: String) -> DataError {
    DataError::Corrupt {
        path: path.to_path_buf(),
        kind: "parquet",
        reason,
    }
}

impl ParquetReader {
    pub fn open(path: &Path, columns: &[ColumnSpec], limits: ReadLimits) -> Result<Self> {
        let file = open_file(path)?;
        let meta = file.metadata().file_metadata();
        let plans = schema::plan(path, meta.schema_descr(), columns)?;
        let total_rows = u64::try_from(meta.num_rows()).unwrap_or(0);
        if total_rows == 0 {
            return Err(DataError::EmptySource {
                path: path.to_path_buf(),
            });
        }
        Ok(ParquetReader {
            path: path.to_path_buf(),
            file,
            plans,
            limits,
            group: 0,
            cursors: None,
            total_rows,
            next_row: 0,
        })
    }

    /// The next rows of the current row group, moving on to the next group when it is done;
    /// `None` after the last group.
    fn read_rows(&mut self) -> std::result::Result<Option<Vec<Vec<Cell>>>, ParquetError> {
        while self.group < self.file.num_row_groups() {
            if self.cursors.is_none() {
                let group = self.file.get_row_group(self.group)?;
                let cursors = self.plans.iter().map(|p| ColumnCursor::open(&*group, p));
                self.cursors = Some(cursors.collect::<std::result::Result<_, _>>()?);
            }
            let cursors = self.cursors.as_mut().expect("opened above");
            let columns = cursors
                .iter_mut()
                .map(|c| c.read(self.limits.chunk_rows, self.limits.max_row_bytes))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let rows = columns.first().map_or(0, Vec::len);
            if columns.iter().any(|c| c.len() != rows) {
                return Err(ParquetError::General(
                    "the columns of a row group have different row counts".into(),
                ));
            }
            if rows > 0 {
                return Ok(Some(transpose(columns, rows)));
            }
            self.group += 1;
            self.cursors = None;
        }
        Ok(None)
    }
}

/// Column-major cells into rows.
fn transpose(columns: Vec<Vec<Cell>>, rows: usize) -> Vec<Vec<Cell>> {
    let mut out: Vec<Vec<Cell>> = (0..rows)
        .map(|_| Vec::with_capacity(columns.len()))
        .collect();
    for column in columns {
        for (row, cell) in out.iter_mut().zip(column) {
            row.push(cell);
        }
    }
    out
}

/// The column names in the schema of `path`.
pub fn column_names(path: &Path) -> Result<Vec<String>> {
    let file = open_file(path)?;
    let schema = file.metadata().file_metadata().schema_descr();
    Ok(schema
        .root_schema()
        .get_fields()
        .iter()
        .map(|f| f.name().to_string())
        .collect())
}

/// A row of cells as a record: refused whole ([`RecordProblem::TooLarge`]) when its cells' bytes
/// sum over `limit` (a cell over the limit alone was never copied out of its page).
fn record(location: Location, cells: Vec<Cell>, limit: u64) -> Record {
    let bytes: u64 = cells.iter().map(|c| c.bytes).sum();
    if bytes > limit {
        return Record {
            location,
            values: vec![Value::Null; cells.len()],
            problem: Some(RecordProblem::TooLarge { bytes, limit }),
            bytes,
        };
    }
    Record {
        location,
        values: cells.into_iter().map(|c| c.value).collect(),
        problem: None,
        bytes,
    }
}

impl RecordReader for ParquetReader {
    fn next_chunk(&mut self) -> Result<Option<Vec<Record>>> {
        let rows = self.read_rows().map_err(|e| {
            // Decoding errors (a truncated page, a bad encoding) come per chunk.
            corrupt(
                &self.path,
                format!("cannot decode rows from {} on: {e}", self.next_row),
            )
        })?;
        let Some(rows) = rows else { return Ok(None) };
        let first = self.next_row;
        self.next_row += rows.len() as u64;
        let limit = self.limits.max_row_bytes;
        Ok(Some(
            rows.into_iter()
                .enumerate()
                .map(|(r, cells)| record(Location::Row(first + r as u64), cells, limit))
                .collect(),
        ))
    }

    fn total_rows(&self) -> Option<u64> {
        Some(self.total_rows)
    }
}
