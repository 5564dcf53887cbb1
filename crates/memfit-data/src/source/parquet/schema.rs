//! Which parquet columns can serve a [`ColumnSpec`], from the file's schema alone: a top-level
//! string/binary or integer leaf, or a conversation column (a LIST whose element is a group of
//! `role`, `content`, … leaves). Anything else is an error naming the column and its type.

use super::super::{ColumnKind, ColumnSpec};
use crate::error::{DataError, Result};
use parquet::basic::{ConvertedType, LogicalType, Repetition, Type as Physical};
use parquet::schema::types::{SchemaDescriptor, Type};
use std::path::Path;

/// How one requested column is read.
#[derive(Debug, Clone)]
pub(super) enum ColumnPlan {
    /// A top-level leaf: its column index and how its values become cells.
    Flat { leaf: usize, values: FlatValues },
    /// A list of structs: the string leaves of the element (name, column index, definition level
    /// of a present value) and the definition levels at which the list and an element exist.
    Messages {
        fields: Vec<(String, usize, i16)>,
        list_def: i16,
        element_def: i16,
    },
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum FlatValues {
    Bytes,
    Signed,
    /// Stored in a signed physical type, meant as unsigned (UINT_32 / UINT_64).
    Unsigned,
}

/// The plan for each spec, in order.
pub(super) fn plan(
    path: &Path,
    schema: &SchemaDescriptor,
    specs: &[ColumnSpec],
) -> Result<Vec<ColumnPlan>> {
    specs
        .iter()
        .map(|spec| plan_one(path, schema, spec))
        .collect()
}

fn plan_one(path: &Path, schema: &SchemaDescriptor, spec: &ColumnSpec) -> Result<ColumnPlan> {
    let roots = schema.root_schema().get_fields();
    let Some(field) = roots.iter().find(|f| f.name() == spec.name) else {
        let names: Vec<&str> = roots.iter().map(|f| f.name()).collect();
        return Err(DataError::MissingColumn {
            path: path.to_path_buf(),
            column: spec.name.clone(),
            available: names.join(", "),
        });
    };
    let flat = flat_values(field);
    let planned = match (spec.kind, flat) {
        (_, Some(FlatValues::Bytes)) | (ColumnKind::Label, Some(_)) => Some(ColumnPlan::Flat {
            leaf: leaf_index(schema, &[field.name()]),
            values: flat.unwrap_or(FlatValues::Bytes),
        }),
        (ColumnKind::TextOrMessages, None) => messages_plan(schema, field),
        _ => None,
    };
    planned.ok_or_else(|| DataError::ColumnType {
        path: path.to_path_buf(),
        column: spec.name.clone(),
        found: describe(field),
        expected: match spec.kind {
            ColumnKind::Text => "a string column",
            ColumnKind::Label => "an integer or string column",
            ColumnKind::TextOrMessages => "a string column or a list of {role, content} structs",
        },
    })
}

/// How a top-level leaf's values become cells; `None` for groups, repeated leaves and types that
/// hold neither text nor integers (floats, dates, decimals, …).
fn flat_values(field: &Type) -> Option<FlatValues> {
    if !field.is_primitive() || field.get_basic_info().repetition() == Repetition::REPEATED {
        return None;
    }
    let info = field.get_basic_info();
    match field.get_physical_type() {
        Physical::BYTE_ARRAY => match info.logical_type_ref() {
            None
            | Some(LogicalType::String)
            | Some(LogicalType::Json)
            | Some(LogicalType::Enum) => Some(FlatValues::Bytes),
            _ => None,
        },
        Physical::INT32 | Physical::INT64 => match (info.logical_type_ref(), info.converted_type())
        {
            (Some(LogicalType::Integer(int)), _) => Some(if int.is_signed {
                FlatValues::Signed
            } else {
                FlatValues::Unsigned
            }),
            (None, ConvertedType::UINT_8 | ConvertedType::UINT_16)
            | (None, ConvertedType::UINT_32 | ConvertedType::UINT_64) => Some(FlatValues::Unsigned),
            (None, ConvertedType::NONE | ConvertedType::INT_8 | ConvertedType::INT_16)
            | (None, ConvertedType::INT_32 | ConvertedType::INT_64) => Some(FlatValues::Signed),
            _ => None,
        },
        _ => None,
    }
}

/// The element group of a LIST column and its string leaves (parquet-format's LogicalTypes.md:
/// a 3-level `list { repeated group list { element } }`, or the legacy 2-level form whose repeated
/// group is the element).
fn messages_plan(schema: &SchemaDescriptor, field: &Type) -> Option<ColumnPlan> {
    let is_list = matches!(
        field.get_basic_info().logical_type_ref(),
        Some(LogicalType::List)
    ) || field.get_basic_info().converted_type() == ConvertedType::LIST;
    if !field.is_group() || !is_list {
        return None;
    }
    let [repeated] = field.get_fields() else {
        return None;
    };
    if !repeated.is_group() || repeated.get_basic_info().repetition() != Repetition::REPEATED {
        return None;
    }
    let list_def = i16::from(field.get_basic_info().repetition() != Repetition::REQUIRED);
    let element_def = list_def + 1;
    let (element, element_path, fields_def) = match repeated.get_fields() {
        [inner] if inner.is_group() => {
            let optional = i16::from(inner.get_basic_info().repetition() == Repetition::OPTIONAL);
            (
                inner.as_ref(),
                vec![repeated.name(), inner.name()],
                element_def + optional,
            )
        }
        _ => (repeated.as_ref(), vec![repeated.name()], element_def),
    };
    let mut fields = Vec::new();
    for leaf in element.get_fields() {
        if flat_values(leaf) != Some(FlatValues::Bytes) {
            continue; // as transformers' templates read them: string fields only
        }
        let mut parts = vec![field.name()];
        parts.extend(&element_path);
        parts.push(leaf.name());
        let optional = i16::from(leaf.get_basic_info().repetition() == Repetition::OPTIONAL);
        fields.push((
            leaf.name().to_string(),
            leaf_index(schema, &parts),
            fields_def + optional,
        ));
    }
    (!fields.is_empty()).then_some(ColumnPlan::Messages {
        fields,
        list_def,
        element_def,
    })
}

/// The column index of the leaf at `parts` (it exists: the parts come from the schema).
fn leaf_index(schema: &SchemaDescriptor, parts: &[&str]) -> usize {
    schema
        .columns()
        .iter()
        .position(|c| {
            c.path()
                .parts()
                .iter()
                .map(String::as_str)
                .eq(parts.iter().copied())
        })
        .unwrap_or(usize::MAX)
}

/// A column's type as an error message names it, e.g. `INT64`, `BYTE_ARRAY (String)`, `group`.
fn describe(field: &Type) -> String {
    let logical = field
        .get_basic_info()
        .logical_type_ref()
        .map(|l| format!(" ({l:?})"));
    let kind = if field.is_primitive() {
        format!("{}", field.get_physical_type())
    } else {
        "group".to_string()
    };
    format!("{kind}{}", logical.unwrap_or_default())
}
