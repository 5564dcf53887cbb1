//! Host memory of memfit's own trainer on the CPU (`--runtime memfit --device cpu`).
//!
//! The terms follow what `memfit-train`'s `T5Engine` holds (crates/memfit-train/src/t5_engine.rs):
//!
//! - **master weights**: every parameter as a host `Vec<f32>` (`model.weights`), 4 B/param;
//! - **device weights**: the copy of all weights uploaded once per optimizer step
//!   (`weights_on_device`), in the compute dtype (4 or 2 B/param; on the CPU backend it is RAM);
//! - **optimizer states**: AdamW's two f32 moments (8 B per trained param), Adafactor's f32 row
//!   and column factors; allocated zeroed (calloc, not resident) and touched by the first step;
//! - **accumulated gradients**: a host `Vec<f32>` per trained tensor, filled after the backward pass
//!   of the first micro-batch and kept until the optimizer step;
//! - **device gradients**: burn's gradient container of one backward pass (compute dtype), alive
//!   while it is copied into the host accumulation;
//! - **activations**: what burn's autodiff graph keeps for the backward pass of one micro-batch,
//!   counted op by op from the T5 forward in crates/memfit-train/src/model/t5.rs (see
//!   [`saved_elements`]), plus the attention matrices and the logits/loss tensors.
//!
//! The peak is the larger of two moments of a step: the end of the forward pass of a micro-batch
//! (states + activations + logits; + accumulated gradients from the second micro-batch on) and the
//! end of its backward pass (states + device gradients + host gradients). Writing a checkpoint is a
//! third moment, counted separately (it does not happen in `memfit bench train`).
//!
//! Four constants are fitted to `validation/memfit_grid.csv` (`memfit bench memory-grid`, 2 threads):
//! see [`fitted`]. Everything else is counted from the code.

use super::setup::{Optimizer, Precision, Setup};
use super::states::{base_trains, trainable};
use super::{Component, HostEstimate, Scaling};
use crate::Task;
use crate::arch::{Arch, Group};

/// Constants fitted to the measured grid (`validation/memfit_grid.csv`) by minimising the largest
/// relative error over its points (a grid search over round values; docs/memory-model.md).
pub mod fitted {
    /// RSS of the trainer before any tensor: the binary, the allocator's arenas, burn's flex
    /// backend and the rayon pool (2 threads). Fitted: 20 MB (the grid's smallest point, a 9.4M
    /// parameter model at 1 × 8 tokens, is 234 MiB of which 224 MiB are the counted states).
    pub const RUNTIME_RSS: u64 = 20_000_000;
    /// Resident share of the op-by-op count of saved block tensors ([`super::encoder_block`]).
    /// Fitted: 1.15 — the count misses temporaries the allocator holds while the graph grows
    /// (re-laid-out heads before a matmul, broadcast copies of the norm's scale).
    pub const BLOCK_SCALE: f64 = 1.15;
    /// `batch × heads × q × k` matrices alive per attention at the end of the forward pass: the
    /// softmax's exp output (kept by its division's backward), the dropout mask and the dropped-out
    /// probabilities (kept by the probs·V matmul). Counted 3 from the code; the fit agrees (3).
    pub const ATTENTION_COPIES: f64 = 3.0;
    /// `target tokens × vocab` f32 buffers alive at the worst moment of the loss: the logits, the
    /// max-shifted copy, its exp (kept by log_softmax's backward) and the log-probabilities, some
    /// of which the allocator reuses. Fitted: 3.5.
    pub const LOGITS_COPIES: f64 = 3.5;
}

