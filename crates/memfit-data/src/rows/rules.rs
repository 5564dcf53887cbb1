//! Per-row rules: which cells must hold what, the label vocabulary, and the `--on-invalid` policy.

use super::{Columns, InvalidPolicy, Mode, RowForm, RowTexts, Verdict};
use crate::chat::Conversation;
use crate::error::{DataError, Location, Result};
use crate::source::{Record, RecordProblem, Value};
use std::collections::HashMap;
use std::path::Path;

/// The most classes a classification store may hold (integer labels `0..MAX_LABELS`, or as many
/// distinct string labels). It bounds everything a label sizes before anything is allocated: the
/// model's head, the evaluation's per-class counts and scores, `id2label`. A label past it is a bad
/// row (usually a typo: one label of 1,000,000 among 0–2 would make a million-class head).
pub const MAX_LABELS: u32 = 65_536;

/// The row rules of one prepare (or prediction), holding the label vocabulary across all its
/// sources: string labels get ids in order of first appearance, unless names were given.
pub struct RowRules {
    columns: Columns,
    policy: InvalidPolicy,
    label_ids: HashMap<String, u32>,
    label_names: Vec<String>,
    /// Names given up front (`--label-names`): labels are looked up, never added.
    fixed_names: bool,
    largest_int_label: Option<u32>,
}

/// The first problem of a row (invalid outranks empty).
struct Problem {
    verdict: Verdict,
    column: String,
    reason: String,
}

/// A row's cells turned into texts, with what went wrong.
struct Cells {
    texts: Vec<String>,
    conversation: Option<Vec<crate::source::Message>>,
    label: Option<u32>,
    /// Whether `--on-invalid keep` can keep the row (not without a label or a conversation).
    keepable: bool,
    problem: Option<Problem>,
}

impl Cells {
    fn note(&mut self, verdict: Verdict, column: &str, reason: String) {
        let replace = match &self.problem {
            None => true,
            Some(p) => p.verdict == Verdict::Empty && verdict == Verdict::Invalid,
        };
        if replace {
            self.problem = Some(Problem {
                verdict,
                column: column.to_string(),
                reason,
            });
        }
    }
}

impl RowRules {
    /// Rules for `columns`; `label_names` fixes the label ids (string labels are looked up in it,
    /// integer labels must be below its length).
    pub fn new(columns: Columns, policy: InvalidPolicy, label_names: Option<Vec<String>>) -> Self {
        let fixed = label_names.unwrap_or_default();
        RowRules {
            label_ids: fixed
                .iter()
                .enumerate()
                .map(|(i, n)| (n.clone(), i as u32))
                .collect(),
            fixed_names: !fixed.is_empty(),
            label_names: fixed,
            columns,
            policy,
            largest_int_label: None,
        }
    }

    pub fn columns(&self) -> &Columns {
        &self.columns
    }

    pub fn policy(&self) -> InvalidPolicy {
        self.policy
    }

    /// Label names by id: the given or string labels' names; empty for integer labels.
    pub fn label_names(&self) -> &[String] {
        &self.label_names
    }

    /// Classes: the names' count, else the largest integer label + 1 (`None` before any label).
    pub fn num_labels(&self) -> Option<u32> {
        if self.label_names.is_empty() {
            self.largest_int_label.map(|l| l + 1)
        } else {
            Some(self.label_names.len() as u32)
        }
    }

    /// The texts of `rec`, or `None` when the policy leaves it out; with its verdict for counting.
    pub fn apply(&mut self, path: &Path, rec: Record) -> Result<(Option<RowTexts>, Verdict)> {
        let location = rec.location;
        let mut cells = Cells {
            texts: Vec::with_capacity(rec.values.len()),
            conversation: None,
            label: None,
            keepable: true,
            problem: None,
        };
        match &rec.problem {
            None => {}
            Some(p @ RecordProblem::Unreadable(_)) => {
                cells.note(Verdict::Invalid, "(whole line)", p.to_string());
            }
            Some(p @ RecordProblem::TooLarge { .. }) => {
                // Nothing of it was read: there is nothing to keep.
                cells.keepable = false;
                cells.note(Verdict::Invalid, "(whole row)", p.to_string());
            }
        }
        let label_at = self.label_index();
        for (k, value) in rec.values.into_iter().enumerate() {
            let name = self.columns.specs[k].name.clone();
            if Some(k) == label_at {
                self.read_label(&mut cells, &name, value);
            } else {
                self.read_text(&mut cells, k, &name, value);
            }
        }
        let verdict = cells.problem.as_ref().map_or(Verdict::Clean, |p| p.verdict);
        if let Some(p) = cells.problem.take() {
            match self.policy {
                InvalidPolicy::Fail => {
                    return Err(DataError::InvalidRow {
                        path: path.to_path_buf(),
                        location,
                        column: p.column,
                        reason: p.reason,
                    });
                }
                InvalidPolicy::Skip => return Ok((None, verdict)),
                InvalidPolicy::Keep if !cells.keepable => return Ok((None, verdict)),
                InvalidPolicy::Keep => {}
            }
        }
        self.check_label_kinds(path, location)?;
        Ok((Some(self.texts(cells)), verdict))
    }

