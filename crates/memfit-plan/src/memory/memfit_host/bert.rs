//! BERT-family (classification) terms of memfit's trainer: what burn's autodiff keeps per post-LN
//! encoder layer (crates/memfit-nn/src/bert/forward.rs), the attention's row statistics, the tiny
//! classifier head, and per-layer checkpointing (bert/block_ckpt.rs).
//!
//! Unlike T5: no position bias (only a `[b, 1, 1, t]` padding mask), LayerNorm with mean and bias
//! (the fused op keeps its f32 output, or its input when the output is bf16), biased dense layers
//! whose GELU is recomputed in backward, an embedding LayerNorm, and logits of `batch × labels`.

use super::{HostFit, Moments, attention_bytes, head_logits, recomputed_block};
use crate::arch::{Arch, Head};
use crate::memory::setup::Setup;

/// Elements (of the activation dtype, `cb` bytes) one trained encoder layer keeps per token,
/// counting its input (d = hidden, f = intermediate; q, k, v are `d` wide):
///
/// - its input x, kept by the q, k and v dense ops (one tensor): d;
/// - q (scaled), k and v, kept by the attention op: 3d;
/// - the context, re-laid out `[b, t, d]` and kept by the output dense: d;
/// - the attention LayerNorm's output h, kept by the intermediate dense (and, f32, by the norm):
///   d; in bf16 the norm keeps its input `x + dropout(attn)` too: d;
/// - the intermediate pre-activation, kept by the output dense, which recomputes GELU: f;
/// - in bf16, the output LayerNorm's input: d (in f32 the norm keeps its output instead, the
///   next layer's input, counted there).
///
/// Dropout keeps a seed, not a mask; the residual adds keep nothing.
fn layer_elements(arch: &Arch, cb: u64) -> u64 {
    let (d, f) = (arch.hidden, arch.ffn);
    let norm_inputs = if cb == 4 { 0 } else { 2 * d };
    6 * d + f + norm_inputs
}

/// The last layer computes only the first position, the one the head reads: per token it keeps
/// its input and k and v (3d elements); everything after attention (q, context, h, the
/// pre-activation, the norms' tensors and, in f32, its output) is one row per sequence.
fn last_layer_bytes(arch: &Arch, cb: u64, batch: u64, seq: u64) -> u64 {
    let d = arch.hidden;
    let output = if cb == 4 { d } else { 0 };
    let per_sequence = cb * (layer_elements(arch, cb) - 3 * d + output);
    batch * (seq * cb * 3 * d + per_sequence)
}

/// Bytes per token of the stack outside the layers: the word embeddings' leaf rows (f32, the
/// table's dtype) and the embedding LayerNorm's f32 output (its sum is f32 in both precisions).
fn stack_bytes(arch: &Arch) -> u64 {
    8 * arch.hidden
}

/// A BERT micro-batch's activations. Frozen groups are counted as trained (the grid measures
/// full fine-tuning; a frozen encoder keeps less).
pub(super) fn activations(
    arch: &Arch,
    setup: &Setup,
    fit: &HostFit,
    cb: u64,
    accumulated: u64,
) -> Moments {
    let (b, s, h) = (setup.batch, setup.seq, arch.heads);
    let layers = arch.encoder_layers;
    let tokens = b * s;
    // the last layer (if any) computes one row a sequence; the others every token
    let last_layers = layers.min(1);
    let full_layers = layers - last_layers;
    let last = last_layers * last_layer_bytes(arch, cb, b, s);
    let saved = tokens * (full_layers * cb * layer_elements(arch, cb) + stack_bytes(arch)) + last;
    let blocks = (fit.block_scale * saved as f64) as u64;
    // Backward of the last attention, while nearly every activation is alive, rebuilds its
    // probabilities and the scores' gradient as f32 `[b, h, s, s]` matrices
    // (kernels/attention_core.rs): two of them beside the saved tensors; with bf16 products a
    // third, the scores' gradient rounded to bf16 and widened back for the product
    // (gemm_bf16.rs's fallback where the CPU has no AVX512-BF16).
    let matrices = if cb == 4 { 2 } else { 3 };
    // (the last layer's attention has one query row: its backward comes first and is small, so
    // the worst one is the layer before's, with the last layer's tensors already freed)
    let rows = b * h * (full_layers * s + last_layers);
    let attention = attention_bytes(rows) + matrices * 4 * b * h * s * s;
    let labels = match arch.head {
        Head::Classifier { labels } => labels,
        _ => 2,
    };
    let logits = head_logits(fit, b, labels, arch.hidden);
    let checkpointed = setup.grad_ckpt.then(|| {
        // the forward keeps each layer's input and the last output (its first position), in the
        // activation dtype
        let boundaries = cb * arch.hidden * (tokens * layers + b);
        let (block, retained) =
            recomputed_block(fit, tokens * cb * layer_elements(arch, cb), b * h * s);
        let trained = 4 * super::trainable(arch, setup).base;
        let head = boundaries + logits + accumulated + retained;
        // the layers hand their gradients to the host one segment at a time: all of them exist
        // by the last (the embeddings' rows go into the table's host gradient)
        let last_block = boundaries + block + retained + trained;
        (head, last_block)
    });
    Moments {
        blocks,
        attention,
        logits,
        head_grads: 0,
        attention_backward: 0,
        checkpointed,
    }
}
