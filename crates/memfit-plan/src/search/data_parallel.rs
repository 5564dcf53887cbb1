//! Data-parallel communication per optimizer step, and the speed-up over one GPU it leaves.
//!
//! What crosses the link: a ring all-reduce sends (and receives) 2·(w−1)/w of the reduced bytes per
//! rank (w = ranks); ZeRO-1/2 reduce-scatter the gradients and all-gather the updated weights, the
//! same volume. The reduced bytes are the trained parameters' gradients:
//! - memfit train (`--runtime memfit`, `memfit_train::data_parallel`): dense f32 gradients, reduced
//!   once per optimizer step. With per-block gradient checkpointing its backward runs block by
//!   block, and each block's gradients are all-reduced as soon as that block is done, during the
//!   last micro-batch's backward (`memfit_train::data_parallel::overlap`): what stays exposed is
//!   what outlasts the backward and at least the tail — the first block's bucket and the embedding
//!   table, whose backward comes last. Without checkpointing the backward is one autodiff pass and
//!   the reduce runs after it (`overlap` 0).
//! - the PyTorch stack: gradients in the weights' dtype (fp32 master gradients under AMP), reduced
//!   once per step (accelerate's `accumulate` wraps the accumulation micro-batches in `no_sync`).
//!   DDP all-reduces its gradient buckets asynchronously as each bucket's gradients become ready in
//!   the backward (Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel
//!   Training", VLDB 2020, §3.2.3; buckets of 25 MiB, the first 1 MiB:
//!   `kDefaultBucketBytesCap`/`kDefaultFirstBucketBytes` in torch/csrc/distributed/c10d/reducer.hpp).
//!   So the reduce hides behind the last micro-batch's backward except for what outlasts it, and at
//!   least the last bucket, which can only start when the backward ends. DeepSpeed's
//!   `overlap_comm` and FSDP's backward reduce-scatter overlap the same way; the model uses DDP's
//!   bucket for all three.
//! - ZeRO-3 / FSDP full-shard all-gathers of the parameters (forward and backward, per micro-batch)
//!   are charged in full: prefetching hides part of them, which the model does not credit.
//!
//! Not modelled: DeepSpeed ZeRO-2/3 reduce-scatter in every micro-batch's backward (partitioned
//! gradients) rather than once per step; latency of small messages; links slower than the nominal
//! rates (`throughput::rates`) — PCIe-only consumer GPUs all-reduce at a fraction of 100 GB/s.

use super::throughput::rates::{INTER_NODE_BW, INTRA_NODE_BW};
use crate::arch::Arch;
use crate::arch::params::Role;
use crate::memory::states::{base_trains, trainable};
use crate::memory::{Runtime, Setup};
use serde::Serialize;

/// DDP's gradient bucket (`kDefaultBucketBytesCap`, 25 MiB): the last one is reduced after the
/// backward ends.
pub const DDP_BUCKET_BYTES: f64 = 25.0 * 1024.0 * 1024.0;
/// Share of a micro-batch's compute that is backward: 4N of the 6N FLOPs per token of a trained
/// weight (Kaplan et al. 2020). With checkpointing the recompute also runs in the backward, so this
/// understates the window (the overlap) slightly.
pub const BACKWARD_SHARE: f64 = 2.0 / 3.0;

/// One optimizer step's communication, per rank.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Comm {
    /// Bytes each rank sends over its link for the gradient reduce (ring: 2·(w−1)/w × gradients).
    pub allreduce_bytes_per_step: f64,
    /// That reduce at the nominal link rate.
    pub allreduce_s_per_step: f64,
    /// The fraction of the reduce hidden behind the backward (memfit train: 0 without gradient
    /// checkpointing).
    pub overlap: f64,
    /// ZeRO-3 / FSDP full-shard parameter all-gathers, charged in full.
    pub gather_s_per_step: f64,
    /// The nominal link rate used: intra-node or, with several nodes, inter-node.
    pub link_bytes_per_s: f64,
}

impl Comm {
    /// Seconds per step the communication adds to the step.
    pub fn exposed_s(&self) -> f64 {
        self.allreduce_s_per_step * (1.0 - self.overlap) + self.gather_s_per_step
    }
}

