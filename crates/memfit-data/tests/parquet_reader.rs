//! The parquet reader against files arrow writes: cells of every supported layout come back as
//! the file holds them, across row groups and chunk boundaries.

mod common;

use arrow_array::builder::{ListBuilder, StringBuilder, StructBuilder};
use arrow_array::{ArrayRef, Int32Array, LargeStringArray, UInt32Array, UInt64Array};
use arrow_schema::{DataType, Field};
use memfit_data::source::{self, ColumnSpec, Message, Value};
use std::sync::Arc;

fn read_all(path: &std::path::Path, specs: &[ColumnSpec], chunk: usize) -> Vec<Vec<Value>> {
    let mut reader = source::open(path, specs, source::ReadLimits::rows(chunk)).unwrap();
    let mut rows = Vec::new();
    while let Some(chunk_rows) = reader.next_chunk().unwrap() {
        assert!(!chunk_rows.is_empty() && chunk_rows.len() <= chunk);
        for r in chunk_rows {
            assert_eq!(r.location, memfit_data::Location::Row(rows.len() as u64));
            rows.push(r.values);
        }
    }
    assert_eq!(Some(rows.len() as u64), reader.total_rows());
    rows
}

/// A conversation's messages as (role, content); `None` for a null list.
type Conversation<'a> = Option<&'a [(Option<&'a str>, &'a str)]>;

/// Conversations: two messages, a null list, an empty list, a message whose role is null.
fn conversations() -> ArrayRef {
    let fields = vec![
        Field::new("role", DataType::Utf8, true),
        Field::new("content", DataType::Utf8, true),
        Field::new("turn", DataType::Int32, true),
    ];
    let mut list = ListBuilder::new(StructBuilder::from_fields(fields, 4));
    let rows: [Conversation; 4] = [
        Some(&[(Some("user"), "hi"), (Some("assistant"), "hello")]),
        None,
        Some(&[]),
        Some(&[(None, "who?")]),
    ];
    for row in rows {
        for (role, content) in row.unwrap_or(&[]) {
            let s = list.values();
            let r = s.field_builder::<StringBuilder>(0).unwrap();
            match role {
                Some(role) => r.append_value(role),
                None => r.append_null(),
            }
            s.field_builder::<StringBuilder>(1)
                .unwrap()
                .append_value(content);
            s.field_builder::<arrow_array::builder::Int32Builder>(2)
                .unwrap()
                .append_value(7);
            s.append(true);
        }
        list.append(row.is_some());
    }
    Arc::new(list.finish())
}

