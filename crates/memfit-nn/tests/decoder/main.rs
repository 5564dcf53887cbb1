//! The decoder family end to end: parity with transformers and PEFT on committed fixtures
//! (`scripts/decoder_reference.py`), LoRA's gradients, adapters and merges, the masked loss and
//! per-layer checkpointing, and generation over the KV cache.

mod counts;
mod generation;
mod lora;
mod parity;
#[path = "../support/torch_save.rs"]
mod torch_save;
mod training;

use std::path::{Path, PathBuf};

use burn::prelude::*;
use burn::tensor::DType;
use memfit_nn::ModelError;
use memfit_nn::batch::TokenRows;
use memfit_nn::decoder::{DecoderConfig, DecoderModel, DecoderOptions};
use memfit_nn::layers::grad_sink::GradTarget;
use serde_json::{Value, json};

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A tiny config of `model_type` made here: GQA 2:1, two layers.
pub fn tiny(model_type: &str, extra: Value) -> DecoderConfig {
    let mut v = json!({
        "model_type": model_type, "vocab_size": 30, "hidden_size": 16, "intermediate_size": 24,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 64, "initializer_range": 0.3, "pad_token_id": 0
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    DecoderConfig::from_json(&v).unwrap()
}

/// Every trained parameter of `model` drawn away from its init (so B ≠ 0, biases and norms
/// generic), deterministically.
pub fn wiggle(model: &mut DecoderModel) {
    use memfit_nn::model::TrainModel;
    for (i, w) in model.params_mut().iter_mut().enumerate() {
        for (j, x) in w.iter_mut().enumerate() {
            *x += (((i * 7919 + j * 104_729) % 1000) as f32 / 1000.0 - 0.5) * 0.4;
        }
    }
}

/// Padded rows: `rows[i]` followed (right) or preceded (left) by padding to `len`.
pub fn rows(rows: &[(&[u32], usize)], len: usize) -> TokenRows {
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    for (tokens, left_pad) in rows {
        let right = len - tokens.len() - left_pad;
        ids.extend(std::iter::repeat_n(0, *left_pad).chain(tokens.iter().copied()));
        ids.extend(std::iter::repeat_n(0, right));
        mask.extend(std::iter::repeat_n(false, *left_pad));
        mask.extend(std::iter::repeat_n(true, tokens.len()));
        mask.extend(std::iter::repeat_n(false, right));
    }
    TokenRows {
        batch: rows.len(),
        len,
        ids,
        mask,
    }
}

/// The parameters of `model` on the CPU in f32, untracked.
pub fn params(model: &DecoderModel) -> Vec<Tensor<2>> {
    model.tensors(&Device::flex(), DType::F32)
}

/// Collects a micro-batch's gradients per parameter, as a trainer's accumulator does.
pub struct Grads(pub Vec<Vec<f32>>);

impl Grads {
    pub fn for_model(model: &DecoderModel) -> Self {
        use memfit_nn::model::TrainModel;
        Self(model.params().iter().map(|p| vec![0.0; p.len()]).collect())
    }
}

fn host(t: Tensor<2>) -> Vec<f32> {
    t.cast(DType::F32).into_data().try_to_vec::<f32>().unwrap()
}

impl GradTarget for Grads {
    fn parameter(&mut self, index: usize, grad: Tensor<2>) -> Result<(), ModelError> {
        for (a, g) in self.0[index].iter_mut().zip(host(grad)) {
            *a += g;
        }
        Ok(())
    }

    fn rows(&mut self, index: usize, ids: &[usize], grad: Tensor<2>) -> Result<(), ModelError> {
        let [n, d] = grad.dims();
        let g = host(grad);
        for (r, &id) in ids.iter().enumerate().take(n) {
            for c in 0..d {
                self.0[index][id * d + c] += g[r * d + c];
            }
        }
        Ok(())
    }
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Largest difference relative to the reference's scale (its largest magnitude, at least 1e-3).
pub fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(1e-3f32, |m, x| m.max(x.abs()));
    max_abs_diff(a, b) / scale
}

pub fn full() -> DecoderOptions {
    DecoderOptions::full()
}
