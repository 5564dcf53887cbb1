//! From tokenized (source, target) rows to padded micro-batches.
//!
//! The order comes from memfit-data's [`memfit_data::Sampler`] (seeded shuffle per epoch, resumable
//! from its [`memfit_data::Cursor`]); this module gives the loop uniform access to rows — a memory-mapped
//! [`memfit_data::TokenStore`] or rows held in memory (tests) — and pads them into the engine's batch.

use crate::engine::Seq2SeqBatch;
use memfit_data::{DataError, RowBuf, TokenStore};

/// Tokenized seq2seq rows, addressable by index.
pub trait PairSource {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Source and target token ids of row `index` (`index < len()`); a store read can fail.
    fn pair(&self, index: usize) -> Result<(Vec<u32>, Vec<u32>), DataError>;
    /// Token count of every row (the sampler's length grouping and token budgets use it).
    fn lengths(&self) -> Result<Vec<u32>, DataError> {
        (0..self.len())
            .map(|i| {
                let (s, t) = self.pair(i)?;
                Ok((s.len() + t.len()) as u32)
            })
            .collect()
    }
}

/// Rows held in memory (tests).
#[derive(Debug, Clone, Default)]
pub struct InMemoryPairs {
    pub rows: Vec<(Vec<u32>, Vec<u32>)>,
}

impl PairSource for InMemoryPairs {
    fn len(&self) -> usize {
        self.rows.len()
    }
    fn pair(&self, index: usize) -> Result<(Vec<u32>, Vec<u32>), DataError> {
        Ok(self.rows[index].clone())
    }
}

/// A seq2seq token store (prepared by memfit-data; rows already end in EOS and are truncated).
pub struct StoreRows(pub TokenStore);

impl PairSource for StoreRows {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn pair(&self, index: usize) -> Result<(Vec<u32>, Vec<u32>), DataError> {
        let mut buf = RowBuf::default();
        let row = self.0.read_row(index, &mut buf)?;
        let target = row.target().map(|t| t.to_vec()).unwrap_or_default();
        Ok((row.source().to_vec(), target))
    }
    fn lengths(&self) -> Result<Vec<u32>, DataError> {
        self.0.row_lengths()
    }
}

pub use memfit_nn::kernels::dropout::SplitMix64;

/// A seed for one purpose derived from the run seed and coordinates (stable across versions).
pub fn derive_seed(seed: u64, parts: &[u64]) -> u64 {
    let mut rng = SplitMix64::new(seed);
    let mut out = rng.next_u64();
    for p in parts {
        rng.perturb(p.wrapping_mul(0xD6E8_FEB8_6659_FD93));
        out = rng.next_u64();
    }
    out
}

/// Micro-batches per epoch (the last one may be short).
pub fn micro_batches_per_epoch(rows: usize, batch: usize) -> u64 {
    rows.div_ceil(batch) as u64
}

/// Optimizer steps per epoch: micro-batches grouped by `accum`, the last group possibly short
/// (the seed's `ceil(len / (batch × accum))`).
pub fn steps_per_epoch(rows: usize, batch: usize, accum: usize) -> u64 {
    micro_batches_per_epoch(rows, batch).div_ceil(accum as u64)
}

/// Rows per optimizer step: the configured micro-batch × accumulation (what the guard keeps fixed).
pub fn effective_batch(batch: usize, accum: usize) -> usize {
    batch.saturating_mul(accum).max(1)
}

/// Micro-batches a full step takes at `micro` rows each.
pub fn accum_for(effective: usize, micro: usize) -> usize {
    effective.div_ceil(micro.max(1))
}

/// The micro-batch after a guard downgrade: half, rounded up, at least 1 (the effective batch is kept
/// by cutting each step's rows into more micro-batches, the last possibly shorter).
pub fn halve(micro: usize) -> usize {
    micro.div_ceil(2).max(1)
}