/// Elements per token (of the compute dtype) one encoder block keeps for the backward pass.
///
/// With trained weights (d = d_model, i = heads × d_kv, f = d_ff):
/// - residual stream in and after the attention sub-layer: 2d;
/// - two RMS norms, each keeping `x·rsqrt(mean(x²)+ε)` (for the weight's gradient) and its product
///   with the weight (kept by the next linears): 4d;
/// - two dropout masks after the sub-layers (f32 masks, burn's `x * mask`): 2d;
/// - q, k, v (kept by the two attention matmuls) and the re-laid-out context (kept by `o`): 4i;
/// - FFN: ReLU output, dropout mask and dropped-out activations (kept by `wo`): 3f.
///
/// A frozen block (its weights need no gradient, but its input does) keeps no linear inputs and no
/// normed products: 2d residual + 2d masks, q, k, v (3i), ReLU output and mask (2f).
fn encoder_block(arch: &Arch, trained: bool) -> u64 {
    let (d, f, i) = (arch.hidden, arch.ffn, arch.heads * arch.head_dim);
    if trained {
        8 * d + 4 * i + 3 * f
    } else {
        4 * d + 3 * i + 2 * f
    }
}

/// Elements per decoder token one decoder block keeps: an encoder block's terms plus a
/// cross-attention sub-layer (residual + norm + mask: 4d; q and context: 2i); with an encoder, also
/// k and v over the encoder tokens ([`cross_kv`]).
fn decoder_block(arch: &Arch) -> u64 {
    let (d, i) = (arch.hidden, arch.heads * arch.head_dim);
    let cross = if arch.encoder_layers > 0 {
        4 * d + 2 * i
    } else {
        0
    };
    encoder_block(arch, true) + cross
}

/// Elements per encoder token each decoder block keeps: the cross-attention's k and v.
fn cross_kv(arch: &Arch) -> u64 {
    if arch.encoder_layers > 0 {
        2 * arch.heads * arch.head_dim
    } else {
        0
    }
}

/// Elements (of the compute dtype) the autodiff graph of one micro-batch keeps for the backward
/// pass, without attention matrices and logits: every block ([`encoder_block`], [`decoder_block`])
/// and, per stack, the embedding output and its dropout mask, the final norm and its dropout (6d).
pub fn saved_elements(arch: &Arch, setup: &Setup) -> u64 {
    let d = arch.hidden;
    let (src, tgt) = lengths(arch, setup);
    let b = setup.batch;
    let mut total = 0;
    let live = live_stacks(arch, setup);
    if arch.encoder_layers > 0 && live.0 {
        let trained = arch
            .tensors
            .iter()
            .any(|t| t.group == Group::Encoder && base_trains(t, setup));
        total += b * src * (arch.encoder_layers * encoder_block(arch, trained) + 6 * d);
    }
    if arch.decoder_layers > 0 && live.1 {
        total += b * tgt * (arch.decoder_layers * decoder_block(arch) + 6 * d);
        total += b * src * arch.decoder_layers * cross_kv(arch);
    }
    total
}

/// Attention matrix elements of one micro-batch: every self- and cross-attention's
/// `batch × heads × q × k`, plus the encoder's position bias with the padding mask folded in
/// (`[batch, heads, s, s]`, shared by all encoder blocks; the decoder's is `[1, heads, t, t]`).
fn attention_elements(arch: &Arch, setup: &Setup) -> (u64, u64) {
    let (src, tgt) = lengths(arch, setup);
    let (b, h) = (setup.batch, arch.heads);
    let live = live_stacks(arch, setup);
    let mut per_attention = 0;
    let mut shared = 0;
    if arch.encoder_layers > 0 && live.0 {
        per_attention += arch.encoder_layers * b * h * src * src;
        shared += b * h * src * src;
    }
    if arch.decoder_layers > 0 && live.1 {
        let cross = if arch.encoder_layers > 0 {
            b * h * tgt * src
        } else {
            0
        };
        per_attention += arch.decoder_layers * (b * h * tgt * tgt + cross);
        shared += h * tgt * tgt;
    }
    (per_attention, shared)
}

