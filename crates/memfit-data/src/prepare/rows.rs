//! From source records to texts: the per-format column rules and the `--on-invalid` policy.

use crate::error::{DataError, Result};
use crate::source::{ColumnSpec, Record, Value};
use crate::store::Task;
use std::collections::HashMap;
use std::path::Path;

/// What to do with a row that is empty (a blank required text) or invalid (null, wrong type,
/// bad UTF-8, unparsable line, bad label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InvalidPolicy {
    /// Stop with an error naming the file, row and column (the default: nothing is dropped
    /// silently).
    #[default]
    Fail,
    /// Leave the row out; it is counted in meta.json.
    Skip,
    /// Keep the row with what it has (a null or bad text becomes its lossy text or empty); rows
    /// without a usable label are still left out, since no label can be made up.
    Keep,
}

impl InvalidPolicy {
    pub fn name(self) -> &'static str {
        match self {
            InvalidPolicy::Fail => "fail",
            InvalidPolicy::Skip => "skip",
            InvalidPolicy::Keep => "keep",
        }
    }
}

/// The columns a format reads, with their defaults.
pub fn column_specs(task: Task, names: Option<&[String]>) -> Result<Vec<ColumnSpec>> {
    let defaults: &[&str] = match task {
        Task::Seq2seq => &["prompt", "response"],
        Task::Chat => &["instruction", "input", "output"],
        Task::Classification => &["text", "label"],
    };
    let names: Vec<String> = match names {
        Some(n) => n.to_vec(),
        None => defaults.iter().map(|s| s.to_string()).collect(),
    };
    let ok = match task {
        Task::Seq2seq | Task::Classification => names.len() == 2,
        Task::Chat => names.len() == 2 || names.len() == 3,
    };
    if !ok || names.iter().any(|n| n.is_empty()) {
        return Err(DataError::Options(format!(
            "--columns for {}: expected {} (got {:?})",
            task.name(),
            match task {
                Task::Seq2seq => "SOURCE,TARGET",
                Task::Chat => "INSTRUCTION,INPUT,OUTPUT or INSTRUCTION,OUTPUT",
                Task::Classification => "TEXT,LABEL",
            },
            names
        )));
    }
    Ok(match task {
        Task::Classification => vec![ColumnSpec::text(&names[0]), ColumnSpec::label(&names[1])],
        _ => names.iter().map(|n| ColumnSpec::text(n)).collect(),
    })
}

/// A row ready to tokenize.
#[derive(Debug, Clone, PartialEq)]
pub struct RowTexts {
    pub source: String,
    pub target: Option<String>,
    pub label: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Clean,
    Empty,
    Invalid,
}

/// Per-file row rules, holding the label vocabulary (string labels get ids in order of first
/// appearance across all sources).
pub struct RowRules<'a> {
    pub task: Task,
    pub columns: &'a [ColumnSpec],
    pub policy: InvalidPolicy,
    pub label_ids: HashMap<String, u32>,
    pub label_names: Vec<String>,
    pub saw_int_labels: bool,
}

struct Problem {
    verdict: Verdict,
    column: String,
    reason: String,
}

