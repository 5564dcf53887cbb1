//! Data parallelism on one machine, the way DDP does it: one model replica per device (rank), each
//! accumulating its share of a step's micro-batches side by side, the gradients summed between
//! ranks once per optimizer step, then the same optimizer update on every rank (lockstep: the
//! replicas stay identical, so rank 0 alone writes checkpoints).
//!
//! The loop does not change: a step's rows are cut into micro-batches as on one device and handed
//! out `ranks` at a time ([`Engine::accumulate_group`]), micro-batch `i` to rank `i mod ranks`, each
//! with its own seed and its share of the step's loss. Summing the ranks' gradients is then the
//! one-device run with the accumulation multiplied by the rank count, and a resume on another
//! rank count continues the same data order.
//!
//! A rank that fails fails the step on all ranks ([`Engine::is_rank_failure`]): nothing of the
//! step reaches an optimizer, the loop checkpoints the last completed step and stops (exit 75).
//! Every collective has a timeout ([`COLLECTIVE_TIMEOUT`]). ZeRO-1
//! ([`DataParallel::with_sharded_optimizer`]) divides the optimizer state between the ranks.

mod collective;
mod engine;
#[cfg(feature = "cuda")]
pub mod nccl;
mod overlap;
mod rank_threads;
mod rendezvous;
mod shards;

pub use collective::{COLLECTIVE_TIMEOUT, Collective, CollectiveError, HostCollective};
use collective::{bucket_of, places_of};

use std::sync::Arc;

use rank_threads::RankThreads;

use crate::engine::{Backend, Replica};

/// What went wrong on which rank.
#[derive(Debug, thiserror::Error)]
pub enum DataParallelError<E: std::error::Error + 'static> {
    /// (Shown without the rank when the group has one.)
    #[error("{}{source}", rank_prefix(*rank, *ranks))]
    Rank {
        rank: usize,
        ranks: usize,
        source: E,
    },
    #[error("rank {rank} panicked: {message}")]
    Panicked { rank: usize, message: String },
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// No rank worked: a rank's thread could not start.
    #[error(transparent)]
    NotStarted(#[from] rank_threads::NotStarted),
    /// The optimizer shards merged into one file could not be written.
    #[error("writing the optimizer state: {0}")]
    Save(String),
    /// The optimizer update failed on a rank after the reduce: the replicas may disagree, so the
    /// state in memory is not saved (the newest checkpoint on disk is the resume point).
    #[error("rank {rank}: optimizer update failed ({message}); the replicas may disagree")]
    Update { rank: usize, message: String },
}

/// The collective between ranks on `backends`: NCCL between CUDA GPUs, the host elsewhere.
pub fn collective_for(backends: &[Backend]) -> Arc<dyn Collective> {
    #[cfg(feature = "cuda")]
    if backends.iter().all(|b| matches!(b, Backend::Cuda(_))) && backends.len() > 1 {
        let devices = backends.iter().map(|b| b.device()).collect();
        return Arc::new(nccl::NcclCollective::new(devices, COLLECTIVE_TIMEOUT));
    }
    Arc::new(HostCollective::new(backends.len(), COLLECTIVE_TIMEOUT))
}

fn rank_prefix(rank: usize, ranks: usize) -> String {
    if ranks > 1 {
        format!("rank {rank}: ")
    } else {
        String::new()
    }
}

/// What every rank's work returned, in rank order (`Err`: its thread panicked, or did not start,
/// or its device failed; the message).
type RankResults<T> = Vec<Result<T, String>>;

/// One replica per rank and the collective between them.
pub struct DataParallel<E: Replica> {
    replicas: Vec<E>,
    collective: Arc<dyn Collective>,
    /// Under ZeRO-1, each rank's mask of the parameters whose optimizer state it keeps and steps.
    shards: Option<Vec<Vec<bool>>>,
    /// This step's gradients were reduced during its last backward ([`overlap`]).
    reduced: bool,
    /// The ranks' threads, started at the first call and kept ([`rank_threads`]).
    threads: RankThreads,
}

impl<E: Replica> DataParallel<E> {
    /// `replicas[r]` is rank `r`; they must start from the same weights and optimizer state.
    pub fn new(replicas: Vec<E>, collective: Arc<dyn Collective>) -> Self {
        assert_eq!(
            replicas.len(),
            collective.ranks(),
            "one replica per rank of the collective"
        );
        assert!(!replicas.is_empty(), "a data-parallel group has a rank");
        Self {
            threads: RankThreads::new(replicas.len()),
            replicas,
            collective,
            shards: None,
            reduced: false,
        }
    }

    /// ZeRO-1: each rank keeps the optimizer state of about 1/ranks of the trained parameters
    /// and steps only those; after each step the updated masters are gathered to every rank (a
    /// sum of each owner's masters and the others' zeros: exact). The same arithmetic as without
    /// sharding, the optimizer state's memory divided by the ranks, one more collective a step.
    pub fn with_sharded_optimizer(mut self) -> Result<Self, DataParallelError<E::Error>> {
        let ranks = self.replicas.len();
        if ranks == 1 {
            return Ok(self);
        }
        let owners = shards::owners(&self.replicas[0].trained_sizes(), ranks);
        let masks = shards::masks(&owners, ranks);
        for (rank, (replica, keep)) in self.replicas.iter_mut().zip(&masks).enumerate() {
            (replica.keep_optimizer_states(keep)).map_err(|source| DataParallelError::Rank {
                rank,
                ranks,
                source,
            })?;
        }
        self.shards = Some(masks);
        Ok(self)
    }