/// Gradient bytes reduced per step: f32 for memfit's trainer, the weights' width otherwise.
fn gradient_bytes(arch: &Arch, setup: &Setup) -> f64 {
    let width = match setup.runtime {
        Runtime::Memfit => 4.0,
        Runtime::Pytorch => setup.precision.weight_bytes() as f64,
    };
    trainable(arch, setup).total() as f64 * width
}

/// The communication of one optimizer step, given the step's compute time on one rank (all its
/// micro-batches).
pub fn comm(arch: &Arch, setup: &Setup, compute_s: f64) -> Comm {
    let world = setup.world() as f64;
    let link = if setup.nodes > 1 {
        INTER_NODE_BW
    } else {
        INTRA_NODE_BW
    };
    if world <= 1.0 {
        return Comm {
            allreduce_bytes_per_step: 0.0,
            allreduce_s_per_step: 0.0,
            overlap: 0.0,
            gather_s_per_step: 0.0,
            link_bytes_per_s: link,
        };
    }
    let shard = (world - 1.0) / world;
    let grads = gradient_bytes(arch, setup);
    let bytes = 2.0 * shard * grads;
    let reduce_s = bytes / link;
    let backward_window = compute_s / setup.accum.max(1) as f64 * BACKWARD_SHARE;
    let tail_bytes = match setup.runtime {
        Runtime::Memfit if !setup.grad_ckpt => grads,
        Runtime::Memfit => memfit_tail_bytes(arch, setup).min(grads),
        Runtime::Pytorch => DDP_BUCKET_BYTES.min(grads),
    };
    let overlap = if reduce_s > 0.0 {
        let exposed = (reduce_s - backward_window).max(reduce_s * tail_bytes / grads);
        1.0 - exposed / reduce_s
    } else {
        0.0
    };
    let gather_s = if setup.zero.stage() == 3 {
        let params = arch.params_total() as f64 * setup.precision.weight_bytes() as f64;
        2.0 * params * setup.accum as f64 * shard / link
    } else {
        0.0
    };
    Comm {
        allreduce_bytes_per_step: bytes,
        allreduce_s_per_step: reduce_s,
        overlap,
        gather_s_per_step: gather_s,
        link_bytes_per_s: link,
    }
}

/// What memfit train reduces after its backward ends (f32): the embedding table, trained, whose
/// backward comes last, and one block's share of the rest, reduced as that first block finishes.
fn memfit_tail_bytes(arch: &Arch, setup: &Setup) -> f64 {
    let embedding: u64 = (arch.tensors.iter())
        .filter(|t| t.role == Role::Embedding && base_trains(t, setup))
        .map(|t| t.elements())
        .sum();
    let blocks = (arch.encoder_layers + arch.decoder_layers).max(1);
    let rest = trainable(arch, setup).total().saturating_sub(embedding);
    4.0 * (embedding + rest / blocks) as f64
}

/// The same training on one GPU at the same effective batch: the accumulation takes the ranks'
/// micro-batches. (Whether that fits one GPU's memory is not asked: this is the speed reference.)
pub fn one_gpu(setup: &Setup) -> Setup {
    let mut one = setup.clone();
    one.accum = setup.accum * setup.world();
    (one.gpus, one.nodes) = (1, 1);
    one
}

/// The data-parallel figures `memfit plan` reports for a setup.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Scaling {
    pub ranks: u64,
    /// Tokens per second over those of [`one_gpu`]: at most `ranks`.
    pub speedup_vs_one_gpu: f64,
    #[serde(flatten)]
    pub comm: Comm,
    /// Seconds one optimizer step takes (model), communication included.
    pub step_s: f64,
}

/// The speed-up of `setup` over [`one_gpu`] and its communication. (The planner trains on the CPU
/// in one process: `memfit train --device cpu:N` ranks share the host's cores and are not planned.)
pub fn scaling(arch: &Arch, setup: &Setup) -> Scaling {
    let step = super::throughput::step_time(arch, setup);
    let speedup = super::throughput::tokens_per_second(arch, setup)
        / super::throughput::tokens_per_second(arch, &one_gpu(setup));
    Scaling {
        ranks: setup.world(),
        speedup_vs_one_gpu: speedup,
        comm: step.comm,
        step_s: step.total_s(),
    }
}
