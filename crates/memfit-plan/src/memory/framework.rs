//! Constants of the software stack that trains: measured, each with its source. Nothing here is
//! fitted to a validation row; `validation/constants.csv` holds the measurements quoted.

use serde::Serialize;

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// The PyTorch/transformers behaviour an estimate assumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Framework {
    /// NVML-visible memory of a CUDA context with PyTorch's kernels loaded, outside the allocator.
    pub cuda_context_bytes: u64,
    /// `torch.optim.AdamW` uses the multi-tensor (`foreach`) path: its step allocates a copy of
    /// all second-moment states at once. Default on CUDA since PyTorch 2.0; 2022 code
    /// (transformers.AdamW, torch ≤ 1.13) stepped tensor by tensor.
    pub foreach_optimizer: bool,
    /// `zero_grad()` keeps gradient tensors between steps (`set_to_none=False`, the default before
    /// PyTorch 2.0 and what transformers' Trainer called in 2022); otherwise they are freed.
    pub grads_persist: bool,
    /// A causal LM's loss upcasts the logits to fp32 and shifts the labels, not the logits
    /// (transformers 5, `loss/loss_utils.py` `ForCausalLMLoss`: `logits = logits.float()`, labels
    /// padded by one and shifted); 2022 models (e.g. `BloomForCausalLM` in 4.2x) kept the logits'
    /// dtype and made a shifted contiguous copy of them.
    pub causal_loss_upcast: bool,
    /// bitsandbytes' 4-bit matmul saves its input for backward (`MatMul4Bit.forward`:
    /// `ctx.tensors = (A, B)`), as it did before 0.44 (removed by "fix QLoRA mem bug: delete
    /// useless buffered activation", bitsandbytes#1270, July 2024; 0.44.0 released Sept 2024).
    pub bnb_saves_input: bool,
    /// torchao ≤ 0.1 quantizes a weight to NF4 in one piece: `NF4Tensor.quantize_tensor_nearest`
    /// computes `(value.unsqueeze(-1) - nf4).abs()` over every element against the 16 NF4 levels,
    /// two bf16 tensors of 16 × numel (`torchao/dtypes/nf4tensor.py` at v0.1, which torchtune
    /// pinned in April 2024: `torchao==0.1`); "perform in chunks" (pytorch/ao#196, 2024-05-01,
    /// released in 0.2.0) bounds it at 1024² elements. See `gpu::nf4_load_reserved`.
    pub nf4_quantize_whole: bool,
    /// transformers hands grouped-query keys and values to SDPA unrepeated (`enable_gqa=True`)
    /// when there is no attention mask (transformers 5, `integrations/sdpa_attention.py`
    /// `use_gqa_in_sdpa`; needs PyTorch ≥ 2.5). With fp32 inputs flash attention is out and
    /// PyTorch's memory-efficient kernel takes no `enable_gqa`, so SDPA runs its math kernel,
    /// which saves the fp32 probabilities (measured: `H13`, validation/measured_here.csv).
    pub sdpa_gqa_unrepeated: bool,
    /// PEFT keeps LoRA weights in fp32 on a 16-bit base (`get_peft_model(...,
    /// autocast_adapter_dtype=True)`, the default since PEFT 0.12, July 2024) and casts each
    /// adapter's input to that dtype (`peft/tuners/lora/layer.py` `Linear.forward`:
    /// `_cast_input_dtype(x, lora_A.weight.dtype)`): without autocast an adapted linear's LoRA
    /// dropout output is fp32 (measured: `H1`, `H18`, validation/measured_here.csv). PEFT 0.5–0.6
    /// (August–November 2023) kept them fp32 too, by omission: `update_layer` builds
    /// `nn.Linear(in_features, r)` in the default dtype and moves it only to the weight's device
    /// (v0.5.0 `tuners/lora.py`: `self.to(self.weight.device)`; v0.6.x `tuners/lora/layer.py`
    /// casts to `self.weight`'s dtype, which a LoRA `Linear` does not have yet when its
    /// `__init__` calls `update_layer`); 0.7–0.11 cast them to the base layer's dtype
    /// (v0.7.0 `update_layer`: `self.to(weight.device, dtype=weight.dtype)` of
    /// `get_base_layer().weight`).
    pub peft_fp32_adapters: bool,
}

impl Framework {
    /// PyTorch ≥ 2.1 with lazy CUDA module loading (the default since CUDA 11.7):
    /// K5 in constants.csv = 0.47 GiB context on an A100 (stas00/ml-engineering).
    pub const TORCH_2: Framework = Framework {
        cuda_context_bytes: 470 * GIB / 1000,
        foreach_optimizer: true,
        grads_persist: false,
        causal_loss_upcast: true,
        bnb_saves_input: false,
        nf4_quantize_whole: false,
        sdpa_gqa_unrepeated: true,
        peft_fp32_adapters: true,
    };

