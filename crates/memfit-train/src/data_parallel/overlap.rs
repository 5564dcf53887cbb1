//! The gradient reduction overlapped with the last backward of a step, as DDP's buckets are:
//! while a rank runs its last micro-batch, the gradients the model declares final go, bucket by
//! bucket, to a thread of the rank's own that reduces them through the collective in the order
//! they were sent (the same on every rank: the model's structure decides it, and the collective
//! checks it), so that the reduction of the last blocks runs while the first blocks' backward
//! does. The reduced buckets then become the replica's gradients.

use std::sync::mpsc;

use super::rank_threads::{RankThreads, finished_on};
use super::{Collective, CollectiveError, DataParallelError};
use crate::engine::{GradBucket, MicroBatch, Replica};

/// Rank `rank` (of `ranks`) runs `m`, its last micro-batch of the step, reducing as it goes.
pub(super) fn accumulate_reducing<E: Replica>(
    replica: &mut E,
    m: &MicroBatch<'_, E::Batch>,
    (collective, threads): (&dyn Collective, &RankThreads),
    (rank, ranks): (usize, usize),
) -> Result<f32, DataParallelError<E::Error>> {
    let places = replica.trained_sizes().len();
    let device = replica.device();
    let (tx, rx) = mpsc::channel::<GradBucket>();
    let reduce = || -> Result<GradBucket, CollectiveError> {
        let mut reduced = Vec::new();
        for bucket in rx {
            reduced.extend(collective.all_reduce_sum(rank, bucket)?);
        }
        // the reduced gradients go back to the rank's thread (rank_threads::finished_on)
        finished_on(&device).map_err(CollectiveError::Device)?;
        Ok(reduced)
    };
    let backward = || {
        let run = std::panic::AssertUnwindSafe(|| {
            let mut send = |bucket: GradBucket| {
                // the bucket's gradients go to the reducing thread (rank_threads::finished_on)
                finished_on(&device)?;
                (tx.send(bucket)).map_err(|_| "the reduction between ranks stopped".to_string())
            };
            replica.accumulate_and_send(m.batch, (m.loss_scale, m.seed), &mut send)
        });
        let loss = std::panic::catch_unwind(run);
        drop(tx);
        // the others must not wait for this rank's buckets until the timeout (nor this rank for
        // its reducer, waiting on them)
        match &loss {
            Ok(Err(e)) => collective.abort(rank, &e.to_string()),
            Err(_) => collective.abort(rank, "the rank's thread panicked"),
            Ok(Ok(_)) => {}
        }
        loss
    };
    let (loss, reduced) = threads.beside_reducer(rank, reduce, backward)?;
    let reduced = reduced.unwrap_or_else(|panic| {
        Err(CollectiveError::Device(format!(
            "rank {rank}: the reducing thread panicked: {panic}"
        )))
    });
    let loss = loss.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    let rank_error = |source| DataParallelError::Rank {
        rank,
        ranks,
        source,
    };
    match (loss, reduced) {
        (Err(e), _) if E::is_out_of_memory(&e) => Err(rank_error(e)),
        // this rank's own failure, which it made the collective give up for
        (Err(e), Err(CollectiveError::Aborted { by, .. })) if by == rank => Err(rank_error(e)),
        (Err(e), Ok(_)) => Err(rank_error(e)),
        // the cause is the collective's (another rank gave up, a timeout), not this rank's send
        (_, Err(e)) => Err(DataParallelError::Collective(e)),
        (Ok(loss), Ok(reduced)) => {
            let grads = super::collective::places_of(reduced, places);
            replica.put_gradients(grads).map_err(rank_error)?;
            Ok(loss)
        }
    }
}
