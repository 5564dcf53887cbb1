//! Which rows go into which batch, in which order, on which rank — and how to resume exactly.
//!
//! An epoch's plan is a pure function of ([`SamplerConfig`], row lengths, epoch):
//! 1. the row order: `0..n`, shuffled with a generator seeded by (seed, epoch) when `shuffle`;
//! 2. windows: with `group_window = Some(w)`, the order is cut into windows of `w` batches' worth
//!    of rows (w × batch size rows, or rows summing to w × the token budget) and each window is
//!    sorted by length, longest first, so rows of similar length share a batch (less padding);
//! 3. batches: each window is cut into batches of `n` rows ([`Batching::Samples`]) or greedily
//!    into batches whose padded size `rows × longest` stays within the budget
//!    ([`Batching::Tokens`]; a single row longer than the budget gets a batch of its own);
//! 4. with grouping and shuffling, the batches are shuffled again so long ones do not cluster;
//! 5. sharding: batch `j·world + rank` goes to `rank`; every rank takes `ceil(B / world)` steps,
//!    the last ranks wrapping around to the epoch's first batches, so all ranks step together.
//!
//! The [`Cursor`] (epoch, position = batches already taken in that epoch, seed) is all a checkpoint
//! needs: [`Sampler::resume`] rebuilds the plan and continues with exactly the batches an
//! uninterrupted run would have produced.

use crate::error::{DataError, Result};
use crate::rng::SplitMix64;
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Batching {
    /// This many rows per batch (the last batch of a window may have fewer).
    Samples(usize),
    /// At most this many padded tokens per batch: rows × the longest row's length.
    Tokens(usize),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplerConfig {
    pub seed: u64,
    pub shuffle: bool,
    pub rank: usize,
    pub world: usize,
    pub batching: Batching,
    /// Sort by length inside windows of this many batches; `None`: no length grouping.
    pub group_window: Option<usize>,
}

impl SamplerConfig {
    /// Shuffled, single process, `batch` rows per batch, no length grouping.
    pub fn new(seed: u64, batching: Batching) -> Self {
        SamplerConfig {
            seed,
            shuffle: true,
            rank: 0,
            world: 1,
            batching,
            group_window: None,
        }
    }

    fn validate(&self, rows: usize) -> Result<()> {
        let bad = |m: String| Err(DataError::Options(m));
        if self.world == 0 || self.rank >= self.world {
            return bad(format!("rank {} of world size {}: need rank < world", self.rank, self.world));
        }
        match self.batching {
            Batching::Samples(0) => return bad("batch size must be at least 1".into()),
            Batching::Tokens(0) => return bad("token budget must be at least 1".into()),
            _ => {}
        }
        if self.group_window == Some(0) {
            return bad("length-grouping window must be at least 1 batch".into());
        }
        if rows == 0 {
            return bad("the dataset has no rows".into());
        }
        Ok(())
    }
}

/// Where a sampler stands: save it in a checkpoint, hand it to [`Sampler::resume`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    pub epoch: u64,
    /// Batches this rank has already taken in `epoch`.
    pub position: u64,
    pub seed: u64,
}

/// One rank's batches of one epoch, flattened.
#[derive(Debug, Clone)]
struct EpochPlan {
    epoch: u64,
    starts: Vec<usize>,
    rows: Vec<u32>,
}

impl EpochPlan {
    fn steps(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }
    fn batch(&self, j: usize) -> &[u32] {
        &self.rows[self.starts[j]..self.starts[j + 1]]
    }
}

