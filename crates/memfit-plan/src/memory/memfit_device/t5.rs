//! T5 (seq2seq) on the GPU's code path: what autodiff keeps per encoder and decoder block when
//! memfit-nn's CPU fast paths do not run (crates/memfit-nn/src/t5/forward.rs: the device RMS norm
//! and dropout, `softmax(q·kᵀ + bias)` materialised).

use super::{Forward, Kept, NORM_ROW_STATS, Widths, attention_kept};
use crate::Task;
use crate::arch::{Activation, Arch, Group};
use crate::memory::memfit_host::group_trains;
use crate::memory::memfit_host::t5::{lengths, live_stacks};
use crate::memory::setup::Setup;

/// What one block keeps per token outside its attention matrices, trained or frozen.
///
/// Trained (d = d_model, i = heads × d_kv, f = d_ff), in the activation dtype:
/// - the block input and the residual after attention, kept by the norms with their row
///   statistics: 2d;
/// - each norm's output (kept by the linears): 2d;
/// - q, k, v (kept by the two attention products) and the context re-laid out for `o`: 4i;
/// - the FFN's activation after dropout (kept by `wo`; dropout after ReLU keeps that output as
///   its own): f; a gated FFN also keeps both projections and the activation's output: 3f more.
///
/// Frozen (no weight gradient: no linear keeps its input): the two residuals (2d) with the norms'
/// statistics, q, k, v (3i); dropout after ReLU still keeps its output (f), a gated FFN its 3f.
fn block(arch: &Arch, w: &Widths, trained: bool) -> u64 {
    let (d, f, i) = (arch.hidden, arch.ffn, arch.heads * arch.head_dim);
    let relu = !arch.gated_ffn && arch.activation == Activation::Relu;
    let gated = if relu { 0 } else { 3 * f };
    let elements = if trained {
        2 * d + 2 * d + 4 * i + f + gated
    } else {
        2 * d + 3 * i + if relu { f } else { 0 } + gated
    };
    Kept {
        elements,
        bytes: 2 * NORM_ROW_STATS,
    }
    .at(w)
}

/// A decoder block's extra cross-attention sub-layer per decoder token: its residual and norm
/// (input with statistics, output), q and context (2d + 2i).
fn cross(arch: &Arch, w: &Widths) -> u64 {
    let (d, i) = (arch.hidden, arch.heads * arch.head_dim);
    Kept {
        elements: 2 * d + 2 * i,
        bytes: NORM_ROW_STATS,
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
    // embedding output after dropout, the final norm's input (with statistics) and output
    let stack = Kept {
        elements: 3 * d,
        bytes: NORM_ROW_STATS,
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
