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

use super::setup::{Attention, Method, Precision, Setup};
use super::states::{adapter_elements, base_trains};
use crate::Task;
use crate::arch::{Activation, Arch, Family, Group, Role};

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
}

impl ActivationBytes {
    pub fn total(&self) -> u64 {
        self.blocks
            + self.recompute
            + self.embeddings
            + self.logits
            + self.transient
            + self.autocast_weights
    }
}

/// Byte widths in effect for a setup.
#[derive(Debug, Clone, Copy)]
struct Widths {
    /// residual stream (fp32 under amp: residual adds promote to fp32)
    r: u64,
    /// matmul outputs
    c: u64,
    /// fp32-list ops under autocast (softmax, layer_norm, pow)
    f: u64,
    amp: bool,
}

fn widths(p: Precision) -> Widths {
    Widths {
        r: p.weight_bytes(),
        c: p.compute_bytes(),
        f: if p.is_amp() { 4 } else { p.compute_bytes() },
        amp: p.is_amp(),
    }
}

/// One stack (encoder or decoder) of identical blocks.
struct Stack {
    group: Group,
    layers: u64,
    /// tokens per stream in this stack (batch × length)
    tokens: u64,
    /// batch × heads × q_len × kv_len of self-attention
    self_matrix: u64,
    /// cross-attention: (encoder tokens, matrix elements)
    cross: Option<(u64, u64)>,
}

