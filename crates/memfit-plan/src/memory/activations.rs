//! Activations: the tensors autograd saves for backward, block by block, as eager PyTorch /
//! transformers code creates them, plus the temporaries alive at the worst moment of a block.
//!
//! Rules used throughout (PyTorch autograd, `tools/autograd/derivatives.yaml`):
//! - a linear saves its input only when its weight needs a gradient (inputs needed for the input
//!   gradient are the weight, already resident); a LoRA adapter saves its dropped-out input;
//! - dropout saves a 1-byte mask (bool, `native_dropout`), never its input;
//! - ReLU saves its output, GELU/SiLU their input, softmax its output, matmul of two activations
//!   both operands, LayerNorm its input (+ mean/rstd);
//! - under autocast (amp) matmuls run in 16 bit but softmax, layer_norm, pow, cross-entropy run in
//!   fp32 (torch/csrc/autograd autocast op lists), and every fp32 activation feeding a linear is
//!   cast to a fresh 16-bit copy per linear (activation casts are not cached; only leaf weights are).

use super::block::block;
use super::ffn::Ffn;
use super::framework::Framework;
use super::logits::logits_and_loss;
use super::setup::{Method, Setup};
use super::states::{adapter_elements, base_trains, quantized};
use crate::Task;
use crate::arch::{Arch, Family, Group, Role};

/// Activation bytes of one micro-batch, by where they come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ActivationBytes {
    /// Saved tensors of all blocks at the end of the forward pass (or only the checkpointed block
    /// inputs with gradient checkpointing).
    pub blocks: u64,
    /// Part of `blocks` that grows with seq² (attention score/probability matrices).
    pub attention_matrices: u64,
    /// With gradient checkpointing: one block's saved tensors, recomputed during backward.
    pub recompute: u64,
    /// Embedding outputs, masks, the input batch.
    pub embeddings: u64,
    /// Logits, their loss copies (shift, fp32 cast, log-softmax output).
    pub logits: u64,
    /// Largest short-lived temporaries (loss backward, one block's gradient tensors).
    pub transient: u64,
    /// autocast's 16-bit copies of the weights, alive from their use in forward to backward.
    pub autocast_weights: u64,
    /// The largest seq² temporary a block frees during its forward (reserved, not allocated).
    pub stranded_per_block: u64,
    /// The 16-bit logits' block, freed before the loss backward and too small for its fp32
    /// gradients (reserved, not allocated).
    pub stranded_logits: u64,
    /// Backward recomputes a checkpointed block only once the loss's tensors are freed
    /// (`Profile::loss_freed_before_recompute`): the two never hold memory at once.
    pub recompute_after_loss: bool,
}

impl ActivationBytes {
    /// The activation phase's allocated peak: what forward keeps, the loss's tensors and one
    /// recomputed block — the larger of the last two where backward frees the one before the
    /// other (traced on PyTorch's meta device and measured on an H200: validation/README.md).
    pub fn total(&self) -> u64 {
        let kept = self.blocks + self.embeddings + self.transient + self.autocast_weights;
        if self.recompute_after_loss {
            kept + self.logits.max(self.recompute)
        } else {
            kept + self.logits + self.recompute
        }
    }

    /// Reserved beside the activation phase's allocations where the two do not meet: the
    /// checkpointed forward runs each block without saving, and the segments its temporaries
    /// leave cached are too small for the logits that follow, so the pool holds both.
    pub fn cached_block_segments(&self) -> u64 {
        if self.recompute_after_loss {
            self.logits.min(self.recompute)
        } else {
            0
        }
    }
}

/// Byte widths in effect for a setup.
#[derive(Debug, Clone, Copy)]
pub(super) struct Widths {
    /// residual stream (fp32 under amp: residual adds promote to fp32)
    pub r: u64,
    /// matmul outputs
    pub c: u64,
    /// fp32-list ops under autocast (softmax, layer_norm, pow)
    pub f: u64,
    pub amp: bool,
}

