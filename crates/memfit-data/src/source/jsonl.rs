//! JSON Lines: one JSON object per line. Lines holding only whitespace are ignored (a trailing
//! newline is common); every other line is one record.

use super::{ColumnKind, ColumnSpec, Record, RecordReader, Value};
use crate::error::{DataError, Location, Result};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

pub struct JsonlReader {
    path: PathBuf,
    reader: BufReader<File>,
    columns: Vec<ColumnSpec>,
    chunk_rows: usize,
    line_no: u64,
    line: Vec<u8>,
    /// The first record, read at open time to check the columns exist.
    pending: Option<Record>,
    /// The keys of the first object (sorted).
    first_keys: Vec<String>,
}

impl JsonlReader {
    pub fn open(path: &Path, columns: &[ColumnSpec], chunk_rows: usize) -> Result<Self> {
        let file = File::open(path).map_err(|e| DataError::read(path, e))?;
        let mut reader = JsonlReader {
            path: path.to_path_buf(),
            reader: BufReader::with_capacity(1 << 20, file),
            columns: columns.to_vec(),
            chunk_rows,
            line_no: 0,
            line: Vec::new(),
            pending: None,
            first_keys: Vec::new(),
        };
        // The first object defines the columns: a column it lacks is a missing column, not a null.
        match reader.read_line_object()? {
            None => {
                return Err(DataError::EmptySource {
                    path: path.to_path_buf(),
                });
            }
            Some(Ok(obj)) => {
                reader.first_keys = obj.keys().cloned().collect();
                for spec in columns {
                    if !obj.contains_key(&spec.name) {
                        let mut keys: Vec<&str> = obj.keys().map(|k| k.as_str()).collect();
                        keys.sort_unstable();
                        return Err(DataError::MissingColumn {
                            path: path.to_path_buf(),
                            column: spec.name.clone(),
                            available: keys.join(", "),
                        });
                    }
                }
                let rec = reader.record_from(Ok(obj));
                reader.pending = Some(rec);
            }
            Some(Err(problem)) => {
                let rec = reader.record_from(Err(problem));
                reader.pending = Some(rec);
            }
        }
        Ok(reader)
    }

    /// Reads the next non-blank line and parses it; `None` at end of file.
    fn read_line_object(
        &mut self,
    ) -> Result<Option<Result<serde_json::Map<String, serde_json::Value>, String>>> {
        loop {
            self.line.clear();
            let n = self
                .reader
                .read_until(b'\n', &mut self.line)
                .map_err(|e| DataError::read(&self.path, e))?;
            if n == 0 {
                return Ok(None);
            }
            self.line_no += 1;
            if self.line.iter().all(|b| b.is_ascii_whitespace()) {
                continue;
            }
            let parsed = match serde_json::from_slice::<serde_json::Value>(&self.line) {
                Ok(serde_json::Value::Object(map)) => Ok(map),
                Ok(other) => Err(format!("not a JSON object but {}", json_type(&other))),
                Err(e) if std::str::from_utf8(&self.line).is_err() => {
                    Err(format!("not valid UTF-8 ({e})"))
                }
                Err(e) => Err(format!("not valid JSON ({e})")),
            };
            return Ok(Some(parsed));
        }
    }

    fn record_from(
        &self,
        parsed: Result<serde_json::Map<String, serde_json::Value>, String>,
    ) -> Record {
        let location = Location::Line(self.line_no);
        match parsed {
            Err(problem) => Record {
                location,
                values: vec![Value::Null; self.columns.len()],
                problem: Some(problem),
            },
            Ok(obj) => Record {
                location,
                values: self
                    .columns
                    .iter()
                    .map(|spec| cell(obj.get(&spec.name), spec.kind))
                    .collect(),
                problem: None,
            },
        }
    }
}

fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

fn cell(v: Option<&serde_json::Value>, kind: ColumnKind) -> Value {
    match (v, kind) {
        (None, _) | (Some(serde_json::Value::Null), _) => Value::Null,
        (Some(serde_json::Value::String(s)), _) => Value::Text(s.clone()),
        (Some(other), ColumnKind::TextOrMessages) => super::messages::cell_from_json(other),
        (Some(serde_json::Value::Number(n)), ColumnKind::Label) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Invalid {
                reason: format!("label {n} is not an integer"),
                lossy: n.to_string(),
            },
        },
        (Some(other), ColumnKind::Text) => Value::Invalid {
            reason: format!("{} where a string was expected", json_type(other)),
            lossy: other.to_string(),
        },
        (Some(other), ColumnKind::Label) => Value::Invalid {
            reason: format!(
                "{} where an integer or string label was expected",
                json_type(other)
            ),
            lossy: other.to_string(),
        },
    }
}

/// The keys of the first object of `path`, sorted.
pub fn column_names(path: &Path) -> Result<Vec<String>> {
    // `open` reads the first object (and fails on an empty file).
    Ok(JsonlReader::open(path, &[], 1)?.first_keys)
}

impl RecordReader for JsonlReader {
    fn next_chunk(&mut self) -> Result<Option<Vec<Record>>> {
        let mut out = Vec::with_capacity(self.chunk_rows.min(1 << 16));
        if let Some(first) = self.pending.take() {
            out.push(first);
        }
        while out.len() < self.chunk_rows {
            match self.read_line_object()? {
                None => break,
                Some(parsed) => out.push(self.record_from(parsed)),
            }
        }
        Ok(if out.is_empty() { None } else { Some(out) })
    }

    fn total_rows(&self) -> Option<u64> {
        None
    }
}
