//! One transformer block's saved tensors: its norms, attention (self and cross) and feed-forward
//! (`ffn.rs`), under the autograd rules listed in `activations.rs`.

use super::activations::{Stack, Widths};
use super::ffn::{self, Ffn};
use super::framework::Framework;
use super::setup::{Attention, Method, Quant, Setup};
use super::stack::Profile;
use super::states::{adapter_elements, base_trains, quantized};
use crate::arch::{Arch, Family, Group, Role};

/// What one block keeps and frees.
pub(super) struct BlockBytes {
    pub saved: u64,
    /// Part of `saved` that grows with seq² (score/probability matrices).
    pub matrices: u64,
    /// Largest short-lived temporary of its forward or backward.
    pub transient: u64,
    /// The largest seq² temporary it frees during its forward (reserved, not allocated).
    pub stranded: u64,
}

/// The questions every part of a block asks about the setup.
pub(super) struct Ctx<'a> {
    pub arch: &'a Arch,
    pub setup: &'a Setup,
    pub w: Widths,
    pub group: Group,
    /// Every linear keeps its input, trained or not: bitsandbytes' quantized linears under QLoRA
    /// before 0.44 (`Framework::bnb_saves_input`; torchao's NF4 never), and DeepSpeed ZeRO-3,
    /// whose zero.Init(mem_efficient_linear=True, the default) routes F.linear through
    /// LinearFunctionForZeroStage3, which saves input and weight unconditionally
    /// (deepspeed/runtime/zero/linear.py).
    pub all_linears_save: bool,
    pub norm_trains: bool,
    pub profile: Profile,
    /// SDPA falls back to its math kernel (`Framework::sdpa_gqa_unrepeated`): transformers'
    /// attention code, grouped-query heads, fp32 inputs.
    pub sdpa_math: bool,
    /// Each adapter reads its own fp32 copy of its input (`Framework::peft_fp32_adapters`, a
    /// 16-bit base without autocast, PEFT's LoRA).
    pub fp32_adapter_inputs: bool,
    /// A fused attention kernel takes grouped-query keys and values as they are, so it saves
    /// them at their own width: transformers' flash attention always, its SDPA where it passes
    /// `enable_gqa` (`Framework::sdpa_gqa_unrepeated`). Eager code, LitGPT and the remote-code
    /// models (chatglm's `expand` of its two groups) repeat them to every head first.
    pub kv_unrepeated: bool,
}