/// All batches of an epoch, before sharding (every rank computes the same list).
pub fn global_batches(config: &SamplerConfig, lengths: &[u32], epoch: u64) -> Vec<Vec<u32>> {
    let n = lengths.len();
    let mut rng = SplitMix64::for_stream(config.seed, epoch);
    let mut order: Vec<u32> = (0..n as u32).collect();
    if config.shuffle {
        rng.shuffle(&mut order);
    }
    let len_of = |k: u32| lengths[k as usize] as usize;
    let mut batches: Vec<Vec<u32>> = Vec::new();
    let mut i = 0;
    while i < n {
        let end = match (config.batching, config.group_window) {
            (Batching::Samples(b), Some(w)) => n.min(i + b.saturating_mul(w)),
            (Batching::Samples(b), None) => n.min(i + b),
            (Batching::Tokens(t), Some(w)) => {
                let target = t.saturating_mul(w);
                let mut sum = 0usize;
                let mut e = i;
                while e < n && (e == i || sum < target) {
                    sum += len_of(order[e]);
                    e += 1;
                }
                e
            }
            // Without sorting, cutting the whole rest greedily is the same as window by window.
            (Batching::Tokens(_), None) => n,
        };
        let window = &mut order[i..end];
        if config.group_window.is_some() {
            window.sort_by_key(|&k| Reverse(lengths[k as usize]));
        }
        match config.batching {
            Batching::Samples(b) => batches.extend(window.chunks(b).map(<[u32]>::to_vec)),
            Batching::Tokens(t) => {
                let mut cur: Vec<u32> = Vec::new();
                let mut longest = 0usize;
                for &k in window.iter() {
                    let l = len_of(k);
                    let new_longest = longest.max(l);
                    if !cur.is_empty() && (cur.len() + 1).saturating_mul(new_longest) > t {
                        batches.push(std::mem::take(&mut cur));
                        longest = l;
                    } else {
                        longest = new_longest;
                    }
                    cur.push(k);
                }
                if !cur.is_empty() {
                    batches.push(cur);
                }
            }
        }
        i = end;
    }
    if config.group_window.is_some() && config.shuffle {
        rng.shuffle(&mut batches);
    }
    batches
}

/// This rank's share: `ceil(B / world)` batches, wrapping around so every rank has as many.
fn shard(config: &SamplerConfig, batches: &[Vec<u32>], epoch: u64) -> EpochPlan {
    let b = batches.len();
    let steps = b.div_ceil(config.world);
    let mut starts = Vec::with_capacity(steps + 1);
    let mut rows = Vec::new();
    starts.push(0);
    for j in 0..steps {
        rows.extend_from_slice(&batches[(j * config.world + config.rank) % b]);
        starts.push(rows.len());
    }
    EpochPlan {
        epoch,
        starts,
        rows,
    }
}

/// Batches for one rank, epoch after epoch, resumable from a [`Cursor`].
#[derive(Debug, Clone)]
pub struct Sampler {
    config: SamplerConfig,
    lengths: Vec<u32>,
    plan: EpochPlan,
    position: usize,
}

impl Sampler {
    /// A sampler at the start of epoch 0. `lengths[i]` is row `i`'s token count (e.g.
    /// [`crate::TokenStore::row_lengths`]).
    pub fn new(config: SamplerConfig, lengths: Vec<u32>) -> Result<Self> {
        Self::resume(
            config.clone(),
            lengths,
            Cursor {
                epoch: 0,
                position: 0,
                seed: config.seed,
            },
        )
    }

