//! Decoder-only (Llama-style: Llama, Qwen2, Mistral) terms of memfit's trainer: what burn's
//! autodiff keeps per pre-norm block (crates/memfit-nn/src/decoder/forward.rs: RMSNorm, RoPE,
//! grouped-query attention, SwiGLU), with LoRA adapters (layers/lora.rs) on a frozen base or every
//! weight trained, the chunked LM head, and per-layer checkpointing (decoder/block_ckpt.rs).

use super::{Moments, attention_bytes, fitted, group_trains, head_logits, recomputed_block};
use crate::arch::{Arch, Group, Head, Role};
use crate::memory::setup::{Method, Setup};
use crate::memory::states::base_trains;

/// Whether the run trains LoRA adapters (the base frozen).
fn is_lora(setup: &Setup) -> bool {
    matches!(setup.method, Method::Lora | Method::Qlora)
}

/// Elements one adapted projection keeps per token: `dropout(x)` (a new tensor per adapter,
/// drawn with memfit's default LoRA dropout 0.05, kept by A's product) and `x·A·scale` (kept by
/// B's): its input width + r. A frozen projection keeps nothing (its weight needs no gradient).
fn adapters(arch: &Arch, setup: &Setup) -> u64 {
    if !is_lora(setup) {
        return 0;
    }
    let (d, f) = (arch.hidden, arch.ffn);
    let q = arch.heads * arch.head_dim;
    let projections = [
        (Role::Q, d),
        (Role::K, d),
        (Role::V, d),
        (Role::O, q),
        (Role::Gate, d),
        (Role::Up, d),
        (Role::Down, f),
    ];
    projections
        .iter()
        .filter(|(role, _)| setup.lora_targets.iter().any(|t| t.covers(*role)))
        .map(|(_, width)| width + setup.lora_r)
        .sum()
}

/// Elements (of the activation dtype) one block keeps per token (d = hidden, n_q = heads ×
/// head_dim, n_kv = kv_heads × head_dim, f = intermediate):
///
/// - the two RMS norms' inputs (the block input and the residual after attention): 2d;
/// - q after RoPE and the d^-½ scale, k after RoPE, v: kept by the attention op, n_q + 2 n_kv
///   (RoPE itself keeps only its cos/sin tables; the op keeps no `q × k` matrix);
/// - SwiGLU: gate's output and its sigmoid (SiLU is `x · σ(x)`), SiLU's output and up's output
///   (kept by the product): 4f;
/// - trained linears (full training) keep their inputs: the normed input of q/k/v and of
///   gate/up (one tensor each), the context and the SwiGLU product: 2d + n_q + f;
/// - under LoRA, each adapter's dropped-out input and rank-r product ([`adapters`]);
/// - Qwen3's per-head norms of q and k keep their inputs: n_q + n_kv.
fn block_elements(arch: &Arch, setup: &Setup) -> u64 {
    let (d, f) = (arch.hidden, arch.ffn);
    let (q, kv) = (arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim);
    let qk_norms = if arch.block.qk_norm { q + kv } else { 0 };
    let kept = 2 * d + q + 2 * kv + 4 * f + qk_norms;
    let linear_inputs = if is_lora(setup) { 0 } else { 2 * d + q + f };
    kept + linear_inputs + adapters(arch, setup)
}

/// A decoder micro-batch's activations. The first block's input needs no gradient when the
/// embedding is frozen (LoRA): its first norm keeps nothing (d less).
pub(super) fn activations(arch: &Arch, setup: &Setup, cb: u64, accumulated: u64) -> Moments {
    let (b, s, d) = (setup.batch, setup.seq, arch.hidden);
    let layers = arch.decoder_layers;
    let tokens = b * s;
    let embedding_trains = group_trains(arch, setup, Group::Embeddings);
    let first_input = if embedding_trains { 0 } else { d };
    // the stack: the embedded tokens (held by their leaf), the final norm's input and output
    let stack = 3 * d;
    let elements = layers * block_elements(arch, setup) - first_input + stack;
    let blocks = (fitted::BLOCK_SCALE * (cb * tokens * elements) as f64) as u64;
    // the causal mask `[b, 1, groups·t, t]` in the activation dtype, shared by the layers
    let groups = arch.heads / arch.kv_heads.max(1);
    let mask = cb * b * groups * s * s;
    let attention = attention_bytes(layers * b * arch.heads * s) + mask;
    let logits = head_logits(tokens, arch.vocab, d);
    let head_trains = arch
        .tensors
        .iter()
        .any(|t| t.role == Role::LmHead && base_trains(t, setup))
        || (arch.head == Head::LmTied && embedding_trains);
    let head_grads = if head_trains {
        2 * 4 * arch.vocab * d
    } else {
        0
    };
    let checkpointed = setup.grad_ckpt.then(|| {
        // the forward keeps each layer's input and the last output, and the mask
        let boundaries = cb * tokens * d * (layers + 1) + mask;
        let (block, retained) = recomputed_block(
            cb * tokens * block_elements(arch, setup),
            b * arch.heads * s,
        );
        let trained = super::trainable(arch, setup);
        let head = boundaries + logits + head_grads + accumulated + retained;
        let last_block = boundaries + block + retained + 4 * (trained.base + trained.adapters);
        (head, last_block)
    });
    Moments {
        blocks,
        attention,
        logits,
        head_grads,
        checkpointed,
    }
}
