//! Reading a chunk of rows from one row group, column by column, through parquet's column readers
//! (values with their definition and repetition levels): pages are read as the reader reaches them,
//! so a huge row group never sits in memory whole.

use super::super::{Message, Value, text_from_bytes};
use super::schema::{ColumnPlan, FlatValues};
use parquet::column::reader::{ColumnReader, ColumnReaderImpl};
use parquet::data_type::{ByteArrayType, DataType, Int32Type, Int64Type};
use parquet::errors::{ParquetError, Result};
use parquet::file::reader::RowGroupReader;

/// One cell and the bytes it takes in the file (text and message fields; 8 for a number). A value
/// over the row limit is not copied out of its page: it stays `Null`, its size counted, and the
/// row is refused by its size.
pub(super) struct Cell {
    pub value: Value,
    pub bytes: u64,
}

impl Cell {
    fn sized(value: Value, bytes: u64) -> Self {
        Cell { value, bytes }
    }
}

/// One requested column of the current row group.
pub(super) enum ColumnCursor {
    Flat {
        reader: Box<ColumnReader>,
        values: FlatValues,
    },
    /// A conversation column: one reader per string field of the element.
    Messages {
        leaves: Vec<(String, ColumnReader, i16)>,
        list_def: i16,
        element_def: i16,
    },
}

impl ColumnCursor {
    pub(super) fn open(group: &dyn RowGroupReader, plan: &ColumnPlan) -> Result<Self> {
        Ok(match plan {
            ColumnPlan::Flat { leaf, values } => ColumnCursor::Flat {
                reader: Box::new(group.get_column_reader(*leaf)?),
                values: *values,
            },
            ColumnPlan::Messages {
                fields,
                list_def,
                element_def,
            } => ColumnCursor::Messages {
                leaves: fields
                    .iter()
                    .map(|(name, leaf, def)| {
                        Ok((name.clone(), group.get_column_reader(*leaf)?, *def))
                    })
                    .collect::<Result<_>>()?,
                list_def: *list_def,
                element_def: *element_def,
            },
        })
    }

    /// The cells of the next (at most) `rows` rows; fewer only at the end of the row group. Values
    /// over `max_bytes` are sized but not copied.
    pub(super) fn read(&mut self, rows: usize, max_bytes: u64) -> Result<Vec<Cell>> {
        match self {
            ColumnCursor::Flat { reader, values } => read_flat(reader, *values, rows, max_bytes),
            ColumnCursor::Messages {
                leaves,
                list_def,
                element_def,
            } => read_messages(leaves, (*list_def, *element_def), rows, max_bytes),
        }
    }
}

/// A leaf's levels and values for some records: `def`/`rep` are empty where the column has no
/// such levels (a required or an unrepeated column).
struct Levels<V> {
    records: usize,
    def: Vec<i16>,
    rep: Vec<i16>,
    values: Vec<V>,
}

impl<V> Levels<V> {
    /// (repetition level, definition level) of each entry, `max_def` where the column has none.
    fn entries(&self, max_def: i16) -> impl Iterator<Item = (i16, i16)> + '_ {
        let n = self.def.len().max(self.values.len());
        (0..n).map(move |i| {
            (
                self.rep.get(i).copied().unwrap_or(0),
                self.def.get(i).copied().unwrap_or(max_def),
            )
        })
    }
}

fn read_levels<T: DataType>(r: &mut ColumnReaderImpl<T>, rows: usize) -> Result<Levels<T::T>> {
    let (mut def, mut rep, mut values) = (Vec::new(), Vec::new(), Vec::new());
    let (records, _, _) = r.read_records(rows, Some(&mut def), Some(&mut rep), &mut values)?;
    Ok(Levels {
        records,
        def,
        rep,
        values,
    })
}

fn unsupported() -> ParquetError {
    ParquetError::General("unsupported column type".into())
}