    /// A sampler that continues exactly after `cursor`.
    pub fn resume(config: SamplerConfig, lengths: Vec<u32>, cursor: Cursor) -> Result<Self> {
        config.validate(lengths.len())?;
        if cursor.seed != config.seed {
            return Err(DataError::Options(format!(
                "the data cursor was saved with seed {}, the run uses seed {}",
                cursor.seed, config.seed
            )));
        }
        let plan = shard(&config, &global_batches(&config, &lengths, cursor.epoch), cursor.epoch);
        let position = usize::try_from(cursor.position).unwrap_or(usize::MAX);
        if position > plan.steps() {
            return Err(DataError::Options(format!(
                "the data cursor is at batch {} of epoch {}, which has only {}",
                cursor.position,
                cursor.epoch,
                plan.steps()
            )));
        }
        Ok(Sampler {
            config,
            lengths,
            plan,
            position,
        })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Where the next batch comes from; save it with a checkpoint.
    pub fn cursor(&self) -> Cursor {
        Cursor {
            epoch: self.plan.epoch,
            position: self.position as u64,
            seed: self.config.seed,
        }
    }

    /// Steps this rank takes in the current epoch (equal on every rank).
    pub fn steps_in_epoch(&self) -> usize {
        self.plan.steps()
    }

    /// True once every batch of the current epoch has been taken.
    pub fn epoch_finished(&self) -> bool {
        self.position >= self.plan.steps()
    }

    /// The next batch's row indices; moves to the next epoch after the last batch of one.
    pub fn next_batch(&mut self) -> Vec<usize> {
        if self.epoch_finished() {
            let epoch = self.plan.epoch + 1;
            self.plan = shard(
                &self.config,
                &global_batches(&self.config, &self.lengths, epoch),
                epoch,
            );
            self.position = 0;
        }
        let batch = self.plan.batch(self.position).iter().map(|&k| k as usize).collect();
        self.position += 1;
        batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lengths(n: usize, seed: u64) -> Vec<u32> {
        let mut g = SplitMix64::new(seed);
        (0..n).map(|_| 1 + g.below(300) as u32).collect()
    }

    fn take(s: &mut Sampler, k: usize) -> Vec<Vec<usize>> {
        (0..k).map(|_| s.next_batch()).collect()
    }

    #[test]
    fn epochs_cover_every_row_once_and_differ() {
        let lens = lengths(103, 1);
        let mut s = Sampler::new(SamplerConfig::new(9, Batching::Samples(10)), lens).unwrap();
        assert_eq!(s.steps_in_epoch(), 11);
        let e0: Vec<usize> = take(&mut s, 11).concat();
        let e1: Vec<usize> = take(&mut s, 11).concat();
        let mut sorted = e0.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..103).collect::<Vec<_>>());
        assert_ne!(e0, e1, "each epoch has its own order");
        assert_eq!(s.cursor().epoch, 1);
    }