    /// PyTorch 2.1–2.3 with bitsandbytes < 0.44 (2023 to mid-2024): as [`Framework::TORCH_2`] but
    /// 4-bit matmuls save their inputs, and torchao's NF4 (torchtune's QLoRA, then at 0.1)
    /// quantizes each weight in one piece.
    pub const TORCH_2_BNB_LT_044: Framework = Framework {
        bnb_saves_input: true,
        nf4_quantize_whole: true,
        sdpa_gqa_unrepeated: false,
        peft_fp32_adapters: false,
        ..Framework::TORCH_2
    };

    /// PyTorch 2.0 with PEFT 0.5–0.6 (August–November 2023): as
    /// [`Framework::TORCH_2_BNB_LT_044`], but PEFT's LoRA weights are fp32 on a 16-bit base
    /// (see `peft_fp32_adapters`).
    pub const TORCH_2_0_PEFT_05: Framework = Framework {
        peft_fp32_adapters: true,
        ..Framework::TORCH_2_BNB_LT_044
    };

    /// PyTorch 1.x / transformers 4.1x-4.2x (2022), eager CUDA module loading: the software of the
    /// published 2022 measurements. `cuda_context_bytes` is the machine's measured context.
    pub fn torch_1x(cuda_context_bytes: u64) -> Framework {
        Framework {
            cuda_context_bytes,
            foreach_optimizer: false,
            grads_persist: true,
            causal_loss_upcast: false,
            bnb_saves_input: true,
            nf4_quantize_whole: true,
            sdpa_gqa_unrepeated: false,
            peft_fp32_adapters: false,
        }
    }
}

impl Default for Framework {
    fn default() -> Self {
        Framework::TORCH_2
    }
}

/// cuBLAS workspace PyTorch allocates per handle through its caching allocator:
/// 4096 KiB × 2 + 16 KiB × 8 (`getChosenWorkspaceSize`, aten/src/ATen/cuda/CublasHandlePool.cpp).
pub const CUBLAS_WORKSPACE: u64 = 4096 * 1024 * 2 + 16 * 1024 * 8;

/// NCCL communicator buffers outside PyTorch's allocator after the first collective:
/// K6 in constants.csv, 2.00 − 0.55 GiB on 2 GPUs of one node (torch-dist-mem-usage.py).
pub const NCCL_BUFFERS: u64 = 1450 * MIB;

/// Caching allocator (c10/cuda/CUDACachingAllocator.cpp): requests are rounded to 512 B; requests
/// above 1 MiB come from the large pool, which cudaMallocs 20 MiB segments for requests under
/// 10 MiB and rounds larger ones up to 2 MiB.
pub const ALLOC_ROUND: u64 = 512;
pub const LARGE_SEGMENT_ROUND: u64 = 2 * MIB;
/// Requests from this size up get a segment of their own (rounded to `LARGE_SEGMENT_ROUND`);
/// smaller large-pool requests share 20 MiB segments (`kMinLargeAlloc`, `kLargeBuffer` in
/// c10/cuda/CUDACachingAllocator.cpp).
pub const MIN_LARGE_ALLOC: u64 = 10 * MIB;

/// Host RSS of a Python process that imported torch + transformers and created a CUDA context
/// with eager module loading (CUDA 11): the kernels of cuBLAS/cuDNN are resident in host memory.
/// Measured in the PEFT 2022 logs: validation rows B1-CPU/B2-CPU, "2.96 GB" as the table prints
/// it, with the model already on the GPU and nothing else on the host. No other published row
/// measures it, so those two rows are this constant's source and are not scored, and no other
/// PEFT host row is scored with it in leave-one-source-out mode (`validation::unscored_reason`).
pub const PYTORCH_CUDA_RUNTIME_RSS: u64 = 2_960_000_000;

/// Host RSS of a CPU-only PyTorch training process (python + torch + transformers imported,
/// no CUDA libraries). An estimate, not measured here (no torch wheel on this machine): the
/// CPU libtorch + Python + transformers imports are commonly reported at 0.4–0.6 GB.
pub const PYTORCH_CPU_RUNTIME_RSS: u64 = 512 * MIB;

/// A PyTorch DataLoader worker is a forked Python process; what it adds beyond copy-on-write
/// sharing (refcount writes un-share pages, torch docs "Multi-process data loading") plus collate
/// buffers and its allocator arenas. An estimate, not measured here.
pub const PYTORCH_WORKER_RSS: u64 = 200 * MIB;

/// memfit's loader workers are threads over the memory-mapped token store: their own state is
/// the prefetched batches only (counted separately) plus a thread stack.
pub const MEMFIT_WORKER_RSS: u64 = 8 * MIB;

/// DataLoader `prefetch_factor` default (torch.utils.data.DataLoader): batches in flight per worker.
pub const PREFETCH_FACTOR: u64 = 2;

/// DeepSpeed defaults (deepspeed/runtime/zero/config.py) as transformers' "auto" fills them:
/// reduce_bucket_size = hidden², stage3_prefetch_bucket_size = 0.9·hidden²,
/// stage3_param_persistence_threshold = 10·hidden; stage3_max_live_parameters = 1e9.
pub const ZERO3_MAX_LIVE_PARAMETERS: u64 = 1_000_000_000;
