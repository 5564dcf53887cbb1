//! Host memory of memfit's own trainer on the CPU (`--runtime memfit --device cpu`).
//!
//! The terms follow what `memfit-train`'s `T5Engine` holds (crates/memfit-train/src/t5_engine.rs):
//!
//! - **master weights**: every parameter as a host `Vec<f32>` (`model.weights`), 4 B/param;
//! - **device weights**: none while training, in f32 and in bf16 (a micro-batch runs on the master
//!   weights' own buffers, lent to the device tensors; bf16 keeps its activations in bf16 beside
//!   these f32 weights); an evaluation uploads a copy in the compute dtype (cached until the next
//!   micro-batch);
//! - **optimizer states**: AdamW's two f32 moments (8 B per trained param), Adafactor's f32 row
//!   and column factors; allocated zeroed (calloc, not resident) and touched by the first step;
//! - **accumulated gradients**: a host `Vec<f32>` per trained tensor, filled after the backward pass
//!   of the first micro-batch and kept until the optimizer step;
//! - **device gradients**: burn's gradient container of one backward pass (f32, the weights'
//!   dtype), moved tensor by tensor into the host accumulation (the first micro-batch's become it);
//!   token embeddings are leaves whose gradient rows are added into the table's host gradient, so
//!   no `vocab × d` gradient is built per lookup;
//! - **activations**: what burn's autodiff graph keeps for the backward pass of one micro-batch,
//!   counted op by op from the T5 forward in crates/memfit-train/src/model/t5.rs (see
//!   [`saved_bytes`]), plus the attention's row statistics and position biases and one chunk of the
//!   logits/loss tensors.
//!
//! The peak is the larger of two moments of a step: the end of the forward pass of a micro-batch
//! (states + activations + logits; + accumulated gradients from the second micro-batch on) and the
//! end of its backward pass (states + device gradients + host gradients). Writing a checkpoint is a
//! third moment, counted separately (it does not happen in `memfit bench train`).
//!
//! Four constants are fitted to `validation/memfit_grid.csv` (`memfit bench memory-grid`, 2 threads):
//! see [`fitted`]. Everything else is counted from the code. The trainer's hand-written ops (norm,
//! dropout, linear layers, attention: flex backend extensions computing in f32, storing f32 or bf16)
//! run in both precisions on the CPU, the only device this model describes.

use super::setup::{Optimizer, Precision, Setup};
use super::states::{base_trains, trainable};
use super::{Component, HostEstimate, Scaling};
use crate::Task;
use crate::arch::{Activation, Arch, Group};

/// Logits per chunk of memfit-train's LM head (`model/chunked_head.rs` `CHUNK_LOGITS`, which a
/// test there keeps equal to this): the loss never holds more than one chunk's logits.
pub const HEAD_CHUNK_LOGITS: u64 = 8 << 20;

