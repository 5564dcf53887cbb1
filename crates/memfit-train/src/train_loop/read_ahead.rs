//! The next step's rows, drawn from the sampler and read and collated on a helper while the
//! current step computes, so that a device does not wait for its input between steps (on a GPU the
//! step is short and a store read is not). The data order is the sampler's either way: a step's
//! rows are drawn when it would have drawn them, only earlier; a run that stops between steps
//! discards what was read ahead and its checkpoint's cursor is the last completed step's.
//!
//! With data-parallel ranks each rank's micro-batches (`i mod ranks`) are read on a helper of its
//! own, from the one shared row source (no copy of the data per rank), and each rank's wait is
//! reported.

use std::time::Instant;

use super::LoopError;
use crate::engine::Engine;
use crate::task::{self, RowSource, Task};
use memfit_data::{Cursor, Sampler};

/// A step's rows as the sampler gave them, with where the sampler stood after them.
pub(super) struct Drawn {
    pub rows: Vec<usize>,
    pub epoch: u64,
    /// The last step of its epoch.
    pub epoch_end: bool,
    /// The sampler's cursor once these rows are drawn: the checkpoint's when the step completes.
    pub cursor: Cursor,
}

impl Drawn {
    pub fn from(sampler: &mut Sampler) -> Self {
        let rows = sampler.next_batch();
        let cursor = sampler.cursor();
        Self {
            rows,
            epoch: cursor.epoch,
            epoch_end: sampler.epoch_finished(),
            cursor,
        }
    }
}

/// The next step, drawn and (on the helper thread) collated at micro-batch `micro`.
pub(super) struct Ahead<B> {
    pub drawn: Drawn,
    pub micro: usize,
    pub batches: Result<Vec<B>, LoopError>,
    /// Seconds the loop waited for the helpers once the step before had computed.
    pub waited_s: f64,
    /// The same per rank: how long after the step before rank r's micro-batches were ready.
    pub rank_waited_s: Vec<f64>,
}

/// `rows` read from `train` and collated into micro-batches of `micro` rows.
pub(super) fn collate<E: Engine, T: Task<E>>(
    task: &T,
    train: &dyn RowSource<T::Row>,
    rows: &[usize],
    micro: usize,
) -> Result<Vec<E::Batch>, LoopError> {
    rows.chunks(micro)
        .map(|chunk| {
            let rows = task::read_rows(train, chunk).map_err(|e| LoopError::Data(e.to_string()))?;
            Ok(task.collate(&rows))
        })
        .collect()
}

/// Runs `step` on this thread while one helper per rank collates its micro-batches of `next` (if
/// any) at micro-batch `micro`; returns the step's result and what was read ahead. The helpers are
/// jobs on rayon's pool, whose threads exist from the start: no thread is created while a run
/// trains, so a run whose address space is used up still reaches its checkpoint and exit 75.
pub(super) fn alongside<E: Engine, T: Task<E>, O>(
    (task, train): (&T, &dyn RowSource<T::Row>),
    (next, micro, ranks): (Option<Drawn>, usize, usize),
    step: impl FnOnce() -> O,
) -> (O, Option<Ahead<E::Batch>>) {
    type Collated<B> = (usize, Result<Vec<(usize, Vec<B>)>, LoopError>, Instant);
    let (sender, received) = std::sync::mpsc::channel::<Collated<E::Batch>>();
    let (out, computed) = rayon::in_place_scope(|scope| {
        if let Some(drawn) = &next {
            let chunks: Vec<Vec<usize>> = drawn.rows.chunks(micro).map(<[usize]>::to_vec).collect();
            for rank in 0..ranks.clamp(1, chunks.len().max(1)) {
                let mine: Vec<(usize, Vec<usize>)> = (chunks.iter().cloned().enumerate())
                    .filter(|(i, _)| i % ranks.max(1) == rank)
                    .collect();
                let sender = sender.clone();
                scope.spawn(move |_| {
                    let read = || {
                        (mine.into_iter())
                            .map(|(i, rows)| Ok((i, collate::<E, T>(task, train, &rows, micro)?)))
                            .collect::<Result<Vec<_>, LoopError>>()
                    };
                    let batches = std::panic::catch_unwind(std::panic::AssertUnwindSafe(read))
                        .unwrap_or_else(|_| {
                            Err(LoopError::Data(
                                "reading the next step's rows panicked".into(),
                            ))
                        });
                    // the receiver outlives the scope
                    let _ = sender.send((rank, batches, Instant::now()));
                });
            }
        }
        let out = step();
        (out, Instant::now())
    });
    drop(sender);
    let mut finished: Vec<Collated<E::Batch>> = received.iter().collect();
    finished.sort_by_key(|(rank, _, _)| *rank);
    let waited_s = computed.elapsed().as_secs_f64();
    let rank_waited_s = (finished.iter())
        .map(|(_, _, done)| done.saturating_duration_since(computed).as_secs_f64())
        .collect();
    let ahead = next.map(|drawn| Ahead {
        drawn,
        micro,
        batches: in_step_order(finished.into_iter().map(|(_, b, _)| b)),
        waited_s,
        rank_waited_s,
    });
    (out, ahead)
}

/// The ranks' micro-batches back in the step's order.
fn in_step_order<B>(
    ranks: impl Iterator<Item = Result<Vec<(usize, Vec<B>)>, LoopError>>,
) -> Result<Vec<B>, LoopError> {
    let mut all = Vec::new();
    for rank in ranks {
        all.extend(rank?);
    }
    all.sort_by_key(|(i, _)| *i);
    Ok(all.into_iter().flat_map(|(_, b)| b).collect())
}
