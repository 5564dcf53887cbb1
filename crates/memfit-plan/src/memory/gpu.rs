//! GPU peak of one rank: persistent state + the worst phase + overheads + allocator slack.

use super::activations::{ActivationBytes, activations};
use super::allocator;
use super::framework::{self, Framework};
use super::setup::{Method, Optimizer, Setup};
use super::states::{self, StateBytes, Trainable, model_states, trainable};
use super::{Component, GpuEstimate, Scaling};
use crate::arch::{Arch, Role};

/// Temporaries of one optimizer step (on the GPU; none when the optimizer is offloaded).
pub fn optimizer_step_transient(arch: &Arch, setup: &Setup, fw: &Framework) -> u64 {
    if setup.offload_optimizer {
        return 0;
    }
    let tr = trainable(arch, setup);
    // states follow the parameter: 16-bit in pure 16-bit training, fp32 under a master copy or
    // for PEFT's fp32 adapters on a 16-bit base
    let state_b = if setup.precision.weight_bytes() == 2
        && !states::uses_master(setup)
        && !states::fp32_adapters(setup, fw)
    {
        2
    } else {
        4
    };
    let sharded = |x: u64| {
        if setup.zero.stage() >= 1 {
            x.div_ceil(setup.world())
        } else {
            x
        }
    };
    let in_backward = setup.stack.profile().steps_in_backward(setup);
    match setup.optimizer {
        // one optimizer per parameter inside backward: its foreach step copies that tensor's
        Optimizer::AdamW | Optimizer::PagedAdamW32bit if in_backward => state_b * tr.largest_tensor,
        Optimizer::AdamW | Optimizer::PagedAdamW32bit if fw.foreach_optimizer => {
            // _multi_tensor_adamw: exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs) — one copy of all
            // second moments (torch/optim/adamw.py)
            sharded(state_b * tr.total())
        }
        // single-tensor AdamW: sqrt(exp_avg_sq) and its division by the bias correction exist
        // together for the largest tensor (torch ≤ 1.13 _single_tensor_adamw)
        Optimizer::AdamW | Optimizer::PagedAdamW32bit => 2 * state_b * tr.largest_tensor,
        // transformers.Adafactor: grad², the rebuilt second moment and the update, per tensor
        Optimizer::Adafactor => 3 * 4 * tr.largest_tensor,
        // in-place momentum update
        Optimizer::Sgd => 0,
        // bitsandbytes 8-bit kernels update in place blockwise
        Optimizer::AdamW8bit | Optimizer::PagedAdamW8bit => 0,
    }
}

/// torchtune's QLoRA on torchao ≤ 0.1 ([`Framework::nf4_quantize_whole`]): every NF4 weight is
/// quantized on the GPU twice before training, when the model is built on the device
/// (`LoRALinear(quantize_base=True)`: `to_nf4(nn.Linear(...).weight)`) and when the checkpoint
/// is loaded into it (torchtune `_register_nf4_dispatch_ops.py` `inplace_copy`:
/// `to_nf4(src.to(device))`). Quantizing the largest such weight of n elements holds its bf16
/// source (2n bytes), the scaled blocks (2n) and `(value - nf4)` with its `.abs()` (16 levels ×
/// 2 bytes × n each) at once: 68n bytes beside the weights already resident. The caching
/// allocator keeps those blocks reserved for the rest of the run (nothing calls
/// `empty_cache`; torchtune's `memory_stats_log` resets the peak counters after model init,
/// which leaves reserved memory where it is), so training's peak reserved is at least this.
/// A smaller weight quantized before a larger one leaves its own pair of `16 × n` blocks cached
/// beside: a block of a cudaMalloc segment never grows into another segment, so the larger
/// request gets new segments (Llama-2-7B: the attention's 2 × 512 MiB, built first, then the
/// MLP's 2 × 1376 MiB). 0 for every other setup.
pub fn nf4_load_reserved(arch: &Arch, setup: &Setup, fw: &Framework, resident: u64) -> u64 {
    if setup.method != Method::Qlora || !fw.nf4_quantize_whole || !setup.stack.profile().torchao_nf4
    {
        return 0;
    }
    // each size larger than all before it opened segments of its own; the earlier ones stay
    let mut largest = 0;
    let mut earlier_pairs = 0;
    for n in nf4_sizes_in_build_order(arch, setup) {
        if n > largest {
            earlier_pairs += 64 * largest;
            largest = n;
        }
    }
    if largest == 0 {
        return 0;
    }
    resident + 68 * largest + earlier_pairs
}