/// The model's activation memory for one micro-batch.
pub fn activations(arch: &Arch, setup: &Setup) -> ActivationBytes {
    let w = widths(setup.precision);
    let b = setup.batch;
    let src = setup.seq;
    let tgt = if setup.task == Task::Seq2seq {
        setup.tgt_seq.max(1)
    } else {
        setup.seq
    };
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
    let mut out = ActivationBytes::default();
    // The graph exists from the first trainable tensor on: stacks before it save nothing.
    let mut live = trains_in(arch, setup, Group::Embeddings);
    let mut largest_block = 0u64;
    let mut largest_block_transient = 0u64;
    for st in &stacks {
        live = live || trains_in(arch, setup, st.group);
        if !live {
            continue;
        }
        let blk = block(arch, setup, w, st);
        let input = w.r * st.tokens * arch.hidden;
        // T5 computes the position bias (batch × heads × q × k, with the mask folded in) once
        // per stack and passes it to every block: alive for the whole step.
        let shared = if arch.family == Family::T5 {
            w.c * st.self_matrix + st.cross.map_or(0, |(_, m)| w.c * m)
        } else {
            0
        };
        if setup.grad_ckpt {
            out.blocks += st.layers * input + shared;
            largest_block = largest_block.max(blk.saved);
        } else {
            out.blocks += st.layers * blk.saved + shared;
            out.attention_matrices += st.layers * blk.matrices;
        }
        largest_block_transient = largest_block_transient.max(blk.transient);
        out.stranded_per_block = out.stranded_per_block.max(blk.stranded);
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
    // Logits and loss.
    let out_tokens = match setup.task {
        Task::Classification => b,
        Task::Seq2seq => b * tgt,
        Task::CausalLm => b * src,
    };
    let classes = if setup.task == Task::Classification {
        2
    } else {
        arch.vocab
    };
    let lv = out_tokens * classes;
    let shift = if setup.task == Task::CausalLm { w.c } else { 0 };
    // logits (c) + causal shift copy (c) + log_softmax output (fp32 under autocast)
    out.logits = lv * (w.c + shift + w.f.max(w.c));
    // loss backward: grad of log_softmax output + grad of logits
    let loss_bwd = lv * (w.f.max(w.c) + w.c);
    out.transient = loss_bwd.max(largest_block_transient);
    // autocast weight copies: every linear weight used in a live block is cast to 16 bit once
    // per forward and kept by autograd for backward (frozen ones too: the input gradient needs it).
    if w.amp {
        let linear: u64 = arch
            .tensors
            .iter()
            .filter(|t| t.is_linear() || t.role == Role::LmHead || tied_head(arch, setup, t))
            .map(|t| t.elements())
            .sum();
        out.autocast_weights = 2 * linear;
        if setup.grad_ckpt {
            // With checkpointing the forward runs without saving, but autocast still caches the
            // casts of trainable leaf weights until the autocast region ends (after the forward).
            out.autocast_weights = 2 * trainable_linear(arch, setup);
        }
    }
    out
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

struct BlockBytes {
    saved: u64,
    matrices: u64,
    transient: u64,
    stranded: u64,
}

/// Saved tensors of one block.
fn block(arch: &Arch, setup: &Setup, w: Widths, st: &Stack) -> BlockBytes {
    let h = arch.hidden;
    let t = st.tokens;
    let inner = arch.heads * arch.head_dim;
    let f = arch.ffn;
    // Whether a linear keeps its input for backward: trained weights do; so do bitsandbytes 4/8-bit
    // linears under QLoRA, whose MatMul4Bit saves its input whenever any input needs a gradient.
    let quantized_base = setup.method == Method::Qlora;
    let trains = |role: Role| {
        arch.tensors.iter().any(|x| {
            x.group == st.group
                && x.role == role
                && (base_trains(x, setup) || (quantized_base && x.is_linear()))
        })
    };
    let lora = |role: Role| {
        arch.tensors
            .iter()
            .any(|x| x.group == st.group && x.role == role && adapter_elements(x, setup) > 0)
    };
    let norm_trains = setup.method == Method::Full
        || (setup.method == Method::Freeze && !setup.freeze.iter().any(|g| g.group() == st.group));
    let hidden_drop = arch.hidden_dropout > 0.0;
    let attn_drop = arch.attention_dropout > 0.0;
    // Norm: LayerNorm saves its input (r) + mean/rstd; RMS norms written in Python (T5, llama)
    // save the fp32 input and, when the weight trains, the normalized tensor.
    let rms = matches!(arch.family, Family::T5 | Family::Llama);
    let norm = |tokens: u64| -> u64 {
        if rms {
            tokens * h * (4 + if norm_trains { 4 } else { 0 })
        } else {
            tokens * h * w.r + 8 * tokens
        }
    };
    // The input of a group of linears reading the same fp32/normed tensor: shared in fp32, one
    // 16-bit cast per linear under autocast. LoRA adds its dropout output + mask per adapted linear.
    let linear_inputs = |tokens: u64, roles: &[Role], in_features: u64, x_bytes: u64| -> u64 {
        let mut bytes = 0;
        let training: Vec<bool> = roles.iter().map(|r| trains(*r)).collect();
        let n_train = training.iter().filter(|x| **x).count() as u64;
        if n_train > 0 {
            bytes += if w.amp && x_bytes == 4 {
                n_train * 2 * tokens * in_features
            } else {
                tokens * in_features * x_bytes
            };
        }
        for r in roles {
            if lora(*r) {
                // lora_dropout output (cast to 16 bit under amp) + its 1-byte mask
                bytes += tokens * in_features * (if w.amp { 2 } else { x_bytes } + 1);
            }
        }
        bytes
    };
    let normed = if w.amp { 4 } else { w.r }; // norm output dtype
    let qkv_roles: &[Role] = if arch.tensors.iter().any(|x| x.role == Role::Qkv) {
        &[Role::Qkv]
    } else {
        &[Role::Q, Role::K, Role::V]
    };

    // Self-attention sub-layer.
    let mut saved = norm(t);
    saved += linear_inputs(t, qkv_roles, h, normed);
    let (attn_saved, matrices, attn_transient) =
        attention_core(arch, setup, w, t, t, st.self_matrix, attn_drop);
    saved += attn_saved;
    saved += linear_inputs(t, &[Role::O], inner, w.c);
    if hidden_drop {
        saved += t * h;
    }
    let mut mats = matrices;
    let mut transient = attn_transient;
    // Cross-attention (encoder-decoder decoder blocks): q from the decoder stream, k/v from the
    // encoder output (its cast copies under amp are per linear and per layer).
    if let Some((enc_t, m)) = st.cross {
        saved += norm(t);
        saved += linear_inputs(t, &[Role::Q], h, normed);
        saved += linear_inputs(enc_t, &[Role::K, Role::V], h, w.r);
        let (a, mm, tr) = attention_core(arch, setup, w, t, enc_t, m, attn_drop);
        saved += a;
        mats += mm;
        transient = transient.max(tr);
        saved += linear_inputs(t, &[Role::O], inner, w.c);
        if hidden_drop {
            saved += t * h;
        }
    }
    // Feed-forward sub-layer.
    if arch.family != Family::Phi && !(arch.family == Family::Falcon) {
        saved += norm(t);
    }
    let up_roles: &[Role] = if arch.gated_ffn {
        &[Role::Gate, Role::Up]
    } else {
        &[Role::Up]
    };
    saved += linear_inputs(t, up_roles, h, normed);
    let tf = t * f;
    let act_saved = match arch.activation {
        Activation::Relu => w.c,                                           // output
        Activation::Gelu | Activation::GeluTanh | Activation::Silu => w.c, // input
        // NewGELU: x, tanh(...) (fp32 under autocast: pow is fp32-listed), 1 + tanh, 0.5·x
        Activation::GeluNew => 2 * w.c + 2 * w.f.max(w.c),
    };
    saved += tf * act_saved;
    if arch.gated_ffn {
        // act(gate) · up saves both factors
        saved += tf * 2 * w.c;
    }
    // T5 applies dropout between the activation and wo.
    let ffn_inner_drop = arch.family == Family::T5 && hidden_drop;
    let down_input_is_new =
        ffn_inner_drop || (!arch.gated_ffn && arch.activation != Activation::Relu);
    if ffn_inner_drop {
        saved += tf; // mask
    }
    if trains(Role::Down) && down_input_is_new {
        saved += tf * w.c;
    }
    if lora(Role::Down) {
        saved += tf * (w.c + 1);
    }
    if hidden_drop {
        saved += t * h;
    }
    // Backward of the FFN creates gradients of the two largest intermediates (fp32 under amp for
    // the activation's own backward).
    transient = transient.max(2 * tf * w.f.max(w.c));
    if quantized_base {
        // each quantized matmul dequantizes its weight to 16 bit for the duration of the op
        transient += 2 * h * f.max(h);
    }
    // Largest freed seq² temporary: the scores (or their fp32 dropout output under autocast).
    let stranded = if setup.attention == Attention::Eager {
        st.self_matrix * w.f.max(w.c)
    } else {
        0
    };
    BlockBytes {
        saved,
        matrices: mats,
        transient,
        stranded,
    }
}

/// q/k/v saved for the two attention matmuls and the score/probability matrices.
/// Returns (saved bytes, of which matrices, transient bytes).
fn attention_core(
    arch: &Arch,
    setup: &Setup,
    w: Widths,
    tq: u64,
    tk: u64,
    matrix: u64,
    dropout: bool,
) -> (u64, u64, u64) {
    let inner = arch.heads * arch.head_dim;
    // q for QKᵀ; k and v (repeated to all heads for GQA in eager code) for the two matmuls
    let qkv = w.c * (tq * inner + 2 * tk * inner);
    match setup.attention {
        Attention::Eager => {
            // softmax output: fp32 under autocast and in T5/llama/bloom code (explicit .float()),
            // else the compute dtype.
            let explicit_fp32 = matches!(
                arch.family,
                Family::T5 | Family::Llama | Family::Bloom | Family::Falcon
            );
            let sm = if w.amp || explicit_fp32 { 4 } else { w.c };
            // what the probs @ V matmul saves: dropout output, or a 16-bit cast of the fp32 probs
            let pv_in = if dropout {
                1 + w.c
            } else if sm != w.c {
                w.c
            } else {
                0
            };
            let per = sm + pv_in;
            // forward temporaries: raw scores and the scaled/masked copy (compute dtype) while
            // softmax runs; backward: grad of probs and of scores
            let transient = matrix * (2 * w.c).max(2 * sm);
            (qkv + matrix * per, matrix * per, transient)
        }
        Attention::Sdpa | Attention::Flash => {
            // fused kernels keep the output and a per-row logsumexp, never the matrix
            let out = w.c * tq * inner + 4 * tq * arch.heads;
            (qkv + out, 0, 2 * w.c * tq * inner)
        }
    }
}
