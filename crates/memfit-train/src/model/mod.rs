//! T5 on burn: configuration, parameter layout with transformers' names, the forward pass, the loss,
//! and weights in Hugging Face safetensors.
//!
//! Parameters live on the host as f32 master copies ([`T5Model::weights`], in [`T5Layout`] order);
//! each forward pass uploads them to the device in its float dtype (f32 or bf16). This keeps the
//! optimizer exact and backend-independent, makes frozen modules simply "not tracked", and ties the
//! LM head to the embedding by using the same tensor twice.

pub mod attention_core;
pub mod block_ckpt;
pub mod bucket;
pub mod chunked_head;
pub mod config;
pub mod dropout;
pub mod dropout_op;
pub mod embedding_leaf;
pub mod flex_op;
pub mod flex_values;
pub mod flops;
pub mod fused_rms_norm;
pub mod gemm_bf16;
pub mod gemm_f32;
pub mod grad_sink;
pub mod layout;
pub mod linear_op;
pub mod loss;
pub mod t5;
pub mod tensor_file;
#[cfg(test)]
mod test_tensors;
pub mod xent;

use std::borrow::Cow;
use std::path::Path;

use burn::prelude::*;
use burn::tensor::{DType, TensorData};

pub use config::T5Config;
pub use layout::{Group, Kind, T5Layout};

use dropout::SplitMix64;
use layout::Init;
use tensor_file::{NamedTensor, read_f32, write_f32};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("invalid T5 config: {0}")]
    Config(String),
    #[error("{0}")]
    Io(String),
    #[error("bad checkpoint: {0}")]
    Format(String),
    #[error("bad input: {0}")]
    Input(String),
}

/// A T5 model's configuration and its f32 master weights.
#[derive(Debug, Clone)]
pub struct T5Model {
    pub config: T5Config,
    pub layout: T5Layout,
    /// One row-major buffer per parameter, in memfit's memory layout ([`Kind::shape`]).
    pub weights: Vec<Vec<f32>>,
}

impl T5Model {
    /// Random initialisation as transformers does it (normal with the per-module std of
    /// `T5PreTrainedModel._init_weights`, norms at 1), drawn from a seeded generator.
    pub fn init(config: T5Config, seed: u64) -> Self {
        let layout = T5Layout::new(&config);
        let weights = layout
            .specs
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                let n = spec.kind.numel();
                match spec.init {
                    Init::Ones => vec![1.0; n],
                    Init::Normal { std } => {
                        // One stream per parameter, so adding a parameter does not shift the others.
                        let mut rng =
                            SplitMix64::new(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                        (0..n).map(|_| (rng.next_normal() * std) as f32).collect()
                    }
                }
            })
            .collect();
        Self {
            config,
            layout,
            weights,
        }
    }

    /// Total and trainable parameter counts (the tied embedding counted once).
    pub fn param_counts(&self, frozen: &[Group]) -> (u64, u64) {
        self.layout.param_counts(frozen)
    }

    /// Uploads every parameter to `device` as `dtype`, untracked.
    pub fn tensors(&self, device: &Device, dtype: DType) -> Vec<Tensor<2>> {
        self.layout
            .specs
            .iter()
            .zip(&self.weights)
            .map(|(spec, w)| {
                Tensor::from_data(
                    TensorData::new(w.clone(), spec.kind.shape()),
                    (device, dtype),
                )
            })
            .collect()
    }

    /// Weights in transformers' names and shapes (`[out, in]` for linear layers).
    pub fn hf_tensors(&self) -> Vec<NamedTensor<'_>> {
        self.layout
            .specs
            .iter()
            .zip(&self.weights)
            .map(|(spec, w)| NamedTensor {
                name: spec.name.clone(),
                shape: spec.kind.hf_shape(),
                values: Cow::Borrowed(w.as_slice()),
                // transposed as it is written, one tensor at a time
                transpose: match spec.kind {
                    Kind::Linear { d_in, d_out } => Some([d_in, d_out]),
                    _ => None,
                },
            })
            .collect()
    }

    /// Writes `config.json` and `model.safetensors` into `dir`.
    pub fn save(&self, dir: &Path) -> Result<(), ModelError> {
        let config = serde_json::to_string_pretty(&self.config.to_json())
            .map_err(|e| ModelError::Io(format!("config.json: {e}")))?;
        write_atomic(&dir.join("config.json"), config.as_bytes())?;
        let metadata = [("format".to_string(), "pt".to_string())]
            .into_iter()
            .collect();
        write_f32(
            &dir.join("model.safetensors"),
            &self.hf_tensors(),
            Some(metadata),
        )
    }

    /// Reads `config.json` and `model.safetensors` from `dir` (a memfit or transformers checkpoint).
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let config = T5Config::from_file(&dir.join("config.json"))?;
        let mut model = Self {
            layout: T5Layout::new(&config),
            config,
            weights: Vec::new(),
        };
        model.load_weights(&dir.join("model.safetensors"))?;
        Ok(model)
    }

    /// Replaces the weights with those of a safetensors file with transformers' names. Extra names
    /// transformers may write for tied weights (`encoder.embed_tokens.weight`, …) are ignored.
    pub fn load_weights(&mut self, path: &Path) -> Result<(), ModelError> {
        let (mut tensors, _) = read_f32(path)?;
        let mut weights = Vec::with_capacity(self.layout.specs.len());
        for spec in &self.layout.specs {
            let t = tensors.remove(&spec.name).ok_or_else(|| {
                ModelError::Format(format!(
                    "{}: tensor {} is missing",
                    path.display(),
                    spec.name
                ))
            })?;
            let want = spec.kind.hf_shape();
            if t.shape != want {
                return Err(ModelError::Format(format!(
                    "{}: tensor {} has shape {:?}, the config needs {want:?}",
                    path.display(),
                    spec.name,
                    t.shape
                )));
            }
            weights.push(match spec.kind {
                Kind::Linear { d_in, d_out } => transpose(&t.values, d_out, d_in),
                _ => t.values,
            });
        }
        const TIED_ALIASES: [&str; 3] = [
            "encoder.embed_tokens.weight",
            "decoder.embed_tokens.weight",
            "lm_head.weight",
        ];
        if let Some(extra) = tensors.keys().find(|k| !TIED_ALIASES.contains(&k.as_str())) {
            return Err(ModelError::Format(format!(
                "{}: tensor {extra} does not belong to this T5 config",
                path.display()
            )));
        }
        self.weights = weights;
        Ok(())
    }
}

/// `[rows, cols]` → `[cols, rows]`.
pub fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; values.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = values[r * cols + c];
        }
    }
    out
}

/// Writes `bytes` to a sibling temporary file and renames it over `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ModelError> {
    let tmp = path.with_extension("tmp-write");
    std::fs::write(&tmp, bytes)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|e| ModelError::Io(format!("{}: {e}", path.display())))
}
