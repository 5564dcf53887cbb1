//! The throughput model that ranks setups. It only has to order setups correctly, so it uses
//! nominal hardware rates (documented below) and the standard FLOP count of training:
//!
//! - FLOPs per token = 2·N forward + 4·N backward for trained weights (input and weight
//!   gradients, Kaplan et al. 2020 "Scaling laws", C ≈ 6N), 2·N backward for frozen weights whose
//!   input gradient is still needed, nothing for a frozen prefix without graph; + the attention
//!   score/value matmuls 4·L·s·d per token forward (×3 with backward); + one more forward with
//!   gradient checkpointing (Chen et al. 2016).
//! - small micro-batches underuse the device: utilisation = T / (T + T½), T = tokens per
//!   micro-batch, T½ = 1024 tokens on a GPU (kernel launch and tile under-occupancy), 64 on CPU.
//!   T½ is an assumed scale (a GEMM with ~1k rows reaches about half of peak on current GPUs),
//!   not a measurement; it decides how much a larger micro-batch is worth against checkpointing.
//! - optimizer offload moves gradients over PCIe every micro-batch, not once per step: DeepSpeed's
//!   ZeRO-1/2 offload copies each micro-batch's gradients to the host and, to accumulate, the host's
//!   running sum back up first (deepspeed/runtime/zero/stage_1_and_2.py,
//!   `async_accumulate_grad_in_cpu_via_gpu`, called from `copy_grads_in_partition` when
//!   gradient_accumulation_steps > 1), then at the step the updated 16-bit weights go up; Adam runs
//!   on the CPU. With parameter offload every parameter crosses twice per micro-batch;
//! - data-parallel communication ([`super::data_parallel`]): ring all-reduce moves 2·(w−1)/w of
//!   the gradient bytes, overlapped with the backward (in memfit's trainer only under per-block
//!   gradient checkpointing); ZeRO-3 adds all-gathers of the parameters in forward and backward.

use super::data_parallel::{Comm, comm};
use crate::Task;
use crate::arch::{Arch, Group};
use crate::memory::states::{adapter_elements, base_trains, trainable};
use crate::memory::{Device, Precision, Runtime, Setup};

/// Nominal rates (a mid-range datacenter GPU / a few desktop CPU cores). Only ratios matter.
pub mod rates {
    /// 16-bit tensor-core matmul throughput sustained in training (≈ 1/3 of an A100's 312 TFLOP/s).
    pub const GPU_HALF_FLOPS: f64 = 100e12;
    /// fp32 (TF32 disabled, PyTorch's default for matmul since 1.12): A100 19.5 TFLOP/s peak.
    pub const GPU_FP32_FLOPS: f64 = 15e12;
    /// HBM bandwidth for the optimizer step (A100 40GB: 1.55 TB/s).
    pub const GPU_MEM_BW: f64 = 1.5e12;
    /// PCIe 4.0 x16 effective host↔device bandwidth.
    pub const PCIE_BW: f64 = 20e9;
    /// DeepSpeed CPUAdam: parameters updated per second on a multi-core host (its paper reports
    /// ~1e9/s on 32 cores; desktop-class hosts manage about half).
    pub const CPU_ADAM_PARAMS_PER_S: f64 = 0.5e9;
    /// Intra-node all-reduce bus bandwidth (NVLink/PCIe mix) and inter-node (100 Gb/s).
    pub const INTRA_NODE_BW: f64 = 100e9;
    pub const INTER_NODE_BW: f64 = 12.5e9;
    /// CPU training: sustained fp32 matmul rate of a few cores with AVX2 (burn flex / MKL).
    pub const CPU_FP32_FLOPS: f64 = 0.2e12;
    /// bf16 in a PyTorch process on the CPU: ~50% slower than fp32 where the CPU has no bf16
    /// arithmetic (docs/architecture.md §6 measurement); AMX or AVX512-BF16 parts run it faster than fp32.
    pub const CPU_BF16_SLOWDOWN: f64 = 1.5;
    /// bf16 in memfit's trainer: its products run on AVX512-BF16 where the CPU has it (faster than
    /// fp32, README's trainer table) and as rounded f32 products elsewhere (a few percent slower).
    /// Ranked just below fp32, so the planner takes bf16 when fp32 does not fit, not for speed
    /// alone: its numerics differ from fp32's.
    pub const MEMFIT_CPU_BF16_SLOWDOWN: f64 = 1.05;
    /// memfit's own trainer on a GPU against PyTorch's on the same card: 0.36×, 0.20× and 0.16×
    /// PyTorch's tokens/s (t5-small, bert-base, Qwen2.5-0.5B LoRA; bf16; an H100, 2026-11-27,
    /// docs/gpu.md), about 1/4.4 in the geometric mean. So a plan that puts memfit's trainer
    /// beside the PyTorch stack on a GPU says how much slower it is there today.
    pub const MEMFIT_GPU_SLOWDOWN: f64 = 4.4;
    /// Host memory bandwidth for a CPU optimizer step.
    pub const CPU_MEM_BW: f64 = 10e9;
}

