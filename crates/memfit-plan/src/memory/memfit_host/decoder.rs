//! Decoder-only (Llama-style: Llama, Qwen2, Mistral) terms of memfit's trainer: what burn's
//! autodiff keeps per pre-norm block (crates/memfit-nn/src/decoder/forward.rs: RMSNorm, RoPE,
//! grouped-query attention, SwiGLU), with LoRA adapters (layers/lora.rs) on a frozen base or every
//! weight trained, the chunked LM head, and per-layer checkpointing (decoder/block_ckpt.rs).

use super::{
    HostFit, Moments, attention_bytes, group_trains, head_logits, head_trains, recomputed_block,
};
use crate::arch::{Arch, Group, Role};
use crate::memory::setup::{Method, Setup};
use crate::memory::states::base_trains;

/// Whether the run trains LoRA adapters (the base frozen).
fn is_lora(setup: &Setup) -> bool {
    matches!(setup.method, Method::Lora | Method::Qlora)
}

/// Elements the adapted projections keep per token beyond their inputs: each adapter's `x·A·scale`
/// (`[tokens, r]`, kept by B's product): r per adapted projection. The down-projection
/// `dropout(x)·A` is one op (kernels/dropout_linear_op.rs) that keeps x itself and the mask's seed,
/// not a dropped copy: the inputs are counted once per input in [`block_elements`], shared by the
/// adapters that read them. A frozen projection keeps nothing (its weight needs no gradient).
fn adapters(setup: &Setup) -> u64 {
    if !is_lora(setup) {
        return 0;
    }
    let roles = [
        Role::Q,
        Role::K,
        Role::V,
        Role::O,
        Role::Gate,
        Role::Up,
        Role::Down,
    ];
    roles.iter().filter(|role| adapted(setup, **role)).count() as u64 * setup.lora_r
}

/// Whether LoRA adapts projection `role`.
pub(crate) fn adapted(setup: &Setup, role: Role) -> bool {
    is_lora(setup) && setup.lora_targets.iter().any(|t| t.covers(role))
}

/// Elements (of the activation dtype) one block keeps per token (d = hidden, n_q = heads ×
/// head_dim, n_kv = kv_heads × head_dim, f = intermediate), from crates/memfit-nn/src/decoder/
/// forward.rs:
///
/// - the two RMS norms' inputs (the block input and the residual after attention), kept by the
///   fused norm (kernels/fused_rms_norm.rs keeps its input, not its output): 2d;
/// - q after RoPE and the d^-½ scale, k after RoPE, v: kept by the attention op, n_q + 2 n_kv
///   (RoPE itself keeps only its cos/sin tables; the op keeps no `q × k` matrix);
/// - SwiGLU's gating, one op (kernels/swiglu_op.rs) keeping gate's and up's outputs: 2f;
/// - the inputs of the projections whose weight trains (full training) or that an adapter reads
///   (LoRA: `dropout(x)·A` keeps x): the normed input of q/k/v and of gate/up (one tensor each,
///   shared by the projections reading it), the attention context (o) and the SwiGLU product
///   (down): 2d + n_q + f when every projection trains or is adapted;
/// - under LoRA, each adapter's rank-r product ([`adapters`]);
/// - Qwen3's per-head norms of q and k keep their inputs: n_q + n_kv.
fn block_elements(arch: &Arch, setup: &Setup) -> u64 {
    let (d, f) = (arch.hidden, arch.ffn);
    let (q, kv) = (arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim);
    let qk_norms = if arch.block.qk_norm { q + kv } else { 0 };
    let kept = 2 * d + q + 2 * kv + 2 * f + qk_norms;
    let reads = |roles: &[Role]| {
        roles.iter().any(|role| {
            adapted(setup, *role)
                || arch
                    .tensors
                    .iter()
                    .any(|t| t.role == *role && base_trains(t, setup))
        })
    };
    let inputs = [
        (&[Role::Q, Role::K, Role::V][..], d),
        (&[Role::O][..], q),
        (&[Role::Gate, Role::Up][..], d),
        (&[Role::Down][..], f),
    ]
    .iter()
    .filter(|(roles, _)| reads(roles))
    .map(|(_, width)| width)
    .sum::<u64>();
    kept + inputs + adapters(setup)
}

/// A decoder micro-batch's activations. The first block's input needs no gradient when the
/// embedding is frozen (LoRA): its first norm keeps nothing (d less).
pub(super) fn activations(
    arch: &Arch,
    setup: &Setup,
    fit: &HostFit,
    cb: u64,
    accumulated: u64,
) -> Moments {
    let (b, s, d) = (setup.batch, setup.seq, arch.hidden);
    let layers = arch.decoder_layers;
    let tokens = b * s;
    let embedding_trains = group_trains(arch, setup, Group::Embeddings);
    let first_input = if embedding_trains { 0 } else { d };
    // the stack: the embedded tokens (held by their leaf), the final norm's input and output
    let stack = 3 * d;
    let elements = layers * block_elements(arch, setup) - first_input + stack;
    let blocks = (fit.block_scale * (cb * tokens * elements) as f64) as u64;
    // the causal mask `[b, 1, groups·t, t]` in the activation dtype, shared by the layers
    let groups = arch.heads / arch.kv_heads.max(1);
    let mask = cb * b * groups * s * s;
    let attention = attention_bytes(layers * b * arch.heads * s) + mask;
    let logits = head_logits(fit, tokens, arch.vocab, d);
    let head_grads = if head_trains(arch, setup) {
        2 * 4 * arch.vocab * d
    } else {
        0
    };
    let checkpointed = setup.grad_ckpt.then(|| {
        // the forward keeps each layer's input and the last output, and the mask
        let boundaries = cb * tokens * d * (layers + 1) + mask;
        let (block, retained) = recomputed_block(
            fit,
            cb * tokens * block_elements(arch, setup),
            b * arch.heads * s,
        );
        let trained = super::trainable(arch, setup);
        let head = boundaries + logits + head_grads + accumulated + retained;
        let last_block = boundaries + block + retained + 4 * (trained.base + trained.adapters);
        (head, last_block)
    });
    // the last block's attention backward (kernels/attention_core.rs): the probabilities recomputed
    // from the row statistics and the cotangent of the dropped ones (turned into the scores' in
    // place), f32 `[b, heads, t, t]` each, while the blocks' tensors are all kept (what the last
    // block's MLP frees by then is not subtracted)
    let attention_backward = 2 * 4 * b * arch.heads * s * s;
    Moments {
        blocks,
        attention,
        logits,
        head_grads,
        attention_backward,
        checkpointed,
    }
}