fn widths(setup: &Setup) -> Widths {
    let p = setup.precision;
    let profile = setup.stack.profile();
    if p.is_amp() && profile.deepspeed(setup) {
        // A DeepSpeed engine casts the module to 16 bit and runs no autocast
        // (deepspeed/runtime/engine.py: `self.module.bfloat16()` / `.half()`).
        return Widths {
            r: 2,
            c: 2,
            f: 2,
            amp: false,
        };
    }
    if setup.method == Method::Qlora && profile.kbit_fp32 && !p.is_amp() {
        // prepare_model_for_kbit_training made the embeddings and norms fp32: without autocast
        // the hidden states stay fp32; bnb's Linear4bit computes in its compute dtype and casts
        // its output back to the input's dtype (bitsandbytes/nn/modules.py `Linear4bit.forward`).
        return Widths {
            r: 4,
            c: 4,
            f: 4,
            amp: false,
        };
    }
    Widths {
        r: p.weight_bytes(),
        c: p.compute_bytes(),
        f: if p.is_amp() { 4 } else { p.compute_bytes() },
        amp: p.is_amp(),
    }
}

/// One stack (encoder or decoder) of blocks alike but for their feed-forward.
pub(super) struct Stack {
    pub group: Group,
    pub layers: u64,
    /// tokens per stream in this stack (batch × length)
    pub tokens: u64,
    /// batch × heads × q_len × kv_len of self-attention
    pub self_matrix: u64,
    /// cross-attention: (encoder tokens, matrix elements)
    pub cross: Option<(u64, u64)>,
}

impl Stack {
    /// The stack's blocks by feed-forward: a mixture's sparse blocks and the dense rest.
    fn by_ffn(&self, arch: &Arch) -> Vec<(Ffn, u64)> {
        match arch.moe {
            Some(m) if self.group == Group::Decoder => vec![
                (Ffn::Dense, self.layers - m.sparse_layers),
                (Ffn::Experts(m), m.sparse_layers),
            ],
            _ => vec![(Ffn::Dense, self.layers)],
        }
    }
}

/// The model's activation memory for one micro-batch.
pub fn activations(arch: &Arch, setup: &Setup, fw: &Framework) -> ActivationBytes {
    let w = widths(setup);
    let b = setup.batch;
    let src = setup.seq;
    let tgt = if setup.task == Task::Seq2seq {
        setup.tgt_seq.max(1)
    } else {
        setup.seq
    };
    let stacks = stacks(arch, b, src, tgt);
    let mut out = ActivationBytes {
        recompute_after_loss: setup.stack.profile().loss_freed_before_recompute(setup),
        ..ActivationBytes::default()
    };
    // The graph exists from the first trainable tensor on: stacks before it save nothing.
    let mut live = trains_in(arch, setup, Group::Embeddings);
    let mut largest_block = 0u64;
    let mut largest_block_transient = 0u64;
    for st in &stacks {
        live = live || trains_in(arch, setup, st.group);
        if !live {
            continue;
        }
        let input = w.r * st.tokens * arch.hidden;
        // T5 computes the position bias (batch × heads × q × k, with the mask folded in) once
        // per stack and passes it to every block: alive for the whole step.
        let shared = if arch.family == Family::T5 {
            w.c * st.self_matrix + st.cross.map_or(0, |(_, m)| w.c * m)
        } else {
            0
        };
        out.blocks += shared;
        for (ffn, layers) in st.by_ffn(arch).into_iter().filter(|(_, n)| *n > 0) {
            let blk = block(arch, setup, fw, w, st, ffn);
            if setup.grad_ckpt {
                out.blocks += layers * input;
                largest_block = largest_block.max(blk.saved);
            } else {
                out.blocks += layers * blk.saved;
                out.attention_matrices += layers * blk.matrices;
            }
            largest_block_transient = largest_block_transient.max(blk.transient);
            out.stranded_per_block = out.stranded_per_block.max(blk.stranded);
        }
        // Encoder output feeding every cross-attention: saved once.
        if let Some((enc_tokens, _)) = st.cross {
            out.blocks += w.r * enc_tokens * arch.hidden;
        }
    }
    if setup.grad_ckpt {
        out.recompute = largest_block;
    }
    // Embeddings: output + dropout mask (+ bert's three-way sum and LayerNorm input), input ids.
    let first_tokens = stacks.first().map_or(0, |s| s.tokens);
    let drop = if arch.hidden_dropout > 0.0 { 1 } else { 0 };
    out.embeddings = if live {
        first_tokens * arch.hidden * (w.r + drop + if arch.family == Family::Bert { 4 } else { 0 })
    } else {
        0
    } + 3 * 8 * b * (src + tgt);
    let logits = logits_and_loss(arch, setup, w, fw);
    out.logits = logits.forward;
    // the loss backward runs after the forward-only logits are gone
    let loss_backward = logits.backward.saturating_sub(logits.freed_before_backward);
    out.transient = loss_backward.max(largest_block_transient);
    out.stranded_logits = logits.stranded;
    // autocast weight copies: every linear weight used in a live block is cast to 16 bit once
    // per forward and kept by autograd for backward (frozen ones too: the input gradient needs it).
    if w.amp {
        out.autocast_weights = autocast_weight_bytes(arch, setup);
    }
    out
}