impl<'a> Ctx<'a> {
    pub fn new(
        arch: &'a Arch,
        setup: &'a Setup,
        fw: &Framework,
        w: Widths,
        group: Group,
    ) -> Ctx<'a> {
        let profile = setup.stack.profile();
        let bnb_saves = setup.method == Method::Qlora && fw.bnb_saves_input && !profile.torchao_nf4;
        let all_linears_save = bnb_saves || (setup.zero.stage() == 3 && !setup.zero.is_fsdp());
        let norm_trains = setup.method == Method::Full
            || (setup.method == Method::Freeze && !setup.freeze.iter().any(|g| g.group() == group));
        let sdpa_math = setup.attention == Attention::Sdpa
            && fw.sdpa_gqa_unrepeated
            && w.c == 4
            && arch.kv_heads < arch.heads
            && setup.stack.runs_transformers_code();
        let fp32_adapter_inputs = super::states::fp32_adapters(setup, fw);
        let kv_unrepeated = setup.stack.runs_transformers_code()
            && !arch.runs_remote_code()
            && (setup.attention == Attention::Flash
                || (setup.attention == Attention::Sdpa && fw.sdpa_gqa_unrepeated));
        Ctx {
            arch,
            setup,
            w,
            group,
            all_linears_save,
            norm_trains,
            profile,
            sdpa_math,
            fp32_adapter_inputs,
            kv_unrepeated,
        }
    }

    /// Whether a linear of `role` keeps its input for its weight gradient.
    pub fn trains(&self, role: Role) -> bool {
        self.arch.tensors.iter().any(|x| {
            x.group == self.group
                && x.role == role
                && (base_trains(x, self.setup) || (self.all_linears_save && x.is_linear()))
        })
    }

    /// Whether a linear of `role` carries a LoRA adapter.
    pub fn lora(&self, role: Role) -> bool {
        self.arch
            .tensors
            .iter()
            .any(|x| x.group == self.group && x.role == role && adapter_elements(x, self.setup) > 0)
    }

    /// A norm over `width` features: LayerNorm saves its input (+ mean/rstd); RMS norms written
    /// in Python (T5, llama-style) save the fp32 input and, when the weight trains, the
    /// normalized tensor the weight multiplies: in the weight's dtype, or in fp32 where the norm
    /// multiplies in fp32 (`Block::rms_weight_fp32`).
    pub fn norm(&self, tokens: u64, width: u64) -> u64 {
        if self.arch.block.rms_norm {
            let normalized = match (self.norm_trains, self.arch.block.rms_weight_fp32) {
                (false, _) => 0,
                (true, true) => 4,
                (true, false) => self.w.r,
            };
            tokens * width * (4 + normalized)
        } else {
            tokens * width * self.w.r + 8 * tokens
        }
    }

    /// Output dtype of a norm: fp32 under autocast (layer_norm is on autocast's fp32 list; the
    /// Python RMS norms compute in fp32), else the weights' dtype.
    pub fn normed(&self) -> u64 {
        if self.w.amp { 4 } else { self.w.r }
    }

    /// The input of a group of linears reading the same tensor: shared when they train, one
    /// 16-bit cast per linear under autocast when it is fp32. LoRA adds its dropout output + mask
    /// per adapted linear; without LoRA dropout (`Profile::lora_dropout`) an adapter's A reads
    /// the input itself, saved once (or cast once per adapter under autocast).
    pub fn linear_inputs(
        &self,
        tokens: u64,
        roles: &[Role],
        in_features: u64,
        x_bytes: u64,
    ) -> u64 {
        let w = self.w;
        let n_train = roles.iter().filter(|r| self.trains(**r)).count() as u64;
        let n_lora = roles.iter().filter(|r| self.lora(**r)).count() as u64;
        let dropout = self.profile.lora_dropout;
        // PEFT's fp32 adapters each save their own fp32 copy, dropped out or not
        let own_copy = self.fp32_adapter_inputs;
        // readers that save the input tensor itself (or its autocast copy)
        let readers = n_train + if dropout || own_copy { 0 } else { n_lora };
        let mut bytes = 0;
        if readers > 0 {
            bytes += if w.amp && x_bytes == 4 {
                readers * 2 * tokens * in_features
            } else {
                tokens * in_features * x_bytes
            };
        }
        if dropout || own_copy {
            // per adapter: its input (an fp32 copy, a 16-bit cast under amp, or the lora_dropout
            // output in the input's dtype) + the dropout's 1-byte mask
            let x = if own_copy {
                4
            } else if w.amp {
                2
            } else {
                x_bytes
            };
            bytes += n_lora * tokens * in_features * (x + u64::from(dropout));
        }
        bytes
    }
}

/// Saved tensors of one block of `st` whose feed-forward is `ffn`.
pub(super) fn block(
    arch: &Arch,
    setup: &Setup,
    fw: &Framework,
    w: Widths,
    st: &Stack,
    ffn: Ffn,
) -> BlockBytes {
    let cx = Ctx::new(arch, setup, fw, w, st.group);
    let (h, t) = (arch.hidden, st.tokens);
    let hidden_drop = if arch.hidden_dropout > 0.0 { t * h } else { 0 };
    let (mut saved, mut mats, mut transient) = self_attention(&cx, st);
    saved += hidden_drop;
    // Cross-attention (encoder-decoder decoder blocks): q from the decoder stream, k/v from the
    // encoder output (its cast copies under amp are per linear and per layer).
    if let Some((enc_t, m)) = st.cross {
        saved += cx.norm(t, h);
        saved += cx.linear_inputs(t, &[Role::Q], h, cx.normed());
        saved += cx.linear_inputs(enc_t, &[Role::K, Role::V], h, w.r);
        let (a, mm, tr) = attention_core(&cx, t, enc_t, m);
        (saved, mats, transient) = (saved + a, mats + mm, transient.max(tr));
        saved += cx.linear_inputs(t, &[Role::O], arch.heads * arch.head_dim, w.c);
        saved += hidden_drop;
    }
    saved += mlp_norms(&cx, t);
    let (ffn_saved, ffn_transient) = ffn::saved(&cx, t, ffn);
    saved += ffn_saved + hidden_drop + gptq_saved_weights(&cx);
    // Largest freed seq² temporary: the scores (or their fp32 dropout output under autocast).
    let stranded = if setup.attention == Attention::Eager {
        st.self_matrix * w.f.max(w.c)
    } else {
        0
    };
    BlockBytes {
        saved,
        matrices: mats,
        transient: transient.max(ffn_transient) + dequantized(&cx),
        stranded,
    }
}

