//! Seq2seq: (source, target) token rows → padded micro-batches whose loss is a mean over target
//! tokens; evaluation by validation loss and greedy generation (the seed's settings: no-repeat
//! n-gram 4, repetition penalty 1.3, stop at EOS) scored by character-level BLEU-4, both the
//! seed's formula and the standard one.

pub mod bleu;

use super::{RowSource, StoreRows, Task, mean_loss, read_rows};
use crate::engine::{Generate, GenerateConfig, Seq2SeqBatch, TokenRows};
use crate::eval::{EvalError, EvalPhase, EvalPlan, EvalProgress, EvalReport, Score};
use crate::text::TextDecoder;
use memfit_data::{DataError, RowBuf};
use std::time::Instant;

/// Greedy decoding with these settings is the evaluation issue 4 specifies (the seed's
/// `my_generate` used no-repeat n-gram 4 in its sampling modes; 1.3 is the specified penalty).
pub const NO_REPEAT_NGRAM: usize = 4;
pub const REPETITION_PENALTY: f32 = 1.3;

/// A seq2seq row: source and target token ids (each ending in EOS).
pub type Pair = (Vec<u32>, Vec<u32>);

/// Padding and truncation limits and ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Collate {
    pub max_src: usize,
    pub max_tgt: usize,
    pub pad_id: u32,
    pub eos_id: u32,
}

impl Collate {
    /// Pads rows to the longest in the batch (dynamic padding); truncates to the limits, keeping a
    /// final EOS on rows that had one.
    pub fn batch(&self, rows: &[Pair]) -> Seq2SeqBatch {
        let srcs: Vec<Vec<u32>> = rows
            .iter()
            .map(|(s, _)| cut(s, self.max_src, self.eos_id))
            .collect();
        let tgts: Vec<Vec<u32>> = rows
            .iter()
            .map(|(_, t)| cut(t, self.max_tgt, self.eos_id))
            .collect();
        let pairs: Vec<(&[u32], &[u32])> = srcs
            .iter()
            .zip(&tgts)
            .map(|(s, t)| (s.as_slice(), t.as_slice()))
            .collect();
        let p = memfit_data::pad_token_pairs(&pairs, self.pad_id, 1);
        Seq2SeqBatch {
            source: TokenRows {
                batch: p.batch,
                len: p.src_len,
                ids: p.input_ids,
                mask: p.input_mask,
            },
            labels: p.labels,
            label_mask: p.label_mask,
            tgt_len: p.tgt_len,
        }
    }
}

/// `ids` cut to `max` tokens, its last one EOS again when it ended in EOS.
fn cut(ids: &[u32], max: usize, eos: u32) -> Vec<u32> {
    if ids.len() <= max {
        return ids.to_vec();
    }
    let mut v = ids[..max].to_vec();
    if ids.last() == Some(&eos)
        && let Some(last) = v.last_mut()
    {
        *last = eos;
    }
    v
}

/// The seq2seq task: its collation, and what its evaluation generates and decodes with.
pub struct Seq2SeqTask<'a> {
    pub collate: Collate,
    pub decoder: &'a dyn TextDecoder,
    pub max_new_tokens: usize,
}

impl<E: Generate<Batch = Seq2SeqBatch>> Task<E> for Seq2SeqTask<'_> {
    type Row = Pair;

    fn collate(&self, rows: &[Pair]) -> Seq2SeqBatch {
        self.collate.batch(rows)
    }

    fn loss_weight(&self, b: &Seq2SeqBatch) -> usize {
        b.target_tokens()
    }

    fn tokens(&self, b: &Seq2SeqBatch) -> u64 {
        (b.source.real_tokens() + b.target_tokens()) as u64
    }

    fn headline(&self) -> &'static str {
        "bleu4"
    }

    fn evaluate(
        &self,
        engine: &E,
        valid: &dyn RowSource<Pair>,
        plan: &EvalPlan<'_>,
        progress: EvalProgress<'_>,
    ) -> Result<Option<EvalReport>, EvalError> {
        let t0 = Instant::now();
        let Some((valid_loss, rows_loss)) = mean_loss(self, engine, valid, plan, &mut *progress)?
        else {
            return Ok(None);
        };
        let Some(scores) = self.generate_and_score(engine, valid, plan, progress)? else {
            return Ok(None);
        };
        let n = scores.rows.max(1) as f64;
        Ok(Some(EvalReport {
            valid_loss,
            scores: vec![
                Score {
                    name: "bleu4".into(),
                    value: scores.seed_sum / n,
                },
                Score {
                    name: "bleu4_standard".into(),
                    value: scores.std_sum / n,
                },
            ],
            rows_loss,
            rows_generated: scores.rows,
            samples: scores.samples,
            seconds: t0.elapsed().as_secs_f64(),
            ..EvalReport::default()
        }))
    }
}

