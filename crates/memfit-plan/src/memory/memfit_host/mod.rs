//! Host memory of memfit's own trainer on the CPU (`--runtime memfit --device cpu`).
//!
//! The terms follow what `memfit-train`'s `ModelEngine` holds (crates/memfit-train/src/engine/):
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
//!   counted op by op from each family's forward pass in crates/memfit-nn (T5 in [`t5`], the BERT
//!   family in [`bert`], Llama-style decoders with LoRA in [`decoder`]), plus the attention's row
//!   statistics, position biases or masks, and one chunk of the logits/loss tensors.
//!
//! The peak is the larger of two moments of a step: the end of the forward pass of a micro-batch
//! (states + activations + logits; + accumulated gradients from the second micro-batch on) and the
//! end of its backward pass (states + device gradients + host gradients). Writing a checkpoint is a
//! third moment, counted separately (it does not happen in `memfit bench train`).
//!
//! Four constants are fitted to `validation/memfit_grid.csv` (`memfit bench memory-grid`, 2 threads):
//! see [`HostFit`]. Everything else is counted from the code. The trainer's hand-written ops (norm,
//! dropout, linear layers, attention: flex backend extensions computing in f32, storing f32 or bf16)
//! run in both precisions on the CPU, the only device this model describes.

mod bert;
pub(crate) mod decoder;
pub mod eval;
pub(crate) mod t5;

use super::setup::{Method, Optimizer, Precision, Setup};
use super::states::{Trainable, base_trains, trainable};
use super::{Component, HostEstimate, Scaling};
use crate::arch::{Arch, Family, Group, Head, Role};

/// Logits per chunk of memfit-train's LM head (`model/chunked_head.rs` `CHUNK_LOGITS`, which a
/// test there keeps equal to this): the loss never holds more than one chunk's logits.
pub const HEAD_CHUNK_LOGITS: u64 = 8 << 20;

/// The four constants of this model that are fitted, not counted: fitted to the *fit half* of the
/// measured grid (`validation/memfit_grid.csv`, [`crate::grid::is_fit_point`]) by minimising the
/// largest relative error over those points (a grid search over round values,
/// [`crate::grid::fit`]); the other half is held out and gates them (tests/accuracy.rs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostFit {
    /// RSS of the trainer before any tensor: the binary, the allocator's arenas, burn's flex
    /// backend and the rayon pool (2 threads).
    pub runtime_rss: u64,
    /// Resident share of the op-by-op count of saved block tensors (every family's blocks): the
    /// count misses what the allocator holds beside the kept tensors while the graph grows (freed
    /// temporaries it has not returned, re-laid-out heads before a product).
    pub block_scale: f64,
    /// One block's graph counted this many times at both moments of a checkpointed step: the
    /// allocator keeps the freed temporaries of a block's untracked forward (or the block
    /// recomputed before) resident beside what is live.
    pub recompute_retained: f64,
    /// f32 buffers of one head chunk (at most [`HEAD_CHUNK_LOGITS`] logits, f32 in both
    /// precisions) alive at the worst moment of the loss: the logits (turned into their gradient
    /// in place) and what the allocator holds beside them.
    pub logits_copies: f64,
}

/// The committed fit ([`crate::grid::fit`] over the fit half reproduces it; a test checks).
pub const FITTED: HostFit = HostFit {
    runtime_rss: 20_000_000,
    block_scale: 0.95,
    recompute_retained: 1.5,
    logits_copies: 1.5,
};

/// What one micro-batch holds beside the model states, as a family counts it.
pub(super) struct Moments {
    /// The tensors autodiff keeps per block and per stack (scaled by [`HostFit::block_scale`]).
    blocks: u64,
    /// Softmax row statistics, position biases and masks.
    attention: u64,
    /// One chunk of the head's logits and the hidden states' cotangent.
    logits: u64,
    /// The LM head's weight gradient beside its host accumulator, at the end of the forward pass.
    head_grads: u64,
    /// The f32 `[b, heads, t, t]` buffers the attention's backward builds for the last block (its
    /// probabilities recomputed, their cotangent) while every block's tensors are still kept: a
    /// moment after the head's, counted instead of the logits when larger (decoders; 0 elsewhere).
    attention_backward: u64,
    /// With `--grad-ckpt`: the two moments (the head's backward, the last recomputed block),
    /// each without the states and, for the second, with the host gradients.
    checkpointed: Option<(u64, u64)>,
}

/// Bytes the attention keeps over `rows` softmax rows beside q, k and v: the engine runs
/// `dropout(softmax(q·kᵀ + bias))·v` as one op (f32 and bf16, computing in f32) that keeps no
/// `q × k` matrix, only each row's max and 1/sum (the probabilities are recomputed in backward,
/// the mask redrawn from its seed).
fn attention_bytes(rows: u64) -> u64 {
    8 * rows
}

/// Whether the LM head's weight trains: its own, or the embedding table a tied head reads.
pub(crate) fn head_trains(arch: &Arch, setup: &Setup) -> bool {
    arch.tensors
        .iter()
        .any(|t| t.role == Role::LmHead && base_trains(t, setup))
        || (arch.head == Head::LmTied && group_trains(arch, setup, Group::Embeddings))
}

