//! The BERT family on burn — BERT, RoBERTa, XLM-RoBERTa for sequence classification: configuration,
//! parameter layout with transformers' names, the forward pass and loss, and weights in Hugging Face
//! safetensors.
//!
//! As for T5, parameters live on the host as f32 master copies ([`BertModel::weights`], in
//! [`BertLayout`] order) and each forward pass uploads them in its float dtype.

mod block_ckpt;
pub mod config;
pub mod forward;
pub mod layout;
pub mod train;

use std::path::Path;

use burn::prelude::*;
use burn::tensor::DType;

pub use config::{BertConfig, Family};
pub use layout::{BertLayout, Group};

use crate::ModelError;
use crate::layers::params;
use crate::weights::{HfWeights, LoadReport, NamedTensor, save_hf_dir};

/// The seed [`BertModel::load`] initialises a missing head with.
pub const HEAD_SEED: u64 = 0x6865_6164;

/// A BERT-family classifier's configuration and its f32 master weights.
#[derive(Debug, Clone)]
pub struct BertModel {
    pub config: BertConfig,
    pub layout: BertLayout,
    /// One row-major buffer per parameter, in memfit's memory layout
    /// ([`Kind::shape`](crate::layers::params::Kind::shape)).
    pub weights: Vec<Vec<f32>>,
}

impl BertModel {
    /// Random initialisation as transformers does it, drawn from a seeded generator.
    pub fn init(config: BertConfig, seed: u64) -> Self {
        let layout = BertLayout::new(&config);
        let weights = params::init_all(&layout.specs, seed);
        Self {
            config,
            layout,
            weights,
        }
    }

    /// Total and trainable parameter counts.
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

    /// Writes `config.json` (with `architectures`, `id2label`, `label2id`) and `model.safetensors`
    /// into `dir`: the directory `*ForSequenceClassification.from_pretrained` reads.
    pub fn save(&self, dir: &Path) -> Result<(), ModelError> {
        save_hf_dir(dir, &self.config.to_json(), &self.hf_tensors())
    }

    /// [`Self::load_seeded`] with [`HEAD_SEED`].
    pub fn load(dir: &Path) -> Result<(Self, LoadReport), ModelError> {
        Self::load_seeded(dir, HEAD_SEED)
    }

    /// Reads `config.json` and the weights from `dir` (one `model.safetensors` or shards,
    /// f32/f16/bf16): a memfit checkpoint, a transformers classifier, or a pretrained encoder whose
    /// head (absent) is initialised from `seed`.
    pub fn load_seeded(dir: &Path, seed: u64) -> Result<(Self, LoadReport), ModelError> {
        let config = BertConfig::from_file(&dir.join("config.json"))?;
        // No initial weights: loading holds each tensor once (the checkpoint's), never two copies.
        let mut model = Self {
            layout: BertLayout::new(&config),
            config,
            weights: Vec::new(),
        };
        let report = model.load_weights(&mut HfWeights::open_dir(dir)?, seed)?;
        Ok((model, report))
    }

    /// Replaces every weight with the checkpoint's tensor of that transformers name, as
    /// `from_pretrained` finds it: with or without the base model's prefix (`bert.`, `roberta.`:
    /// a checkpoint saved from `BertModel` has none), LayerNorm's `weight`/`bias` also under their
    /// legacy names `gamma`/`beta`. The pooler and classifier may be absent: they are initialised
    /// from `seed` (as [`Self::init`] would) and listed as initialised. Tensors of the pretraining heads and saved
    /// buffers are listed as unused; any other tensor, and a tensor of another shape, is an error
    /// naming it.
    pub fn load_weights(
        &mut self,
        source: &mut HfWeights,
        seed: u64,
    ) -> Result<LoadReport, ModelError> {
        let prefix = format!("{}.", self.config.family.prefix());
        let mut weights = Vec::with_capacity(self.layout.specs.len());
        let mut initialised = Vec::new();
        for (i, spec) in self.layout.specs.iter().enumerate() {
            let found = checkpoint_names(&spec.name, &prefix)
                .into_iter()
                .find(|n| source.shape(n).is_some());
            match found {
                Some(name) => {
                    let values = source.take_shaped(&name, &spec.kind.hf_shape())?;
                    weights.push(spec.kind.from_hf(values));
                }
                None if matches!(spec.group, Group::Pooler | Group::Head) => {
                    initialised.push(spec.name.clone());
                    weights.push(spec.init.values(spec.kind, seed, i));
                }
                None => {
                    return Err(ModelError::Format(format!(
                        "{}: tensor {} is missing",
                        source.source().display(),
                        spec.name
                    )));
                }
            }
        }
        let unused = source.untaken();
        if let Some(extra) = unused.iter().find(|k| !self.expected_unused(k)) {
            return Err(ModelError::Format(format!(
                "{}: tensor {extra} does not belong to this {} config",
                source.source().display(),
                self.config.architecture()
            )));
        }
        self.weights = weights;
        Ok(LoadReport {
            initialised,
            unused,
        })
    }

    /// Tensors a pretrained checkpoint holds that the classifier does not use: the pretraining heads
    /// (BERT's `cls.*`, RoBERTa's `lm_head.*`), RoBERTa's pooler (its classifier has none), and the
    /// position/token-type id buffers older transformers saved.
    fn expected_unused(&self, name: &str) -> bool {
        let prefix = format!("{}.", self.config.family.prefix());
        let base = name.strip_prefix(&prefix).unwrap_or(name);
        let buffer = matches!(
            base,
            "embeddings.position_ids" | "embeddings.token_type_ids"
        );
        buffer
            || match self.config.family {
                Family::Bert => name.starts_with("cls."),
                Family::Roberta => name.starts_with("lm_head.") || base.starts_with("pooler."),
            }
    }
}

/// The names under which transformers finds parameter `name` in a checkpoint, preferred first.
pub(crate) fn checkpoint_names(name: &str, prefix: &str) -> Vec<String> {
    let mut names = vec![name.to_string()];
    if let Some(bare) = name.strip_prefix(prefix) {
        names.push(bare.to_string());
    }
    // transformers' "legacy" renaming (conversion_mapping.py): LayerNorm.gamma/beta → weight/bias.
    let legacy: Vec<String> = names
        .iter()
        .filter_map(|n| {
            n.strip_suffix("LayerNorm.weight")
                .map(|s| format!("{s}LayerNorm.gamma"))
                .or_else(|| {
                    n.strip_suffix("LayerNorm.bias")
                        .map(|s| format!("{s}LayerNorm.beta"))
                })
        })
        .collect();
    names.extend(legacy);
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_names_cover_prefix_and_legacy_norms() {
        let names = checkpoint_names("bert.embeddings.LayerNorm.weight", "bert.");
        assert_eq!(
            names,
            [
                "bert.embeddings.LayerNorm.weight",
                "embeddings.LayerNorm.weight",
                "bert.embeddings.LayerNorm.gamma",
                "embeddings.LayerNorm.gamma"
            ]
        );
        assert_eq!(
            checkpoint_names("classifier.bias", "bert."),
            ["classifier.bias"]
        );
    }
}