/// The sizes of the quantized weights in the order a decoder layer builds them: attention
/// (q, k, v, o) before the MLP (gate, up, down), as every builder of a block does.
fn nf4_sizes_in_build_order(arch: &Arch, setup: &Setup) -> Vec<u64> {
    let mut tensors: Vec<_> = arch
        .tensors
        .iter()
        .filter(|t| states::quantized(setup, t))
        .collect();
    tensors.sort_by_key(|t| !matches!(t.role, Role::Q | Role::K | Role::V | Role::O | Role::Qkv));
    tensors.iter().map(|t| t.size()).collect()
}

/// Rounds a live-set total the way the caching allocator's segments do (2 MiB granularity).
fn round_segments(bytes: u64) -> u64 {
    bytes.div_ceil(framework::LARGE_SEGMENT_ROUND) * framework::LARGE_SEGMENT_ROUND
}

/// GPU peak of one rank, by component.
pub fn gpu(arch: &Arch, setup: &Setup, fw: &Framework) -> GpuEstimate {
    let st = model_states(arch, setup, fw);
    let act = activations(arch, setup, fw);
    let peak = peak(arch, setup, fw, &st, &act);
    let nvml_used = fw.cuda_context_bytes + peak.reserved + peak.nccl + st.gpu_paged;
    let mut c = state_components(setup, &st, &peak);
    c.extend(activation_components(setup, &act));
    c.extend(overhead_components(fw, &peak));
    // zero-sized lines (no offload, one GPU, …) say nothing
    c.retain(|x| x.bytes > 0);
    GpuEstimate {
        peak_allocated_bytes: peak.allocated,
        peak_reserved_bytes: peak.reserved,
        nvml_used_bytes: nvml_used,
        components: c,
    }
}

/// The peaks of one rank and the GPU bytes, besides model states and activations, behind them.
struct GpuPeak {
    /// gradients alive at the peak (none when the step runs inside backward)
    grads: u64,
    live_params: u64,
    zero_buffers: u64,
    ddp_buckets: u64,
    step_transient: u64,
    allocated: u64,
    reserved: u64,
    /// the NF4 quantization at load, not training, sets the reserved peak
    reserved_at_nf4_load: bool,
    /// reserved by FSDP's gather-stream pool beyond the blocks allocated at the peak
    gather_pool: u64,
    nccl: u64,
}

/// The larger of a step's two phases (activations alive, optimizer step), plus what the
/// allocator reserves beyond it.
fn peak(
    arch: &Arch,
    setup: &Setup,
    fw: &Framework,
    st: &StateBytes,
    act: &ActivationBytes,
) -> GpuPeak {
    let tr = trainable(arch, setup);
    let grad_b = working_dtype_bytes(setup);
    let ddp_buckets = ddp_bucket_bytes(setup, &tr, grad_b);
    let zero_buffers = zero_bucket_bytes(arch, setup, grad_b);
    let live_params = zero3_live_parameter_bytes(arch, setup);
    let persistent_no_grads = st.gpu_weights
        + st.gpu_optimizer
        + st.gpu_gathered
        + live_params
        + zero_buffers
        + ddp_buckets
        + framework::CUBLAS_WORKSPACE;
    let in_backward = setup.stack.profile().steps_in_backward(setup);
    // With the step inside backward a gradient lives only until its parameter's step.
    let grads = if in_backward { 0 } else { st.gpu_grads };
    let act_total = act.total();
    // Gradients exist through the forward pass when zero_grad keeps them, and from the second
    // micro-batch on when micro-batches accumulate.
    let activation_phase = if fw.grads_persist || setup.accum > 1 {
        persistent_no_grads + grads + act_total
    } else {
        // gradients are created while activations are freed, block by block: the live sum is
        // largest at one of the two ends of the backward pass
        persistent_no_grads + act_total.max(grads + act.transient)
    };
    let step_transient = if in_backward {
        // one parameter's gradient and its step's temporaries at a time
        tr.largest_tensor * grad_b + optimizer_step_transient(arch, setup, fw)
    } else {
        optimizer_step_transient(arch, setup, fw)
    };
    let step_phase = if in_backward {
        persistent_no_grads + act.transient.max(step_transient)
    } else {
        persistent_no_grads + grads + step_transient
    };
    let allocated = activation_phase.max(step_phase);
    // the activation phase's pool: its allocations and the block segments cached beside them
    let activation_pool = activation_phase + act.cached_block_segments();
    let stranded = if activation_pool >= step_phase {
        stranded_bytes(arch, setup, act)
    } else {
        0
    };
    let gather_pool = fsdp_gather_pool_bytes(arch, setup);
    // segments shorter steps left cached (lengths varying step to step) stay reserved beside
    // the activation phase; the step phase runs in them once they are free
    let spread = allocator::length_spread_reserved(arch, setup, fw);
    let training_reserved = allocated.max(activation_pool + spread) + stranded + gather_pool;
    let load_reserved = nf4_load_reserved(arch, setup, fw, st.gpu_weights);
    GpuPeak {
        grads,
        live_params,
        zero_buffers,
        ddp_buckets,
        step_transient,
        allocated,
        reserved: round_segments(training_reserved.max(load_reserved)),
        reserved_at_nf4_load: load_reserved > training_reserved,
        gather_pool,
        nccl: if setup.world() > 1 {
            framework::NCCL_BUFFERS
        } else {
            0
        },
    }
}