/// Whether any tensor of `group` trains.
pub(crate) fn group_trains(arch: &Arch, setup: &Setup, group: Group) -> bool {
    arch.tensors
        .iter()
        .any(|t| t.group == group && base_trains(t, setup))
}

/// The head's logits and loss over `out_tokens` rows of `classes`: one chunk of at most
/// [`HEAD_CHUNK_LOGITS`] f32 logits (the head computes in f32 over the f32 weights; the logits are
/// turned into their gradient in place) and the hidden states' cotangent, assembled from the
/// chunks' in f32 (2 copies of `out_tokens × d`).
fn head_logits(fit: &HostFit, out_tokens: u64, classes: u64, hidden: u64) -> u64 {
    let chunk = (out_tokens * classes).min(HEAD_CHUNK_LOGITS);
    (fit.logits_copies * (4 * chunk) as f64) as u64 + 2 * 4 * out_tokens * hidden
}

/// One recomputed block's graph beside what the allocator keeps of the block computed before it
/// ([`HostFit::recompute_retained`]): `bytes` of saved tensors over `rows` softmax rows.
fn recomputed_block(fit: &HostFit, bytes: u64, rows: u64) -> (u64, u64) {
    let block = (fit.block_scale * bytes as f64) as u64 + attention_bytes(rows);
    let retained = ((fit.recompute_retained - 1.0) * block as f64) as u64;
    (block, retained)
}

/// Trained parameters: the base's, or under LoRA the adapters' (f32 A and B).
fn trained_params(tr: &Trainable) -> u64 {
    tr.base + tr.adapters
}

/// The memfit trainer's host peak on the CPU, by component, with the committed fit.
pub fn host(arch: &Arch, setup: &Setup) -> HostEstimate {
    host_with(arch, setup, &FITTED)
}

/// [`host`] with the fitted constants given (the grid's fit searches over them).
pub fn host_with(arch: &Arch, setup: &Setup, fit: &HostFit) -> HostEstimate {
    let tr = trainable(arch, setup);
    let pt = trained_params(&tr);
    let lora = matches!(setup.method, Method::Lora | Method::Qlora);
    // compute dtype of the activations (bf16 or f32)
    let cb = match setup.precision {
        Precision::Bf16 | Precision::Fp16 => 2,
        _ => 4,
    };
    let host_grads = 4 * pt;
    let device_grads = 4 * pt;
    let accumulated = if setup.accum > 1 { host_grads } else { 0 };
    let m = match arch.family {
        Family::Bert => bert::activations(arch, setup, fit, cb, accumulated),
        Family::Llama => decoder::activations(arch, setup, fit, cb, accumulated),
        _ => t5::activations(arch, setup, fit, cb, accumulated),
    };
    // At the end of a backward pass burn holds the micro-batch's gradients (f32, as the weights);
    // they are moved out one by one into the host accumulators, so the first micro-batch peaks at
    // the host gradients and later ones add the device gradients.
    let backward_end = if setup.accum > 1 {
        host_grads + device_grads
    } else {
        host_grads
    };
    let (forward_end, backward_end) = match m.checkpointed {
        Some(moments) => moments,
        None => (
            m.blocks
                + m.attention
                + (m.logits + m.head_grads).max(m.attention_backward)
                + accumulated,
            backward_end,
        ),
    };
    let mut c = state_components(arch, setup, fit, &tr, lora);
    if setup.host_resident_bytes > 0 {
        c.push(Component::new(
            "data and tokenizer",
            setup.host_resident_bytes,
            Scaling::Neither,
            "resident beyond the runtime once the data is prepared, before the model (measured by \
             memfit train): the tokenizer, the readers' state, the validation rows",
        ));
    }
    let states: u64 = c.iter().map(|x| x.bytes).sum();
    if setup.grad_ckpt {
        c.push(Component::new(
            "activations (checkpointed)",
            forward_end.max(backward_end),
            Scaling::BatchAndSequence,
            "block inputs kept between forward and backward + the worse of the head's loss \
             (logits, embedding gradient) and one recomputed block beside the host gradients",
        ));
    } else if forward_end >= backward_end {
        c.extend(forward_end_components(&m, accumulated));
    } else {
        c.extend(backward_end_components(setup, backward_end, device_grads));
    }
    let train = states + forward_end.max(backward_end);
    let checkpoint = checkpoint_write(arch, &tr, lora);
    // an evaluation just before the checkpoint re-uploads the device weights (a copy, cached until
    // the next micro-batch): they are counted (under LoRA only the adapter is written)
    let checkpoint_peak = states + if lora { 0 } else { cb * arch.params_total() } + checkpoint;
    c.push(Component::new(
        "checkpoint write (transient)",
        checkpoint,
        Scaling::Neither,
        "the largest tensor's f32 copy and serialised bytes while a checkpoint is written",
    ));
    let eval_rss_bytes = states
        + eval::eval_weight_copy(arch, setup)
        + eval::eval_forward_bytes(arch, setup, fit, setup.batch);
    HostEstimate {
        peak_rss_bytes: train.max(checkpoint_peak),
        train_rss_bytes: train,
        eval_rss_bytes,
        components: c,
    }
}