/// QLoRA: a 4-bit linear computes with its weight dequantized to 16 bit for the duration of the
/// matmul, in forward and again for the input gradient in backward (bitsandbytes
/// `MatMul4Bit`: `F.dequantize_4bit(B, quant_state).to(A.dtype)`; torchao `linear_nf4`:
/// `weight.to(input.dtype)`): the block's largest quantized linear, once, beside its other
/// temporaries.
/// GPTQ (auto-gptq's torch path, below) unpacks the codes through a 4-byte int32 tensor and its
/// 1-byte int8 cast before the 2-byte fp16 weight exists: 7 B per element of the largest.
fn dequantized(cx: &Ctx) -> u64 {
    let per_element = if cx.setup.quant == Some(Quant::Gptq4) {
        4 + 1 + 2
    } else {
        2
    };
    cx.arch
        .tensors
        .iter()
        .filter(|t| t.group == cx.group && quantized(cx.setup, t))
        .map(|t| per_element * t.size())
        .max()
        .unwrap_or(0)
}

/// GPTQ: auto-gptq's `QuantLinear.forward` (qlinear_cuda_old.py, `disable_exllama`) runs its
/// CUDA kernel only below `kernel_switch_threshold` (128) rows; a training micro-batch has more,
/// so it dequantizes the whole weight to fp16 (`scales * (weight - zeros)`) and calls
/// `torch.matmul(x, weight)` under autograd. That weight needs no gradient but the input does, so
/// matmul saves the dequantized weight for backward: every quantized linear of a block whose
/// graph is built keeps 2 B per weight element until backward (bitsandbytes' `MatMul4Bit`
/// dequantizes again in backward instead and saves nothing of the weight).
fn gptq_saved_weights(cx: &Ctx) -> u64 {
    if cx.setup.method != Method::Qlora || cx.setup.quant != Some(Quant::Gptq4) {
        return 0;
    }
    cx.arch
        .tensors
        .iter()
        .filter(|t| t.group == cx.group && quantized(cx.setup, t))
        .map(|t| 2 * t.size())
        .sum()
}

/// The norm in front of the MLP and any norm after attention or MLP. A sequential block's MLP
/// norm saves the new residual (input + attention output). A parallel block's MLP reads the
/// block input the attention norm already keeps: a second LayerNorm on it adds only its
/// mean/rstd. gemma2's sandwich adds a post-attention and a post-MLP norm over sublayer outputs.
fn mlp_norms(cx: &Ctx, t: u64) -> u64 {
    let (arch, h) = (cx.arch, cx.arch.hidden);
    if matches!(arch.family, Family::T5 | Family::Bert) {
        return cx.norm(t, h);
    }
    if arch.block.parallel {
        return match (arch.block.norms, arch.block.rms_norm) {
            (0 | 1, _) => 0,
            (_, true) => cx.norm(t, h), // a Python RMS norm upcasts its input again
            (_, false) => 8 * t,
        };
    }
    cx.norm(t, h) * (1 + arch.block.norms.saturating_sub(2))
}

/// Norm, q/k/v projections (and their norms and rotary), attention, output projection.
fn self_attention(cx: &Ctx, st: &Stack) -> (u64, u64, u64) {
    let (arch, w, t) = (cx.arch, cx.w, st.tokens);
    let inner = arch.heads * arch.head_dim;
    let kv_inner = arch.kv_heads * arch.head_dim;
    let fused = arch.tensors.iter().any(|x| x.role == Role::Qkv);
    let qkv_roles: &[Role] = if fused {
        &[Role::Qkv]
    } else {
        &[Role::Q, Role::K, Role::V]
    };
    let mut saved = cx.norm(t, arch.hidden);
    saved += cx.linear_inputs(t, qkv_roles, arch.hidden, cx.normed());
    if arch.block.qk_norm {
        // qwen3's q_norm/k_norm (RMS over head_dim), stablelm's per-head LayerNorms (mean/rstd
        // per head): their inputs are the projected q and k
        saved += if arch.block.rms_norm {
            cx.norm(t, inner + kv_inner)
        } else {
            t * (inner + kv_inner) * w.r + 8 * t * (arch.heads + arch.kv_heads)
        };
    }
    let v_is_view = if cx.profile.litgpt_code {
        // LitGPT: q, k, v are views of the fused output; under grouped queries k and v are
        // repeated to every head by `expand` + `reshape`, a copy, which frees it.
        arch.kv_heads == arch.heads
    } else {
        arch.family != Family::Falcon
    };
    if fused && arch.block.rotary && v_is_view {
        // v is a view of the fused projection's output (gpt-neox `qkv.chunk`, phi3 slices), so
        // saving v keeps all of it alive, while rotary made new q and k: the projected q and k
        // stay as well. Falcon's `_split_heads` copies k and v (list indexing) in its multi-query
        // and new-architecture layouts, freeing the fused output.
        saved += w.c * t * (inner + kv_inner);
    }
    saved += zero_pad(cx, t);
    let (a, mats, transient) = attention_core(cx, t, t, st.self_matrix);
    saved += a;
    saved += cx.linear_inputs(t, &[Role::O], inner, w.c);
    (saved, mats, transient)
}