/// (source, target) lengths: seq2seq has both; other tasks one stream of `seq`.
fn lengths(arch: &Arch, setup: &Setup) -> (u64, u64) {
    if setup.task == Task::Seq2seq && arch.encoder_layers > 0 {
        (setup.seq, setup.tgt_seq.max(1))
    } else {
        (setup.seq, setup.seq)
    }
}

/// Whether the graph exists in the (encoder, decoder) stack: from the first trained tensor on
/// (a frozen encoder still records its ops when the shared embedding it reads trains).
fn live_stacks(arch: &Arch, setup: &Setup) -> (bool, bool) {
    let trains = |g: Group| {
        arch.tensors
            .iter()
            .any(|t| t.group == g && base_trains(t, setup))
    };
    let enc = trains(Group::Embeddings) || trains(Group::Encoder);
    let dec = enc || trains(Group::Decoder) || trains(Group::Head);
    (enc, dec)
}

/// Per-block gradient checkpointing (crates/memfit-train/src/model/block_ckpt.rs): the forward
/// pass keeps only each block's input (+ the encoder output and the two position biases); the
/// backward pass first runs the head (final norm, logits, loss) with autodiff, then recomputes one
/// block at a time, last first, handing each segment's gradients to the host accumulators.
/// Returns the two moments of the step: (head backward, last recomputed block).
fn checkpointed(arch: &Arch, setup: &Setup, cb: u64, logits: u64, accumulated: u64) -> (u64, u64) {
    let (src, tgt) = lengths(arch, setup);
    let (b, d, h) = (setup.batch, arch.hidden, arch.heads);
    let boundaries = cb
        * (b * src * d * (arch.encoder_layers + 2)
            + b * tgt * d * arch.decoder_layers
            + b * h * src * src
            + h * tgt * tgt);
    // one block recomputed with its graph: the largest block of either stack
    let one_block = |elements: u64, matrices: u64| {
        (fitted::BLOCK_SCALE * (cb * elements) as f64) as u64
            + (fitted::ATTENTION_COPIES * (cb * matrices) as f64) as u64
    };
    // recomputed blocks run with their weights as autodiff leaves: counted as trained
    let cross = if arch.encoder_layers > 0 {
        tgt * src
    } else {
        0
    };
    let encoder = one_block(b * src * encoder_block(arch, true), b * h * src * src);
    let decoder = one_block(
        b * tgt * decoder_block(arch) + b * src * cross_kv(arch),
        b * h * (tgt * tgt + cross),
    );
    let block = encoder.max(decoder);
    // the head's backward: the shared embedding's gradient on the device and on the host
    let embedding = arch.vocab * d;
    let trained = trainable(arch, setup).base;
    let head = boundaries + logits + (cb + 4) * embedding + accumulated;
    let last_block = boundaries + block + 4 * trained;
    (head, last_block)
}