/// Training FLOPs per token of one forward + backward (+ recompute) pass.
pub fn flops_per_token(arch: &Arch, setup: &Setup) -> f64 {
    let mut flops = 0.0;
    let mut live = false;
    for group in [
        Group::Embeddings,
        Group::Encoder,
        Group::Decoder,
        Group::Head,
    ] {
        let tensors: Vec<_> = arch.tensors.iter().filter(|t| t.group == group).collect();
        let trains = tensors
            .iter()
            .any(|t| base_trains(t, setup) || adapter_elements(t, setup) > 0);
        live = live || trains;
        for t in tensors {
            if !t.is_linear() && t.role != crate::arch::Role::LmHead {
                continue; // embeddings are lookups; norms and biases are negligible
            }
            let n = t.elements() as f64 * active_fraction(arch, t);
            let fwd = 2.0 * n;
            let bwd = if base_trains(t, setup) {
                4.0 * n
            } else if live {
                2.0 * n
            } else {
                0.0
            };
            let recompute = if setup.grad_ckpt && live && group != Group::Head {
                fwd
            } else {
                0.0
            };
            flops += fwd + bwd + recompute;
        }
    }
    // attention matmuls: QKᵀ and PV, 2 · 2 · s · (heads·head_dim) per token per layer forward
    let ctx = match setup.task {
        Task::Seq2seq => (setup.seq + setup.tgt_seq) as f64 / 2.0,
        _ => setup.seq as f64,
    };
    let inner = (arch.heads * arch.head_dim) as f64;
    flops += 3.0 * 4.0 * ctx * inner * arch.layers_total() as f64;
    flops
}

/// The part of a tensor's instances one token computes with: top_k of the experts for a routed
/// expert's weights, all of any other tensor.
fn active_fraction(arch: &Arch, t: &crate::arch::ParamTensor) -> f64 {
    match arch.moe {
        Some(m) if t.routed => m.top_k as f64 / m.experts as f64,
        _ => 1.0,
    }
}

/// Bytes an optimizer offload moves over PCIe per optimizer step for `trainable` parameters: the
/// gradients of every micro-batch down (16-bit under ZeRO mixed precision, else the weights' width),
/// the running sum up before each micro-batch after the first, and the updated 16-bit weights up once
/// (DeepSpeed stage_1_and_2.py; see the module doc).
pub fn offload_pcie_bytes(trainable: f64, setup: &Setup) -> f64 {
    let grad_b = if crate::memory::states::uses_master(setup) {
        2.0
    } else {
        setup.precision.weight_bytes() as f64
    };
    let accum = setup.accum.max(1) as f64;
    trainable * (grad_b * (2.0 * accum - 1.0) + 2.0)
}