/// The runtime and the model states: master weights, device weights, optimizer states.
fn state_components(
    arch: &Arch,
    setup: &Setup,
    fit: &HostFit,
    tr: &Trainable,
    lora: bool,
) -> Vec<Component> {
    let p = arch.params_total();
    let pt = trained_params(tr);
    let optimizer = match setup.optimizer {
        Optimizer::Adafactor => 4 * tr.adafactor_elements,
        Optimizer::Sgd => 4 * pt,
        // the trainer has AdamW and Adafactor; every other name is planned as AdamW's f32 moments
        _ => 8 * pt,
    };
    // Under LoRA the frozen base is held by the model as device tensors in its own dtype; the
    // master weights are the adapters.
    let (master, frozen_base) = if lora {
        let base = match setup.base_precision {
            Some(Precision::Bf16) => 2,
            _ => 4,
        };
        (4 * pt, base * p)
    } else {
        (4 * p, 0)
    };
    let n = Scaling::Neither;
    vec![
        Component::new(
            "runtime",
            fit.runtime_rss,
            n,
            "memfit binary, allocator arenas, burn flex backend and its thread pool (fitted)",
        ),
        Component::new(
            "master weights",
            master,
            n,
            if lora {
                "the adapters' A and B as host f32 (model.weights)"
            } else {
                "all parameters as host f32 (model.weights)"
            },
        ),
        // A micro-batch runs on the master weights' own buffers (lent to the device tensors, no
        // copy), in bf16 too: the hand-written ops take f32 weights beside bf16 activations.
        // Under LoRA the frozen base lives in device tensors of its own dtype.
        Component::new(
            "device weights",
            frozen_base,
            n,
            if lora {
                "the frozen base, held by the model in its --base-precision"
            } else {
                "none while training: the device tensors borrow the master weights' buffers"
            },
        ),
        Component::new(
            "optimizer states",
            optimizer,
            n,
            format!("{} states, f32, trained parameters only", setup.optimizer),
        ),
    ]
}

/// What a micro-batch holds at the end of its forward pass, when that is the peak.
fn forward_end_components(m: &Moments, accumulated: u64) -> Vec<Component> {
    let bs = Scaling::BatchAndSequence;
    let mut c = vec![
        Component::new(
            "activations (blocks)",
            m.blocks,
            bs,
            "tensors burn's autodiff keeps per block for the backward pass",
        ),
        Component::new(
            "attention matrices",
            m.attention,
            bs,
            "the position biases (+ mask) shared by the blocks, and each softmax row's max and 1/sum (no per-attention q × k matrix: probabilities recomputed in backward)",
        ),
        Component::new(
            "logits and loss",
            m.logits,
            bs,
            "target tokens × vocab f32 buffers of the cross-entropy and its first backward op",
        ),
    ];
    if m.attention_backward > m.logits + m.head_grads {
        c.push(Component::new(
            "attention backward",
            m.attention_backward - m.logits - m.head_grads,
            bs,
            "the last block's attention backward (recomputed probabilities and their \
             cotangent, f32 b × heads × t × t each) beyond the head's logits",
        ));
    }
    if m.head_grads > 0 {
        c.push(Component::new(
            "head gradients",
            m.head_grads,
            Scaling::Neither,
            "the LM head's weight gradient beside its host accumulator",
        ));
    }
    if accumulated > 0 {
        c.push(Component::new(
            "accumulated gradients",
            accumulated,
            Scaling::Neither,
            "host f32 gradients of the earlier micro-batches (accum > 1)",
        ));
    }
    c
}

/// The gradients alive at the end of a backward pass, when that is the peak.
fn backward_end_components(setup: &Setup, backward_end: u64, device_grads: u64) -> Vec<Component> {
    let mut c = Vec::new();
    if setup.accum > 1 {
        c.push(Component::new(
            "device gradients",
            device_grads,
            Scaling::Neither,
            "gradients of one backward pass, before they are added to the host accumulators",
        ));
    }
    c.push(Component::new(
        "accumulated gradients",
        backward_end - if setup.accum > 1 { device_grads } else { 0 },
        Scaling::Neither,
        "host f32 gradients, kept until the optimizer step",
    ));
    c
}

/// Writing a checkpoint: safetensors files are written one tensor at a time (a transposed f32
/// copy for linear weights and its little-endian bytes: 2 × 4 B × the largest tensor), the model
/// first, then the optimizer states (`tensor_file::write_f32`). The step has dropped the
/// gradients. Under LoRA only the adapter is written.
fn checkpoint_write(arch: &Arch, tr: &Trainable, lora: bool) -> u64 {
    let largest = if lora {
        tr.largest_tensor
    } else {
        arch.tensors.iter().map(|t| t.elements()).max().unwrap_or(0)
    };
    2 * 4 * largest
}