/// Each micro-batch's share of the step's target tokens: the loss scale that makes a step's gradient
/// the mean over all its target tokens, whatever way its rows are cut into micro-batches (transformers
/// made the same fix in 4.46, `num_items_in_batch`). With equal token counts it is 1/k, the classic
/// scaling; with no target tokens at all it falls back to 1/k.
pub fn token_weights(micro_batches: &[Seq2SeqBatch]) -> Vec<f64> {
    let k = micro_batches.len().max(1) as f64;
    let total: usize = micro_batches.iter().map(|b| b.target_tokens()).sum();
    micro_batches
        .iter()
        .map(|b| {
            if total == 0 {
                1.0 / k
            } else {
                b.target_tokens() as f64 / total as f64
            }
        })
        .collect()
}

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
    /// final EOS on targets that had one.
    pub fn batch(&self, rows: &[(Vec<u32>, Vec<u32>)]) -> Seq2SeqBatch {
        let cut = |ids: &[u32], max: usize, keep_eos: bool| -> Vec<u32> {
            if ids.len() <= max {
                return ids.to_vec();
            }
            let mut v = ids[..max].to_vec();
            if keep_eos
                && ids.last() == Some(&self.eos_id)
                && let Some(last) = v.last_mut()
            {
                *last = self.eos_id;
            }
            v
        };
        let srcs: Vec<Vec<u32>> = rows
            .iter()
            .map(|(s, _)| cut(s, self.max_src, true))
            .collect();
        let tgts: Vec<Vec<u32>> = rows
            .iter()
            .map(|(_, t)| cut(t, self.max_tgt, true))
            .collect();
        let pairs: Vec<(&[u32], &[u32])> = srcs
            .iter()
            .zip(&tgts)
            .map(|(s, t)| (s.as_slice(), t.as_slice()))
            .collect();
        memfit_data::pad_token_pairs(&pairs, self.pad_id, 1)
    }
}

/// Source + target tokens a batch really holds (padding excluded).
pub fn real_tokens(b: &Seq2SeqBatch) -> u64 {
    (b.input_mask.iter().filter(|m| **m).count() + b.target_tokens()) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_counts_round_up() {
        assert_eq!(micro_batches_per_epoch(10, 3), 4);
        assert_eq!(steps_per_epoch(10, 3, 3), 2);
        assert_eq!(steps_per_epoch(9, 3, 3), 1);
    }

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
        assert_eq!((b.batch, b.src_len, b.tgt_len), (2, 3, 3));
        assert_eq!(b.input_ids, vec![7, 8, 0, 5, 6, 1]);
        assert_eq!(b.input_mask, vec![true, true, false, true, true, true]);
        assert_eq!(b.labels, vec![9, 10, 1, 12, 1, 0]);
        assert_eq!(b.label_mask, vec![true, true, true, true, true, false]);
        assert_eq!(real_tokens(&b), 5 + 5);
    }

    #[test]
    fn halving_keeps_the_effective_batch_and_weights_follow_target_tokens() {
        assert_eq!((halve(32), halve(3), halve(1)), (16, 2, 1));
        assert_eq!(accum_for(effective_batch(32, 1), 16), 2);
        // 3 × 1 rows halved to 2: two micro-batches (2 + 1 rows) still cover the 3.
        assert_eq!(accum_for(effective_batch(3, 1), halve(3)), 2);
        let c = Collate {
            max_src: 8,
            max_tgt: 8,
            pad_id: 0,
            eos_id: 1,
        };
        let a = c.batch(&[(vec![5, 1], vec![5, 6, 7, 1])]);
        let b = c.batch(&[(vec![5, 1], vec![5, 1]), (vec![6, 1], vec![6, 1])]);
        assert_eq!(token_weights(&[a, b]), vec![0.5, 0.5]);
        let short = c.batch(&[(vec![5, 1], vec![1])]);
        let long = c.batch(&[(vec![5, 1], vec![5, 6, 1])]);
        assert_eq!(token_weights(&[short, long]), vec![0.25, 0.75]);
    }

    #[test]
    fn derived_seeds_differ_by_coordinate() {
        let s = derive_seed(1, &[2, 3]);
        assert_eq!(s, derive_seed(1, &[2, 3]));
        assert_ne!(s, derive_seed(1, &[3, 2]));
        assert_ne!(s, derive_seed(2, &[2, 3]));
    }
}