/// One optimizer step on one rank, by part (seconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTime {
    /// Tokens one rank processes per optimizer step.
    pub tokens_per_rank: f64,
    pub compute_s: f64,
    /// Optimizer step and parameter offload.
    pub optimizer_s: f64,
    pub comm: Comm,
    /// Loader stall and unpinned copies, a fraction of the step.
    pub stall: f64,
}

impl StepTime {
    pub fn total_s(&self) -> f64 {
        (self.compute_s + self.optimizer_s + self.comm.exposed_s()) * (1.0 + self.stall)
    }
}

/// Tokens processed per second over all ranks (higher is better).
pub fn tokens_per_second(arch: &Arch, setup: &Setup) -> f64 {
    let step = step_time(arch, setup);
    step.tokens_per_rank * setup.world() as f64 / step.total_s()
}

/// The step time breakdown of one rank.
pub fn step_time(arch: &Arch, setup: &Setup) -> StepTime {
    use rates::*;
    let tokens_per_sample = setup.seq
        + if setup.task == Task::Seq2seq {
            setup.tgt_seq
        } else {
            0
        };
    let micro_tokens = (setup.batch * tokens_per_sample) as f64;
    let step_tokens = micro_tokens * setup.accum as f64; // per rank
    let (rate, half_tokens) = match setup.device {
        Device::Cuda => (
            if setup.precision == Precision::Fp32 {
                GPU_FP32_FLOPS
            } else {
                GPU_HALF_FLOPS
            } / if setup.runtime == Runtime::Memfit {
                MEMFIT_GPU_SLOWDOWN
            } else {
                1.0
            },
            1024.0,
        ),
        Device::Cpu => (
            match (setup.precision, setup.runtime) {
                (Precision::Bf16, Runtime::Memfit) => CPU_FP32_FLOPS / MEMFIT_CPU_BF16_SLOWDOWN,
                (Precision::Bf16, _) => CPU_FP32_FLOPS / CPU_BF16_SLOWDOWN,
                _ => CPU_FP32_FLOPS,
            },
            64.0,
        ),
    };
    let utilisation = micro_tokens / (micro_tokens + half_tokens);
    let compute = step_tokens * flops_per_token(arch, setup) / (rate * utilisation);
    let tr = trainable(arch, setup).total() as f64;
    let params = arch.params_total() as f64;
    let wb = setup.precision.weight_bytes() as f64;
    let optimizer = if setup.offload_optimizer {
        offload_pcie_bytes(tr, setup) / PCIE_BW + tr / CPU_ADAM_PARAMS_PER_S
    } else if setup.device == Device::Cpu {
        tr * 16.0 / CPU_MEM_BW
    } else {
        tr * 16.0 / GPU_MEM_BW
    };
    let param_offload = if setup.offload_params {
        // every parameter crosses PCIe for forward and backward (and recompute) per micro-batch
        let passes = if setup.grad_ckpt { 3.0 } else { 2.0 };
        passes * params * wb * setup.accum as f64 / PCIE_BW
    } else {
        0.0
    };
    // Data loading on the training thread stalls the device; workers overlap it. pytorch
    // tokenises/collates in Python, memfit reads a memory-mapped store. Assumed shares of a step
    // (5% / 1%, not measured): they only break ties between otherwise equal setups.
    let data_stall = match (setup.runtime, setup.workers) {
        (_, w) if w > 0 => 0.0,
        (Runtime::Pytorch, _) => 0.05,
        (Runtime::Memfit, _) => 0.01,
    };
    // Pinned memory lets the host→device copy of the batch overlap compute (assumed 1% of a step,
    // a tie-breaker like the loader stall above).
    let pin = if setup.device == Device::Cuda && !setup.pin_memory {
        0.01
    } else {
        0.0
    };
    StepTime {
        tokens_per_rank: step_tokens,
        compute_s: compute,
        optimizer_s: optimizer + param_offload,
        comm: comm(arch, setup, compute),
        stall: data_stall + pin,
    }
}