impl RowRules<'_> {
    /// The texts of `rec`, or `None` when the policy leaves it out; with its verdict for counting.
    pub fn apply(&mut self, path: &Path, rec: Record) -> Result<(Option<RowTexts>, Verdict)> {
        let mut problem: Option<Problem> = None;
        let mut note = |verdict: Verdict, column: &str, reason: String| {
            // Invalid outranks empty; the first problem of a rank is the one reported.
            let replace = match &problem {
                None => true,
                Some(p) => p.verdict == Verdict::Empty && verdict == Verdict::Invalid,
            };
            if replace {
                problem = Some(Problem {
                    verdict,
                    column: column.to_string(),
                    reason,
                });
            }
        };
        if let Some(p) = &rec.problem {
            note(Verdict::Invalid, "(whole line)", p.clone());
        }
        // Text cells: index of the cell in `columns` → text (lossy/empty stand-ins for `keep`).
        let mut texts: Vec<String> = Vec::with_capacity(rec.values.len());
        let mut label: Option<u32> = None;
        let mut label_usable = true;
        for (k, (spec, value)) in self.columns.iter().zip(rec.values).enumerate() {
            let is_label = self.task == Task::Classification && k == 1;
            // The chat `input` column (3-column form, middle one) may be null or empty.
            let optional = self.task == Task::Chat && self.columns.len() == 3 && k == 1;
            if is_label {
                match value {
                    Value::Int(i) => match u32::try_from(i) {
                        Ok(l) => {
                            self.saw_int_labels = true;
                            label = Some(l);
                        }
                        Err(_) => {
                            label_usable = false;
                            note(Verdict::Invalid, &spec.name, format!("label {i} is not in 0..2^32"));
                        }
                    },
                    Value::Text(s) if s.trim().is_empty() => {
                        label_usable = false;
                        note(Verdict::Empty, &spec.name, "empty label".into());
                    }
                    Value::Text(s) => {
                        let next = self.label_names.len() as u32;
                        let id = *self.label_ids.entry(s.clone()).or_insert_with(|| {
                            self.label_names.push(s);
                            next
                        });
                        label = Some(id);
                    }
                    Value::Null => {
                        label_usable = false;
                        note(Verdict::Invalid, &spec.name, "null label".into());
                    }
                    Value::Invalid { reason, .. } => {
                        label_usable = false;
                        note(Verdict::Invalid, &spec.name, reason);
                    }
                }
                continue;
            }
            let text = match value {
                Value::Text(s) => {
                    if s.trim().is_empty() && !optional {
                        note(Verdict::Empty, &spec.name, "empty text".into());
                    }
                    s
                }
                Value::Null if optional => String::new(),
                Value::Null => {
                    note(Verdict::Invalid, &spec.name, "null value".into());
                    String::new()
                }
                Value::Int(i) => {
                    note(Verdict::Invalid, &spec.name, format!("integer {i} where text was expected"));
                    i.to_string()
                }
                Value::Invalid { reason, lossy } => {
                    note(Verdict::Invalid, &spec.name, reason);
                    lossy
                }
            };
            texts.push(text);
        }
        let verdict = problem.as_ref().map_or(Verdict::Clean, |p| p.verdict);
        if let Some(p) = problem {
            match self.policy {
                InvalidPolicy::Fail => {
                    return Err(DataError::InvalidRow {
                        path: path.to_path_buf(),
                        location: rec.location,
                        column: p.column,
                        reason: p.reason,
                    });
                }
                InvalidPolicy::Skip => return Ok((None, verdict)),
                InvalidPolicy::Keep if !label_usable => return Ok((None, verdict)),
                InvalidPolicy::Keep => {}
            }
        }
        if self.task == Task::Classification && self.saw_int_labels && !self.label_names.is_empty()
        {
            return Err(DataError::InvalidRow {
                path: path.to_path_buf(),
                location: rec.location,
                column: self.columns[1].name.clone(),
                reason: "labels mix integers and strings".into(),
            });
        }
        let mut texts = texts.into_iter();
        let row = match self.task {
            Task::Seq2seq => RowTexts {
                source: texts.next().unwrap_or_default(),
                target: Some(texts.next().unwrap_or_default()),
                label: None,
            },
            Task::Chat => {
                let all: Vec<String> = texts.collect();
                let (instruction, input, output) = match all.as_slice() {
                    [i, inp, o] => (i.clone(), inp.clone(), o.clone()),
                    [i, o] => (i.clone(), String::new(), o.clone()),
                    _ => (String::new(), String::new(), String::new()),
                };
                // Instruction and input joined by a newline, as Alpaca-style prompts do.
                let source = if input.trim().is_empty() {
                    instruction
                } else {
                    format!("{instruction}\n{input}")
                };
                RowTexts {
                    source,
                    target: Some(output),
                    label: None,
                }
            }
            Task::Classification => RowTexts {
                source: texts.next().unwrap_or_default(),
                target: None,
                label,
            },
        };
        Ok((Some(row), verdict))
    }
}
