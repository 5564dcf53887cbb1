//! The all-reduce between GPUs: burn's `all_reduce` (NCCL through cubecl-cuda), as burn documents
//! it. Each rank first meets the others at a host [`Rendezvous`] with the collective timeout: a
//! rank that died or hangs fails the group there, before anyone enters NCCL, whose calls cannot
//! be cancelled once all ranks are inside.
//!
//! Not run in CI (no GPU) nor on the single-GPU machines checks have had: docs/gpu.md says so.

use std::time::Duration;

use burn::prelude::*;
use burn::tensor::distributed::{self, ReduceOperation};

use super::collective::Collective;
use super::rendezvous::{CollectiveError, Rendezvous};

pub struct NcclCollective {
    devices: Vec<Device>,
    meeting: Rendezvous<(), ()>,
}

impl NcclCollective {
    /// `devices[r]` is rank `r`'s GPU.
    pub fn new(devices: Vec<Device>, timeout: Duration) -> Self {
        Self {
            meeting: Rendezvous::new(devices.len(), timeout),
            devices,
        }
    }
}

impl Collective for NcclCollective {
    fn ranks(&self) -> usize {
        self.devices.len()
    }

    fn all_reduce_sum(
        &self,
        rank: usize,
        grads: Vec<Option<Tensor<2>>>,
    ) -> Result<Vec<Option<Tensor<2>>>, CollectiveError> {
        self.meeting.exchange(rank, (), |_| ())?;
        Ok((grads.into_iter())
            .map(|g| {
                g.map(|g| {
                    distributed::all_reduce(g, ReduceOperation::Sum, self.devices.clone()).resolve()
                })
            })
            .collect())
    }

    fn abort(&self, rank: usize, reason: &str) {
        self.meeting.abort(rank, reason);
    }
}
