//! T5 (seq2seq) terms of memfit's trainer: what burn's autodiff keeps per encoder and decoder
//! block (crates/memfit-nn/src/t5/forward.rs), the attention's row statistics and position biases,
//! the chunked LM head, and per-block checkpointing (t5/block_ckpt.rs).

use super::{HostFit, Moments, attention_bytes, group_trains, head_logits, head_trains};
use crate::Task;
use crate::arch::{Activation, Arch, Group};
use crate::memory::setup::Setup;
use crate::memory::states::trainable;

/// Bytes per token one encoder block keeps for the backward pass, activations in `cb`-byte elements
/// (dropout keeps no mask: it is drawn again from its seed in backward, and after ReLU the kept
/// output tells where the gradient passes).
///
/// With trained weights (d = d_model, i = heads × d_kv, f = d_ff):
/// - residual stream in and after the attention sub-layer: 2d;
/// - two RMS norms, each keeping its output (kept by the next linears; the fused norm itself keeps
///   only its input, the residual stream): 2d;
/// - q, k, v (kept by the attention op) and the re-laid-out context (kept by `o`): 4i;
/// - FFN: the dropped-out activations (kept by `wo`): f; with another activation than a plain
///   ReLU, also the activation's input: 2f (the engine fuses ReLU and dropout into one op).
///
/// A frozen block (its weights need no gradient, but its input does) keeps no linear inputs and no
/// normed products: 2d residual, q, k, v (3i), and the activation's input unless ReLU (f) — or,
/// for ReLU, the ReLU-dropout output its gradient is read from (f; in a trained block `wo` keeps
/// it anyway).
fn encoder_block(arch: &Arch, trained: bool, cb: u64) -> u64 {
    let (d, f, i) = (arch.hidden, arch.ffn, arch.heads * arch.head_dim);
    let fused_relu = arch.activation == Activation::Relu && !arch.gated_ffn;
    let activation_input = if fused_relu { 0 } else { f };
    if trained {
        cb * (2 * d + 2 * d + 4 * i + f + activation_input)
    } else {
        let relu_output = if fused_relu { f } else { 0 };
        cb * (2 * d + 3 * i + activation_input + relu_output)
    }
}

/// Bytes per decoder token one decoder block keeps: an encoder block's terms plus a
/// cross-attention sub-layer (residual + norm output: 2d; q and context: 2i); with an encoder,
/// also k and v over the encoder tokens ([`cross_kv`]).
fn decoder_block(arch: &Arch, cb: u64) -> u64 {
    let (d, i) = (arch.hidden, arch.heads * arch.head_dim);
    let cross = if arch.encoder_layers > 0 {
        cb * (2 * d + 2 * i)
    } else {
        0
    };
    encoder_block(arch, true, cb) + cross
}

/// Bytes per encoder token each decoder block keeps: the cross-attention's k and v.
fn cross_kv(arch: &Arch, cb: u64) -> u64 {
    if arch.encoder_layers > 0 {
        cb * 2 * arch.heads * arch.head_dim
    } else {
        0
    }
}

/// Bytes the autodiff graph of one micro-batch keeps for the backward pass, without attention
/// matrices and logits: every block ([`encoder_block`], [`decoder_block`]) and, per stack, the
/// embedding output, the final norm's input and output (3d).
pub(super) fn saved_bytes(arch: &Arch, setup: &Setup, cb: u64) -> u64 {
    let d = arch.hidden;
    let stack = cb * 3 * d;
    let (src, tgt) = lengths(arch, setup);
    let b = setup.batch;
    let mut total = 0;
    let live = live_stacks(arch, setup);
    if arch.encoder_layers > 0 && live.0 {
        let trained = group_trains(arch, setup, Group::Encoder);
        total += b * src * (arch.encoder_layers * encoder_block(arch, trained, cb) + stack);
    }
    if arch.decoder_layers > 0 && live.1 {
        total += b * tgt * (arch.decoder_layers * decoder_block(arch, cb) + stack);
        total += b * src * arch.decoder_layers * cross_kv(arch, cb);
    }
    total
}

/// Attention elements of one micro-batch: every self- and cross-attention's softmax rows
/// (`batch × heads × q`), and the encoder's position bias with the padding mask folded in
/// (`[batch, heads, s, s]`, shared by all encoder blocks; the decoder's is `[1, heads, t, t]`).
fn attention_elements(arch: &Arch, setup: &Setup) -> (u64, u64) {
    let (src, tgt) = lengths(arch, setup);
    let (b, h) = (setup.batch, arch.heads);
    let live = live_stacks(arch, setup);
    let mut rows = 0;
    let mut shared = 0;
    if arch.encoder_layers > 0 && live.0 {
        rows += arch.encoder_layers * b * h * src;
        shared += b * h * src * src;
    }
    if arch.decoder_layers > 0 && live.1 {
        let cross_rows = if arch.encoder_layers > 0 {
            b * h * tgt
        } else {
            0
        };
        rows += arch.decoder_layers * (b * h * tgt + cross_rows);
        shared += h * tgt * tgt;
    }
    (rows, shared)
}

