//! Llama-style decoders (Llama, Qwen2, Mistral, Qwen3) on the GPU's code path: what autodiff keeps
//! per pre-norm block (crates/memfit-nn/src/decoder/forward.rs and attention.rs off flex's
//! hand-written ops: the device RMS norm and SwiGLU, RoPE by products with the tables, attention
//! fused without dropout ([`fused_attention`]), else grouped-query `softmax(q·kᵀ + mask)`
//! materialised), with LoRA adapters (layers/lora.rs).

use super::{Forward, NORM_ROW_STATS, Widths, attention_kept};
use crate::arch::{Arch, Role};
use crate::memory::memfit_host::decoder::adapted;
use crate::memory::setup::Setup;
use crate::memory::states::base_trains;

/// `memfit train`'s LoRA dropout unless `--lora-dropout` says otherwise (cmd/train/mod.rs): the
/// planner's setup does not carry it, so an adapter's dropped copy is always counted.
const LORA_DROPOUT: f64 = 0.05;

/// Whether projection `role` keeps its input itself: its weight trains, or an adapter reads it
/// undropped (with LoRA dropout an adapter keeps its own dropped copy: [`adapters`]).
fn reads_input(arch: &Arch, setup: &Setup, role: Role) -> bool {
    (adapted(setup, role) && LORA_DROPOUT == 0.0)
        || arch
            .tensors
            .iter()
            .any(|t| t.role == role && base_trains(t, setup))
}

/// Bytes per token each adapter keeps: its rank-r product (scaled, kept by B) and, with LoRA
/// dropout, its own dropped-out copy of the input (dropout keeps no mask).
fn adapters(arch: &Arch, setup: &Setup, w: &Widths) -> u64 {
    let (d, f) = (arch.hidden, arch.ffn);
    let q = arch.heads * arch.head_dim;
    [
        (Role::Q, d),
        (Role::K, d),
        (Role::V, d),
        (Role::O, q),
        (Role::Gate, d),
        (Role::Up, d),
        (Role::Down, f),
    ]
    .iter()
    .filter(|(role, _)| adapted(setup, *role))
    .map(|(_, input)| {
        let dropped = if LORA_DROPOUT > 0.0 { *input } else { 0 };
        w.compute * (setup.lora_r + dropped)
    })
    .sum()
}

/// Bytes one block keeps per token beside its attention matrices (d = hidden, n_q = heads ×
/// head_dim, n_kv = kv heads × head_dim, f = intermediate):
/// - the norms' inputs (the residual stream) with their row statistics, kept by the norms: 2d;
/// - the norms' outputs where a projection reads them: d each (q/k/v, gate/up);
/// - q after RoPE and the d^-½ scale, k after RoPE, v (kept by the products): n_q + 2 n_kv;
/// - the context re-laid out for o, where o reads it: n_q;
/// - SwiGLU: gate and up (kept by the gating), and their product where down reads it: 2f (+ f);
/// - Qwen3's per-head norms of q and k: their inputs with statistics per head, and outputs.
fn block(arch: &Arch, setup: &Setup, w: &Widths) -> u64 {
    let (d, f) = (arch.hidden, arch.ffn);
    let (q, kv) = (arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim);
    let reads = |roles: &[Role]| roles.iter().any(|r| reads_input(arch, setup, *r));
    let cb = w.compute;
    let norms = 2 * (cb * d + NORM_ROW_STATS);
    let mut elements = q + 2 * kv + 2 * f;
    if reads(&[Role::Q, Role::K, Role::V]) {
        elements += d;
    }
    if reads(&[Role::O]) {
        elements += q;
    }
    if reads(&[Role::Gate, Role::Up]) {
        elements += d;
    }
    if reads(&[Role::Down]) {
        elements += f;
    }
    let qk_norms = if arch.block.qk_norm {
        2 * cb * (q + kv) + NORM_ROW_STATS * (arch.heads + arch.kv_heads)
    } else {
        0
    };
    norms + cb * elements + qk_norms + adapters(arch, setup, w)
}

/// Whether the blocks' attention runs fused (memfit-nn's `decoder::attention::attend_causal_or_masked`):
/// without attention dropout, on right-padded training batches (memfit's collation), it keeps no
/// `q × k` matrix and its backward recomputes the probabilities, holding two matrices at its
/// peak beside the recomputed block as the composite backward does beside the kept one (counted on
/// flex's run of the GPU's code path, `tests/device_memory.rs`). A sliding window shorter than the
/// sequence (not in the planner's configs) would take the masked form.
fn fused_attention(arch: &Arch) -> bool {
    arch.attention_dropout == 0.0
}

/// One decoder micro-batch's forward pass and the tokens the LM head reads. The mask is shared by
/// the blocks: fused, the causal one `[1, 1, groups × t, t]` made on the device (memfit-nn's
/// `Context::causal`), else the causal + padding one `[b, 1, groups × t, t]`; the final norm's
/// input (with statistics) and output stay for backward. Under per-layer checkpointing (decoder/block_ckpt.rs) the forward keeps each
/// block's input (the residual stream) and backward recomputes one block at a time.
pub(super) fn forward(arch: &Arch, setup: &Setup, w: &Widths) -> Forward {
    let (b, s, d) = (setup.batch, setup.seq, arch.hidden);
    let groups = (arch.heads / arch.kv_heads.max(1)).max(1);
    let fused = fused_attention(arch);
    let attention = if fused {
        0
    } else {
        attention_kept(w, arch.heads * s, arch.attention_dropout)
    };
    let one = b * s * (block(arch, setup, w) + attention);
    let final_norm = b * s * (2 * w.compute * d + NORM_ROW_STATS);
    let masks = w.compute * if fused { 1 } else { b } * groups * s * s;
    Forward {
        saved: arch.decoder_layers * one + final_norm + masks,
        boundaries: w.compute * b * s * d * arch.decoder_layers + final_norm + masks,
        largest_block: one,
        head_tokens: b * s,
        matrix: w.compute * b * arch.heads * s * s,
    }
}
