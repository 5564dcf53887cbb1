//! The columns a task reads, by name, and the form of row they make.
//!
//! | task | training columns | prediction columns |
//! |---|---|---|
//! | seq2seq | `SOURCE,TARGET` (`prompt,response`) | `SOURCE` |
//! | chat | `INSTRUCTION[,INPUT],OUTPUT` | `INSTRUCTION[,INPUT]` |
//! | classification | `TEXT[,TEXT_PAIR],LABEL` (`text[,text_pair],label`) | `TEXT[,TEXT_PAIR]` |
//! | causal-lm | `MESSAGES` or `TEXT` (one column), or `INSTRUCTION[,INPUT],OUTPUT` | the same less `OUTPUT` |
//!
//! Without `--columns`, the defaults in parentheses are used; where a task has several forms the
//! first input's columns choose: `text_pair` present → pairs; causal-lm: `messages`, else
//! `instruction` (+ `input` if present, + `output`), else `text`; chat: `input` if present.

use super::Mode;
use crate::error::{DataError, Result};
use crate::source::{self, ColumnSpec};
use crate::store::Task;
use std::path::Path;

/// The shape of a row, from the task and its columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowForm {
    /// Source and target.
    Seq2seq,
    /// Instruction, an optional input, output.
    Instruction { input: bool },
    /// A text or a pair, label.
    Classification { pair: bool },
    /// One causal-LM column holding a text (pretraining) or a conversation (messages).
    TextOrMessages,
}

/// The columns one task reads, in the order a row's cells come.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Columns {
    pub task: Task,
    pub mode: Mode,
    pub form: RowForm,
    pub specs: Vec<ColumnSpec>,
}

impl Columns {
    /// The columns named by `names`, or the task's defaults chosen by `first_input`'s columns
    /// (static defaults when it is `None`).
    pub fn resolve(
        task: Task,
        mode: Mode,
        names: Option<&[String]>,
        first_input: Option<&Path>,
    ) -> Result<Self> {
        let Some(names) = names else {
            let present = match first_input {
                Some(p) => source::column_names(p)?,
                None => Vec::new(),
            };
            let names = default_names(task, mode, &present);
            // A causal-LM prediction from `instruction` alone is an instruction row, not a text.
            let instruction_only = task == Task::CausalLm && names == ["instruction"];
            let hint = instruction_only.then_some(RowForm::Instruction { input: false });
            return Self::from_names(task, mode, names, hint);
        };
        Self::from_names(task, mode, names.to_vec(), None)
    }

    fn from_names(
        task: Task,
        mode: Mode,
        names: Vec<String>,
        hint: Option<RowForm>,
    ) -> Result<Self> {
        let train = mode == Mode::Train;
        // One response column (target, output, label) when training.
        let n = names.len() - usize::from(train).min(names.len());
        let form = match (task, n) {
            (Task::Seq2seq, 1) => Some(RowForm::Seq2seq),
            (Task::Chat | Task::CausalLm, 1) if train || task == Task::Chat => {
                Some(RowForm::Instruction { input: false })
            }
            (Task::Chat | Task::CausalLm, 2) => Some(RowForm::Instruction { input: true }),
            (Task::Classification, 1 | 2) => Some(RowForm::Classification { pair: n == 2 }),
            (Task::CausalLm, 0) if train => Some(RowForm::TextOrMessages),
            (Task::CausalLm, 1) => Some(RowForm::TextOrMessages),
            _ => None,
        };
        let form = hint.or(form);
        let Some(form) = form.filter(|_| names.iter().all(|n| !n.is_empty())) else {
            return Err(DataError::Options(format!(
                "--columns for {}{}: expected {} (got {:?})",
                task.name(),
                if train { "" } else { " prediction" },
                expected(task, mode),
                names
            )));
        };
        let specs = names
            .iter()
            .enumerate()
            .map(|(k, name)| match form {
                RowForm::Classification { .. } if k == n => ColumnSpec::label(name),
                RowForm::TextOrMessages => ColumnSpec::text_or_messages(name),
                _ => ColumnSpec::text(name),
            })
            .collect();
        Ok(Columns {
            task,
            mode,
            form,
            specs,
        })
    }

    pub fn names(&self) -> Vec<String> {
        self.specs.iter().map(|s| s.name.clone()).collect()
    }

    /// The names joined with commas (how an error names a whole row's columns).
    pub fn joined(&self) -> String {
        self.names().join(",")
    }
}

