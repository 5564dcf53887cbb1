//! T5 on burn: configuration, parameter layout with transformers' names, the forward pass, the loss,
//! and weights in Hugging Face safetensors.
//!
//! Parameters live on the host as f32 master copies ([`T5Model::weights`], in [`T5Layout`] order);
//! each forward pass uploads them to the device in its float dtype (f32 or bf16). This keeps the
//! optimizer exact and backend-independent, makes frozen modules simply "not tracked", and ties the
//! LM head to the embedding by using the same tensor twice.

pub mod block_ckpt;
pub mod bucket;
pub mod chunked_head;
pub mod config;
pub mod embedding_leaf;
pub mod flops;
pub mod forward;
pub mod layout;
pub mod train;

use std::path::Path;

use burn::prelude::*;
use burn::tensor::DType;

pub use config::T5Config;
pub use layout::{Group, Kind, T5Layout};

use crate::ModelError;
use crate::layers::params;
use crate::weights::{HfWeights, LoadReport, NamedTensor, save_hf_dir};

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
        let weights = params::init_all(&layout.specs, seed);
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
        params::upload(&self.layout.specs, &self.weights, device, dtype)
    }

    /// Weights in transformers' names and shapes (`[out, in]` for linear layers).
    pub fn hf_tensors(&self) -> Vec<NamedTensor<'_>> {
        params::hf_tensors(&self.layout.specs, &self.weights)
    }

    /// Writes `config.json` and `model.safetensors` into `dir`.
    pub fn save(&self, dir: &Path) -> Result<(), ModelError> {
        save_hf_dir(dir, &self.config.to_json(), &self.hf_tensors())
    }

    /// Reads `config.json` and the weights from `dir`: a memfit checkpoint, or a transformers
    /// directory (one `model.safetensors` or shards, f32/f16/bf16). Returns what was left unused.
    pub fn load(dir: &Path) -> Result<(Self, LoadReport), ModelError> {
        let config = T5Config::from_file(&dir.join("config.json"))?;
        let mut model = Self {
            layout: T5Layout::new(&config),
            config,
            weights: Vec::new(),
        };
        let report = model.load_weights(&mut HfWeights::open_dir(dir)?)?;
        Ok((model, report))
    }

    /// Replaces every weight with the tensor of the same transformers name. The copies transformers
    /// may write of the tied embedding (`encoder.embed_tokens.weight`, …) are reported as unused; any
    /// other tensor the layout does not know is an error naming it.
    pub fn load_weights(&mut self, source: &mut HfWeights) -> Result<LoadReport, ModelError> {
        let mut weights = Vec::with_capacity(self.layout.specs.len());
        for spec in &self.layout.specs {
            let values = source.take_shaped(&spec.name, &spec.kind.hf_shape())?;
            weights.push(spec.kind.from_hf(values));
        }
        const TIED_ALIASES: [&str; 3] = [
            "encoder.embed_tokens.weight",
            "decoder.embed_tokens.weight",
            "lm_head.weight",
        ];
        let unused = source.untaken();
        if let Some(extra) = unused.iter().find(|k| !TIED_ALIASES.contains(&k.as_str())) {
            return Err(ModelError::Format(format!(
                "{}: tensor {extra} does not belong to this T5 config",
                source.source().display()
            )));
        }
        self.weights = weights;
        Ok(LoadReport {
            initialised: Vec::new(),
            unused,
        })
    }
}
