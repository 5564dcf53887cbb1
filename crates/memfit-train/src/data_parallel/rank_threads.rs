//! The ranks' threads: one per rank for its work and one per rank for its reducer, started once
//! (at the group's first call) and kept, so that no step starts a thread. A thread started each
//! step would also map a stack and Rust's signal stack each step; where the address space runs out
//! (`RLIMIT_AS`) the second failure aborts the process, so only the start may fail, and then no
//! rank works. Each rank queues on its own streams and waits for its device before its tensors
//! leave the thread.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, OnceLock, PoisonError};

use burn::prelude::Device;
use burn::tensor::StreamId;
use rayon::{ThreadPool, ThreadPoolBuilder};

use super::RankResults;
use crate::engine::Replica;

/// The ranks' threads could not be started (a stack not mapped: the address space used up), so no
/// rank worked; the loop treats it as a failed rank: checkpoint, exit 75.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct NotStarted(String);

/// A group's threads, started at its first call that needs them.
pub(super) struct RankThreads {
    ranks: usize,
    pools: OnceLock<Result<Pools, NotStarted>>,
}

/// Thread `r` of each pool serves rank `r` (rayon's broadcast runs one call on each thread). Two
/// pools, so that a rank's reducer runs beside its backward.
struct Pools {
    compute: ThreadPool,
    reduce: ThreadPool,
}

impl RankThreads {
    pub(super) fn new(ranks: usize) -> Self {
        Self {
            ranks,
            pools: OnceLock::new(),
        }
    }

    fn pools(&self) -> Result<&Pools, NotStarted> {
        let start = || {
            Ok(Pools {
                compute: pool(self.ranks, Role::Compute)?,
                reduce: pool(self.ranks, Role::Reduce)?,
            })
        };
        self.pools.get_or_init(start).as_ref().map_err(Clone::clone)
    }

    /// Runs `work` for every rank (its replica, `&` or `&mut`) on the rank's thread; the results
    /// in rank order (a rank that panicked, or whose device failed: the message as the error), or
    /// [`NotStarted`] where no rank worked.
    pub(super) fn on_every_rank<E, I, T, F>(
        &self,
        replicas: impl IntoIterator<Item = I>,
        work: F,
    ) -> Result<RankResults<T>, NotStarted>
    where
        E: Replica,
        I: std::ops::Deref<Target = E> + Send,
        T: Send,
        F: Fn(usize, I) -> T + Sync,
    {
        let mut replicas: Vec<I> = replicas.into_iter().collect();
        assert_eq!(replicas.len(), self.ranks, "one replica per rank");
        if self.ranks == 1 {
            // one device: no thread, and a panic goes on up as it would without data parallelism
            return Ok(replicas
                .pop()
                .map(|only| Ok(work(0, only)))
                .into_iter()
                .collect());
        }
        let compute = &self.pools()?.compute;
        let slots: Vec<Mutex<Option<I>>> =
            replicas.into_iter().map(|r| Mutex::new(Some(r))).collect();
        Ok(compute.broadcast(|context| {
            let rank = context.index();
            let taken = slots[rank]
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            let replica = taken.expect("a broadcast runs once on each thread");
            stream_of(rank, Role::Compute).executes(|| {
                let device = replica.device();
                let out = catch_unwind(AssertUnwindSafe(|| work(rank, replica)));
                let out = out.map_err(|panic| panic_message(&panic))?;
                finished_on(&device).map(|()| out)
            })
        }))
    }

    /// Runs `body` on this (rank `rank`'s) thread while `reduce` runs on the rank's reducing
    /// thread, on the rank's reducing stream; both results once both are done (a panicking reducer:
    /// its message as the error).
    pub(super) fn beside_reducer<B, R>(
        &self,
        rank: usize,
        reduce: impl FnOnce() -> R + Send,
        body: impl FnOnce() -> B,
    ) -> Result<(B, Result<R, String>), NotStarted>
    where
        R: Send,
    {
        let pools = self.pools()?;
        let mut reduced = None;
        let slot = &mut reduced;
        let out = pools.reduce.in_place_scope(|s| {
            s.spawn(move |_| {
                let run = || catch_unwind(AssertUnwindSafe(reduce));
                let result = stream_of(rank, Role::Reduce).executes(run);
                *slot = Some(result.map_err(|panic| panic_message(&panic)));
            });
            body()
        });
        let reduced = reduced.unwrap_or_else(|| Err("the reducer did not run".into()));
        Ok((out, reduced))
    }
}

