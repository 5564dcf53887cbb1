//! The arithmetic of steps and micro-batches (steps per epoch, the effective batch, the guard's
//! halving) and the seeds derived from the run seed. The order of rows comes from memfit-data's
//! [`memfit_data::Sampler`] (seeded shuffle per epoch, resumable from its [`memfit_data::Cursor`]);
//! how rows become micro-batches is the task's (`crate::task`).

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
    fn halving_keeps_the_effective_batch() {
        assert_eq!((halve(32), halve(3), halve(1)), (16, 2, 1));
        assert_eq!(accum_for(effective_batch(32, 1), 16), 2);
        // 3 × 1 rows halved to 2: two micro-batches (2 + 1 rows) still cover the 3.
        assert_eq!(accum_for(effective_batch(3, 1), halve(3)), 2);
    }

    #[test]
    fn derived_seeds_differ_by_coordinate() {
        let s = derive_seed(1, &[2, 3]);
        assert_eq!(s, derive_seed(1, &[2, 3]));
        assert_ne!(s, derive_seed(1, &[3, 2]));
        assert_ne!(s, derive_seed(2, &[2, 3]));
    }
}