    #[test]
    fn no_shuffle_keeps_file_order() {
        let mut cfg = SamplerConfig::new(1, Batching::Samples(4));
        cfg.shuffle = false;
        let mut s = Sampler::new(cfg, vec![5; 10]).unwrap();
        assert_eq!(take(&mut s, 3), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
    }

    #[test]
    fn length_grouping_cuts_padding() {
        let lens = lengths(4000, 3);
        let padded = |window: Option<usize>| -> usize {
            let mut cfg = SamplerConfig::new(5, Batching::Samples(16));
            cfg.group_window = window;
            global_batches(&cfg, &lens, 0)
                .iter()
                .map(|b| b.len() * b.iter().map(|&k| lens[k as usize] as usize).max().unwrap())
                .sum()
        };
        let (plain, grouped) = (padded(None), padded(Some(50)));
        assert!(grouped * 10 < plain * 7, "grouped {grouped} vs plain {plain}");
    }

    #[test]
    fn bad_configs_are_errors() {
        let mut cfg = SamplerConfig::new(1, Batching::Samples(4));
        cfg.rank = 2;
        cfg.world = 2;
        assert!(Sampler::new(cfg, vec![1; 8]).is_err());
        assert!(Sampler::new(SamplerConfig::new(1, Batching::Tokens(0)), vec![1; 8]).is_err());
        assert!(Sampler::new(SamplerConfig::new(1, Batching::Samples(2)), vec![]).is_err());
        let s = Sampler::new(SamplerConfig::new(1, Batching::Samples(2)), vec![1; 8]).unwrap();
        let wrong_seed = Cursor { seed: 2, ..s.cursor() };
        assert!(Sampler::resume(s.config().clone(), vec![1; 8], wrong_seed).is_err());
        let too_far = Cursor { position: 99, ..s.cursor() };
        assert!(Sampler::resume(s.config().clone(), vec![1; 8], too_far).is_err());
    }

    #[test]
    fn cursor_round_trips_through_json() {
        let c = Cursor { epoch: 3, position: 17, seed: 42 };
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(json, r#"{"epoch":3,"position":17,"seed":42}"#);
        assert_eq!(serde_json::from_str::<Cursor>(&json).unwrap(), c);
    }

    fn config_strategy() -> impl Strategy<Value = SamplerConfig> {
        (
            any::<u64>(),
            any::<bool>(),
            1usize..5,
            prop_oneof![(1usize..9).prop_map(Batching::Samples), (1usize..900).prop_map(Batching::Tokens)],
            prop_oneof![Just(None), (1usize..6).prop_map(Some)],
        )
            .prop_map(|(seed, shuffle, world, batching, group_window)| SamplerConfig {
                seed,
                shuffle,
                rank: 0,
                world,
                batching,
                group_window,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Resuming from the cursor at any step yields exactly the batches of an uninterrupted run,
        /// across epoch boundaries.
        #[test]
        fn resume_replays_the_uninterrupted_run(
            config in config_strategy(), n in 1usize..120, stop in 0usize..60, lseed in any::<u64>()
        ) {
            let lens = lengths(n, lseed);
            let mut straight = Sampler::new(config.clone(), lens.clone()).unwrap();
            let expected = take(&mut straight, stop + 25);
            let mut first = Sampler::new(config.clone(), lens.clone()).unwrap();
            let before = take(&mut first, stop);
            let saved = serde_json::to_string(&first.cursor()).unwrap();
            let cursor: Cursor = serde_json::from_str(&saved).unwrap();
            let mut resumed = Sampler::resume(config, lens, cursor).unwrap();
            let after = take(&mut resumed, 25);
            prop_assert_eq!(&before[..], &expected[..stop]);
            prop_assert_eq!(&after[..], &expected[stop..]);
        }

        /// Every rank steps the same number of times; together the ranks cover every row, and
        /// only the wrapped-around batches repeat rows.
        #[test]
        fn shards_are_equal_and_cover_the_data(
            config in config_strategy(), n in 1usize..150, lseed in any::<u64>(), epoch in 0u64..3
        ) {
            let lens = lengths(n, lseed);
            let global = global_batches(&config, &lens, epoch);
            let mut seen = vec![0usize; n];
            let mut steps = Vec::new();
            for rank in 0..config.world {
                let cfg = SamplerConfig { rank, ..config.clone() };
                let plan = shard(&cfg, &global, epoch);
                steps.push(plan.steps());
                for &k in &plan.rows {
                    seen[k as usize] += 1;
                }
            }
            prop_assert!(steps.iter().all(|&s| s == steps[0]));
            prop_assert_eq!(steps[0], global.len().div_ceil(config.world));
            prop_assert!(seen.iter().all(|&c| c >= 1));
            let total: usize = seen.iter().sum();
            let wrapped = steps[0] * config.world - global.len();
            let max_repeat: usize = global.iter().take(wrapped).map(Vec::len).sum();
            prop_assert!(total <= n + max_repeat);
        }

        /// Token-budget batches stay within the budget unless a single row alone exceeds it.
        #[test]
        fn token_budget_is_respected(
            seed in any::<u64>(), budget in 1usize..2000, n in 1usize..200, window in prop_oneof![Just(None), (1usize..6).prop_map(Some)]
        ) {
            let lens = lengths(n, seed);
            let cfg = SamplerConfig { group_window: window, ..SamplerConfig::new(seed, Batching::Tokens(budget)) };
            for b in global_batches(&cfg, &lens, 0) {
                let longest = b.iter().map(|&k| lens[k as usize] as usize).max().unwrap();
                prop_assert!(b.len() == 1 || b.len() * longest <= budget);
            }
        }
    }
}
