//! The gradient all-reduce between the ranks of a data-parallel group.
//!
//! [`HostCollective`] sums through host memory and works for any backend and device: it is how
//! ranks on CPU devices (the tests, and burn's CPU backends, which have no collective ops) meet,
//! and the reference the GPU path is held to. [`super::nccl::NcclCollective`] (cargo feature
//! `cuda`) is burn's `all_reduce`, NCCL between GPUs.

use std::time::Duration;

use burn::prelude::*;
use burn::tensor::DType;
use memfit_nn::layers::host::{float_tensor, to_f32_vec};

pub use super::rendezvous::CollectiveError;
use super::rendezvous::Rendezvous;

/// How long a rank waits for the others at a collective before the group stops (a rank that
/// died or hangs): long enough for a slow rank's micro-batches, short enough not to hold GPUs
/// idle for long.
pub const COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(600);

/// The reduction of the accumulated gradients between ranks.
pub trait Collective: Send + Sync {
    fn ranks(&self) -> usize;

    /// The element-wise sum of every rank's `grads` (same shapes, same order, `None` at the same
    /// places on every rank), as this rank's copy on the device its tensors were on.
    fn all_reduce_sum(
        &self,
        rank: usize,
        grads: Vec<Option<Tensor<2>>>,
    ) -> Result<Vec<Option<Tensor<2>>>, CollectiveError>;

    /// `rank` will not take part in the next collective: the others fail at once instead of at
    /// the timeout.
    fn abort(&self, rank: usize, reason: &str);
}

/// One rank's gradients on the host.
type HostGrads = Vec<Option<(Vec<f32>, [usize; 2])>>;

/// The all-reduce through host memory: each rank's gradients are read back, summed in rank order
/// (the same sum on every rank, whatever the arrival order) and uploaded to each rank's device.
pub struct HostCollective {
    meeting: Rendezvous<HostGrads, Result<HostGrads, String>>,
}

impl HostCollective {
    pub fn new(ranks: usize, timeout: Duration) -> Self {
        Self {
            meeting: Rendezvous::new(ranks, timeout),
        }
    }
}

impl Collective for HostCollective {
    fn ranks(&self) -> usize {
        self.meeting.ranks()
    }

    fn all_reduce_sum(
        &self,
        rank: usize,
        grads: Vec<Option<Tensor<2>>>,
    ) -> Result<Vec<Option<Tensor<2>>>, CollectiveError> {
        let device = grads.iter().flatten().next().map(Tensor::device);
        let host = match to_host(grads) {
            Ok(host) => host,
            Err(e) => {
                self.meeting.abort(rank, &e);
                return Err(CollectiveError::Device(e));
            }
        };
        let sum = self.meeting.exchange(rank, host, sum_in_rank_order)?;
        let sum = sum
            .as_ref()
            .as_ref()
            .map_err(|e| CollectiveError::Device(e.clone()))?;
        let Some(device) = device else {
            return Ok(vec![None; sum.len()]);
        };
        Ok((sum.iter())
            .map(|g| {
                g.as_ref()
                    .map(|(v, dims)| float_tensor(v, *dims, &device, DType::F32))
            })
            .collect())
    }

    fn abort(&self, rank: usize, reason: &str) {
        self.meeting.abort(rank, reason);
    }
}

fn to_host(grads: Vec<Option<Tensor<2>>>) -> Result<HostGrads, String> {
    (grads.into_iter())
        .map(|g| {
            g.map(|g| {
                let dims = g.dims();
                to_f32_vec(g).map(|v| (v, dims)).map_err(|e| e.to_string())
            })
            .transpose()
        })
        .collect()
}

/// Rank 0's gradients plus rank 1's, plus rank 2's, …; ranks that disagree on a shape are an
/// error (they would be different models).
fn sum_in_rank_order(ranks: Vec<HostGrads>) -> Result<HostGrads, String> {
    let mut ranks = ranks.into_iter();
    let mut total = ranks.next().unwrap_or_default();
    for (r, grads) in ranks.enumerate() {
        if grads.len() != total.len() {
            return Err(format!(
                "rank {} has {} parameters, rank 0 has {}",
                r + 1,
                grads.len(),
                total.len()
            ));
        }
        for (p, (acc, g)) in total.iter_mut().zip(grads).enumerate() {
            match (acc, g) {
                (Some((a, da)), Some((g, dg))) if *da == dg => {
                    a.iter_mut().zip(&g).for_each(|(a, g)| *a += g);
                }
                (None, None) => {}
                (acc, g) => {
                    return Err(format!(
                        "parameter {p}: rank {} sent {:?}, rank 0 {:?}",
                        r + 1,
                        g.map(|(_, d)| d),
                        acc.as_ref().map(|(_, d)| *d)
                    ));
                }
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grads(values: &[f32], device: &Device) -> Vec<Option<Tensor<2>>> {
        vec![
            Some(float_tensor(values, [1, values.len()], device, DType::F32)),
            None,
        ]
    }

    #[test]
    fn every_rank_gets_the_sum_on_its_own_device() {
        let devices = [Device::flex(), Device::flex(), Device::flex()];
        let collective = HostCollective::new(3, Duration::from_secs(10));
        let out: Vec<Vec<Option<Tensor<2>>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (devices.iter().enumerate())
                .map(|(r, d)| {
                    let collective = &collective;
                    let values = [r as f32, 10.0 * r as f32];
                    s.spawn(move || collective.all_reduce_sum(r, grads(&values, d)).unwrap())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for rank in out {
            assert!(
                rank[1].is_none(),
                "a frozen parameter stays without a gradient"
            );
            let sum = to_f32_vec(rank[0].clone().unwrap()).unwrap();
            assert_eq!(sum, vec![3.0, 30.0]);
        }
    }

    #[test]
    fn ranks_that_disagree_on_a_shape_fail_with_the_parameter() {
        let collective = HostCollective::new(2, Duration::from_secs(10));
        let d = Device::flex();
        let errs = std::thread::scope(|s| {
            let a = s.spawn(|| collective.all_reduce_sum(0, grads(&[1.0, 2.0], &d)));
            let b = s.spawn(|| collective.all_reduce_sum(1, grads(&[1.0, 2.0, 3.0], &d)));
            [
                a.join().unwrap().unwrap_err(),
                b.join().unwrap().unwrap_err(),
            ]
        });
        for e in errs {
            assert!(e.to_string().contains("parameter 0"), "{e}");
        }
    }
}