/// (source, target) lengths: seq2seq has both; other tasks one stream of `seq`.
pub(crate) fn lengths(arch: &Arch, setup: &Setup) -> (u64, u64) {
    if setup.task == Task::Seq2seq && arch.encoder_layers > 0 {
        (setup.seq, setup.tgt_seq.max(1))
    } else {
        (setup.seq, setup.seq)
    }
}

/// Whether the graph exists in the (encoder, decoder) stack: from the first trained tensor on
/// (a frozen encoder still records its ops when the shared embedding it reads trains).
pub(crate) fn live_stacks(arch: &Arch, setup: &Setup) -> (bool, bool) {
    let trains = |g| group_trains(arch, setup, g);
    let enc = trains(Group::Embeddings) || trains(Group::Encoder);
    let dec = enc || trains(Group::Decoder) || trains(Group::Head);
    (enc, dec)
}

/// Per-block gradient checkpointing (crates/memfit-nn/src/t5/block_ckpt.rs): the forward
/// pass keeps only each block's input (+ the encoder output and the two position biases); the
/// backward pass first runs the head (final norm, logits, loss) with autodiff, then recomputes one
/// block at a time, last first, handing each segment's gradients to the host accumulators.
/// Returns the two moments of the step: (head backward, last recomputed block).
fn checkpointed(
    arch: &Arch,
    setup: &Setup,
    fit: &HostFit,
    cb: u64,
    logits: u64,
    head_grads: u64,
    accumulated: u64,
) -> (u64, u64) {
    let (src, tgt) = lengths(arch, setup);
    let (b, d, h) = (setup.batch, arch.hidden, arch.heads);
    let boundaries = cb
        * (b * src * d * (arch.encoder_layers + 2)
            + b * tgt * d * arch.decoder_layers
            + b * h * src * src
            + h * tgt * tgt);
    // one block recomputed with its graph: the largest block of either stack
    let one_block =
        |bytes: u64, rows: u64| (fit.block_scale * bytes as f64) as u64 + attention_bytes(rows);
    // recomputed blocks run with their weights as autodiff leaves: counted as trained
    let cross_rows = if arch.encoder_layers > 0 { tgt } else { 0 };
    let encoder = one_block(b * src * encoder_block(arch, true, cb), b * h * src);
    let decoder = one_block(
        b * tgt * decoder_block(arch, cb) + b * src * cross_kv(arch, cb),
        b * h * (tgt + cross_rows),
    );
    let block = encoder.max(decoder);
    let retained = ((fit.recompute_retained - 1.0) * block as f64) as u64;
    let trained = trainable(arch, setup).base;
    // the head's backward: a chunk's head-weight gradient beside its host accumulator
    let head = boundaries + logits + head_grads + accumulated + retained;
    // the embedding segments add their gradient rows into the table's host accumulator
    let last_block = boundaries + block + retained + 4 * trained;
    (head, last_block)
}

/// A T5 micro-batch's activations: the blocks' saved tensors, the attention's rows and biases, one
/// chunk of the LM head's logits and its weight gradient, or the checkpointed moments.
pub(super) fn activations(
    arch: &Arch,
    setup: &Setup,
    fit: &HostFit,
    cb: u64,
    accumulated: u64,
) -> Moments {
    let (src, tgt) = lengths(arch, setup);
    let (rows, shared_bias) = attention_elements(arch, setup);
    let blocks = (fit.block_scale * saved_bytes(arch, setup, cb) as f64) as u64;
    // the position biases come from f32 tables (the weights stay f32 in both precisions)
    let attention = attention_bytes(rows) + 4 * shared_bias;
    let out_tokens = match setup.task {
        Task::Seq2seq => setup.batch * tgt,
        _ => setup.batch * src,
    };
    let logits = head_logits(fit, out_tokens, arch.vocab, arch.hidden);
    // The head's chunks are back-propagated while every activation is alive: each yields the
    // head's `vocab × d` weight gradient, added into (or, the first, copied to) its host
    // accumulator: 2 copies.
    let head_grads = if head_trains(arch, setup) {
        2 * 4 * arch.vocab * arch.hidden
    } else {
        0
    };
    let checkpointed = setup
        .grad_ckpt
        .then(|| checkpointed(arch, setup, fit, cb, logits, head_grads, accumulated));
    Moments {
        blocks,
        attention,
        logits,
        head_grads,
        attention_backward: 0,
        checkpointed,
    }
}