    /// f32 values of optimizer state each rank holds.
    pub fn optimizer_state_values(&self) -> Result<Vec<usize>, DataParallelError<E::Error>> {
        (self.replicas.iter().enumerate())
            .map(|(rank, r)| {
                (r.optimizer_state().map(|o| o.state_values()))
                    .map_err(|source| self.rank_error(rank, source))
            })
            .collect()
    }

    pub fn replicas(&self) -> &[E] {
        &self.replicas
    }

    fn first(&self) -> &E {
        &self.replicas[0]
    }

    fn rank_error(&self, rank: usize, source: E::Error) -> DataParallelError<E::Error> {
        DataParallelError::Rank {
            rank,
            ranks: self.replicas.len(),
            source,
        }
    }
}

impl<E: Replica> DataParallel<E> {
    /// The first error of the ranks' results, in rank order (an out-of-memory first, so that the
    /// loop halves the micro-batch on every rank).
    fn first_error<T>(
        results: RankResults<Result<T, E::Error>>,
    ) -> Result<Vec<T>, DataParallelError<E::Error>> {
        let ranks = results.len();
        let lifted = (results.into_iter().enumerate())
            .map(|(rank, r)| {
                r.map(|r| {
                    r.map_err(|source| DataParallelError::Rank {
                        rank,
                        ranks,
                        source,
                    })
                })
            })
            .collect();
        Self::first_failure(lifted)
    }

    /// The error that explains the others: an out-of-memory first (the loop halves the
    /// micro-batch on every rank), then a rank's own failure, then the collective's (which the
    /// other ranks see when one gives up), each in rank order.
    fn first_failure<T>(
        results: RankResults<Result<T, DataParallelError<E::Error>>>,
    ) -> Result<Vec<T>, DataParallelError<E::Error>> {
        let mut oks = Vec::with_capacity(results.len());
        let mut errors = Vec::new();
        for (rank, r) in results.into_iter().enumerate() {
            match r {
                Ok(Ok(t)) => oks.push(t),
                Ok(Err(e)) => errors.push(e),
                Err(message) => errors.push(DataParallelError::Panicked { rank, message }),
            }
        }
        let rank = |oom: bool| {
            move |e: &DataParallelError<E::Error>| match e {
                DataParallelError::Rank { source, .. } => E::is_out_of_memory(source) == oom,
                DataParallelError::Panicked { .. } => !oom,
                _ => false,
            }
        };
        let first = (errors.iter().position(rank(true)))
            .or_else(|| errors.iter().position(rank(false)))
            .or((!errors.is_empty()).then_some(0));
        match first {
            Some(i) => Err(errors.swap_remove(i)),
            None => Ok(oks),
        }
    }

    /// Under ZeRO-1, every rank's masters replaced by their owners' (just stepped).
    fn gather_masters(&mut self) -> Result<(), DataParallelError<E::Error>> {
        let Some(masks) = &self.shards else {
            return Ok(());
        };
        let collective = &self.collective;
        let ranks = self.replicas.len();
        let results = self
            .threads
            .on_every_rank(&mut self.replicas, |rank, replica| {
                let fail = |source| DataParallelError::Rank {
                    rank,
                    ranks,
                    source,
                };
                let mine = replica.masters_for_gather(&masks[rank]).map_err(fail)?;
                let places = mine.len();
                let all = collective.all_reduce_sum(rank, bucket_of(mine))?;
                replica.put_masters(places_of(all, places)).map_err(fail)
            })?;
        Self::flatten(results)
    }

    /// The first failure of ranks whose work returns this engine's errors.
    fn flatten(
        results: RankResults<Result<(), DataParallelError<E::Error>>>,
    ) -> Result<(), DataParallelError<E::Error>> {
        for (rank, r) in results.into_iter().enumerate() {
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(message) => return Err(DataParallelError::Panicked { rank, message }),
            }
        }
        Ok(())
    }

    /// Every rank's gradients replaced by their sum over the ranks.
    fn reduce_gradients(&mut self) -> Result<(), DataParallelError<E::Error>> {
        let collective = &self.collective;
        let ranks = self.replicas.len();
        let results = self
            .threads
            .on_every_rank(&mut self.replicas, |rank, replica| {
                let grads = match replica.take_gradients() {
                    Ok(g) => g,
                    Err(e) => {
                        collective.abort(rank, &e.to_string());
                        return Err(DataParallelError::Rank {
                            rank,
                            ranks,
                            source: e,
                        });
                    }
                };
                let places = grads.len();
                let summed = collective.all_reduce_sum(rank, bucket_of(grads))?;
                replica
                    .put_gradients(places_of(summed, places))
                    .map_err(|source| DataParallelError::Rank {
                        rank,
                        ranks,
                        source,
                    })
            })?;
        Self::flatten(results)
    }
}