/// Bytes per element of gradients and gathered parameters: 16-bit beside an fp32 master copy.
fn working_dtype_bytes(setup: &Setup) -> u64 {
    if states::uses_master(setup) {
        2
    } else {
        setup.precision.weight_bytes()
    }
}

fn ddp_bucket_bytes(setup: &Setup, tr: &Trainable, grad_b: u64) -> u64 {
    if setup.world() > 1 && setup.zero.stage() == 0 {
        // DDP's reducer copies every gradient into flat buckets (gradient_as_bucket_view=False,
        // the default): one more gradient-sized buffer (torch DistributedDataParallel docs).
        tr.total() * grad_b
    } else {
        0
    }
}

fn zero_bucket_bytes(arch: &Arch, setup: &Setup, grad_b: u64) -> u64 {
    let hidden2 = arch.hidden * arch.hidden;
    // reduce_bucket_size: the config's, else transformers' "auto" (hidden²)
    let bucket = setup.zero_bucket_size.unwrap_or(hidden2);
    match setup.zero.stage() {
        0 => 0,
        // stage_1_and_2.py `backward`: with contiguous_gradients two `ipg_buffer`s of
        // reduce_bucket_size elements (the second for overlap_comm, which the Trainer's and
        // Qwen's configs set), allocated whatever the trainable size
        1 | 2 => 2 * bucket * grad_b,
        // reduce bucket + prefetch bucket (0.9·hidden², "auto") of 16-bit parameters
        _ => bucket * grad_b + 9 * hidden2 / 10 * 2,
    }
}

/// ZeRO-3: DeepSpeed's own estimate keeps the largest layer gathered (`gpu_gathered`); in a
/// step, parameters fetched for forward stay resident while they will be reused within
/// stage3_max_reuse_distance (1e9 by default) up to stage3_max_live_parameters (1e9):
/// DeepSpeed holds min(1e9, all parameters) gathered. FSDP frees each unit after use:
/// `fsdp_gathered_blocks` of them at once, and the root unit (embeddings, head), which the root
/// does not reshard after forward (torch fsdp/_runtime_utils.py `_post_forward_reshard`).
fn zero3_live_parameter_bytes(arch: &Arch, setup: &Setup) -> u64 {
    let param_b = working_dtype_bytes(setup);
    match (setup.zero.stage(), setup.zero.is_fsdp()) {
        (3, false) => framework::ZERO3_MAX_LIVE_PARAMETERS.min(arch.params_total()) * param_b,
        (3, true) => {
            (fsdp_gathered_blocks(setup) * block_params(arch) + root_params(arch)) * param_b
        }
        _ => 0,
    }
}

