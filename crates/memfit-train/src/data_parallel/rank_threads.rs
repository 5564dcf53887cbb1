//! The ranks' threads: each rank's work for one call on a thread of its own, all of them started
//! before any works (a rank left without a thread would leave the others waiting in a collective
//! until its timeout), each queuing on its rank's own stream, and each waiting for its device
//! before its tensors leave the thread.

use std::sync::{Mutex, PoisonError, mpsc};
use std::thread::{Builder, Scope, ScopedJoinHandle};

use burn::prelude::Device;
use burn::tensor::StreamId;

use super::RankResults;
use crate::engine::Replica;

/// A rank's thread could not be started (its stack not mapped: the address space used up), so no
/// rank worked; the loop treats it as a failed rank: checkpoint, exit 75.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotStarted(String);

/// Runs `work` for every rank (its replica, `&` or `&mut`) on a thread of its own; the results in
/// rank order (a rank that panicked, or whose device failed: the message as the error), or
/// [`NotStarted`] where no rank worked.
pub(super) fn on_every_rank<E, I, T, F>(
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
    let ranks = replicas.len();
    if ranks == 1 {
        // one device: no thread, and a panic goes on up as it would without data parallelism
        return Ok(replicas
            .pop()
            .map(|only| Ok(work(0, only)))
            .into_iter()
            .collect());
    }
    std::thread::scope(|s| {
        let work = &work;
        let mut started = Vec::with_capacity(ranks);
        let mut not_started = None;
        for (rank, replica) in replicas.into_iter().enumerate() {
            let (gate, opened) = mpsc::channel::<bool>();
            let run = move || {
                // `false` (or the gate gone): another rank has no thread, so none works
                opened.recv().ok().filter(|go| *go)?;
                stream_of(rank, Role::Compute).executes(|| {
                    let device = replica.device();
                    let out = work(rank, replica);
                    Some(finished_on(&device).map(|()| out))
                })
            };
            match thread_for(rank).spawn_scoped(s, run) {
                Ok(handle) => started.push((gate, handle)),
                Err(e) => {
                    not_started = Some(format!("rank {rank}'s thread could not start: {e}"));
                    break;
                }
            }
        }
        for (gate, _) in &started {
            let _ = gate.send(not_started.is_none());
        }
        let joined = started.into_iter().map(|(_, h)| joined(h));
        match not_started {
            Some(why) => {
                joined.for_each(drop);
                Err(NotStarted(why))
            }
            None => Ok(joined
                .map(|r| r.unwrap_or_else(|| Err("not run".into())))
                .collect()),
        }
    })
}

/// A started rank's result: `None` where it did not work.
fn joined<T>(h: ScopedJoinHandle<'_, Option<Result<T, String>>>) -> Option<Result<T, String>> {
    match h.join() {
        Ok(out) => out,
        Err(panic) => Some(Err(panic_message(&panic))),
    }
}

/// The thread a rank's work runs on (tests ask for a stack no machine can map).
fn thread_for(rank: usize) -> Builder {
    let builder = Builder::new().name(format!("memfit-rank-{rank}"));
    #[cfg(test)]
    if tests::UNSTARTABLE.with(|r| r.get()) == Some(rank) {
        return builder.stack_size(1 << 60);
    }
    builder
}

/// A scoped thread for a rank's reducer, on the rank's reducing stream, or the reason it could not
/// start.
pub(super) fn spawn_for_rank<'scope, T: Send + 'scope>(
    scope: &'scope Scope<'scope, '_>,
    rank: usize,
    f: impl FnOnce() -> T + Send + 'scope,
) -> Result<ScopedJoinHandle<'scope, T>, String> {
    let f = move || stream_of(rank, Role::Reduce).executes(f);
    (thread_for(rank).spawn_scoped(scope, f))
        .map_err(|e| format!("rank {rank}'s reducing thread could not start: {e}"))
}

/// What a rank queues on a stream: its compute, or its reducer's sums (a stream of their own, so
/// that the reduction overlaps the backward).
#[derive(Debug, Clone, Copy)]
enum Role {
    Compute = 0,
    Reduce = 1,
}

/// The stream rank `rank`'s `role` queues on: the same for every call of the process. cubecl gives
/// each new thread a new stream, and on CUDA each stream has a memory pool of its own (cubecl-cuda's
/// `Stream`, up to 128 of them per device): a rank on a fresh thread each step would leave each
/// step's activations reserved in another pool, until the device ran out.
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
        /// The rank whose thread [`thread_for`] makes unstartable, on this (the test's) thread.
        pub(in super::super) static UNSTARTABLE: Cell<Option<usize>> = const { Cell::new(None) };
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

    #[test]
    fn each_rank_queues_on_the_same_streams_every_call() {
        let replicas = [tiny_engine(), tiny_engine()];
        let streams = || {
            let all = on_every_rank(&replicas, |rank, _: &_| {
                let reducer = std::thread::scope(|s| {
                    let handle = spawn_for_rank(s, rank, StreamId::current).unwrap();
                    handle.join().unwrap()
                });
                (StreamId::current(), reducer)
            });
            all.unwrap()
                .into_iter()
                .map(Result::unwrap)
                .collect::<Vec<_>>()
        };
        let (first, second) = (streams(), streams());
        assert_eq!(first, second, "new threads, the same streams");
        let mut distinct: Vec<_> = first.iter().flat_map(|(c, r)| [*c, *r]).collect();
        distinct.push(StreamId::current());
        distinct.sort();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            5,
            "one per rank and role, none the caller's: {first:?}"
        );
    }

    #[test]
    fn a_rank_without_a_thread_stops_every_rank_before_any_works() {
        let replicas = [tiny_engine(), tiny_engine(), tiny_engine()];
        let worked = AtomicUsize::new(0);
        let work = |rank: usize, _: &_| {
            worked.fetch_add(1, Ordering::SeqCst);
            rank
        };
        let all = on_every_rank(&replicas, work).unwrap();
        assert_eq!(all, vec![Ok(0), Ok(1), Ok(2)]);
        UNSTARTABLE.with(|r| r.set(Some(2)));
        let none = on_every_rank(&replicas, work);
        UNSTARTABLE.with(|r| r.set(None));
        assert_eq!(
            worked.load(Ordering::SeqCst),
            3,
            "no rank worked the second time"
        );
        let not_started = none.unwrap_err();
        let e = not_started.to_string();
        assert!(e.contains("rank 2's thread could not start"), "{e}");
        // the loop stops every rank resumable, as for a failed rank (checkpoint, exit 75)
        type Group = super::super::DataParallel<crate::engine::ModelEngine<T5Model>>;
        let as_error = super::super::DataParallelError::from(not_started);
        assert!(<Group as crate::engine::Engine>::is_rank_failure(&as_error));
    }
}
