//! Dynamic padding: a list of rows becomes one rectangular batch padded to its longest row.
//!
//! [`PaddedSeq2Seq`] is also the trainer's micro-batch (`memfit_train::engine::Seq2SeqBatch`).

use crate::error::{DataError, Result};
use crate::store::{Row, RowBuf, Task, TokenStore};

/// A padded seq2seq micro-batch, row-major `[batch, len]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaddedSeq2Seq {
    pub batch: usize,
    /// Longest source in the batch.
    pub src_len: usize,
    /// Longest target in the batch.
    pub tgt_len: usize,
    /// `[batch, src_len]` source ids, padded with the pad id.
    pub input_ids: Vec<u32>,
    /// `[batch, src_len]`, true on real tokens.
    pub input_mask: Vec<bool>,
    /// `[batch, tgt_len]` target ids (ending in EOS), padded with the pad id.
    pub labels: Vec<u32>,
    /// `[batch, tgt_len]`, true on real target tokens (the ones that count in the loss).
    pub label_mask: Vec<bool>,
}

impl PaddedSeq2Seq {
    /// An empty batch of `batch` rows padded to `src_len` / `tgt_len`, its vectors reserved.
    fn with_capacity(batch: usize, src_len: usize, tgt_len: usize) -> Self {
        Self {
            batch,
            src_len,
            tgt_len,
            input_ids: Vec::with_capacity(batch * src_len),
            input_mask: Vec::with_capacity(batch * src_len),
            labels: Vec::with_capacity(batch * tgt_len),
            label_mask: Vec::with_capacity(batch * tgt_len),
        }
    }

    /// Target tokens that count in the loss (non-padding labels).
    pub fn target_tokens(&self) -> usize {
        self.label_mask.iter().filter(|m| **m).count()
    }
}

/// A padded classification batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaddedClassification {
    pub batch: usize,
    pub len: usize,
    /// `[batch, len]` ids, padded with the pad id.
    pub input_ids: Vec<u32>,
    /// `[batch, len]`, true on real tokens.
    pub input_mask: Vec<bool>,
    /// `[batch, len]` token type ids (0 on padding), when a row is a pair with type-1 tokens;
    /// `None` when every type is 0.
    pub token_types: Option<Vec<u32>>,
    /// One label id per row.
    pub labels: Vec<u32>,
}

/// Appends `tokens` then pads to `len`.
fn push_padded(
    ids: &mut Vec<u32>,
    mask: &mut Vec<bool>,
    tokens: impl ExactSizeIterator<Item = u32>,
    len: usize,
    pad: u32,
) {
    let n = tokens.len();
    ids.extend(tokens);
    ids.extend(std::iter::repeat_n(pad, len - n));
    mask.extend(std::iter::repeat_n(true, n));
    mask.extend(std::iter::repeat_n(false, len - n));
}