/// Blocks FSDP holds gathered at once in backward: the one computed and the one
/// `BackwardPrefetch.BACKWARD_PRE` fetches, the unit before it in forward order
/// (fsdp/_exec_order_utils.py `get_handle_to_backward_prefetch`). Where LoRA adapters are units
/// of their own (PEFT's and torchtune's wrapping policies) that unit is the previous block's last
/// adapter, so one block is gathered; the next comes when the gradient reaches it, as the computed
/// one is resharded (replayed with torch 2.2.2, scripts/replay_torchtune_fsdp_cpu.py).
fn fsdp_gathered_blocks(setup: &Setup) -> u64 {
    let adapters_own_units = matches!(setup.method, Method::Lora | Method::Qlora)
        && !setup.stack.profile().fsdp_mixed_units;
    if adapters_own_units { 1 } else { 2 }
}

/// FSDP gathers on a stream of its own, and the caching allocator serves a stream's freed blocks
/// only to that stream (c10 CUDACachingAllocator: a block belongs to the stream it was allocated
/// on): the next block's gather cannot reuse the one still in use, so the gather pool keeps two
/// blocks' segments reserved even where only one is allocated at the peak.
fn fsdp_gather_pool_bytes(arch: &Arch, setup: &Setup) -> u64 {
    if !(setup.zero.stage() == 3 && setup.zero.is_fsdp()) {
        return 0;
    }
    (2 - fsdp_gathered_blocks(setup)) * block_params(arch) * working_dtype_bytes(setup)
}

/// Eager attention leaves, per block, the freed score temporary whose segment the block's
/// later, smaller tensors split (masks, hidden-size outputs): the next block cannot reuse it
/// for its own seq² temporaries, so reserved exceeds allocated by about one score-sized block
/// per layer at the end of the forward pass (c10 CUDACachingAllocator block splitting).
fn stranded_bytes(arch: &Arch, setup: &Setup, act: &ActivationBytes) -> u64 {
    let blocks = if setup.grad_ckpt {
        act.stranded_per_block
    } else {
        act.stranded_per_block * arch.layers_total()
    };
    blocks + act.stranded_logits
}

/// Lines for the persistent model states and ZeRO-3's gathered parameters.
fn state_components(setup: &Setup, st: &StateBytes, peak: &GpuPeak) -> Vec<Component> {
    vec![
        Component::new(
            "weights",
            st.gpu_weights,
            Scaling::Neither,
            weights_note(setup),
        ),
        Component::new(
            "gradients",
            peak.grads,
            Scaling::Neither,
            "trainable parameters × gradient dtype",
        ),
        Component::new(
            "optimizer states",
            st.gpu_optimizer,
            Scaling::Neither,
            format!(
                "{} (+ a DeepSpeed ZeRO optimizer's fp32 partition copy and gradient)",
                setup.optimizer
            ),
        ),
        Component::new(
            "zero-3 live parameters",
            peak.live_params,
            Scaling::Neither,
            if setup.zero.is_fsdp() {
                "FSDP: the blocks gathered in backward and the root unit (embeddings, head)"
            } else {
                "gathered parameters kept for reuse (stage3_max_live_parameters)"
            },
        ),
        Component::new(
            "zero-3 gathered layer",
            st.gpu_gathered,
            Scaling::Neither,
            "largest layer's parameters + gradients, gathered whole",
        ),
        Component::new(
            "paged optimizer states",
            st.gpu_paged,
            Scaling::Neither,
            "CUDA unified memory: in nvml_used, not in torch's counters; pages out under pressure",
        ),
    ]
}

/// Lines for the activations of one micro-batch and the backward pass's temporaries.
fn activation_components(setup: &Setup, act: &ActivationBytes) -> Vec<Component> {
    let bs = Scaling::BatchAndSequence;
    let (blocks, note) = match (setup.grad_ckpt, act.recompute_after_loss) {
        (false, _) => (act.blocks, "saved for backward, every block"),
        (true, false) => (
            act.blocks + act.recompute,
            "checkpointed block inputs + one block recomputed",
        ),
        (true, true) => (
            act.blocks + act.recompute.saturating_sub(act.logits),
            "checkpointed block inputs + what one block recomputed in backward needs beyond the loss's tensors, freed before it",
        ),
    };
    vec![
        Component::new("activations (blocks)", blocks, bs, note),
        Component::new(
            "  of which attention matrices",
            act.attention_matrices,
            bs,
            "batch × heads × seq² scores/probabilities (eager)",
        ),
        Component::new(
            "embeddings + inputs",
            act.embeddings,
            bs,
            "embedding output, dropout masks, token ids",
        ),
        Component::new(
            "logits + loss",
            act.logits,
            bs,
            "logits, the loss's copy of them (fp32 or shifted), log-softmax, at the end of forward",
        ),
        Component::new(
            "autocast weight copies",
            act.autocast_weights,
            Scaling::Neither,
            "16-bit casts of the linear weights kept for backward",
        ),
        Component::new(
            "backward temporaries",
            act.transient,
            bs,
            "loss gradients beyond the logits forward freed, or one block's gradient tensors",
        ),
    ]
}

