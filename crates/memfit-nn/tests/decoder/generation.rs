//! Greedy generation over the KV cache equals step-by-step full forward passes, for prompts of
//! different lengths in one batch (left-padded), with a sliding window shorter than the sequence.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use memfit_nn::batch::TokenRows;
use memfit_nn::decoder::DecoderModel;
use memfit_nn::decoding::{GenerateConfig, StopSignal, argmax};
use memfit_nn::model::{CausalGenerate, Precision};

use crate::{fixture, full, params};

fn config(max_new_tokens: usize) -> GenerateConfig {
    GenerateConfig {
        max_new_tokens,
        no_repeat_ngram: 0,
        repetition_penalty: 1.0,
        eos_id: 39,
        stop: Vec::new(),
    }
}

/// Greedy continuation of one prompt by a full forward pass over the whole sequence per token.
fn without_cache(model: &DecoderModel, prompt: &[u32], n: usize, eos: u32) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    let vocab = model.config.vocab_size;
    for _ in 0..n {
        let rows = TokenRows {
            batch: 1,
            len: seq.len(),
            ids: seq.clone(),
            mask: vec![true; seq.len()],
        };
        let logits = model
            .logits(&params(model), &rows, Precision::Fp32)
            .unwrap();
        let next = argmax(&logits[(seq.len() - 1) * vocab..]);
        if next == eos {
            break;
        }
        seq.push(next);
    }
    seq[prompt.len()..].to_vec()
}

#[test]
fn the_kv_cache_continues_as_full_passes_do() {
    let prompts = vec![vec![5, 9, 11, 12, 30, 7], vec![7, 8], vec![17, 2, 33, 34]];
    // mistral-tiny's window of 4 is shorter than the sequences; llama-tiny has llama3 RoPE and
    // biases; qwen3-tiny the per-head norms.
    for name in ["mistral-tiny", "llama-tiny", "qwen3-tiny"] {
        let (model, _) = DecoderModel::load(&fixture(name), &full()).unwrap();
        let cached = model
            .generate(&params(&model), &prompts, &config(12), Precision::Fp32)
            .unwrap();
        for (prompt, got) in prompts.iter().zip(&cached) {
            let want = without_cache(&model, prompt, 12, 39);
            assert_eq!(got, &want, "{name}, prompt {prompt:?}");
        }
        assert!(cached.iter().any(|c| c.len() == 12), "{name}: {cached:?}");
    }
}

#[test]
fn a_stop_request_ends_generation_early() {
    let (model, _) = DecoderModel::load(&fixture("llama-tiny"), &full()).unwrap();
    let stop = StopSignal(Arc::new(AtomicBool::new(true)));
    let cfg = GenerateConfig {
        stop: vec![stop],
        ..config(64)
    };
    let out = model
        .generate(&params(&model), &[vec![3, 4]], &cfg, Precision::Fp32)
        .unwrap();
    assert!(out[0].len() <= 1, "{out:?}");
    let e = model
        .generate(&params(&model), &[vec![]], &config(4), Precision::Fp32)
        .unwrap_err()
        .to_string();
    assert!(e.contains("empty"), "{e}");
}