/// Pads seq2seq rows (source, target) to the longest source and longest target of the batch.
/// A row without a target (classification) gets an empty one.
pub fn pad_seq2seq(rows: &[Row<'_>], pad_id: u32) -> PaddedSeq2Seq {
    let src_len = rows.iter().map(|r| r.source().len()).max().unwrap_or(0);
    let tgt_len = rows
        .iter()
        .map(|r| r.target().map_or(0, |t| t.len()))
        .max()
        .unwrap_or(0);
    let mut out = PaddedSeq2Seq::with_capacity(rows.len(), src_len, tgt_len);
    for r in rows {
        push_padded(
            &mut out.input_ids,
            &mut out.input_mask,
            r.source().iter(),
            src_len,
            pad_id,
        );
        match r.target() {
            Some(t) => push_padded(
                &mut out.labels,
                &mut out.label_mask,
                t.iter(),
                tgt_len,
                pad_id,
            ),
            None => push_padded(
                &mut out.labels,
                &mut out.label_mask,
                std::iter::empty(),
                tgt_len,
                pad_id,
            ),
        }
    }
    out
}

/// Pads (source, target) token lists to the longest source and longest target of the batch, each
/// at least `min_len` long (the trainer asks for 1 so that no tensor has a zero-sized axis).
pub fn pad_token_pairs(rows: &[(&[u32], &[u32])], pad_id: u32, min_len: usize) -> PaddedSeq2Seq {
    let src_len = rows
        .iter()
        .map(|(s, _)| s.len())
        .max()
        .unwrap_or(0)
        .max(min_len);
    let tgt_len = rows
        .iter()
        .map(|(_, t)| t.len())
        .max()
        .unwrap_or(0)
        .max(min_len);
    let mut out = PaddedSeq2Seq::with_capacity(rows.len(), src_len, tgt_len);
    for (source, target) in rows {
        let (ids, mask) = (&mut out.input_ids, &mut out.input_mask);
        push_padded(ids, mask, source.iter().copied(), src_len, pad_id);
        let (ids, mask) = (&mut out.labels, &mut out.label_mask);
        push_padded(ids, mask, target.iter().copied(), tgt_len, pad_id);
    }
    out
}

/// Pads classification rows (a text, or a pair's two segments) to the longest of the batch.
pub fn pad_classification(rows: &[Row<'_>], pad_id: u32) -> PaddedClassification {
    let len = rows.iter().map(Row::total_tokens).max().unwrap_or(0);
    let typed = rows
        .iter()
        .any(|r| r.target().is_some_and(|t| !t.is_empty()));
    let mut out = PaddedClassification {
        batch: rows.len(),
        len,
        input_ids: Vec::with_capacity(rows.len() * len),
        input_mask: Vec::with_capacity(rows.len() * len),
        token_types: typed.then(|| Vec::with_capacity(rows.len() * len)),
        labels: Vec::with_capacity(rows.len()),
    };
    for r in rows {
        let ids = r
            .segments()
            .iter()
            .flat_map(|s| s.iter())
            .collect::<Vec<_>>();
        push_padded(
            &mut out.input_ids,
            &mut out.input_mask,
            ids.into_iter(),
            len,
            pad_id,
        );
        if let Some(types) = out.token_types.as_mut() {
            let first = r.source().len();
            let total = r.total_tokens();
            types.extend((0..len).map(|k| u32::from(k >= first && k < total)));
        }
        out.labels.push(r.label().unwrap_or(0));
    }
    out
}

impl TokenStore {
    fn require_pad(&self) -> Result<u32> {
        self.pad_id()
            .ok_or_else(|| DataError::store(self.dir(), "meta.json has no pad id"))
    }

    /// The padded seq2seq batch of rows `indices` (a seq2seq or chat store), read through `buf`.
    pub fn seq2seq_batch_with(&self, indices: &[usize], buf: &mut RowBuf) -> Result<PaddedSeq2Seq> {
        if !matches!(self.task(), Task::Seq2seq | Task::Chat) {
            return Err(DataError::store(
                self.dir(),
                format!(
                    "a {} store is not read as seq2seq (source, target) batches",
                    self.task().name()
                ),
            ));
        }
        let pad = self.require_pad()?;
        Ok(pad_seq2seq(&self.read_rows(indices, buf)?, pad))
    }

    /// [`TokenStore::seq2seq_batch_with`] with a fresh buffer.
    pub fn seq2seq_batch(&self, indices: &[usize]) -> Result<PaddedSeq2Seq> {
        self.seq2seq_batch_with(indices, &mut RowBuf::default())
    }

    /// The padded classification batch of rows `indices` (a classification store).
    pub fn classification_batch(&self, indices: &[usize]) -> Result<PaddedClassification> {
        if self.task() != Task::Classification {
            return Err(DataError::store(self.dir(), "not a classification store"));
        }
        let pad = self.require_pad()?;
        Ok(pad_classification(
            &self.read_rows(indices, &mut RowBuf::default())?,
            pad,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::pad_token_pairs;

    #[test]
    fn token_pairs_pad_to_longest_and_min_len() {
        let b = pad_token_pairs(
            &[(&[5, 6, 1][..], &[7, 1][..]), (&[8, 1][..], &[][..])],
            0,
            1,
        );
        assert_eq!((b.batch, b.src_len, b.tgt_len), (2, 3, 2));
        assert_eq!(b.input_ids, vec![5, 6, 1, 8, 1, 0]);
        assert_eq!(b.input_mask, vec![true, true, true, true, true, false]);
        assert_eq!(b.labels, vec![7, 1, 0, 0]);
        assert_eq!(b.label_mask, vec![true, true, false, false]);
        let empty = pad_token_pairs(&[(&[][..], &[][..])], 0, 1);
        assert_eq!(
            (empty.src_len, empty.tgt_len, empty.input_mask),
            (1, 1, vec![false])
        );
    }
}
