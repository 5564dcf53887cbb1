//! The next step's rows, drawn from the sampler and read and collated on a helper thread while the
//! current step computes, so that a device does not wait for its input between steps (on a GPU the
//! step is short and a store read is not). The data order is the sampler's either way: a step's
//! rows are drawn when it would have drawn them, only earlier; a run that stops between steps
//! discards what was read ahead and its checkpoint's cursor is the last completed step's.

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
    /// Seconds the loop waited for the helper once the step before had computed.
    pub waited_s: f64,
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

/// Runs `step` on this thread while the helper collates `next` (if any) at micro-batch `micro`;
/// returns the step's result and what was read ahead.
pub(super) fn alongside<E: Engine, T: Task<E>, O>(
    (task, train): (&T, &dyn RowSource<T::Row>),
    next: Option<Drawn>,
    micro: usize,
    step: impl FnOnce() -> O,
) -> (O, Option<Ahead<E::Batch>>) {
    std::thread::scope(|scope| {
        let helper = next.as_ref().map(|drawn| {
            let rows = drawn.rows.clone();
            scope.spawn(move || collate::<E, T>(task, train, &rows, micro))
        });
        let out = step();
        let t0 = Instant::now();
        let batches = helper.map(|h| {
            h.join().unwrap_or_else(|_| {
                Err(LoopError::Data(
                    "reading the next step's rows panicked".into(),
                ))
            })
        });
        let waited_s = t0.elapsed().as_secs_f64();
        let ahead = next.zip(batches).map(|(drawn, batches)| Ahead {
            drawn,
            micro,
            batches,
            waited_s,
        });
        (out, ahead)
    })
}
