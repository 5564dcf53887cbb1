//! GPU memory of memfit's own trainer on a CUDA device (`--runtime memfit --device cuda`).
//!
//! On a GPU the engine runs its device placement (crates/memfit-train/src/engine/device_state.rs)
//! and memfit-nn's GPU code path: burn's ops, with the device ops (memfit-nn `kernels/device`:
//! softmax, the norms, the activations and dropout as one kernel each way) where burn's would
//! run several. The terms follow what that code holds on the device:
//!
//! - **master weights**: the trained parameters (or LoRA adapters) as f32 tensors, 4 B each;
//! - **compute weights**: under bf16 the masters cast to bf16 once per optimizer step (2 B per
//!   trained parameter; in fp32 the masters are read as they are);
//! - **frozen weights**: a frozen part (a LoRA base, `--freeze` groups) once, at its dtype;
//! - **optimizer states**: AdamW's two f32 moments, Adafactor's f32 factors;
//! - **gradients**: the f32 accumulators, and at the end of a backward pass that pass's
//!   gradients in the compute dtype before they are added in;
//! - **activations**: what burn's autodiff keeps for backward, counted op by op from each family's
//!   forward pass on that path (T5 in [`t5`], BERT in [`bert`], Llama-style decoders in
//!   [`decoder`]): materialised `q·kᵀ` probabilities (none in a decoder's fused attention), each
//!   norm's input and row statistics, each activation's input; dropout keeps no mask (it draws it
//!   again in backward);
//! - **LM head**: one chunk of logits at a time ([`HEAD_CHUNK_LOGITS_GPU`], f32) and the weight's
//!   gradient, while every activation is alive;
//! - **attention backward**: the last block's two `q × k` gradient matrices beside what is kept;
//! - **the optimizer step**: the gradients laid out end to end as the masters are (`optim/flat.rs`)
//!   and one chunk's temporary (at most 64 MiB of f32, or the largest parameter), while the compute
//!   weights are released: never more than the end of a backward pass, so not a moment of its own.
//!
//! Counted against a real allocator on the CPU (flex runs this same code path — burn's ops and the
//! device ops, which keep the same tensors there —, its slices views as cubecl's are:
//! crates/memfit-train/tests/device_memory.rs). Not
//! counted, because only a card can measure them: cubecl's pool rounding (reserved beyond the
//! tensors) and the CUDA context, taken here as PyTorch's (`Framework::cuda_context_bytes`) until
//! `scripts/gpu/accept.sh` measures memfit's.

mod bert;
mod decoder;
mod t5;

use super::memfit_host::head_trains;
use super::setup::{Method, Optimizer, Precision, Setup};
use super::states::{Trainable, trainable};
use super::{Component, Framework, GpuEstimate, Scaling};
use crate::arch::{Arch, Family};

/// Bytes of an element of the activation dtype — also that of the masks and position biases,
/// which are built in the compute weights' dtype.
pub(super) struct Widths {
    pub compute: u64,
}

/// Elements of the activation dtype, and bytes of anything else (the norms' f32 row statistics).
pub(super) struct Kept {
    pub elements: u64,
    pub bytes: u64,
}

impl Kept {
    pub fn at(&self, w: &Widths) -> u64 {
        self.elements * w.compute + self.bytes
    }
}

/// Bytes one query token's attention keeps over `keys` (heads × key positions): the device softmax
/// keeps its output, the probabilities, and their product with v keeps its input — the
/// probabilities themselves, or with dropout their dropped-out copy (dropout keeps no mask): one
/// matrix, two with dropout (crates/memfit-train/tests/device_memory.rs).
pub(super) fn attention_kept(w: &Widths, keys: u64, p: f64) -> u64 {
    let matrices = if p > 0.0 { 2 } else { 1 };
    matrices * w.compute * keys
}

/// Bytes a device norm keeps per row besides its input: the row's mean and `r` (f32).
pub(super) const NORM_ROW_STATS: u64 = 8;

/// Logits per chunk of the LM head on the GPU's code path (memfit-nn's `layers/chunked_head.rs`
/// `DEVICE_CHUNK_LOGITS`, which a test there holds to this): 32 Mi, four times the CPU's chunk, for
/// fewer launches and products with more rows.
pub const HEAD_CHUNK_LOGITS_GPU: u64 = 32 << 20;

