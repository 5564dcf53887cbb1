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

use crate::engine::GradBucket;

pub use super::rendezvous::CollectiveError;
use super::rendezvous::Rendezvous;

/// How long a rank waits for the others at a collective before the group stops (a rank that
/// died or hangs): long enough for a slow rank's micro-batches, short enough not to hold GPUs
/// idle for long.
pub const COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(600);

/// The reduction of the accumulated gradients between ranks.
pub trait Collective: Send + Sync {
    fn ranks(&self) -> usize;

    /// The element-wise sum of every rank's `bucket` (the same parameters, in the same order and
    /// shapes, on every rank: else an error naming the first difference), as this rank's copy on
    /// the device its tensors were on.
    fn all_reduce_sum(
        &self,
        rank: usize,
        bucket: GradBucket,
    ) -> Result<GradBucket, CollectiveError>;

    /// `rank` will not take part in the next collective: the others fail at once instead of at
    /// the timeout.
    fn abort(&self, rank: usize, reason: &str);

    /// After a step abandoned on every rank (every rank's work joined): the next collective meets
    /// afresh, as if no rank had aborted.
    fn reset(&self);
}

/// Parameter `i`'s tensor at place `i` of the list, for every `Some` (frozen parameters: `None`).
pub fn bucket_of(grads: Vec<Option<Tensor<2>>>) -> GradBucket {
    (grads.into_iter().enumerate())
        .filter_map(|(i, g)| g.map(|g| (i, g)))
        .collect()
}

/// A bucket back as a list of `len` places (`None` where it has no parameter).
pub fn places_of(bucket: GradBucket, len: usize) -> Vec<Option<Tensor<2>>> {
    let mut places = vec![None; len];
    for (i, g) in bucket {
        places[i] = Some(g);
    }
    places
}

/// One rank's bucket on the host: parameter index, values, shape.
type HostBucket = Vec<(usize, Vec<f32>, [usize; 2])>;

/// The all-reduce through host memory: each rank's gradients are read back, summed in rank order
/// (the same sum on every rank, whatever the arrival order) and uploaded to each rank's device.
pub struct HostCollective {
    meeting: Rendezvous<HostBucket, Result<HostBucket, String>>,
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
        bucket: GradBucket,
    ) -> Result<GradBucket, CollectiveError> {
        let device = bucket.first().map(|(_, t)| t.device());
        let host = match to_host(bucket) {
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
            return Ok(Vec::new());
        };
        Ok((sum.iter())
            .map(|(i, v, dims)| (*i, float_tensor(v, *dims, &device, DType::F32)))
            .collect())
    }

    fn abort(&self, rank: usize, reason: &str) {
        self.meeting.abort(rank, reason);
    }

    fn reset(&self) {
        self.meeting.reset();
    }
}