    fn label_index(&self) -> Option<usize> {
        let train = self.columns.mode == Mode::Train;
        matches!(self.columns.form, RowForm::Classification { .. } if train)
            .then(|| self.columns.specs.len() - 1)
    }

    fn read_label(&mut self, cells: &mut Cells, column: &str, value: Value) {
        let label = match value {
            Value::Int(i) => match u32::try_from(i) {
                Ok(l) if l >= MAX_LABELS => Err(format!(
                    "label {l} is past the largest label memfit takes ({}): integer labels are \
                     class ids 0..{MAX_LABELS}",
                    MAX_LABELS - 1
                )),
                Ok(l) if self.fixed_names && l as usize >= self.label_names.len() => Err(format!(
                    "label {l} is outside the {} given label names",
                    self.label_names.len()
                )),
                Ok(l) => {
                    self.largest_int_label = self.largest_int_label.max(Some(l));
                    Ok(l)
                }
                Err(_) => Err(format!("label {i} is not in 0..2^32")),
            },
            Value::Text(s) if s.trim().is_empty() => {
                cells.keepable = false;
                cells.note(Verdict::Empty, column, "empty label".into());
                return;
            }
            Value::Text(s) => match self.label_ids.get(&s) {
                Some(&id) => Ok(id),
                None if self.fixed_names => Err(format!(
                    "label {s:?} is not among the given label names ({})",
                    self.label_names.join(", ")
                )),
                None if self.label_names.len() >= MAX_LABELS as usize => Err(format!(
                    "label {s:?} would be class {} and memfit takes at most {MAX_LABELS} labels",
                    self.label_names.len() + 1
                )),
                None => {
                    let id = self.label_names.len() as u32;
                    self.label_ids.insert(s.clone(), id);
                    self.label_names.push(s);
                    Ok(id)
                }
            },
            Value::Null => Err("null label".into()),
            Value::Messages(_) => Err("a list where a label was expected".into()),
            Value::Invalid { reason, .. } => Err(reason),
        };
        match label {
            Ok(l) => cells.label = Some(l),
            Err(reason) => {
                cells.keepable = false;
                cells.note(Verdict::Invalid, column, reason);
            }
        }
    }

    fn read_text(&self, cells: &mut Cells, k: usize, column: &str, value: Value) {
        // The instruction form's `input` (the second column) may be null or empty.
        let optional = matches!(self.columns.form, RowForm::Instruction { input: true }) && k == 1;
        let text = match value {
            Value::Text(s) => {
                if s.trim().is_empty() && !optional {
                    cells.note(Verdict::Empty, column, "empty text".into());
                }
                s
            }
            Value::Messages(m) => {
                if m.is_empty() {
                    cells.keepable = false;
                    cells.note(Verdict::Empty, column, "no messages".into());
                }
                cells.conversation = Some(m);
                String::new()
            }
            Value::Null if optional => String::new(),
            Value::Null => {
                cells.note(Verdict::Invalid, column, "null value".into());
                String::new()
            }
            Value::Int(i) => {
                let reason = format!("integer {i} where text was expected");
                cells.note(Verdict::Invalid, column, reason);
                i.to_string()
            }
            Value::Invalid { reason, lossy } => {
                // A broken conversation is no text to train on as it is.
                if self.columns.form == RowForm::TextOrMessages {
                    cells.keepable = false;
                }
                cells.note(Verdict::Invalid, column, reason);
                lossy
            }
        };
        cells.texts.push(text);
    }

    /// Integer and string labels cannot share a store unless their names were given.
    fn check_label_kinds(&self, path: &Path, location: Location) -> Result<()> {
        let mixed = self.largest_int_label.is_some() && !self.label_names.is_empty();
        if mixed && !self.fixed_names {
            let column = self.columns.specs.last().map(|s| s.name.clone());
            return Err(DataError::InvalidRow {
                path: path.to_path_buf(),
                location,
                column: column.unwrap_or_default(),
                reason: "labels mix integers and strings".into(),
            });
        }
        Ok(())
    }

    fn texts(&self, cells: Cells) -> RowTexts {
        let train = self.columns.mode == Mode::Train;
        let mut texts = cells.texts.into_iter();
        let mut next = || texts.next().unwrap_or_default();
        match self.columns.form {
            RowForm::Seq2seq => RowTexts::Seq2seq {
                source: next(),
                target: train.then(&mut next),
            },
            RowForm::Classification { pair } => RowTexts::Classification {
                text: next(),
                text_pair: pair.then(&mut next),
                label: cells.label,
            },
            RowForm::Instruction { input } => RowTexts::Chat(Conversation::Instruction {
                instruction: next(),
                input: if input { next() } else { String::new() },
                output: train.then(&mut next),
            }),
            RowForm::TextOrMessages => match cells.conversation {
                Some(m) => RowTexts::Chat(Conversation::Messages(m)),
                None => RowTexts::Text(next()),
            },
        }
    }
}
