//! JSON Lines: one JSON object per line. Lines holding only whitespace are ignored (a trailing
//! newline is common); every other line is one record. A line over the row limit is counted to its
//! newline but never held: at most `max_row_bytes` of it are buffered ([`read_bounded_line`]).

use super::{
    CHUNK_BYTES, ColumnKind, ColumnSpec, ReadLimits, Record, RecordProblem, RecordReader, Value,
};
use crate::error::{DataError, Location, Result};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

/// UTF-8's byte order mark.
const BOM: &[u8] = &[0xef, 0xbb, 0xbf];

/// A parsed line: its object, or what is wrong with it.
type Parsed = std::result::Result<serde_json::Map<String, serde_json::Value>, RecordProblem>;

pub struct JsonlReader {
    path: PathBuf,
    reader: BufReader<File>,
    columns: Vec<ColumnSpec>,
    limits: ReadLimits,
    line_no: u64,
    line: Vec<u8>,
    /// The size of the line last read (without its newline).
    line_bytes: u64,
    /// The first record, read at open time to check the columns exist.
    pending: Option<Record>,
    /// The keys of the first object (sorted).
    first_keys: Vec<String>,
}

impl JsonlReader {
    pub fn open(path: &Path, columns: &[ColumnSpec], limits: ReadLimits) -> Result<Self> {
        let file = File::open(path).map_err(|e| DataError::read(path, e))?;
        let mut reader = JsonlReader {
            path: path.to_path_buf(),
            reader: BufReader::with_capacity(1 << 20, file),
            columns: columns.to_vec(),
            limits,
            line_no: 0,
            line: Vec::new(),
            line_bytes: 0,
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
    fn read_line_object(&mut self) -> Result<Option<Parsed>> {
        loop {
            let limit = self.limits.max_row_bytes;
            let Some(bytes) = read_bounded_line(&mut self.reader, &mut self.line, limit)
                .map_err(|e| DataError::read(&self.path, e))?
            else {
                return Ok(None);
            };
            self.line_no += 1;
            self.line_bytes = bytes;
            if bytes > limit {
                return Ok(Some(Err(RecordProblem::TooLarge { bytes, limit })));
            }
            if self.line.iter().all(|b| b.is_ascii_whitespace()) {
                continue;
            }
            // A byte order mark opening the file (Windows editors write one) is no part of a row.
            let bom = if self.line_no == 1 && self.line.starts_with(BOM) {
                BOM.len()
            } else {
                0
            };
            let parsed = match serde_json::from_slice::<serde_json::Value>(&self.line[bom..]) {
                Ok(serde_json::Value::Object(map)) => Ok(map),
                Ok(other) => Err(format!("not a JSON object but {}", json_type(&other))),
                Err(e) if std::str::from_utf8(&self.line).is_err() => {
                    Err(format!("not valid UTF-8 ({e})"))
                }
                Err(e) if self.line.windows(3).any(|w| w == BOM) => Err(format!(
                    "not valid JSON ({e}): it holds a byte order mark (U+FEFF) past the file's start"
                )),
                Err(e) => Err(format!("not valid JSON ({e})")),
            };
            return Ok(Some(parsed.map_err(RecordProblem::Unreadable)));
        }
    }

    fn record_from(&self, parsed: Parsed) -> Record {
        let location = Location::Line(self.line_no);
        let bytes = self.line_bytes;
        match parsed {
            Err(problem) => Record {
                location,
                values: vec![Value::Null; self.columns.len()],
                problem: Some(problem),
                bytes,
            },
            Ok(obj) => Record {
                location,
                values: self
                    .columns
                    .iter()
                    .map(|spec| cell(obj.get(&spec.name), spec.kind))
                    .collect(),
                problem: None,
                bytes,
            },
        }
    }
}

/// Reads one line into `line` (its newline included) and returns its size without the newline;
/// `None` at end of file. A line over `limit` bytes is read to its end but not kept: `line` is left
/// empty, and never holds more than `limit` + 1 bytes plus one buffer's worth.
fn read_bounded_line(
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
    limit: u64,
) -> std::io::Result<Option<u64>> {
    line.clear();
    let (mut total, mut keep) = (0u64, true);
    loop {
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok((total > 0).then_some(total));
        }
        let newline = buf.iter().position(|&b| b == b'\n');
        let take = newline.map_or(buf.len(), |i| i + 1);
        let content = newline.map_or(take, |i| i) as u64;
        if keep && total + content <= limit {
            line.extend_from_slice(&buf[..take]);
        } else if keep {
            // Over the limit: drop what was kept (and its memory) and only count the rest.
            keep = false;
            *line = Vec::new();
        }
        total += content;
        reader.consume(take);
        if newline.is_some() {
            return Ok(Some(total));
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
    let reader = JsonlReader::open(path, &[], ReadLimits::rows(1))?;
    if let Some(Record {
        problem: Some(problem @ RecordProblem::TooLarge { .. }),
        location,
        ..
    }) = reader.pending
    {
        return Err(DataError::RowTooLarge {
            path: path.to_path_buf(),
            location,
            reason: format!("{problem}; or name the columns with --columns"),
        });
    }
    Ok(reader.first_keys)
}

impl RecordReader for JsonlReader {
    fn next_chunk(&mut self) -> Result<Option<Vec<Record>>> {
        let mut out = Vec::with_capacity(self.limits.chunk_rows.min(1 << 16));
        let mut held = 0u64;
        if let Some(first) = self.pending.take() {
            held += first.bytes;
            out.push(first);
        }
        while out.len() < self.limits.chunk_rows && held < CHUNK_BYTES {
            match self.read_line_object()? {
                None => break,
                Some(parsed) => {
                    let record = self.record_from(parsed);
                    // An oversize line was not held.
                    if record.problem.is_none() {
                        held += record.bytes;
                    }
                    out.push(record);
                }
            }
        }
        Ok(if out.is_empty() { None } else { Some(out) })
    }

    fn total_rows(&self) -> Option<u64> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Lines of `text` read with a 4-byte buffer (a line spans many reads) under `limit`.
    fn lines(text: &str, limit: u64) -> Vec<(u64, String)> {
        let mut reader = BufReader::with_capacity(4, text.as_bytes());
        let mut line = Vec::new();
        let mut out = Vec::new();
        while let Some(size) = read_bounded_line(&mut reader, &mut line, limit).unwrap() {
            assert!(line.len() as u64 <= limit + 1, "held {} bytes", line.len());
            out.push((size, String::from_utf8(line.clone()).unwrap()));
        }
        out
    }

    #[test]
    fn a_line_over_the_limit_is_sized_but_not_held() {
        let long = "y".repeat(25);
        let text = format!("abc\n{long}\nlast");
        assert_eq!(
            lines(&text, 10),
            vec![(3, "abc\n".into()), (25, String::new()), (4, "last".into())]
        );
        // at the limit exactly it is kept
        assert_eq!(lines("0123456789\n", 10), vec![(10, "0123456789\n".into())]);
        assert_eq!(lines("", 10), vec![]);
    }

    #[test]
    fn an_oversize_line_becomes_a_problem_record_and_reading_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.jsonl");
        let mut f = File::create(&path).unwrap();
        writeln!(f, r#"{{"text": "ok"}}"#).unwrap();
        writeln!(f, r#"{{"text": "{}"}}"#, "z".repeat(100)).unwrap();
        writeln!(f, r#"{{"text": "fine"}}"#).unwrap();
        drop(f);
        let limits = ReadLimits {
            chunk_rows: 10,
            max_row_bytes: 50,
        };
        let mut reader = JsonlReader::open(&path, &[ColumnSpec::text("text")], limits).unwrap();
        let chunk = reader.next_chunk().unwrap().unwrap();
        assert_eq!(chunk.len(), 3);
        assert_eq!(chunk[0].values, vec![Value::Text("ok".into())]);
        assert_eq!(chunk[1].location, Location::Line(2));
        assert_eq!(
            chunk[1].problem,
            Some(RecordProblem::TooLarge {
                bytes: 112,
                limit: 50
            })
        );
        assert_eq!(chunk[1].values, vec![Value::Null]);
        assert_eq!(chunk[2].values, vec![Value::Text("fine".into())]);
    }

    #[test]
    fn a_byte_order_mark_opening_the_file_is_skipped_and_one_later_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bom.jsonl");
        let text = "\u{feff}{\"text\": \"first\"}\n\u{feff}{\"text\": \"second\"}\n";
        std::fs::write(&path, text).unwrap();
        let limits = ReadLimits {
            chunk_rows: 10,
            max_row_bytes: 1000,
        };
        let mut reader = JsonlReader::open(&path, &[ColumnSpec::text("text")], limits).unwrap();
        let chunk = reader.next_chunk().unwrap().unwrap();
        assert_eq!(chunk[0].values, vec![Value::Text("first".into())]);
        assert!(chunk[0].problem.is_none());
        let Some(RecordProblem::Unreadable(why)) = &chunk[1].problem else {
            panic!("{:?}", chunk[1].problem)
        };
        assert!(why.contains("byte order mark"), "{why}");
    }

    #[test]
    fn an_oversize_first_line_cannot_name_the_columns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.jsonl");
        let line = format!(
            "{{\"text\": \"{}\"}}\n",
            "z".repeat(super::super::DEFAULT_MAX_ROW_BYTES as usize)
        );
        std::fs::write(&path, line).unwrap();
        let e = column_names(&path).unwrap_err().to_string();
        assert!(
            e.contains("big.jsonl: line 1")
                && e.contains("--max-row-bytes")
                && e.contains("--columns"),
            "{e}"
        );
    }
}