/// `ranks` threads for `role`, thread `r` named for rank `r` (tests ask for a stack no machine can
/// map).
fn pool(ranks: usize, role: Role) -> Result<ThreadPool, NotStarted> {
    let builder = ThreadPoolBuilder::new().num_threads(ranks);
    let builder = builder.spawn_handler(move |thread| {
        let rank = thread.index();
        let named = std::thread::Builder::new().name(format!("memfit-rank-{rank}-{}", role.name()));
        #[cfg(test)]
        let named = match tests::UNSTARTABLE.with(|r| r.get()) {
            Some(unstartable) if unstartable == rank => named.stack_size(1 << 60),
            _ => named,
        };
        let spawned = named.spawn(move || thread.run());
        let why = |e: std::io::Error| {
            format!("rank {rank}'s {} thread could not start: {e}", role.name())
        };
        spawned
            .map(drop)
            .map_err(|e| std::io::Error::new(e.kind(), why(e)))
    });
    builder.build().map_err(|e| NotStarted(e.to_string()))
}

/// What a rank queues on a stream: its compute, or its reducer's sums (a stream of their own, so
/// that the reduction overlaps the backward).
#[derive(Debug, Clone, Copy)]
enum Role {
    Compute = 0,
    Reduce = 1,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Compute => "compute",
            Role::Reduce => "reducing",
        }
    }
}

/// The stream rank `rank`'s `role` queues on: the same for every call of the process. cubecl gives
/// each new thread a new stream, and on CUDA each stream has a memory pool of its own (cubecl-cuda's
/// `Stream`, up to 128 of them per device): were a rank's work to move between threads, its
/// activations would be reserved in another pool each time, until the device ran out.
fn stream_of(rank: usize, role: Role) -> StreamId {
    static STREAMS: Mutex<Vec<[StreamId; 2]>> = Mutex::new(Vec::new());
    let mut streams = STREAMS.lock().unwrap_or_else(PoisonError::into_inner);
    while streams.len() <= rank {
        streams.push([StreamId::allocate(), StreamId::allocate()]);
    }
    streams[rank][role as usize]
}

/// Waits until `device` has done what this thread queued on it. cubecl queues each thread's work
/// on a stream of its own, and another thread's work does not wait for it: without this, tensors
/// a rank's thread left half-computed were read by the next step's threads (on wgpu, a group of
/// ranks drifted from one device by 0.2% of the loss in 20 steps; synced, it holds to 1e-5).
pub(super) fn finished_on(device: &Device) -> Result<(), String> {
    device.sync().map_err(|e| format!("the device failed: {e}"))
}

fn panic_message(payload: &Box<dyn std::any::Any + Send>) -> String {
    (crate::engine::panic_text(payload).unwrap_or("a rank's thread panicked")).to_string()
}

#[cfg(test)]
pub(super) mod tests {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use memfit_nn::t5::T5Model;

    thread_local! {
        /// The rank whose threads [`pool`] cannot start, for pools built on this (the test's) thread.
        pub(super) static UNSTARTABLE: Cell<Option<usize>> = const { Cell::new(None) };
    }

    fn tiny_engine() -> crate::engine::ModelEngine<T5Model> {
        let config = memfit_nn::t5::T5Config::from_json(&serde_json::json!({
            "vocab_size": 16, "d_model": 8, "d_kv": 4, "d_ff": 8, "num_layers": 1,
            "num_decoder_layers": 1, "num_heads": 2, "relative_attention_num_buckets": 4,
            "relative_attention_max_distance": 8, "dropout_rate": 0.0,
            "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0
        }))
        .unwrap();
        crate::engine::ModelEngine::new(T5Model::init(config, 1), Default::default()).unwrap()
    }

    /// Each rank's compute and reducer: their streams and threads.
    fn streams_and_threads(threads: &RankThreads, replicas: &[T5Engine]) -> Vec<[Place; 2]> {
        let here = || (StreamId::current(), std::thread::current().id());
        let all = threads.on_every_rank(replicas, |rank, _: &_| {
            let (compute, reducer) = threads.beside_reducer(rank, here, here).unwrap();
            [compute, reducer.unwrap()]
        });
        all.unwrap().into_iter().map(Result::unwrap).collect()
    }