/// The f32 buffers of one head chunk alive at once, a chunk's worth each: its logits and their
/// gradient (`kernels/xent.rs` on the device builds the gradient as a new tensor).
const HEAD_CHUNK_COPIES: u64 = 2;

/// One micro-batch's forward pass as a family counts it.
pub(super) struct Forward {
    /// Everything autodiff keeps for backward (no checkpointing).
    pub saved: u64,
    /// Under per-block checkpointing: what the forward pass keeps (each block's input, the shared
    /// biases and masks, the embeddings' and final norm's tensors) ...
    pub boundaries: u64,
    /// ... and the largest block recomputed with its graph in backward.
    pub largest_block: u64,
    /// Rows the LM head reads (0: no LM head).
    pub head_tokens: u64,
    /// One `batch × heads × q × k` matrix of the largest attention, in the activation dtype: its
    /// backward holds two beside what is kept (the probabilities' gradient and the scores').
    pub matrix: u64,
}

/// memfit's trainer on one GPU, by component: the model states and the worst of a step's
/// moments ([`moments`]).
pub fn device(arch: &Arch, setup: &Setup, fw: &Framework) -> GpuEstimate {
    let tr = trainable(arch, setup);
    let pt = tr.total();
    // memfit's bf16 is mixed precision (bf16 compute over f32 masters), what AMP names amp-bf16
    let w = Widths {
        compute: setup.precision.compute_bytes(),
    };
    let mut c = states(arch, setup, &w, &tr);
    let worst = moments(arch, setup, &w, pt)
        .into_iter()
        .max_by_key(|m| m.iter().map(|x| x.bytes).sum::<u64>())
        .expect("three moments");
    c.extend(worst.into_iter().filter(|x| x.bytes > 0));
    let allocated: u64 = c.iter().map(|x| x.bytes).sum();
    c.push(Component::new(
        "cuda context",
        fw.cuda_context_bytes,
        Scaling::Neither,
        "the driver's context, taken as PyTorch's (lazy loading) until measured for memfit",
    ));
    GpuEstimate {
        peak_allocated_bytes: allocated,
        peak_reserved_bytes: allocated,
        nvml_used_bytes: allocated + fw.cuda_context_bytes,
        components: c,
    }
}

/// What a step holds beside the model states at each of its three moments: the head's loss
/// beside every kept activation; the last block's attention backward beside them (under
/// `--grad-ckpt`, the largest block recomputed with its graph, beside the accumulators the later
/// blocks filled); the end of a backward pass (its gradients beside the f32 accumulators).
fn moments(arch: &Arch, setup: &Setup, w: &Widths, pt: u64) -> [Vec<Component>; 3] {
    let f = forward(arch, setup, w);
    let bs = Scaling::BatchAndSequence;
    let accumulated = 4 * pt;
    let grads =
        |bytes, note| Component::new("accumulated gradients", bytes, Scaling::Neither, note);
    let earlier = grads(
        if setup.accum > 1 { accumulated } else { 0 },
        "f32, from the second micro-batch of a step on",
    );
    let kept = if setup.grad_ckpt {
        let note = "each block's input, the shared biases and masks (per-block checkpointing)";
        Component::new("activations", f.boundaries, bs, note)
    } else {
        let note = "what burn's autodiff keeps for backward on the GPU's code path: each norm's \
                    and activation's input, the probabilities of attention not run fused";
        Component::new("activations", f.saved, bs, note)
    };
    let head_note = "one f32 logits chunk and its gradient, the hidden states' cotangent, the head \
                     weight's gradient";
    let head = Component::new(
        "LM head",
        head(arch, setup, w, f.head_tokens),
        bs,
        head_note,
    );
    let backward = if setup.grad_ckpt {
        let note = "the largest block's graph recomputed in backward, and its attention's \
                    backward (two q × k matrices)";
        vec![
            Component::new("recomputed block", f.largest_block + 2 * f.matrix, bs, note),
            grads(accumulated, "f32, filled by the blocks after it"),
        ]
    } else {
        let note = "the last block's attention backward: two q × k matrices";
        vec![
            Component::new("attention backward", 2 * f.matrix, bs, note),
            earlier.clone(),
        ]
    };
    let end = Component::new(
        "gradients",
        w.compute * pt + accumulated,
        Scaling::Neither,
        "one backward pass's (compute dtype) beside the f32 accumulators",
    );
    [
        vec![kept.clone(), head, earlier],
        [vec![kept], backward].concat(),
        vec![end],
    ]
}

