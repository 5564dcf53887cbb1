//! Logits and loss: vocabulary × output tokens, in the compute dtype, with the copies the loss
//! makes of them and the gradients its backward creates.

use super::activations::Widths;
use super::framework::Framework;
use super::setup::{Method, Setup};
use super::stack::Loss;
use crate::Task;
use crate::arch::Arch;

/// Bytes of the logits and loss of one micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct LogitsBytes {
    /// Alive at the end of the forward pass: the logits and what the loss saved.
    pub forward: u64,
    /// Created by the loss backward while the forward's tensors are still alive.
    pub backward: u64,
    /// Part of `forward` that nothing saved for backward: freed when the forward pass returns,
    /// before the loss backward creates `backward`.
    pub freed_before_backward: u64,
    /// Part of `freed_before_backward` the caching allocator keeps reserved but cannot hand to
    /// the loss backward's larger fp32 gradients.
    pub stranded: u64,
}

/// Logits of `tokens × classes` elements and the cross-entropy over them.
pub(super) fn logits_and_loss(
    arch: &Arch,
    setup: &Setup,
    w: Widths,
    fw: &Framework,
) -> LogitsBytes {
    let b = setup.batch;
    let (out_tokens, classes) = match setup.task {
        Task::Classification => (b, 2),
        Task::Seq2seq => (b * setup.tgt_seq.max(1), arch.vocab),
        Task::CausalLm => (b * setup.seq, arch.vocab),
    };
    let lv = out_tokens * classes;
    // gemma2's final_logit_softcapping: tanh(logits / cap) · cap, tanh saving its output
    let softcap = if arch.block.logit_softcap && setup.task != Task::Classification {
        w.c
    } else {
        0
    };
    let profile = setup.stack.profile();
    // A quantized head (LitGPT's QLoRA) dequantizes its whole weight for each chunk it computes,
    // in forward and again for the input gradient: one weight-sized 16-bit temporary.
    let head_dequant = if setup.method == Method::Qlora
        && profile.quantize_head
        && setup.task != Task::Classification
    {
        2 * arch.vocab * arch.embed_dim
    } else {
        0
    };
    match profile.loss_for(setup) {
        Loss::ChunkedKeep { tokens } => {
            // every chunk's logits (the list the step keeps) and its log-softmax output, both in
            // the logits' dtype (the chunked path applies no final softcapping: `litgpt/lora.py`
            // `GPT.forward`); backward creates every chunk's logits gradient before the head's
            // backward runs (the loss nodes come later in the graph), one chunk's log-softmax
            // gradient at a time.
            let chunk = lv.min(b * tokens * classes);
            return LogitsBytes {
                forward: lv * 2 * w.c,
                backward: lv * w.c + chunk * w.c + head_dequant,
                ..LogitsBytes::default()
            };
        }
        Loss::ChunkedUpcast { chunks } => {
            // the fp32 log-softmax of every chunk stays; the 16-bit logits are deleted before
            // backward, which then creates every chunk's 16-bit logits gradient, each chunk's fp32
            // gradients in turn.
            let chunk = lv.div_ceil(chunks.max(1));
            return LogitsBytes {
                forward: lv * (4 + softcap),
                backward: lv * w.c + chunk * (4 + 4) + head_dequant,
                ..LogitsBytes::default()
            };
        }
        Loss::Plain => {
            // torchtune's decoder returns `self.output(h).float()` (torchtune/modules/
            // transformer.py, April 2024): the step keeps the fp32 shifted copy, cross-entropy
            // its fp32 log-softmax output; backward: the fp32 gradients of both
            return LogitsBytes {
                forward: lv * (4 + 4),
                backward: lv * (4 + 4),
                ..LogitsBytes::default()
            };
        }
        Loss::Whole => {}
    }
    if setup.task == Task::CausalLm && own_shifted_loss(arch) {
        return own_shifted_loss_bytes(lv, w, profile.deepspeed(setup));
    }
    if setup.task == Task::CausalLm && fw.causal_loss_upcast {
        // ForCausalLMLoss: `logits.float()` (a copy unless they are fp32 already), the fp32
        // log-softmax output cross-entropy saves; labels are shifted, the logits are not. Its
        // backward: the fp32 gradients of the log-softmax output and of the upcast logits. The
        // logits and their upcast copy are saved by nothing (the head saves its input, the cast
        // and log-softmax need no input for backward) and die with the model's output: measured
        // on an H200, the allocated bytes after forward are the blocks' plus the fp32 log-softmax
        // output alone, and the loss backward's peak is that plus two fp32 gradients
        // (validation/measured_here.csv, `H14`, `H19`).
        let upcast = if w.c < 4 { 4 } else { 0 };
        return LogitsBytes {
            forward: lv * (w.c + softcap + upcast + 4),
            backward: lv * (4 + 4),
            freed_before_backward: lv * (w.c + upcast),
            // the fp32 copy's block takes the first fp32 gradient; the 16-bit logits' block is
            // half the size of either, so the second gradient needs a new one
            stranded: if upcast > 0 { lv * w.c } else { 0 },
        };
    }
    // Models of 2022: a causal LM shifts a contiguous copy of the logits in their dtype; the
    // log-softmax output is fp32 under autocast (cross-entropy is on its fp32 list).
    let shift = if setup.task == Task::CausalLm { w.c } else { 0 };
    let log_softmax = w.f.max(w.c);
    LogitsBytes {
        forward: lv * (w.c + softcap + shift + log_softmax),
        // gradient of the log-softmax output + gradient of the logits
        backward: lv * (log_softmax + w.c),
        ..LogitsBytes::default()
    }
}

