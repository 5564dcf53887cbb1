//! Causal LM: one token sequence per row, its first `prompt_len` tokens a prompt that is not trained
//! (chat rows; 0 for plain text) → padded micro-batches whose loss is a mean over the trained
//! tokens; evaluation by validation loss and perplexity, and greedy continuations of a few
//! validation prompts shown in the log.

use super::{RowSource, StoreRows, Task, mean_loss, read_rows};
use crate::engine::{CausalLmBatch, Continue, GenerateConfig, TokenRows};
use crate::eval::{EvalError, EvalPhase, EvalPlan, EvalProgress, EvalReport, Score};
use crate::text::TextDecoder;
use memfit_data::{DataError, RowBuf};
use std::time::Instant;

/// One row: its token ids, the first `prompt_len` of them a prompt (not trained) — memfit-data's
/// causal-LM row.
pub use memfit_data::CausalRow as LmRow;

/// Pads rows to the longest of the batch (at most `max_len` tokens, a longer row cut at its end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LmCollate {
    pub max_len: usize,
    pub pad_id: u32,
}

impl LmCollate {
    pub fn batch(&self, rows: &[LmRow]) -> CausalLmBatch {
        let len = rows
            .iter()
            .map(|r| r.ids.len().min(self.max_len))
            .max()
            .unwrap_or(1)
            .max(1);
        let n = rows.len() * len;
        let mut b = CausalLmBatch {
            input: TokenRows {
                batch: rows.len(),
                len,
                ids: Vec::with_capacity(n),
                mask: Vec::with_capacity(n),
            },
            target_mask: Vec::with_capacity(n),
        };
        for r in rows {
            let keep = r.ids.len().min(self.max_len);
            b.input.ids.extend(&r.ids[..keep]);
            b.input
                .ids
                .resize(b.input.ids.len() + len - keep, self.pad_id);
            b.input.mask.extend((0..len).map(|t| t < keep));
            // position 0 has no prefix to be predicted from
            let first = r.prompt_len.max(1);
            b.target_mask
                .extend((0..len).map(|t| t >= first && t < keep));
        }
        b
    }
}

/// The causal-LM task: its collation, and what its evaluation continues prompts with.
pub struct CausalLmTask<'a> {
    pub collate: LmCollate,
    pub decoder: &'a dyn TextDecoder,
    pub eos_id: u32,
    pub max_new_tokens: usize,
}

impl<E: Continue<Batch = CausalLmBatch>> Task<E> for CausalLmTask<'_> {
    type Row = LmRow;

    fn collate(&self, rows: &[LmRow]) -> CausalLmBatch {
        self.collate.batch(rows)
    }

    fn loss_weight(&self, b: &CausalLmBatch) -> usize {
        b.target_tokens()
    }

    fn tokens(&self, b: &CausalLmBatch) -> u64 {
        b.input.real_tokens() as u64
    }

    fn headline(&self) -> &'static str {
        "perplexity"
    }

    fn evaluate(
        &self,
        engine: &E,
        valid: &dyn RowSource<LmRow>,
        plan: &EvalPlan<'_>,
        progress: EvalProgress<'_>,
    ) -> Result<Option<EvalReport>, EvalError> {
        let t0 = Instant::now();
        let Some((valid_loss, rows_loss)) = mean_loss(self, engine, valid, plan, &mut *progress)?
        else {
            return Ok(None);
        };
        let Some(samples) = self.continue_prompts(engine, valid, plan, progress)? else {
            return Ok(None);
        };
        Ok(Some(EvalReport {
            valid_loss,
            scores: vec![Score {
                name: "perplexity".into(),
                value: valid_loss.exp(),
            }],
            rows_loss,
            rows_generated: samples.len(),
            samples,
            seconds: t0.elapsed().as_secs_f64(),
            ..EvalReport::default()
        }))
    }
}

impl CausalLmTask<'_> {
    /// Greedy continuations of the prompts of the first `plan.generate_rows` validation rows that
    /// have one: (reference response, generated).
    fn continue_prompts<E: Continue<Batch = CausalLmBatch>>(
        &self,
        engine: &E,
        valid: &dyn RowSource<LmRow>,
        plan: &EvalPlan<'_>,
        progress: EvalProgress<'_>,
    ) -> Result<Option<Vec<(String, String)>>, EvalError> {
        let config = GenerateConfig {
            max_new_tokens: self.max_new_tokens,
            no_repeat_ngram: 0,
            repetition_penalty: 1.0,
            eos_id: self.eos_id,
            stop: plan.stop_signals(),
        };
        let n = plan.generate_rows.min(valid.len());
        let rows = read_rows(valid, &(0..n).collect::<Vec<_>>())?;
        let with_prompt: Vec<&LmRow> = rows.iter().filter(|r| r.prompt_len > 0).collect();
        let mut samples = Vec::new();
        progress(EvalPhase::Generate, 0, with_prompt.len());
        for chunk in with_prompt.chunks(plan.batch.max(1)) {
            if plan.stopped() {
                return Ok(None);
            }
            let prompts: Vec<Vec<u32>> = chunk
                .iter()
                .map(|r| r.ids[..r.prompt_len.min(self.collate.max_len)].to_vec())
                .collect();
            let outputs = engine.continue_prompts(&prompts, &config)?;
            if plan.stopped() {
                return Ok(None);
            }
            for (row, out) in chunk.iter().zip(&outputs) {
                let reference = self.decoder.decode(&row.ids[row.prompt_len..]);
                samples.push((reference, self.decoder.decode(out)));
            }
            progress(EvalPhase::Generate, samples.len(), with_prompt.len());
        }
        Ok(Some(samples))
    }
}

/// A causal-LM store: each row's prompt and response, one sequence.
impl RowSource<LmRow> for StoreRows {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn row(&self, index: usize) -> Result<LmRow, DataError> {
        self.0.causal_row(index, &mut RowBuf::default())
    }
    fn lengths(&self) -> Result<Vec<u32>, DataError> {
        self.0.row_lengths()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_and_padding_are_not_targets() {
        let c = LmCollate {
            max_len: 6,
            pad_id: 0,
        };
        let b = c.batch(&[
            LmRow {
                ids: vec![5, 6, 7, 8, 1],
                prompt_len: 2,
            },
            LmRow {
                ids: vec![9, 10, 11, 12, 13, 14, 15, 1],
                prompt_len: 0,
            },
        ]);
        assert_eq!((b.input.batch, b.input.len), (2, 6));
        assert_eq!(b.input.ids, vec![5, 6, 7, 8, 1, 0, 9, 10, 11, 12, 13, 14]);
        let targets: Vec<u8> = b.target_mask.iter().map(|&m| u8::from(m)).collect();
        // row 0: tokens 2..5 trained; row 1 (plain text): every token after the first
        assert_eq!(targets, vec![0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1]);
        assert_eq!(b.target_tokens(), 8);
    }
}