#[test]
fn conversation_lists_keep_their_messages_nulls_and_empties() {
    let tmp = tempfile::tempdir().unwrap();
    let path = common::write_parquet(
        &tmp.path().join("c.parquet"),
        vec![("m", conversations())],
        3,
    );
    let rows = read_all(&path, &[ColumnSpec::text_or_messages("m")], 2);
    let cells: Vec<&Value> = rows.iter().map(|r| &r[0]).collect();
    assert_eq!(
        cells[0],
        &Value::Messages(vec![
            Message::new("user", "hi"),
            Message::new("assistant", "hello")
        ])
    );
    assert_eq!(cells[1], &Value::Null);
    assert_eq!(cells[2], &Value::Messages(vec![]));
    match cells[3] {
        Value::Invalid { reason, .. } => {
            assert!(reason.contains("`role` is not a string"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn labels_of_every_integer_width_and_sign_and_large_strings_read_as_written() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 23;
    let path = common::write_parquet(
        &tmp.path().join("l.parquet"),
        vec![
            (
                "a",
                Arc::new(Int32Array::from_iter(
                    (0..n).map(|i| (i % 5 != 3).then_some(i - 10)),
                )),
            ),
            (
                "b",
                Arc::new(UInt32Array::from_iter_values(
                    (0..n).map(|i| u32::MAX - i as u32),
                )) as ArrayRef,
            ),
            (
                "c",
                Arc::new(UInt64Array::from_iter_values(
                    (0..n).map(|i| u64::MAX - i as u64),
                )) as ArrayRef,
            ),
            (
                "t",
                Arc::new(LargeStringArray::from_iter_values(
                    (0..n).map(|i| format!("row {i}")),
                )),
            ),
        ],
        5,
    );
    let specs = ["a", "b", "c"].map(ColumnSpec::label);
    let specs = [&specs[..], &[ColumnSpec::text("t")]].concat();
    for chunk in [1, 4, 64] {
        let rows = read_all(&path, &specs, chunk);
        assert_eq!(rows.len(), n as usize);
        for (i, row) in rows.iter().enumerate() {
            let i = i as i64;
            let a = if i % 5 != 3 {
                Value::Int(i - 10)
            } else {
                Value::Null
            };
            let b = Value::Int(i64::from(u32::MAX) - i);
            let t = Value::Text(format!("row {i}"));
            assert_eq!(row, &vec![a, b, Value::Int(i64::MAX), t], "chunk {chunk}");
        }
    }
}

#[test]
fn columns_of_unusable_types_are_errors_naming_the_type() {
    let tmp = tempfile::tempdir().unwrap();
    let path = common::write_parquet(
        &tmp.path().join("f.parquet"),
        vec![(
            "x",
            Arc::new(arrow_array::Float32Array::from(vec![1.0])) as ArrayRef,
        )],
        5,
    );
    let e = source::open(
        &path,
        &[ColumnSpec::label("x")],
        source::ReadLimits::rows(4),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("f.parquet") && e.contains("`x`") && e.contains("FLOAT"),
        "{e}"
    );
    let path = common::write_parquet(
        &tmp.path().join("m.parquet"),
        vec![("m", conversations())],
        5,
    );
    let e = source::open(&path, &[ColumnSpec::text("m")], source::ReadLimits::rows(4))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("m.parquet") && e.contains("group"), "{e}");
}

/// The rows of `path` as (values, problem, bytes) under a row limit of `max_row_bytes`.
fn read_limited(
    path: &std::path::Path,
    specs: &[ColumnSpec],
    max_row_bytes: u64,
) -> Vec<(Vec<Value>, Option<source::RecordProblem>, u64)> {
    let limits = source::ReadLimits {
        chunk_rows: 2,
        max_row_bytes,
    };
    let mut reader = source::open(path, specs, limits).unwrap();
    let mut rows = Vec::new();
    while let Some(chunk) = reader.next_chunk().unwrap() {
        rows.extend(chunk.into_iter().map(|r| (r.values, r.problem, r.bytes)));
    }
    rows
}

#[test]
fn rows_over_the_limit_are_refused_by_their_size_texts_and_messages_alike() {
    let tmp = tempfile::tempdir().unwrap();
    let texts = ["short", &"x".repeat(40), "also short"];
    let path = common::write_parquet(
        &tmp.path().join("t.parquet"),
        vec![(
            "t",
            Arc::new(arrow_array::StringArray::from_iter_values(texts)) as ArrayRef,
        )],
        5,
    );
    let rows = read_limited(&path, &[ColumnSpec::text("t")], 10);
    assert_eq!(rows[0], (vec![Value::Text("short".into())], None, 5));
    let too_large = source::RecordProblem::TooLarge {
        bytes: 40,
        limit: 10,
    };
    assert_eq!(rows[1], (vec![Value::Null], Some(too_large), 40));
    assert_eq!(rows[2].1, None, "the rows after it read on");
    let message = rows[1].1.as_ref().unwrap().to_string();
    assert!(message.contains("40 bytes") && message.contains("--max-row-bytes"));

    // A conversation's size is its fields' bytes: "user"+"hi"+"assistant"+"hello" = 20.
    let path = common::write_parquet(
        &tmp.path().join("c.parquet"),
        vec![("m", conversations())],
        3,
    );
    let spec = [ColumnSpec::text_or_messages("m")];
    let rows = read_limited(&path, &spec, 19);
    assert_eq!(
        rows[0].1,
        Some(source::RecordProblem::TooLarge {
            bytes: 20,
            limit: 19
        })
    );
    assert_eq!(rows[1].1, None);
    let rows = read_limited(&path, &spec, 20);
    assert!(matches!(&rows[0].0[0], Value::Messages(m) if m.len() == 2));
}