/// A top-level column's cells: null where undefined.
fn read_flat(
    reader: &mut ColumnReader,
    kind: FlatValues,
    rows: usize,
    max_bytes: u64,
) -> Result<Vec<Cell>> {
    fn cells<V>(levels: Levels<V>, cell: impl Fn(V) -> Cell) -> Vec<Cell> {
        let max_def = i16::from(!levels.def.is_empty());
        let defined: Vec<bool> = levels.entries(max_def).map(|(_, d)| d == max_def).collect();
        let mut values = levels.values.into_iter();
        let null = || Cell::sized(Value::Null, 0);
        defined
            .into_iter()
            .map(|d| {
                if d {
                    values.next().map_or_else(null, &cell)
                } else {
                    null()
                }
            })
            .collect()
    }
    let unsigned = kind == FlatValues::Unsigned;
    let int = |v: i64| Cell::sized(Value::Int(v), 8);
    Ok(match reader {
        ColumnReader::ByteArrayColumnReader(r) => cells(read_levels(r, rows)?, |v| {
            let bytes = v.data().len() as u64;
            if bytes > max_bytes {
                Cell::sized(Value::Null, bytes)
            } else {
                Cell::sized(text_from_bytes(v.data()), bytes)
            }
        }),
        ColumnReader::Int32ColumnReader(r) => cells(read_levels::<Int32Type>(r, rows)?, |v| {
            int(if unsigned {
                i64::from(v as u32)
            } else {
                i64::from(v)
            })
        }),
        ColumnReader::Int64ColumnReader(r) => cells(read_levels::<Int64Type>(r, rows)?, |v| {
            int(if unsigned {
                i64::try_from(v as u64).unwrap_or(i64::MAX)
            } else {
                v
            })
        }),
        _ => return Err(unsupported()),
    })
}

/// One row's messages as JSON objects, built field by field.
type Objects = Vec<serde_json::Map<String, serde_json::Value>>;

/// A conversation column's cells: each leaf adds its field to the elements of every row. A field
/// value over `max_bytes` is sized, not copied (the row is refused by its size).
fn read_messages(
    leaves: &mut [(String, ColumnReader, i16)],
    (list_def, element_def): (i16, i16),
    rows: usize,
    max_bytes: u64,
) -> Result<Vec<Cell>> {
    let mut conversations: Vec<Option<Objects>> = Vec::new();
    let mut bad_text: Vec<Option<String>> = Vec::new();
    let mut sizes: Vec<u64> = Vec::new();
    for (k, (name, reader, max_def)) in leaves.iter_mut().enumerate() {
        let ColumnReader::ByteArrayColumnReader(r) = reader else {
            return Err(unsupported());
        };
        let levels = read_levels::<ByteArrayType>(r, rows)?;
        if k > 0 && levels.records != conversations.len() {
            return Err(ParquetError::General(format!(
                "field `{name}` has {} rows where the first field has {}",
                levels.records,
                conversations.len()
            )));
        }
        let mut values = levels.values.iter();
        let (mut row, mut element) = (usize::MAX, 0usize);
        for (rep, def) in levels.entries(*max_def) {
            if rep == 0 {
                row = row.wrapping_add(1);
                element = 0;
                if k == 0 {
                    conversations.push((def >= list_def).then(Vec::new));
                    bad_text.push(None);
                    sizes.push(0);
                }
            }
            if def < element_def {
                continue; // a null or empty list: no element
            }
            let value = if def == *max_def {
                let bytes = values
                    .next()
                    .ok_or_else(|| ParquetError::General("missing value".into()))?;
                if let Some(size) = sizes.get_mut(row) {
                    *size += bytes.data().len() as u64;
                }
                if bytes.data().len() as u64 > max_bytes {
                    // sized, not copied: the row is refused by its size
                    serde_json::Value::Null
                } else {
                    let text = String::from_utf8_lossy(bytes.data());
                    if let (std::borrow::Cow::Owned(_), Some(slot)) = (&text, bad_text.get_mut(row))
                    {
                        *slot = Some(format!("message {element}: `{name}` is not valid UTF-8"));
                    }
                    text.into_owned().into()
                }
            } else {
                serde_json::Value::Null
            };
            let Some(Some(objects)) = conversations.get_mut(row) else {
                return Err(ParquetError::General(format!(
                    "field `{name}`: rows out of step"
                )));
            };
            if k == 0 {
                objects.push(serde_json::Map::new());
            }
            let Some(object) = objects.get_mut(element) else {
                return Err(ParquetError::General(format!(
                    "field `{name}`: elements out of step"
                )));
            };
            object.insert(name.clone(), value);
            element += 1;
        }
    }
    Ok(conversations
        .into_iter()
        .zip(bad_text)
        .zip(sizes)
        .map(|(conversation, bytes)| Cell::sized(conversation_cell(conversation), bytes))
        .collect())
}

fn conversation_cell((objects, bad_text): (Option<Objects>, Option<String>)) -> Value {
    let Some(objects) = objects else {
        return Value::Null;
    };
    if let Some(reason) = bad_text {
        return Value::Invalid {
            reason,
            lossy: String::new(),
        };
    }
    let messages = objects
        .into_iter()
        .enumerate()
        .map(|(k, m)| Message::from_json(k, &serde_json::Value::Object(m)))
        .collect::<std::result::Result<Vec<_>, _>>();
    match messages {
        Ok(m) => Value::Messages(m),
        Err(reason) => Value::Invalid {
            reason,
            lossy: String::new(),
        },
    }
}