/// LitGPT's LoRA on part of a fused qkv linear (`LoRAQKVLinear`, q and v but not k, say)
/// scatters the adapters' output into a zero tensor of the full width with `index_copy_`,
/// whose backward keeps its source: tokens × the adapted widths (`litgpt/lora.py` `zero_pad`).
fn zero_pad(cx: &Ctx, t: u64) -> u64 {
    let (arch, setup) = (cx.arch, cx.setup);
    if !cx.profile.litgpt_code || !cx.lora(Role::Qkv) {
        return 0;
    }
    let has = |r: Role| {
        setup
            .lora_targets
            .iter()
            .any(|l| l.covers(r) && l.covers(Role::Qkv))
    };
    let widths = [
        (has(Role::Q), arch.heads * arch.head_dim),
        (has(Role::K), arch.kv_heads * arch.head_dim),
        (has(Role::V), arch.kv_heads * arch.head_dim),
    ];
    if widths.iter().all(|(on, _)| *on) {
        return 0; // all three adapted: no padding
    }
    let adapted: u64 = widths.iter().filter(|(on, _)| *on).map(|(_, w)| w).sum();
    cx.w.c * t * adapted
}

/// q/k/v saved for the two attention matmuls and the score/probability matrices.
/// Returns (saved bytes, of which matrices, transient bytes).
pub(super) fn attention_core(cx: &Ctx, tq: u64, tk: u64, matrix: u64) -> (u64, u64, u64) {
    let (arch, w) = (cx.arch, cx.w);
    let inner = arch.heads * arch.head_dim;
    // LitGPT computes softcapped attention (gemma2) by hand whatever the setting
    // (`litgpt/model.py` `scaled_dot_product_attention`)
    let eager = cx.setup.attention == Attention::Eager
        || (cx.profile.litgpt_code && arch.block.attn_softcap)
        || cx.sdpa_math;
    // gpt-j's eager attention upcasts q and k to fp32 before QKᵀ (modeling_gptj.py `_attn`)
    let qk_b = if eager && arch.family == Family::GptJ {
        4
    } else {
        w.c
    };
    // k and v at their own width where a fused kernel takes them as they are, else repeated
    // to every head (eager code under GQA)
    let kv = if cx.kv_unrepeated && !eager {
        arch.kv_heads * arch.head_dim
    } else {
        inner
    };
    // q for QKᵀ; k and v for the two matmuls
    let qkv = qk_b * (tq * inner + tk * kv) + w.c * tk * kv;
    if !eager {
        // fused kernels keep the output and a per-row logsumexp, never the matrix
        let out = w.c * tq * inner + 4 * tq * arch.heads;
        return (qkv + out, 0, 2 * w.c * tq * inner);
    }
    // softmax output: fp32 under autocast and where the code asks for it (`.float()` or
    // `softmax(dtype=torch.float32)`), else the compute dtype.
    let explicit_fp32 = matches!(
        arch.family,
        Family::T5
            | Family::Llama
            | Family::Phi
            | Family::Bloom
            | Family::Falcon
            | Family::GptNeox
            | Family::GptJ
            | Family::Opt
            | Family::Starcoder2
    );
    let sm = if w.amp || explicit_fp32 { 4 } else { w.c };
    // what the probs @ V matmul saves: dropout output, or a 16-bit cast of the fp32 probs
    let pv_in = if arch.attention_dropout > 0.0 {
        1 + w.c
    } else if sm != w.c {
        w.c
    } else {
        0
    };
    // gemma2's attn_logit_softcapping: tanh(scores / cap) · cap, tanh saving its output
    let softcap = if arch.block.attn_softcap { qk_b } else { 0 };
    let per = sm + pv_in + softcap;
    // forward temporaries: raw scores and the scaled/masked copy (compute dtype) while
    // softmax runs; backward: grad of probs and of scores
    let transient = matrix * (2 * w.c).max(2 * sm);
    (qkv + matrix * per, matrix * per, transient)
}
