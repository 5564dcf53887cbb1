//! T5 (seq2seq) on burn's generic ops: what autodiff keeps per encoder and decoder block when
//! memfit-nn's CPU fast paths do not run (crates/memfit-nn/src/t5/forward.rs, the `else`
//! branches: composite RMS norm, `softmax(q·kᵀ + bias)` materialised, boolean dropout masks).

use super::{Forward, Kept, Widths, attention_kept, dropout_mask};
use crate::Task;
use crate::arch::{Activation, Arch, Group};
use crate::memory::memfit_host::group_trains;
use crate::memory::memfit_host::t5::{lengths, live_stacks};
use crate::memory::setup::Setup;

/// What one block keeps per token outside its attention matrices, trained or frozen.
///
/// Trained (d = d_model, i = heads × d_kv, f = d_ff), in the activation dtype:
/// - the block input and the residual after attention, kept by the norms' `x²` and `x·r`: 2d;
/// - each RMS norm's `x·r` (kept by the product with its weight) and output (kept by the
///   linears): 2 × 2d;
/// - q, k, v (kept by the two attention products) and the context re-laid out for `o`: 4i;
/// - the FFN's dropped-out activation (kept by `wo`): f; a gated FFN also keeps both
///   projections and its activation's intermediates: 3f more;
///
/// and 1-byte masks: dropout after attention and after the FFN (2d), the ReLU-and-dropout mask (f).
///
/// Frozen (no weight gradient: no linear keeps its input, no norm its `x·r` or output): the two
/// residuals (2d), q, k, v (3i), the masks.
fn block(arch: &Arch, w: &Widths, trained: bool) -> u64 {
    let (d, f, i) = (arch.hidden, arch.ffn, arch.heads * arch.head_dim);
    let relu = !arch.gated_ffn && arch.activation == Activation::Relu;
    let gated = if relu { 0 } else { 3 * f };
    // ReLU and dropout are one masked fill: its mask is kept even without dropout
    let ffn_mask = if relu {
        f
    } else {
        dropout_mask(arch.hidden_dropout, f)
    };
    let masks = dropout_mask(arch.hidden_dropout, 2 * d) + ffn_mask;
    let kept = if trained {
        Kept {
            elements: 2 * d + 4 * d + 4 * i + f + gated,
            bytes: masks,
        }
    } else {
        Kept {
            elements: 2 * d + 3 * i + gated,
            bytes: masks,
        }
    };
    kept.at(w)
}

/// A decoder block's extra cross-attention sub-layer per decoder token: its residual, norm
/// (`x·r`, output), q and context (3d + 2i), and the dropout mask after it.
fn cross(arch: &Arch, w: &Widths) -> u64 {
    let (d, i) = (arch.hidden, arch.heads * arch.head_dim);
    Kept {
        elements: 3 * d + 2 * i,
        bytes: dropout_mask(arch.hidden_dropout, d),
    }
    .at(w)
}

/// One T5 micro-batch's forward pass: the blocks, the attention matrices, the stacks' embeddings
/// and final norms, the shared position biases; and under per-block checkpointing
/// (t5/block_ckpt.rs) each block's input, the biases and the larger stack's block recomputed with
/// its graph (its weights as leaves: counted as trained).
pub(super) fn forward(arch: &Arch, setup: &Setup, w: &Widths) -> Forward {
    let (src, tgt) = lengths(arch, setup);
    let (b, d, h) = (setup.batch, arch.hidden, arch.heads);
    let live = live_stacks(arch, setup);
    // embedding output after dropout, final norm's x·r and output, and their masks
    let stack = Kept {
        elements: 3 * d,
        bytes: dropout_mask(arch.hidden_dropout, 2 * d),
    }
    .at(w);
    let p = arch.attention_dropout.max(arch.hidden_dropout);
    let encoder_block =
        |trained| b * src * (block(arch, w, trained) + attention_kept(w, h * src, p));
    let cross_keys = if arch.encoder_layers > 0 { src } else { 0 };
    let cross_part = if cross_keys > 0 {
        cross(arch, w) + attention_kept(w, h * cross_keys, p)
    } else {
        0
    };
    // the self- and cross-attention per decoder token, and the cross-attention's k and v over the
    // encoder tokens
    let decoder_block =
        b * tgt * (block(arch, w, true) + attention_kept(w, h * tgt, p) + cross_part)
            + b * cross_keys * 2 * arch.heads * arch.head_dim * w.compute;
    let (mut saved, mut boundaries, mut largest) = (0, 0, 0);
    if arch.encoder_layers > 0 {
        // the position bias with the padding mask, [b, h, s, s], shared by the blocks
        let bias = w.compute * b * h * src * src;
        // checkpointing keeps every encoder block's input, the last block's output and the
        // encoder output, trained or not (t5/block_ckpt.rs)
        boundaries += w.compute * b * src * d * (arch.encoder_layers + 2) + bias;
        if live.0 {
            let trained = group_trains(arch, setup, Group::Encoder);
            saved += arch.encoder_layers * encoder_block(trained) + b * src * stack + bias;
            largest = encoder_block(true);
        } else {
            // a frozen encoder runs without a graph: its output stays, read by the decoder's
            // cross-attention keys and values
            saved += w.compute * b * src * d;
        }
    }
    if arch.decoder_layers > 0 && live.1 {
        let bias = w.compute * h * tgt * tgt;
        saved += arch.decoder_layers * decoder_block + b * tgt * stack + bias;
        boundaries += w.compute * b * tgt * d * arch.decoder_layers + bias;
        largest = largest.max(decoder_block);
    }
    let head_tokens = match setup.task {
        Task::Seq2seq => b * tgt,
        _ => b * src,
    };
    Forward {
        saved,
        boundaries,
        largest_block: largest,
        head_tokens,
        matrix: w.compute * b * h * src.max(tgt) * src.max(tgt),
    }
}
