//! Parquet through the arrow reader: only the requested columns are decoded, one batch of
//! `chunk_rows` rows at a time (pages are read lazily, so even a single huge row group — the ChatLM
//! fixtures have one — never sits in memory whole). Every codec the `parquet` crate is built with
//! works, GZIP included.

use super::{ColumnKind, ColumnSpec, Record, RecordReader, Value, messages, text_from_bytes};
use crate::error::{DataError, Location, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use std::fs::File;
use std::path::{Path, PathBuf};

pub struct ParquetReader {
    path: PathBuf,
    reader: ParquetRecordBatchReader,
    columns: Vec<ColumnSpec>,
    total_rows: u64,
    next_row: u64,
}

fn text_type(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
    )
}

fn int_type(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
    )
}

impl ParquetReader {
    pub fn open(path: &Path, columns: &[ColumnSpec], chunk_rows: usize) -> Result<Self> {
        let corrupt = |e: parquet::errors::ParquetError| DataError::Corrupt {
            path: path.to_path_buf(),
            kind: "parquet",
            reason: e.to_string(),
        };
        let file = File::open(path).map_err(|e| DataError::read(path, e))?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(corrupt)?;
        let total_rows = u64::try_from(builder.metadata().file_metadata().num_rows()).unwrap_or(0);
        let schema = builder.schema().clone();
        let mut roots = Vec::with_capacity(columns.len());
        for spec in columns {
            let Some((idx, field)) = schema.column_with_name(&spec.name) else {
                let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                return Err(DataError::MissingColumn {
                    path: path.to_path_buf(),
                    column: spec.name.clone(),
                    available: names.join(", "),
                });
            };
            let dt = field.data_type();
            let ok = match spec.kind {
                ColumnKind::Text => text_type(dt),
                ColumnKind::Label => text_type(dt) || int_type(dt),
                ColumnKind::TextOrMessages => text_type(dt) || messages::is_messages_type(dt),
            };
            if !ok {
                return Err(DataError::ColumnType {
                    path: path.to_path_buf(),
                    column: spec.name.clone(),
                    found: dt.to_string(),
                    expected: match spec.kind {
                        ColumnKind::Text => "a string column",
                        ColumnKind::Label => "an integer or string column",
                        ColumnKind::TextOrMessages => {
                            "a string column or a list of {role, content} structs"
                        }
                    },
                });
            }
            roots.push(idx);
        }
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
        let reader = builder
            .with_projection(mask)
            .with_batch_size(chunk_rows)
            .build()
            .map_err(corrupt)?;
        if total_rows == 0 {
            return Err(DataError::EmptySource {
                path: path.to_path_buf(),
            });
        }
        Ok(ParquetReader {
            path: path.to_path_buf(),
            reader,
            columns: columns.to_vec(),
            total_rows,
            next_row: 0,
        })
    }
}

/// The column names in the schema of `path`.
pub fn column_names(path: &Path) -> Result<Vec<String>> {
    let file = File::open(path).map_err(|e| DataError::read(path, e))?;
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| DataError::Corrupt {
            path: path.to_path_buf(),
            kind: "parquet",
            reason: e.to_string(),
        })?;
    Ok(builder
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect())
}

/// The cell at `row` of `array`, whatever string/binary/integer layout the file used.
fn cell(array: &ArrayRef, row: usize) -> Value {
    if array.is_null(row) {
        return Value::Null;
    }
    macro_rules! int {
        ($t:ty) => {
            array
                .as_primitive_opt::<$t>()
                .map(|a| i64::try_from(a.value(row)).unwrap_or(i64::MAX))
        };
    }
    let int_value = match array.data_type() {
        DataType::Int8 => int!(Int8Type),
        DataType::Int16 => int!(Int16Type),
        DataType::Int32 => int!(Int32Type),
        DataType::Int64 => int!(Int64Type),
        DataType::UInt8 => int!(UInt8Type),
        DataType::UInt16 => int!(UInt16Type),
        DataType::UInt32 => int!(UInt32Type),
        DataType::UInt64 => int!(UInt64Type),
        _ => None,
    };
    if let Some(i) = int_value {
        return Value::Int(i);
    }
    if let Some(conversation) = messages::cell_from_arrow(array, row) {
        return conversation;
    }
    if let Some(a) = array.as_string_opt::<i32>() {
        return Value::Text(a.value(row).to_string());
    }
    if let Some(a) = array.as_string_opt::<i64>() {
        return Value::Text(a.value(row).to_string());
    }
    if let Some(a) = array.as_string_view_opt() {
        return Value::Text(a.value(row).to_string());
    }
    if let Some(a) = array.as_binary_opt::<i32>() {
        return text_from_bytes(a.value(row));
    }
    if let Some(a) = array.as_binary_opt::<i64>() {
        return text_from_bytes(a.value(row));
    }
    if let Some(a) = array.as_binary_view_opt() {
        return text_from_bytes(a.value(row));
    }
    // Unreachable after the schema check in `open`; still not a panic on user data.
    Value::Invalid {
        reason: format!("unsupported type {}", array.data_type()),
        lossy: String::new(),
    }
}

impl RecordReader for ParquetReader {
    fn next_chunk(&mut self) -> Result<Option<Vec<Record>>> {
        let batch = match self.reader.next() {
            None => return Ok(None),
            Some(Ok(b)) => b,
            Some(Err(e)) => {
                // Decoding errors (a truncated page, invalid UTF-8 in a string column) come per batch.
                return Err(DataError::Corrupt {
                    path: self.path.clone(),
                    kind: "parquet",
                    reason: format!("cannot decode rows from {} on: {e}", self.next_row),
                });
            }
        };
        let arrays: Vec<ArrayRef> =
            self.columns
                .iter()
                .map(|spec| {
                    batch.column_by_name(&spec.name).cloned().ok_or_else(|| {
                        DataError::MissingColumn {
                            path: self.path.clone(),
                            column: spec.name.clone(),
                            available: String::from("(lost in projection)"),
                        }
                    })
                })
                .collect::<Result<_>>()?;
        let n = batch.num_rows();
        let mut out = Vec::with_capacity(n);
        for r in 0..n {
            out.push(Record {
                location: Location::Row(self.next_row + r as u64),
                values: arrays.iter().map(|a| cell(a, r)).collect(),
                problem: None,
            });
        }
        self.next_row += n as u64;
        Ok(Some(out))
    }

    fn total_rows(&self) -> Option<u64> {
        Some(self.total_rows)
    }
}