/// Lines for the optimizer step, communication buffers and what lies outside torch's counters.
fn overhead_components(fw: &Framework, peak: &GpuPeak) -> Vec<Component> {
    vec![
        Component::new(
            "optimizer step temporaries",
            peak.step_transient,
            Scaling::Neither,
            if fw.foreach_optimizer {
                "foreach step copies (only when larger than the activations phase)"
            } else {
                "per-tensor step copies"
            },
        ),
        Component::new(
            "ddp gradient buckets",
            peak.ddp_buckets,
            Scaling::Neither,
            "flat copies of all gradients for all-reduce",
        ),
        Component::new(
            "zero buckets",
            peak.zero_buffers,
            Scaling::Neither,
            "reduce / all-gather / prefetch buckets at hidden² elements",
        ),
        Component::new(
            "cublas workspace",
            framework::CUBLAS_WORKSPACE,
            Scaling::Neither,
            "per handle, through the caching allocator",
        ),
        Component::new(
            "allocator slack",
            peak.reserved - peak.allocated,
            Scaling::Neither,
            if peak.reserved_at_nf4_load {
                "reserved − allocated: blocks cached from quantizing the weights to NF4 at load (torchao 0.1)"
            } else if peak.gather_pool > 0 {
                "reserved − allocated: a second block in FSDP's gather-stream pool, seq² temporaries stranded, 2 MiB segments"
            } else {
                "reserved − allocated: seq² temporaries stranded by block splitting, a checkpointed forward's block segments beside the logits, shorter steps' segments (--length-spread), 2 MiB segments"
            },
        ),
        Component::new(
            "cuda context",
            fw.cuda_context_bytes,
            Scaling::Neither,
            "kernels and driver state, outside the allocator",
        ),
        Component::new(
            "nccl buffers",
            peak.nccl,
            Scaling::Neither,
            "communicator buffers outside the allocator",
        ),
    ]
}

fn weights_note(setup: &Setup) -> String {
    let mut n = format!("{} weights", setup.precision);
    if let Some(q) = setup.quant {
        n += &format!(", {q}-quantized base");
    }
    if setup.zero.stage() == 3 {
        n += if setup.offload_params {
            ", offloaded to host"
        } else {
            ", partitioned across ranks"
        };
    }
    n
}

/// Parameters outside the blocks (embeddings, head): FSDP's root unit.
fn root_params(arch: &Arch) -> u64 {
    arch.params_in(crate::arch::Group::Embeddings) + arch.params_in(crate::arch::Group::Head)
}

/// Parameters of one transformer block (the FSDP wrapping unit).
fn block_params(arch: &Arch) -> u64 {
    let blocks: u64 = arch
        .tensors
        .iter()
        .filter(|t| {
            matches!(
                t.group,
                crate::arch::Group::Encoder | crate::arch::Group::Decoder
            )
        })
        .map(|t| t.elements())
        .sum();
    blocks / arch.layers_total().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::preset;
    use crate::memory::setup::{Precision, Zero};

    /// ZeRO-2's two 16-bit ipg buffers follow the config's reduce_bucket_size, whatever the
    /// trainable size (stage_1_and_2.py `backward`).
    #[test]
    fn zero2_holds_two_reduce_buckets_of_the_configured_size() {
        let arch = preset("llama-2-7b").unwrap();
        let mut auto = Setup::new(&arch);
        auto.precision = Precision::AmpBf16;
        auto.method = Method::Lora;
        auto.zero = Zero::Z2;
        let mut set = auto.clone();
        set.zero_bucket_size = Some(200_000_000);
        let fw = Framework::default();
        let (a, s) = (gpu(&arch, &auto, &fw), gpu(&arch, &set, &fw));
        let hidden2 = arch.hidden * arch.hidden;
        assert_eq!(
            s.peak_allocated_bytes - a.peak_allocated_bytes,
            2 * (200_000_000 - hidden2) * 2
        );
    }
}