/// The memfit trainer's host peak on the CPU, by component.
pub fn host(arch: &Arch, setup: &Setup) -> HostEstimate {
    let p = arch.params_total();
    let tr = trainable(arch, setup);
    let pt = tr.base;
    // compute dtype of the device copies and activations (bf16 or f32)
    let cb = match setup.precision {
        Precision::Bf16 | Precision::Fp16 => 2,
        _ => 4,
    };
    let optimizer = match setup.optimizer {
        Optimizer::Adafactor => 4 * tr.adafactor_elements,
        Optimizer::Sgd => 4 * pt,
        // the trainer has AdamW and Adafactor; every other name is planned as AdamW's f32 moments
        _ => 8 * pt,
    };
    let (src, tgt) = lengths(arch, setup);
    let (matrices, shared_bias) = attention_elements(arch, setup);
    let blocks = (fitted::BLOCK_SCALE * (cb * saved_elements(arch, setup)) as f64) as u64;
    let attention = (fitted::ATTENTION_COPIES * (cb * matrices) as f64) as u64 + cb * shared_bias;
    let out_tokens = match setup.task {
        Task::Seq2seq => setup.batch * tgt,
        Task::CausalLm => setup.batch * src,
        Task::Classification => setup.batch,
    };
    let classes = if setup.task == Task::Classification {
        2
    } else {
        arch.vocab
    };
    // the loss runs in f32 whatever the compute dtype (masked_cross_entropy casts the logits)
    let logits = (fitted::LOGITS_COPIES * (4 * out_tokens * classes) as f64) as u64;
    let host_grads = 4 * pt;
    let device_grads = cb * pt;
    let accumulated = if setup.accum > 1 { host_grads } else { 0 };
    let (forward_end, backward_end) = if setup.grad_ckpt {
        checkpointed(arch, setup, cb, logits, accumulated)
    } else {
        (
            blocks + attention + logits + accumulated,
            device_grads + host_grads,
        )
    };
    let n = Scaling::Neither;
    let mut c = vec![
        Component::new(
            "runtime",
            fitted::RUNTIME_RSS,
            n,
            "memfit binary, allocator arenas, burn flex backend and its thread pool (fitted)",
        ),
        Component::new(
            "master weights",
            4 * p,
            n,
            "all parameters as host f32 (model.weights)",
        ),
        Component::new(
            "device weights",
            cb * p,
            n,
            format!("copy uploaded per optimizer step in {}", setup.precision),
        ),
        Component::new(
            "optimizer states",
            optimizer,
            n,
            format!("{} states, f32, trained parameters only", setup.optimizer),
        ),
    ];
    let states: u64 = c.iter().map(|x| x.bytes).sum();
    let bs = Scaling::BatchAndSequence;
    if setup.grad_ckpt {
        c.push(Component::new(
            "activations (checkpointed)",
            forward_end.max(backward_end),
            bs,
            "block inputs kept between forward and backward + the worse of the head's loss \
             (logits, embedding gradient) and one recomputed block beside the host gradients",
        ));
    } else if forward_end >= backward_end {
        c.push(Component::new(
            "activations (blocks)",
            blocks,
            bs,
            "tensors burn's autodiff keeps per block for the backward pass",
        ));
        c.push(Component::new(
            "attention matrices",
            attention,
            Scaling::BatchAndSequence,
            "batch × heads × q × k per attention (softmax, dropout mask, probabilities) + position bias",
        ));
        c.push(Component::new(
            "logits and loss",
            logits,
            bs,
            "target tokens × vocab f32 buffers of the cross-entropy and its first backward op",
        ));
        if accumulated > 0 {
            c.push(Component::new(
                "accumulated gradients",
                accumulated,
                n,
                "host f32 gradients of the earlier micro-batches (accum > 1)",
            ));
        }
    } else {
        c.push(Component::new(
            "device gradients",
            device_grads,
            n,
            "gradients of one backward pass, before they are copied to the host",
        ));
        c.push(Component::new(
            "accumulated gradients",
            host_grads,
            n,
            "host f32 gradients, kept until the optimizer step",
        ));
    }
    let train = states + forward_end.max(backward_end);
    // Writing a checkpoint: the model's tensors as transposed f32 copies and their little-endian
    // bytes (2 × 4 B/param), then the optimizer states copied and serialised the same way
    // (2 × the state bytes), one file after the other (Optimizer::save, tensor_file::write_f32).
    // The step has dropped the gradients, but an evaluation just before the checkpoint re-uploads
    // the device weights (cached until the next step): they are counted.
    let checkpoint = (2 * 4 * p).max(2 * optimizer);
    let checkpoint_peak = states + checkpoint;
    c.push(Component::new(
        "checkpoint write (transient)",
        checkpoint,
        n,
        "f32 copies + serialised bytes of the weights or optimizer states while a checkpoint is written",
    ));
    HostEstimate {
        peak_rss_bytes: train.max(checkpoint_peak),
        train_rss_bytes: train,
        components: c,
    }
}
