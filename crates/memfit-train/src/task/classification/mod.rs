//! Sequence classification: a text (or a text pair) with its label → padded micro-batches whose
//! loss is a mean over rows; evaluation by validation loss, accuracy, macro-F1 and per-class
//! precision and recall ([`metrics`]), all from one forward pass over the evaluated rows.

pub mod labels;
pub mod metrics;

use super::{RowSource, StoreRows, Task, read_rows};
use crate::engine::{ClassificationBatch, Classify, TokenRows};
use crate::eval::{EvalError, EvalPhase, EvalPlan, EvalProgress, EvalReport, Score};
use memfit_data::{DataError, RowBuf};
use metrics::{Confusion, row_loss_and_prediction};
use std::time::Instant;

/// One row: the text's token ids with the tokenizer's specials ([CLS] … [SEP], or a pair), its
/// segment ids (`None`: all 0) and its label id — memfit-data's classification row.
pub use memfit_data::ClassificationRow as ClsRow;

/// Pads rows to the longest of the batch, cutting a longer row to `max_len` with its last token
/// (the closing [SEP] / </s>) kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClsCollate {
    pub max_len: usize,
    pub pad_id: u32,
}

impl ClsCollate {
    pub fn batch(&self, rows: &[ClsRow]) -> ClassificationBatch {
        let len = rows
            .iter()
            .map(|r| r.ids.len().min(self.max_len))
            .max()
            .unwrap_or(0)
            .max(1);
        let typed = rows.iter().any(|r| r.token_types.is_some());
        let mut b = ClassificationBatch {
            input: TokenRows {
                batch: rows.len(),
                len,
                ids: Vec::with_capacity(rows.len() * len),
                mask: Vec::with_capacity(rows.len() * len),
            },
            token_types: typed.then(|| Vec::with_capacity(rows.len() * len)),
            labels: rows.iter().map(|r| r.label).collect(),
        };
        for r in rows {
            let keep = r.ids.len().min(self.max_len);
            let ids = cut_keeping_last(&r.ids, keep);
            b.input.ids.extend(&ids);
            b.input
                .ids
                .resize(b.input.ids.len() + len - keep, self.pad_id);
            b.input.mask.extend((0..len).map(|i| i < keep));
            if let Some(types) = &mut b.token_types {
                let row_types = match &r.token_types {
                    Some(t) => cut_keeping_last(t, keep),
                    None => vec![0; keep],
                };
                types.extend(&row_types);
                types.resize(types.len() + len - keep, 0);
            }
        }
        b
    }
}

/// The first `keep - 1` values and the last one (all of them when they fit).
fn cut_keeping_last(v: &[u32], keep: usize) -> Vec<u32> {
    if v.len() <= keep || keep == 0 {
        return v[..keep.min(v.len())].to_vec();
    }
    let mut out = v[..keep - 1].to_vec();
    out.push(v[v.len() - 1]);
    out
}

/// The classification task.
pub struct ClassificationTask {
    pub collate: ClsCollate,
}

impl<E: Classify<Batch = ClassificationBatch>> Task<E> for ClassificationTask {
    type Row = ClsRow;

    fn collate(&self, rows: &[ClsRow]) -> ClassificationBatch {
        self.collate.batch(rows)
    }

    fn loss_weight(&self, b: &ClassificationBatch) -> usize {
        b.input.batch
    }

    fn tokens(&self, b: &ClassificationBatch) -> u64 {
        b.input.real_tokens() as u64
    }

    fn headline(&self) -> &'static str {
        "accuracy"
    }

    /// Loss and predictions from one forward pass per batch over the loss rows.
    fn evaluate(
        &self,
        engine: &E,
        valid: &dyn RowSource<ClsRow>,
        plan: &EvalPlan<'_>,
        progress: EvalProgress<'_>,
    ) -> Result<Option<EvalReport>, EvalError> {
        let t0 = Instant::now();
        let names = engine.labels();
        let mut confusion = Confusion::new(names.len());
        let batches = plan.loss_batches(valid.len());
        let n: usize = batches.iter().map(Vec::len).sum();
        let (mut loss_sum, mut done, mut samples) = (0.0f64, 0, Vec::new());
        progress(EvalPhase::Loss, 0, n);
        for indices in batches {
            if plan.stopped() {
                return Ok(None);
            }
            let b = self.collate.batch(&read_rows(valid, &indices)?);
            let logits = engine.logits(&b)?;
            for (row, &label) in logits.chunks_exact(names.len()).zip(&b.labels) {
                let (loss, predicted) = row_loss_and_prediction(row, label as usize);
                loss_sum += loss;
                confusion.add(label as usize, predicted);
                if samples.len() < 3 {
                    samples.push((names[label as usize].clone(), names[predicted].clone()));
                }
            }
            done += indices.len();
            progress(EvalPhase::Loss, done, n);
        }
        Ok(Some(EvalReport {
            valid_loss: if n > 0 { loss_sum / n as f64 } else { f64::NAN },
            scores: vec![
                Score {
                    name: "accuracy".into(),
                    value: confusion.accuracy(),
                },
                Score {
                    name: "macro_f1".into(),
                    value: confusion.macro_f1(),
                },
            ],
            classes: confusion.per_class(&names),
            rows_loss: n,
            samples,
            seconds: t0.elapsed().as_secs_f64(),
            ..EvalReport::default()
        }))
    }
}

/// A classification store (memfit-data keeps the pair's second part's segment ids).
impl RowSource<ClsRow> for StoreRows {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn row(&self, index: usize) -> Result<ClsRow, DataError> {
        self.0.classification_row(index, &mut RowBuf::default())
    }
    fn lengths(&self) -> Result<Vec<u32>, DataError> {
        self.0.row_lengths()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collate_pads_cuts_keeping_the_closing_token_and_fills_types() {
        let c = ClsCollate {
            max_len: 4,
            pad_id: 0,
        };
        let rows = [
            ClsRow {
                ids: vec![2, 5, 6, 7, 8, 3],
                token_types: None,
                label: 1,
            },
            ClsRow {
                ids: vec![2, 9, 3],
                token_types: Some(vec![0, 0, 1]),
                label: 0,
            },
        ];
        let b = c.batch(&rows);
        assert_eq!((b.input.batch, b.input.len), (2, 4));
        assert_eq!(b.input.ids, vec![2, 5, 6, 3, 2, 9, 3, 0]);
        assert_eq!(
            b.input.mask,
            vec![true, true, true, true, true, true, true, false]
        );
        assert_eq!(b.token_types, Some(vec![0, 0, 0, 0, 0, 0, 1, 0]));
        assert_eq!(b.labels, vec![1, 0]);
    }
}
