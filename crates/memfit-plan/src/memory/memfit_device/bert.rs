//! The BERT family (classification) on the GPU's code path: what autodiff keeps per post-LN
//! encoder layer (crates/memfit-nn/src/bert/forward.rs off flex's hand-written ops: the device
//! LayerNorm and exact GELU, `softmax(q·kᵀ + mask)` materialised, dropout without masks).

use super::{Forward, Kept, NORM_ROW_STATS, Widths, attention_kept};
use crate::arch::Arch;
use crate::memory::setup::Setup;

/// Bytes per token of one device LayerNorm: its input (the residual sum) and row statistics, kept
/// by the norm, and its output (kept by the next dense layers), in the activation dtype.
fn layer_norm(d: u64, w: &Widths) -> u64 {
    2 * w.compute * d + NORM_ROW_STATS
}

/// Bytes one trained layer keeps per token (d = hidden, f = intermediate; q, k, v are d wide):
/// q (scaled), k, v (3d) and the context re-laid out for the output dense (d); the
/// intermediate's output (kept by GELU) and GELU's output (kept by the output dense): 2f; two
/// LayerNorms; the attention's matrices over `keys` (heads × tokens).
fn layer(arch: &Arch, w: &Widths, keys: u64) -> u64 {
    let (d, f) = (arch.hidden, arch.ffn);
    Kept {
        elements: 4 * d + 2 * f,
        bytes: 0,
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
    // the word rows' leaf, the embedding LayerNorm (its input, statistics and output)
    let embeddings = b * s * (w.compute * d + layer_norm(d, w));
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
