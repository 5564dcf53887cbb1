//! The all-reduce between GPUs: burn's `all_reduce` (NCCL through cubecl-cuda), as burn documents
//! it. Each rank first meets the others at a host [`Rendezvous`] with the collective timeout: a
//! rank that died or hangs fails the group there, before anyone enters NCCL, whose calls cannot
//! be cancelled once all ranks are inside.
//!
//! Not run in CI (no GPU) nor on the single-GPU machines checks have had: docs/gpu.md says so.

use std::time::Duration;

use burn::prelude::*;
use burn::tensor::distributed::{self, ReduceOperation};

use super::collective::{Collective, disagreement};
use super::rendezvous::{CollectiveError, Rendezvous};
use crate::engine::GradBucket;

pub struct NcclCollective {
    devices: Vec<Device>,
    /// Each rank brings its bucket's parameters and shapes: ranks out of step fail here, before
    /// NCCL (which would hang or mix gradients).
    meeting: Rendezvous<BucketKey, Result<(), String>>,
}

type BucketKey = Vec<(usize, [usize; 2])>;

impl NcclCollective {
    /// `devices[r]` is rank `r`'s GPU.
    pub fn new(devices: Vec<Device>, timeout: Duration) -> Self {
        Self {
            meeting: Rendezvous::new(devices.len(), timeout),
            devices,
        }
    }
}

/// Every rank's key the same as rank 0's.
fn agree(keys: Vec<BucketKey>) -> Result<(), String> {
    match (1..keys.len()).find(|&r| keys[r] != keys[0]) {
        Some(r) => Err(disagreement(&keys[0], &keys[r], r)),
        None => Ok(()),
    }
}

impl Collective for NcclCollective {
    fn ranks(&self) -> usize {
        self.devices.len()
    }

    fn all_reduce_sum(
        &self,
        rank: usize,
        bucket: GradBucket,
    ) -> Result<GradBucket, CollectiveError> {
        let key = bucket.iter().map(|(i, g)| (*i, g.dims())).collect();
        let agreed = self.meeting.exchange(rank, key, agree)?;
        (agreed.as_ref().clone()).map_err(CollectiveError::Device)?;
        Ok((bucket.into_iter())
            .map(|(i, g)| {
                let devices = self.devices.clone();
                (
                    i,
                    distributed::all_reduce(g, ReduceOperation::Sum, devices).resolve(),
                )
            })
            .collect())
    }

    fn abort(&self, rank: usize, reason: &str) {
        self.meeting.abort(rank, reason);
    }

    fn reset(&self) {
        self.meeting.reset();
    }
}
