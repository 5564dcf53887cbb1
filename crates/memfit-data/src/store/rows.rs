//! The rows a trainer reads, typed by task: [`ClassificationRow`] (ids, token types, label) and
//! [`CausalRow`] (one sequence and how many of its leading tokens are prompt), and a
//! classification store's labels (names by id, `num_labels`).

use super::{LABELS_FILE, Row, RowBuf, Task, TokenStore};
use crate::error::{DataError, Result};
use crate::rows::MAX_LABELS;
use std::io::{BufReader, Read};

/// A classification row: the text (or pair) with the tokenizer's specials, its token type ids
/// (`None` when all are 0: a single text, or a pair from a tokenizer that types every token 0,
/// as RoBERTa's), and its label id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassificationRow {
    pub ids: Vec<u32>,
    pub token_types: Option<Vec<u32>>,
    pub label: u32,
}

/// A causal-LM row: prompt and response as one sequence; the first `prompt_len` tokens are the
/// prompt (not trained: the loss covers the tokens after them, EOS included). `prompt_len` is 0
/// for plain text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CausalRow {
    pub ids: Vec<u32>,
    pub prompt_len: usize,
}

/// Token type ids of a sequence of `len` tokens whose second part starts at `second`: 0 before,
/// 1 from there; `None` when every type is 0 (no second part, or an empty one).
pub fn token_types(second: usize, len: usize) -> Option<Vec<u32>> {
    (second < len).then(|| {
        let mut types = vec![0; second];
        types.resize(len, 1);
        types
    })
}

fn classification_row(
    row: &Row<'_>,
    store: &TokenStore,
    index: usize,
) -> Result<ClassificationRow> {
    let label = row
        .label()
        .ok_or_else(|| DataError::store(store.dir(), format!("row {index} has no label")))?;
    let mut ids = row.source().to_vec();
    let second = ids.len();
    if let Some(pair) = row.target() {
        pair.extend_into(&mut ids);
    }
    Ok(ClassificationRow {
        token_types: token_types(second, ids.len()),
        ids,
        label,
    })
}

fn causal_row(row: &Row<'_>) -> CausalRow {
    let mut ids = row.source().to_vec();
    let prompt_len = ids.len();
    if let Some(response) = row.target() {
        response.extend_into(&mut ids);
    }
    CausalRow { ids, prompt_len }
}

impl TokenStore {
    fn require_task(&self, task: Task) -> Result<()> {
        if self.task() == task {
            return Ok(());
        }
        Err(DataError::store(
            self.dir(),
            format!("a {} store, not a {} one", self.task().name(), task.name()),
        ))
    }

    /// Row `i` of a classification store (two positioned reads, plus the label's).
    pub fn classification_row(&self, i: usize, buf: &mut RowBuf) -> Result<ClassificationRow> {
        self.require_task(Task::Classification)?;
        classification_row(&self.read_row(i, buf)?, self, i)
    }

    /// Rows `indices` of a classification store, in order.
    pub fn classification_rows(
        &self,
        indices: &[usize],
        buf: &mut RowBuf,
    ) -> Result<Vec<ClassificationRow>> {
        self.require_task(Task::Classification)?;
        let rows = self.read_rows(indices, buf)?;
        rows.iter()
            .zip(indices)
            .map(|(r, &i)| classification_row(r, self, i))
            .collect()
    }

    /// Row `i` of a causal-LM store.
    pub fn causal_row(&self, i: usize, buf: &mut RowBuf) -> Result<CausalRow> {
        self.require_task(Task::CausalLm)?;
        Ok(causal_row(&self.read_row(i, buf)?))
    }

    /// Rows `indices` of a causal-LM store, in order.
    pub fn causal_rows(&self, indices: &[usize], buf: &mut RowBuf) -> Result<Vec<CausalRow>> {
        self.require_task(Task::CausalLm)?;
        Ok(self
            .read_rows(indices, buf)?
            .iter()
            .map(causal_row)
            .collect())
    }

    /// The number of classes of a classification store: `num_labels` of meta.json, or, for a
    /// store written before that field, the largest label in `labels.bin` + 1.
    /// A count past [`MAX_LABELS`] (a store an older memfit prepared from a stray label) is refused.
    pub fn num_labels(&self) -> Result<u32> {
        let n = self.counted_labels()?;
        if n > MAX_LABELS {
            return Err(DataError::store(
                self.dir(),
                format!(
                    "{n} labels, past the {MAX_LABELS} memfit takes: a label of {} is in its rows; \
                     prepare it again, and memfit names the row",
                    n - 1
                ),
            ));
        }
        Ok(n)
    }

    fn counted_labels(&self) -> Result<u32> {
        self.require_task(Task::Classification)?;
        if let Some(n) = self.meta().num_labels {
            return Ok(n);
        }
        if !self.meta().label_names.is_empty() {
            return Ok(self.meta().label_names.len() as u32);
        }
        let path = self.dir().join(LABELS_FILE);
        let file = std::fs::File::open(&path).map_err(|e| DataError::read(&path, e))?;
        let mut reader = BufReader::with_capacity(1 << 16, file);
        let (mut largest, mut b) = (0u32, [0u8; 4]);
        for _ in 0..self.len() {
            reader
                .read_exact(&mut b)
                .map_err(|e| DataError::read(&path, e))?;
            largest = largest.max(u32::from_le_bytes(b));
        }
        Ok(largest + 1)
    }

    /// Label names by id (`id2label`): the store's names, or `LABEL_0` … for integer labels.
    pub fn label_names(&self) -> Result<Vec<String>> {
        Ok(self.meta().label_names_by_id(self.num_labels()?))
    }
}

#[cfg(test)]
mod tests {
    use super::token_types;

    #[test]
    fn token_types_switch_to_one_at_the_second_part() {
        assert_eq!(token_types(3, 5), Some(vec![0, 0, 0, 1, 1]));
        assert_eq!(token_types(5, 5), None, "an empty second part: all type 0");
    }
}