fn expected(task: Task, mode: Mode) -> &'static str {
    match (task, mode) {
        (Task::Seq2seq, Mode::Train) => "SOURCE,TARGET",
        (Task::Seq2seq, Mode::Predict) => "SOURCE",
        (Task::Chat, Mode::Train) => "INSTRUCTION,INPUT,OUTPUT or INSTRUCTION,OUTPUT",
        (Task::Chat, Mode::Predict) => "INSTRUCTION,INPUT or INSTRUCTION",
        (Task::Classification, Mode::Train) => "TEXT,LABEL or TEXT,TEXT_PAIR,LABEL",
        (Task::Classification, Mode::Predict) => "TEXT or TEXT,TEXT_PAIR",
        (Task::CausalLm, Mode::Train) => {
            "MESSAGES or TEXT (one column), INSTRUCTION,INPUT,OUTPUT or INSTRUCTION,OUTPUT"
        }
        (Task::CausalLm, Mode::Predict) => "MESSAGES or TEXT (one column), or INSTRUCTION,INPUT",
    }
}

/// The default column names of `task`, chosen by the columns the first input has.
fn default_names(task: Task, mode: Mode, present: &[String]) -> Vec<String> {
    let has = |c: &str| present.iter().any(|p| p == c);
    let train = mode == Mode::Train;
    let instruction = |out: &mut Vec<&str>| {
        out.push("instruction");
        // Without a file to look at, assume the input column is there (the documented default).
        if has("input") || present.is_empty() {
            out.push("input");
        }
        if train {
            out.push("output");
        }
    };
    let mut names: Vec<&str> = Vec::new();
    match task {
        Task::Seq2seq => {
            names.push("prompt");
            if train {
                names.push("response");
            }
        }
        Task::Chat => instruction(&mut names),
        Task::Classification => {
            names.push("text");
            if has("text_pair") {
                names.push("text_pair");
            }
            if train {
                names.push("label");
            }
        }
        Task::CausalLm if has("messages") => names.push("messages"),
        Task::CausalLm if has("instruction") => instruction(&mut names),
        Task::CausalLm => names.push("text"),
    }
    names.into_iter().map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn form(task: Task, mode: Mode, v: &[&str]) -> Result<RowForm> {
        Columns::resolve(task, mode, Some(&names(v)), None).map(|c| c.form)
    }

    #[test]
    fn forms_follow_the_task_and_the_number_of_columns() {
        use RowForm::*;
        let (t, p) = (Mode::Train, Mode::Predict);
        assert_eq!(form(Task::Seq2seq, t, &["a", "b"]).unwrap(), Seq2seq);
        assert_eq!(form(Task::Seq2seq, p, &["a"]).unwrap(), Seq2seq);
        assert!(form(Task::Seq2seq, t, &["a"]).is_err());
        let pair = Classification { pair: true };
        assert_eq!(
            form(Task::Classification, t, &["a", "b", "y"]).unwrap(),
            pair
        );
        assert_eq!(form(Task::Classification, p, &["a", "b"]).unwrap(), pair);
        assert_eq!(
            form(Task::Classification, t, &["a", "y"]).unwrap(),
            Classification { pair: false }
        );
        assert_eq!(form(Task::CausalLm, t, &["m"]).unwrap(), TextOrMessages);
        assert_eq!(
            form(Task::CausalLm, t, &["i", "o"]).unwrap(),
            Instruction { input: false }
        );
        assert_eq!(
            form(Task::CausalLm, p, &["i", "in"]).unwrap(),
            Instruction { input: true }
        );
        let e = form(Task::Classification, t, &["a", "b", "c", "d"]).unwrap_err();
        assert!(e.to_string().contains("TEXT,TEXT_PAIR,LABEL"), "{e}");
        assert!(form(Task::CausalLm, t, &["", "o"]).is_err());
    }

    #[test]
    fn defaults_follow_the_first_input() {
        let d = |task, mode, present: &[&str]| default_names(task, mode, &names(present));
        assert_eq!(
            d(
                Task::Classification,
                Mode::Train,
                &["label", "text", "text_pair"]
            ),
            names(&["text", "text_pair", "label"])
        );
        assert_eq!(
            d(Task::CausalLm, Mode::Train, &["messages", "text"]),
            names(&["messages"])
        );
        assert_eq!(
            d(Task::CausalLm, Mode::Train, &["instruction", "output"]),
            names(&["instruction", "output"])
        );
        assert_eq!(
            d(
                Task::CausalLm,
                Mode::Predict,
                &["instruction", "input", "output"]
            ),
            names(&["instruction", "input"])
        );
        assert_eq!(d(Task::CausalLm, Mode::Train, &["text"]), names(&["text"]));
        assert_eq!(
            d(Task::Chat, Mode::Train, &[]),
            names(&["instruction", "input", "output"])
        );
    }
}
