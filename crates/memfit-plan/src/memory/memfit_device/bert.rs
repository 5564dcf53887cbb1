//! The BERT family (classification) on burn's generic ops: what autodiff keeps per post-LN
//! encoder layer (crates/memfit-nn/src/bert/forward.rs, the `else` branches: composite LayerNorm in
//! f32, composite exact GELU, `softmax(q·kᵀ + mask)` materialised, boolean dropout masks).

use super::{Forward, Kept, Widths, attention_kept, dropout_mask};
use crate::arch::Arch;
use crate::memory::setup::Setup;

/// Bytes per token of one composite LayerNorm: its centred input and normalised value, f32 in
/// both precisions (kept by `x²`, `x·r` and the product with γ), and its output in the activation
/// dtype (kept by the next dense layers).
fn layer_norm(d: u64, w: &Widths) -> u64 {
    2 * 4 * d + w.compute * d
}

/// Bytes one trained layer keeps per token (d = hidden, f = intermediate; q, k, v are d wide):
/// q (scaled), k, v (3d) and the context re-laid out for the output dense (d); the
/// intermediate's output and the composite GELU's three intermediates (x/√2, the CDF, the product:
/// 4f); two LayerNorms; the dropout masks after attention and after the FFN (1 B each); the
/// attention's matrices over `keys` (heads × tokens).
fn layer(arch: &Arch, w: &Widths, keys: u64) -> u64 {
    let (d, f) = (arch.hidden, arch.ffn);
    Kept {
        elements: 4 * d + 4 * f,
        bytes: dropout_mask(arch.hidden_dropout, 2 * d),
    }
    .at(w)
        + 2 * layer_norm(d, w)
        + attention_kept(w, keys, arch.attention_dropout)
}

/// One BERT micro-batch's forward pass; no LM head (0 head tokens). The last layer computes only
/// the first position (the one the head reads): per token it keeps k and v (2d). Frozen groups
/// are counted as trained. Under per-layer checkpointing (bert/block_ckpt.rs) the forward keeps
/// each layer's input and the last one's output, and backward recomputes one layer at a time.
pub(super) fn forward(arch: &Arch, setup: &Setup, w: &Widths) -> Forward {
    let (b, s, d) = (setup.batch, setup.seq, arch.hidden);
    let layers = arch.encoder_layers;
    // the word rows' leaf, the embedding LayerNorm, its dropout's mask and output
    let embeddings = b * s * (2 * w.compute * d + 2 * 4 * d + dropout_mask(arch.hidden_dropout, d));
    let one = b * s * layer(arch, w, arch.heads * s);
    let last = if layers > 0 {
        b * s * 2 * w.compute * d
    } else {
        0
    };
    Forward {
        saved: embeddings + layers.saturating_sub(1) * one + last,
        // the embeddings run without a graph and are recomputed last
        boundaries: w.compute * b * s * d * (layers + 1),
        largest_block: one,
        head_tokens: 0,
        matrix: w.compute * b * arch.heads * s * s,
    }
}