    type Place = (StreamId, std::thread::ThreadId);
    type T5Engine = crate::engine::ModelEngine<T5Model>;

    #[test]
    fn each_rank_keeps_its_threads_and_streams_for_every_call() {
        let replicas = [tiny_engine(), tiny_engine()];
        let threads = RankThreads::new(2);
        let calls: Vec<_> = (0..4)
            .map(|_| streams_and_threads(&threads, &replicas))
            .collect();
        let first = &calls[0];
        let streams = |call: &Vec<[Place; 2]>| call.iter().map(|r| [r[0].0, r[1].0]).collect();
        let compute = |call: &Vec<[Place; 2]>| call.iter().map(|r| r[0].1).collect();
        for call in &calls {
            let (s, c): (Vec<[StreamId; 2]>, Vec<_>) = (streams(call), compute(call));
            assert_eq!((s, c), (streams(first), compute(first)), "{calls:?}");
        }
        let caller = (StreamId::current(), std::thread::current().id());
        let mut distinct: Vec<StreamId> = streams(first).into_iter().flatten().collect();
        distinct.extend([caller.0]);
        distinct.sort();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            5,
            "one per rank and role, none the caller's: {first:?}"
        );
        // the reducers run on the reducing pool's two threads, whichever is free, every call
        let mut reducers: Vec<_> = calls.iter().flatten().map(|r| r[1].1).collect();
        reducers.sort_by_key(|t| format!("{t:?}"));
        reducers.dedup();
        let others: Vec<_> = compute(first).into_iter().chain([caller.1]).collect();
        assert!(
            others[0] != others[1] && !others[..2].contains(&caller.1),
            "{first:?}"
        );
        assert!(
            reducers.len() <= 2 && reducers.iter().all(|t| !others.contains(t)),
            "{calls:?}"
        );
    }

    #[test]
    fn a_reducer_that_panics_is_its_ranks_error_not_a_crash() {
        let replicas = [tiny_engine(), tiny_engine()];
        let threads = RankThreads::new(2);
        let all = threads.on_every_rank(&replicas, |rank, _: &_| {
            let reduce = || -> () { panic!("reducer {rank} fell over") };
            threads.beside_reducer(rank, reduce, || rank).unwrap()
        });
        for (rank, result) in all.unwrap().into_iter().enumerate() {
            let (body, reduced) = result.unwrap();
            assert_eq!(body, rank);
            assert!(
                reduced
                    .unwrap_err()
                    .contains(&format!("reducer {rank} fell over"))
            );
        }
    }

    #[test]
    fn a_rank_without_a_thread_stops_every_rank_before_any_works() {
        let replicas = [tiny_engine(), tiny_engine(), tiny_engine()];
        let worked = AtomicUsize::new(0);
        let work = |rank: usize, _: &_| {
            worked.fetch_add(1, Ordering::SeqCst);
            rank
        };
        UNSTARTABLE.with(|r| r.set(Some(2)));
        let unstartable = RankThreads::new(3);
        let none = unstartable.on_every_rank(&replicas, work);
        UNSTARTABLE.with(|r| r.set(None));
        assert_eq!(worked.load(Ordering::SeqCst), 0, "no rank worked");
        let not_started = none.unwrap_err();
        let e = not_started.to_string();
        assert!(e.contains("rank 2's compute thread could not start"), "{e}");
        // the threads of a group that started are kept: a later call starts none
        let started = RankThreads::new(3);
        assert_eq!(
            started.on_every_rank(&replicas, work).unwrap(),
            vec![Ok(0), Ok(1), Ok(2)]
        );
        UNSTARTABLE.with(|r| r.set(Some(1)));
        let again = started.on_every_rank(&replicas, work);
        UNSTARTABLE.with(|r| r.set(None));
        assert_eq!(again.unwrap(), vec![Ok(0), Ok(1), Ok(2)]);
        // the loop stops every rank resumable, as for a failed rank (checkpoint, exit 75)
        type Group = super::super::DataParallel<T5Engine>;
        let as_error = super::super::DataParallelError::from(not_started);
        assert!(<Group as crate::engine::Engine>::is_rank_failure(&as_error));
    }
}