/// The model states on the device.
fn states(arch: &Arch, setup: &Setup, w: &Widths, tr: &Trainable) -> Vec<Component> {
    let pt = tr.total();
    let lora = matches!(setup.method, Method::Lora | Method::Qlora);
    let frozen_dtype = match (lora, setup.base_precision) {
        (true, Some(Precision::Bf16)) => 2,
        (true, _) => 4,
        (false, _) => w.compute,
    };
    let frozen = arch.params_total() - if lora { 0 } else { pt };
    let per_element = match setup.optimizer {
        Optimizer::Adafactor => 4.0 * tr.adafactor_elements as f64 / pt.max(1) as f64,
        Optimizer::Sgd => 4.0,
        _ => 8.0,
    };
    let shards = setup.optimizer_shards.max(1);
    let (elements, note) = if shards > 1 {
        // whole tensors go to the least-loaded rank, the largest first: no rank holds more than
        // an even share and the largest tensor
        let share = (pt.div_ceil(shards) + tr.largest_tensor).min(pt);
        let note = format!(
            "{} states, f32, of at most {} of the {pt} trained parameters (ZeRO-1 over {shards} ranks: an even share and the largest tensor)",
            setup.optimizer, share
        );
        (share, note)
    } else {
        (pt, format!("{} states, f32", setup.optimizer))
    };
    let optimizer = (per_element * elements as f64).round() as u64;
    let n = Scaling::Neither;
    vec![
        Component::new("master weights", 4 * pt, n, "trained parameters, f32"),
        Component::new(
            "compute weights",
            if w.compute < 4 { w.compute * pt } else { 0 },
            n,
            "the masters cast to bf16 once per step (fp32 reads the masters)",
        ),
        Component::new(
            "frozen weights",
            frozen_dtype * frozen,
            n,
            "frozen parameters once, at their dtype",
        ),
        Component::new("optimizer states", optimizer, n, note),
    ]
}

/// One micro-batch's forward pass, by family.
fn forward(arch: &Arch, setup: &Setup, w: &Widths) -> Forward {
    match arch.family {
        Family::Bert => bert::forward(arch, setup, w),
        Family::Llama => decoder::forward(arch, setup, w),
        _ => t5::forward(arch, setup, w),
    }
}

/// The LM head beside the activations: one chunk's f32 logits and their gradient, the hidden
/// states' cotangent (assembled from the chunks), the head weight's gradient beside its
/// accumulator when it trains.
fn head(arch: &Arch, setup: &Setup, w: &Widths, tokens: u64) -> u64 {
    if tokens == 0 {
        return 0;
    }
    let chunk = (tokens * arch.vocab).min(HEAD_CHUNK_LOGITS_GPU);
    let weight_grad = if head_trains(arch, setup) {
        2 * w.compute * arch.vocab * arch.hidden
    } else {
        0
    };
    HEAD_CHUNK_COPIES * 4 * chunk + 2 * w.compute * tokens * arch.hidden + weight_grad
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::presets::preset;
    use crate::memory::{Device, Runtime};

    fn optimizer_bytes(setup: &Setup, arch: &Arch) -> u64 {
        let e = device(arch, setup, &Framework::default());
        let c = e.components.iter().find(|c| c.name == "optimizer states");
        c.expect("an optimizer line").bytes
    }

    /// ZeRO-1 (`optimizer_shards`): a rank holds at least an even share of AdamW's states and at
    /// most that and the largest tensor's; unsharded, all of them.
    #[test]
    fn a_sharded_rank_holds_its_share_of_the_optimizer_state() {
        let arch = preset("t5-small").unwrap();
        let mut setup = Setup::new(&arch);
        (setup.device, setup.runtime) = (Device::Cuda, Runtime::Memfit);
        let pt = arch.params_total();
        assert_eq!(optimizer_bytes(&setup, &arch), 8 * pt);
        setup.optimizer_shards = 3;
        let largest = crate::memory::states::trainable(&arch, &setup).largest_tensor;
        let share = optimizer_bytes(&setup, &arch);
        assert!(share >= 8 * pt / 3, "{share}");
        assert!(share <= 8 * (pt.div_ceil(3) + largest), "{share}");
        assert!(share < 8 * pt);
    }
}