/// Constants fitted to the measured grid (`validation/memfit_grid.csv`) by minimising the largest
/// relative error over its points (a grid search over round values; docs/memory-model.md).
pub mod fitted {
    /// RSS of the trainer before any tensor: the binary, the allocator's arenas, burn's flex
    /// backend and the rayon pool (2 threads). Fitted: 20 MB (the grid's smallest point, a 9.4M
    /// parameter model at 1 × 8 tokens, is 234 MiB of which 224 MiB are the counted states).
    pub const RUNTIME_RSS: u64 = 20_000_000;
    /// Resident share of the op-by-op count of saved block tensors ([`super::encoder_block`]).
    /// Fitted: 1.05 — the count misses what the allocator holds beside the kept tensors while the
    /// graph grows (freed temporaries it has not returned, re-laid-out heads before a product).
    pub const BLOCK_SCALE: f64 = 1.05;
    /// One block's graph counted this many times at both moments of a checkpointed step: the
    /// allocator keeps the freed temporaries of a block's untracked forward (or the block
    /// recomputed before) resident beside what is live. Fitted: 1.4 (with 1.0 the checkpointed
    /// points came out 5–11% low).
    pub const RECOMPUTE_RETAINED: f64 = 1.4;
    /// f32 buffers of one head chunk (at most [`super::HEAD_CHUNK_LOGITS`] logits, f32 in both
    /// precisions) alive at the worst moment of the loss: the logits (turned into their gradient
    /// in place) and what the allocator holds beside them. Fitted: 1.75.
    pub const LOGITS_COPIES: f64 = 1.75;
}

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
pub fn saved_bytes(arch: &Arch, setup: &Setup, cb: u64) -> u64 {
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

/// Bytes the attention keeps over `rows` softmax rows beside q, k and v: the engine runs
/// `dropout(softmax(q·kᵀ + bias))·v` as one op (f32 and bf16, computing in f32) that keeps no
/// `q × k` matrix, only each row's max and 1/sum (the probabilities are recomputed in backward,
/// the mask redrawn from its seed).
fn attention_bytes(rows: u64) -> u64 {
    8 * rows
}

/// Whether any tensor of `group` trains.
fn group_trains(arch: &Arch, setup: &Setup, group: Group) -> bool {
    arch.tensors
        .iter()
        .any(|t| t.group == group && base_trains(t, setup))
}

/// Whether the shared embedding table trains.
fn shared_trains(arch: &Arch, setup: &Setup) -> bool {
    group_trains(arch, setup, Group::Embeddings)
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
        |bytes: u64, rows: u64| (fitted::BLOCK_SCALE * bytes as f64) as u64 + attention_bytes(rows);
    // recomputed blocks run with their weights as autodiff leaves: counted as trained
    let cross_rows = if arch.encoder_layers > 0 { tgt } else { 0 };
    let encoder = one_block(b * src * encoder_block(arch, true, cb), b * h * src);
    let decoder = one_block(
        b * tgt * decoder_block(arch, cb) + b * src * cross_kv(arch, cb),
        b * h * (tgt + cross_rows),
    );
    let block = encoder.max(decoder);
    let retained = ((fitted::RECOMPUTE_RETAINED - 1.0) * block as f64) as u64;
    let trained = trainable(arch, setup).base;
    // the head's backward: a chunk's head-weight gradient beside its host accumulator
    let head = boundaries + logits + head_grads + accumulated + retained;
    // the embedding segments add their gradient rows into the table's host accumulator
    let last_block = boundaries + block + retained + 4 * trained;
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
    let (rows, shared_bias) = attention_elements(arch, setup);
    let blocks = (fitted::BLOCK_SCALE * saved_bytes(arch, setup, cb) as f64) as u64;
    // the position biases come from f32 tables (the weights stay f32 in both precisions)
    let attention = attention_bytes(rows) + 4 * shared_bias;
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
    // The head computes in f32 over the f32 weights, one chunk of logits at a time; the decoder
    // output's cotangent is assembled from the chunks' in f32 (2 copies) and cast to `cb`.
    let chunk = (out_tokens * classes).min(HEAD_CHUNK_LOGITS);
    let logits =
        (fitted::LOGITS_COPIES * (4 * chunk) as f64) as u64 + 2 * 4 * out_tokens * arch.hidden;
    let host_grads = 4 * pt;
    let device_grads = 4 * pt;
    let accumulated = if setup.accum > 1 { host_grads } else { 0 };
    // At the end of a backward pass burn holds the micro-batch's gradients (f32, as the weights);
    // they are moved out one by one into the host accumulators, so the first micro-batch peaks at
    // the host gradients and later ones add the device gradients.
    let shared_trains = shared_trains(arch, setup);
    let backward_end = if setup.accum > 1 {
        host_grads + device_grads
    } else {
        host_grads
    };
    // The head's chunks are back-propagated while every activation is alive: each yields the
    // head's `vocab × d` weight gradient, added into (or, the first, copied to) its host
    // accumulator: 2 copies.
    let head_trains = arch
        .tensors
        .iter()
        .any(|t| t.role == crate::arch::Role::LmHead && base_trains(t, setup))
        || (arch.head == crate::arch::Head::LmTied && shared_trains);
    let head_grads = if head_trains {
        2 * 4 * arch.vocab * arch.hidden
    } else {
        0
    };
    let (forward_end, backward_end) = if setup.grad_ckpt {
        checkpointed(arch, setup, cb, logits, head_grads, accumulated)
    } else {
        (
            blocks + attention + logits + head_grads + accumulated,
            backward_end,
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
        // A micro-batch runs on the master weights' own buffers (lent to the device tensors, no
        // copy), in bf16 too: the hand-written ops take f32 weights beside bf16 activations.
        Component::new(
            "device weights",
            0,
            n,
            "none while training: the device tensors borrow the master weights' buffers",
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
            "the position biases (+ mask) shared by the blocks, and each softmax row's max and 1/sum (no per-attention q × k matrix: probabilities recomputed in backward)",
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
        if setup.accum > 1 {
            c.push(Component::new(
                "device gradients",
                device_grads,
                n,
                "gradients of one backward pass, before they are added to the host accumulators",
            ));
        }
        c.push(Component::new(
            "accumulated gradients",
            backward_end - if setup.accum > 1 { device_grads } else { 0 },
            n,
            "host f32 gradients, kept until the optimizer step",
        ));
    }
    let train = states + forward_end.max(backward_end);
    // Writing a checkpoint: safetensors files are written one tensor at a time (a transposed f32
    // copy for linear weights and its little-endian bytes: 2 × 4 B × the largest tensor), the model
    // first, then the optimizer states (`tensor_file::write_f32`). The step has dropped the
    // gradients, but an evaluation just before the checkpoint re-uploads the device weights (a
    // copy, cached until the next micro-batch): they are counted.
    let largest = arch.tensors.iter().map(|t| t.elements()).max().unwrap_or(0);
    let checkpoint = 2 * 4 * largest;
    let checkpoint_peak = states + cb * p + checkpoint;
    c.push(Component::new(
        "checkpoint write (transient)",
        checkpoint,
        n,
        "the largest tensor's f32 copy and serialised bytes while a checkpoint is written",
    ));
    HostEstimate {
        peak_rss_bytes: train.max(checkpoint_peak),
        train_rss_bytes: train,
        components: c,
    }
}
