//! Evaluation as its own phase of memfit's trainer on the CPU (issue 29: a run planned at 0.15 GiB
//! peaked at 0.57 GiB in validation). An evaluation runs after an optimizer step, when the gradients
//! are gone: the model states, the weights uploaded once in the compute dtype for evaluation (a copy,
//! cached until the next micro-batch; under LoRA the frozen base is used as it is), and one forward
//! pass of `eval_batch` rows without an autodiff graph — one block's tensors at a time (with what the
//! allocator keeps of the block before, [`HostFit::recompute_retained`]), a seq2seq encoder's output
//! while the decoder runs, the attention's row statistics, one chunk of the head's logits (the
//! validation loss runs the head in chunks as training does), and generation's KV cache.

use super::{HostFit, attention_bytes, head_logits};
use crate::Task;
use crate::arch::{Activation, Arch};
use crate::memory::setup::{Method, Precision, Setup};

/// Bytes of one evaluation forward pass of `batch` rows beside the model states.
pub fn eval_forward_bytes(arch: &Arch, setup: &Setup, fit: &HostFit, batch: u64) -> u64 {
    let cb = match setup.precision {
        Precision::Bf16 | Precision::Fp16 => 2,
        _ => 4,
    };
    let (d, f, i) = (arch.hidden, arch.ffn, arch.heads * arch.head_dim);
    let unfused = u64::from(arch.activation != Activation::Relu || arch.gated_ffn);
    // One block's live tensors per token: residual, norm output, block output, q/k/v/context, FFN.
    let block_per_token = cb * (3 * d + 4 * i + (1 + unfused) * f);
    let seq2seq = setup.task == Task::Seq2seq;
    let (src, tgt) = (setup.seq, if seq2seq { setup.tgt_seq } else { 0 });
    let tokens = batch * src.max(tgt);
    let block = (fit.recompute_retained * (block_per_token * tokens) as f64) as u64;
    let encoder_output = if seq2seq { cb * batch * src * d } else { 0 };
    let rows = batch * arch.heads * (src + tgt);
    let (head_rows, classes) = match setup.task {
        Task::Classification => (batch, 2),
        Task::Seq2seq => (batch * tgt, arch.vocab),
        _ => (batch * src, arch.vocab),
    };
    // Generation keeps K and V per decoder layer: self-attention over the generated tokens and,
    // for seq2seq, cross-attention over the source.
    let kv_cache = match setup.task {
        Task::Classification => 0,
        _ => 2 * arch.decoder_layers * batch * (src + tgt) * i * cb,
    };
    block
        + encoder_output
        + attention_bytes(rows)
        + head_logits(fit, head_rows, classes, d)
        + kv_cache
}

/// The weights evaluation uploads in the compute dtype (none under LoRA: the base is used as held).
pub fn eval_weight_copy(arch: &Arch, setup: &Setup) -> u64 {
    let lora = matches!(setup.method, Method::Lora | Method::Qlora);
    let cb = match setup.precision {
        Precision::Bf16 | Precision::Fp16 => 2,
        _ => 4,
    };
    if lora { 0 } else { cb * arch.params_total() }
}

/// The evaluation phase's predicted peak (the estimate's `eval_rss_bytes`) at `batch` rows.
pub fn eval_phase(arch: &Arch, setup: &Setup, batch: u64) -> u64 {
    let at = Setup {
        batch,
        ..setup.clone()
    };
    super::host(arch, &at).eval_rss_bytes
}

/// The largest evaluation batch, the training micro-batch (`setup.batch`) or a halving of it,
/// whose phase (the estimate's `eval_rss_bytes`: states, the weight copy, one forward pass) stays
/// at or below `limit`; 1 when none does.
pub fn eval_batch_within(arch: &Arch, setup: &Setup, limit: u64) -> u64 {
    let mut batch = setup.batch.max(1);
    while batch > 1 && eval_phase(arch, setup, batch) > limit {
        batch /= 2;
    }
    batch
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::memfit_host::{FITTED, host};
    use crate::memory::setup::{Device, Runtime};

    /// A tiny T5 with a ChatLM-sized vocabulary (the case), seq 128 + 128.
    fn tiny_t5(batch: u64) -> (Arch, Setup) {
        let config = serde_json::json!({
            "model_type": "t5", "vocab_size": 29298, "d_model": 256, "d_kv": 32, "d_ff": 1024,
            "num_layers": 4, "num_heads": 8
        });
        let arch = crate::arch::config::from_value("t5.json", &config, "tiny").unwrap();
        let mut setup = Setup::new(&arch);
        setup.task = Task::Seq2seq;
        (setup.batch, setup.seq, setup.tgt_seq) = (batch, 128, 128);
        (setup.device, setup.runtime) = (Device::Cpu, Runtime::Memfit);
        (arch, setup)
    }

    #[test]
    fn the_eval_phase_grows_with_the_eval_batch_and_is_reported() {
        let (arch, setup) = tiny_t5(16);
        let sizes: Vec<u64> = [1, 2, 8, 32]
            .iter()
            .map(|&b| eval_forward_bytes(&arch, &setup, &FITTED, b))
            .collect();
        assert!(sizes.windows(2).all(|w| w[0] < w[1]), "{sizes:?}");
        let estimate = host(&arch, &setup);
        let states: u64 = estimate.components[..4].iter().map(|c| c.bytes).sum();
        assert_eq!(
            estimate.eval_rss_bytes,
            states
                + eval_weight_copy(&arch, &setup)
                + eval_forward_bytes(&arch, &setup, &FITTED, 16)
        );
    }

    #[test]
    fn the_eval_batch_shrinks_until_the_phase_fits() {
        let (arch, setup) = tiny_t5(16);
        let phase = |b| eval_phase(&arch, &setup, b);
        // Room for the whole batch: kept.
        assert_eq!(eval_batch_within(&arch, &setup, phase(16)), 16);
        // Room for a quarter of it: halved twice, and the result fits.
        let limit = phase(4);
        assert_eq!(eval_batch_within(&arch, &setup, limit), 4);
        assert_eq!(eval_batch_within(&arch, &setup, limit - 1), 2);
        // Nothing fits: one row at a time.
        assert_eq!(eval_batch_within(&arch, &setup, 1), 1);
    }
}
