//! Logits and loss: vocabulary × output tokens, in the compute dtype, with the copies the loss
//! makes of them and the gradients its backward creates.

use super::activations::Widths;
use super::framework::Framework;
use super::setup::Setup;
use crate::Task;
use crate::arch::Arch;

/// Bytes of the logits and loss of one micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LogitsBytes {
    /// Alive at the end of the forward pass: the logits and what the loss saved.
    pub forward: u64,
    /// Created by the loss backward while the forward's tensors are still alive.
    pub backward: u64,
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
    if setup.task == Task::CausalLm && fw.causal_loss_upcast {
        // ForCausalLMLoss: `logits.float()` (a copy unless they are fp32 already), the fp32
        // log-softmax output cross-entropy saves; labels are shifted, the logits are not. Its
        // backward: the fp32 gradients of the log-softmax output and of the upcast logits.
        let upcast = if w.c < 4 { 4 } else { 0 };
        return LogitsBytes {
            forward: lv * (w.c + softcap + upcast + 4),
            backward: lv * (4 + 4),
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
    }
}