fn to_host(bucket: GradBucket) -> Result<HostBucket, String> {
    (bucket.into_iter())
        .map(|(i, g)| {
            let dims = g.dims();
            to_f32_vec(g)
                .map(|v| (i, v, dims))
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// Rank 0's gradients plus rank 1's, plus rank 2's, …; ranks that disagree on a parameter or a
/// shape are an error (different models, or buckets out of step).
fn sum_in_rank_order(ranks: Vec<HostBucket>) -> Result<HostBucket, String> {
    let keys: Vec<Vec<(usize, [usize; 2])>> = (ranks.iter())
        .map(|b| b.iter().map(|(i, _, d)| (*i, *d)).collect())
        .collect();
    if let Some(r) = (1..keys.len()).find(|&r| keys[r] != keys[0]) {
        return Err(disagreement(&keys[0], &keys[r], r));
    }
    let mut ranks = ranks.into_iter();
    let mut total = ranks.next().unwrap_or_default();
    for bucket in ranks {
        for ((_, acc, _), (_, g, _)) in total.iter_mut().zip(bucket) {
            acc.iter_mut().zip(&g).for_each(|(a, g)| *a += g);
        }
    }
    Ok(total)
}

/// The first parameter (index and shape) where rank `r`'s bucket differs from rank 0's.
pub(super) fn disagreement(
    first: &[(usize, [usize; 2])],
    other: &[(usize, [usize; 2])],
    r: usize,
) -> String {
    let at = (first.iter().zip(other))
        .position(|(a, b)| a != b)
        .unwrap_or(first.len().min(other.len()));
    let name = |p: Option<&(usize, [usize; 2])>| match p {
        Some((i, dims)) => format!("parameter {i} {dims:?}"),
        None => "nothing".to_string(),
    };
    format!(
        "the ranks reduce different gradients: place {at} of the bucket is {} on rank {r}, {} on \
         rank 0 ({} and {} parameters in the bucket)",
        name(other.get(at)),
        name(first.get(at)),
        other.len(),
        first.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(values: &[f32], device: &Device) -> GradBucket {
        vec![(
            3,
            float_tensor(values, [1, values.len()], device, DType::F32),
        )]
    }

    #[test]
    fn every_rank_gets_the_sum_on_its_own_device() {
        let devices = [Device::flex(), Device::flex(), Device::flex()];
        let collective = HostCollective::new(3, Duration::from_secs(10));
        let out: Vec<GradBucket> = std::thread::scope(|s| {
            let handles: Vec<_> = (devices.iter().enumerate())
                .map(|(r, d)| {
                    let collective = &collective;
                    let values = [r as f32, 10.0 * r as f32];
                    s.spawn(move || collective.all_reduce_sum(r, bucket(&values, d)).unwrap())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for rank in out {
            assert_eq!(rank.len(), 1);
            assert_eq!(rank[0].0, 3, "the parameter index comes back");
            let sum = to_f32_vec(rank[0].1.clone()).unwrap();
            assert_eq!(sum, vec![3.0, 30.0]);
        }
    }

    /// Ranks 0 and 1 all-reduce `a` and `b` side by side.
    fn two_ranks(
        collective: &HostCollective,
        a: GradBucket,
        b: GradBucket,
    ) -> [Result<GradBucket, CollectiveError>; 2] {
        std::thread::scope(|s| {
            let a = s.spawn(|| collective.all_reduce_sum(0, a));
            let b = s.spawn(|| collective.all_reduce_sum(1, b));
            [a.join().unwrap(), b.join().unwrap()]
        })
    }

    #[test]
    fn ranks_that_disagree_on_a_shape_or_a_parameter_fail_naming_it() {
        let collective = HostCollective::new(2, Duration::from_secs(10));
        let d = Device::flex();
        let errs = two_ranks(
            &collective,
            bucket(&[1.0, 2.0], &d),
            bucket(&[1.0, 2.0, 3.0], &d),
        );
        for e in errs.map(Result::unwrap_err) {
            assert!(
                e.to_string().contains("parameter 3 [1, 3] on rank 1"),
                "{e}"
            );
        }
        collective.reset();
        let other = vec![(4, float_tensor(&[1.0, 2.0], [1, 2], &d, DType::F32))];
        let errs = two_ranks(&collective, bucket(&[1.0, 2.0], &d), other);
        for e in errs.map(Result::unwrap_err) {
            assert!(
                e.to_string().contains("parameter 4 [1, 2] on rank 1"),
                "{e}"
            );
        }
    }

    #[test]
    fn after_a_reset_an_aborted_group_meets_again() {
        let collective = HostCollective::new(2, Duration::from_secs(10));
        let d = Device::flex();
        collective.abort(1, "rank 1 ran out of memory");
        assert!(collective.all_reduce_sum(0, bucket(&[1.0], &d)).is_err());
        collective.reset();
        let sums = two_ranks(&collective, bucket(&[1.0], &d), bucket(&[2.0], &d));
        for sum in sums.map(Result::unwrap) {
            assert_eq!(to_f32_vec(sum[0].1.clone()).unwrap(), vec![3.0]);
        }
    }
}