struct Scores {
    seed_sum: f64,
    std_sum: f64,
    rows: usize,
    samples: Vec<(String, String)>,
}

impl Seq2SeqTask<'_> {
    /// Greedy generation for the first `plan.generate_rows` rows, scored by BLEU-4.
    fn generate_and_score<E: Generate<Batch = Seq2SeqBatch>>(
        &self,
        engine: &E,
        valid: &dyn RowSource<Pair>,
        plan: &EvalPlan<'_>,
        progress: EvalProgress<'_>,
    ) -> Result<Option<Scores>, EvalError> {
        let config = GenerateConfig {
            max_new_tokens: self.max_new_tokens,
            no_repeat_ngram: NO_REPEAT_NGRAM,
            repetition_penalty: REPETITION_PENALTY,
            eos_id: self.collate.eos_id,
            stop: plan.stop_signals(),
        };
        let (batch, n) = (plan.batch.max(1), plan.generate_rows.min(valid.len()));
        let mut s = Scores {
            seed_sum: 0.0,
            std_sum: 0.0,
            rows: n,
            samples: Vec::new(),
        };
        progress(EvalPhase::Generate, 0, n);
        for start in (0..n).step_by(batch) {
            if plan.stopped() {
                return Ok(None);
            }
            let indices: Vec<usize> = (start..(start + batch).min(n)).collect();
            let rows = read_rows(valid, &indices)?;
            let b = self.collate.batch(&rows);
            let outputs = engine.generate(&b.source, &config)?;
            if plan.stopped() {
                return Ok(None);
            }
            for ((_, target), out) in rows.iter().zip(&outputs) {
                let reference = self.decoder.decode(target);
                let generated = self.decoder.decode(out);
                s.seed_sum += bleu::bleu4_seed(&generated, &reference);
                s.std_sum += bleu::bleu4_standard(&generated, &reference);
                if s.samples.len() < 3 {
                    s.samples.push((reference, generated));
                }
            }
            progress(EvalPhase::Generate, start + rows.len(), n);
        }
        Ok(Some(s))
    }
}

/// A seq2seq token store (prepared by memfit-data; rows already end in EOS and are truncated).
impl RowSource<Pair> for StoreRows {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn row(&self, index: usize) -> Result<Pair, DataError> {
        let mut buf = RowBuf::default();
        let row = self.0.read_row(index, &mut buf)?;
        let target = row.target().map(|t| t.to_vec()).unwrap_or_default();
        Ok((row.source().to_vec(), target))
    }
    fn lengths(&self) -> Result<Vec<u32>, DataError> {
        self.0.row_lengths()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collate_pads_masks_and_keeps_eos_on_truncation() {
        let c = Collate {
            max_src: 3,
            max_tgt: 3,
            pad_id: 0,
            eos_id: 1,
        };
        let b = c.batch(&[
            (vec![7, 8], vec![9, 10, 11, 1]),
            (vec![5, 6, 7, 8, 1], vec![12, 1]),
        ]);
        assert_eq!((b.source.batch, b.source.len, b.tgt_len), (2, 3, 3));
        assert_eq!(b.source.ids, vec![7, 8, 0, 5, 6, 1]);
        assert_eq!(b.source.mask, vec![true, true, false, true, true, true]);
        assert_eq!(b.labels, vec![9, 10, 1, 12, 1, 0]);
        assert_eq!(b.label_mask, vec![true, true, true, true, true, false]);
        assert_eq!(b.source.real_tokens() + b.target_tokens(), 5 + 5);
    }
}