/// The encoder and decoder stacks a micro-batch of `b` rows runs through (`src` tokens in,
/// `tgt` decoder tokens for seq2seq).
fn stacks(arch: &Arch, b: u64, src: u64, tgt: u64) -> Vec<Stack> {
    let heads = arch.heads;
    let mut stacks = Vec::new();
    if arch.encoder_layers > 0 {
        stacks.push(Stack {
            group: Group::Encoder,
            layers: arch.encoder_layers,
            tokens: b * src,
            self_matrix: b * heads * src * src,
            cross: None,
        });
    }
    if arch.decoder_layers > 0 {
        let (len, cross) = if arch.encoder_layers > 0 {
            (tgt, Some((b * src, b * heads * tgt * src)))
        } else {
            (src, None)
        };
        stacks.push(Stack {
            group: Group::Decoder,
            layers: arch.decoder_layers,
            tokens: b * len,
            self_matrix: b * heads * len * len,
            cross,
        });
    }
    stacks
}

/// autocast's 16-bit copies of the linear weights, alive from forward to backward.
fn autocast_weight_bytes(arch: &Arch, setup: &Setup) -> u64 {
    if setup.grad_ckpt {
        // With checkpointing the forward runs without saving, but autocast still caches the
        // casts of trainable leaf weights until the autocast region ends (after the forward).
        return 2 * trainable_linear(arch, setup);
    }
    let linear: u64 = arch
        .tensors
        .iter()
        // 4-bit linears dequantize per call instead (their matmul is not autocast-cached)
        .filter(|t| t.is_linear() || t.role == Role::LmHead || tied_head(arch, setup, t))
        .filter(|t| !quantized(setup, t))
        .map(|t| t.elements())
        .sum();
    2 * linear
}

/// A tied LM head multiplies by the embedding matrix: autocast casts it like a linear weight.
fn tied_head(arch: &Arch, setup: &Setup, t: &crate::arch::ParamTensor) -> bool {
    arch.head == crate::arch::Head::LmTied
        && setup.task != Task::Classification
        && t.role == Role::Embedding
        && t.rows == arch.vocab
}

fn trainable_linear(arch: &Arch, setup: &Setup) -> u64 {
    arch.tensors
        .iter()
        .filter(|t| t.is_linear() && base_trains(t, setup))
        .map(|t| t.elements())
        .sum()
}

fn trains_in(arch: &Arch, setup: &Setup, group: Group) -> bool {
    arch.tensors
        .iter()
        .filter(|t| t.group == group)
        .any(|t| base_trains(t, setup) || adapter_elements(t, setup) > 0)
}