/// Remote-code models whose `forward` computes the loss itself instead of transformers'
/// `ForCausalLMLoss`. Qwen v1 (`modeling_qwen.py`, `QWenLMHeadModel.forward`):
/// `shift_logits = lm_logits[..., :-1, :].contiguous()` then `CrossEntropyLoss()` on it.
fn own_shifted_loss(arch: &Arch) -> bool {
    arch.model_type == "qwen"
}

/// Bytes per logit element of such a loss, each term from the code that makes it:
/// - `lm_head` output in the compute dtype (`w.c`), alive in the model's output until the
///   Trainer's `compute_loss` returns, i.e. until just before `backward()`;
/// - the label-shift copy (`.contiguous()`, `w.c`), a local of `forward`, saved by nothing;
/// - cross-entropy's `log_softmax` output, saved for its backward: fp32 under the Trainer's
///   autocast (`bf16=True`/`fp16=True`: log_softmax and nll_loss are on autocast's fp32 list),
///   which first makes an fp32 copy of the shifted logits (4 B, saved by nothing); a DeepSpeed
///   engine runs no autocast, so there the log-softmax and its input stay 16-bit.
///
/// Backward starts from the log-softmax output alone: `nll_loss`'s backward creates its dense
/// gradient and `log_softmax`'s backward the input gradient, both in the log-softmax's dtype
/// (the 16-bit gradients of the shift copy and of the full-size logits come after those are
/// freed). The two 16-bit blocks freed before backward (logits, shift copy) are half the size
/// of an fp32 gradient: the caching allocator keeps them reserved but cannot serve those
/// gradients from them.
fn own_shifted_loss_bytes(lv: u64, w: Widths, deepspeed: bool) -> LogitsBytes {
    let log_softmax = if deepspeed { w.c } else { 4.max(w.c) };
    let upcast = if log_softmax > w.c { log_softmax } else { 0 };
    LogitsBytes {
        forward: lv * (w.c + w.c + upcast + log_softmax),
        backward: lv * 2 * log_softmax,
        freed_before_backward: lv * (w.c + w.c + upcast),
        stranded: if upcast > 0 { lv * 2 * w.c } else { 0 },
    }
}
