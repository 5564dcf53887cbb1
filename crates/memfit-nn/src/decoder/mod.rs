//! Decoder-only language models on burn — Llama, Qwen2, Mistral, Qwen3 (`*ForCausalLM`):
//! configuration, weight layout with transformers' names, the forward pass with LoRA adapters, the
//! masked next-token loss through a chunked head, greedy generation over a KV cache, and
//! checkpoints as transformers and PEFT write them.
//!
//! Two ways to train ([`Method`]):
//! - **full**: every weight is a trained f32 master copy on the host ([`TrainModel::params`]), as
//!   for T5 and BERT; `--freeze` names groups (embeddings, layers, norm, lm_head).
//! - **LoRA**: the base is frozen and held by the model itself as device tensors, in f32 or bf16
//!   ([`BasePrecision`]: bf16 halves its memory); the trained parameters are the adapters' A and B
//!   (f32, as are their gradients and optimizer state). A bf16 base is multiplied with bf16
//!   products (the activations rounded to bf16 for those products, summed in f32), so it is read
//!   where it lies and never widened whole.
//!
//! What a trainer calls: [`DecoderOptions::full`] / [`DecoderOptions::lora`] (with
//! `with_base_precision`, `with_seed`), then [`DecoderModel::init`] (random weights from a config),
//! [`DecoderModel::load`] (a transformers directory) or [`DecoderModel::load_with_adapter`] (a base
//! and a PEFT adapter); the [`TrainModel`] methods (LoRA mode: `save`/`load` write and read the
//! adapter); [`CausalGenerate::generate`]; [`DecoderModel::save_merged`] for `export --merge`.
//!
//! Files: `config` (+ `fields`, `rope`) read config.json; `layout` names every weight; `lora` the
//! adapters; `attention` masks, positions, grouped attention and the KV cache; `forward` the
//! layers; `train` the pass and [`TrainModel`]; `block_ckpt` per-layer checkpointing; `generate`
//! greedy decoding; `adapter` checkpoints (PEFT adapter, merged model).
//!
//! [`TrainModel`]: crate::model::TrainModel
//! [`TrainModel::params`]: crate::model::TrainModel::params
//! [`CausalGenerate::generate`]: crate::model::CausalGenerate::generate

pub mod adapter;
pub mod attention;
pub mod block_ckpt;
pub mod config;
pub mod fields;
pub mod forward;
pub mod generate;
pub mod layout;
pub mod lora;
pub mod rope;
pub mod train;

use std::path::Path;

use burn::prelude::*;
use burn::tensor::{DType, TensorData, bf16};

pub use config::{DecoderConfig, Family};
pub use layout::{DecoderLayout, Group, Proj};
pub use lora::LoraLayout;

pub use crate::layers::lora::LoraSettings;

use crate::ModelError;
use crate::layers::grad_sink::block_params;
use crate::layers::params;
use crate::weights::{HfWeights, LoadReport};

/// How the base is trained.
#[derive(Debug, Clone, PartialEq)]
pub enum Method {
    /// Every weight trains (less the frozen groups).
    Full,
    /// The base is frozen; adapters on `targets` train.
    Lora {
        settings: LoraSettings,
        targets: Vec<Proj>,
    },
}

/// The dtype the frozen base is held in under LoRA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BasePrecision {
    #[default]
    F32,
    /// Half the memory; the weights rounded to bf16 once, as loaded.
    Bf16,
}

impl BasePrecision {
    pub fn dtype(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::Bf16 => DType::BF16,
        }
    }
}

/// How a model is built: method, base precision, seed (random weights and fresh adapters) and
/// the device the frozen base lives on.
#[derive(Debug, Clone)]
pub struct DecoderOptions {
    pub method: Method,
    pub base_precision: BasePrecision,
    pub seed: u64,
    pub device: Device,
}

impl DecoderOptions {
    /// Full training, f32, on the CPU.
    pub fn full() -> Self {
        Self {
            method: Method::Full,
            base_precision: BasePrecision::F32,
            seed: 0,
            device: Device::flex(),
        }
    }

    /// LoRA on the projections `targets` names (see [`lora::parse_targets`]).
    pub fn lora(settings: LoraSettings, targets: &[String]) -> Result<Self, ModelError> {
        settings.validate()?;
        Ok(Self {
            method: Method::Lora {
                settings,
                targets: lora::parse_targets(targets)?,
            },
            ..Self::full()
        })
    }

    pub fn with_base_precision(self, base_precision: BasePrecision) -> Self {
        Self {
            base_precision,
            ..self
        }
    }

    pub fn with_seed(self, seed: u64) -> Self {
        Self { seed, ..self }
    }

    /// The frozen base on `device` (the engine's).
    pub fn on(self, device: Device) -> Self {
        Self { device, ..self }
    }

    fn check(&self) -> Result<(), ModelError> {
        match (&self.method, self.base_precision) {
            (Method::Full, BasePrecision::Bf16) => Err(ModelError::Input(
                "--base-precision bf16 needs --method lora: full training updates the base's f32 \
                 master weights"
                    .into(),
            )),
            _ => Ok(()),
        }
    }
}

/// The weights a model holds, by method.
#[derive(Clone)]
enum State {
    Full {
        weights: Vec<Vec<f32>>,
    },
    Lora {
        /// The frozen base on its device, by layout index.
        base: Vec<Tensor<2>>,
        layout: LoraLayout,
        /// A and B of every adapter, f32, in memfit's layout.
        weights: Vec<Vec<f32>>,
    },
}

/// A decoder: configuration, layout and weights.
#[derive(Clone)]
pub struct DecoderModel {
    pub config: DecoderConfig,
    pub layout: DecoderLayout,
    /// Where the base came from (adapter_config.json's `base_model_name_or_path`).
    pub base_name: Option<String>,
    pub base_precision: BasePrecision,
    state: State,
}

impl std::fmt::Debug for DecoderModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecoderModel")
            .field("architecture", &self.config.architecture())
            .field("base_name", &self.base_name)
            .field("method", &self.method())
            .finish()
    }
}

impl DecoderModel {
    /// Random weights as transformers initialises them (and fresh adapters under LoRA), the same
    /// values as [`params::init_all`] draws.
    pub fn init(config: DecoderConfig, options: &DecoderOptions) -> Result<Self, ModelError> {
        options.check()?;
        let layout = DecoderLayout::new(&config);
        // Drawn as consumed: under LoRA one f32 weight at a time exists beside the base.
        let specs = layout.specs.clone();
        let weights = specs
            .iter()
            .enumerate()
            .map(|(i, spec)| Ok(spec.init.values(spec.kind, options.seed, i)));
        Self::assemble(config, layout, weights, options, None)
    }

    /// Reads `config.json` and the weights from `dir` (one `model.safetensors` or shards,
    /// f32/f16/bf16): a transformers model directory or a memfit checkpoint. Under LoRA each
    /// weight goes to the device in the base precision as it is read, so loading holds one f32
    /// tensor at a time beside the base. Returns what the files held beyond the model.
    pub fn load(dir: &Path, options: &DecoderOptions) -> Result<(Self, LoadReport), ModelError> {
        options.check()?;
        let config = DecoderConfig::from_file(&dir.join("config.json"))?;
        let layout = DecoderLayout::new(&config);
        let mut source = HfWeights::open_dir(dir)?;
        let reading = layout.clone();
        let weights = read_weights(&reading, &mut source);
        let name = Some(dir.display().to_string());
        let model = Self::assemble(config, layout, weights, options, name)?;
        let unused = check_unused(&source, &model.layout)?;
        Ok((
            model,
            LoadReport {
                initialised: Vec::new(),
                unused,
            },
        ))
    }

    /// The model from its weights in layout order (read and consumed one at a time under LoRA).
    fn assemble(
        config: DecoderConfig,
        layout: DecoderLayout,
        weights: impl Iterator<Item = Result<Vec<f32>, ModelError>>,
        options: &DecoderOptions,
        base_name: Option<String>,
    ) -> Result<Self, ModelError> {
        let state = match &options.method {
            Method::Full => State::Full {
                weights: weights.collect::<Result<_, _>>()?,
            },
            Method::Lora { settings, targets } => {
                let lora = LoraLayout::new(&config, *settings, targets);
                let base = layout
                    .specs
                    .iter()
                    .zip(weights)
                    .map(|(spec, w)| {
                        let shape = spec.kind.shape();
                        Ok(device_tensor(
                            w?,
                            shape,
                            options.base_precision,
                            &options.device,
                        ))
                    })
                    .collect::<Result<_, ModelError>>()?;
                State::Lora {
                    base,
                    weights: params::init_all(&lora.specs, options.seed),
                    layout: lora,
                }
            }
        };
        Ok(Self {
            config,
            layout,
            base_name,
            base_precision: options.base_precision,
            state,
        })
    }

    pub fn method(&self) -> Method {
        match &self.state {
            State::Full { .. } => Method::Full,
            State::Lora { layout, .. } => Method::Lora {
                settings: layout.settings,
                targets: layout.targets.clone(),
            },
        }
    }

    /// The adapters' layout under LoRA.
    pub fn lora_layout(&self) -> Option<&LoraLayout> {
        match &self.state {
            State::Full { .. } => None,
            State::Lora { layout, .. } => Some(layout),
        }
    }

    /// The frozen base on its device under LoRA.
    pub fn frozen_base(&self) -> Option<&[Tensor<2>]> {
        match &self.state {
            State::Full { .. } => None,
            State::Lora { base, .. } => Some(base),
        }
    }

    /// The trained parameters: every weight (full) or the adapters' A and B (LoRA).
    pub fn trained(&self) -> &[Vec<f32>] {
        match &self.state {
            State::Full { weights } | State::Lora { weights, .. } => weights,
        }
    }

    fn trained_mut(&mut self) -> &mut Vec<Vec<f32>> {
        match &mut self.state {
            State::Full { weights } | State::Lora { weights, .. } => weights,
        }
    }

    /// The layout of [`Self::trained`].
    pub fn trained_specs(&self) -> &[layout::ParamSpec] {
        match &self.state {
            State::Full { .. } => &self.layout.specs,
            State::Lora { layout, .. } => &layout.specs,
        }
    }

    /// The trained parameters final once the head's backward is done (the final norm and an
    /// untied LM head; none under LoRA, whose adapters are all in the layers).
    pub fn head_params(&self) -> Vec<usize> {
        match &self.state {
            State::Full { .. } => std::iter::once(self.layout.norm)
                .chain(self.layout.lm_head)
                .collect(),
            State::Lora { .. } => Vec::new(),
        }
    }

    /// Each layer's trained parameters (its weights, or its LoRA adapters), final once that
    /// layer's backward is done.
    pub fn layer_params(&self) -> Vec<Vec<usize>> {
        let names: Vec<&str> = self
            .trained_specs()
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        let layers = self.layout.layers.len();
        block_params(&names, layers, |i| format!("model.layers.{i}."), &[])
    }

    /// [`Self::trained`] uploaded to `device` as `dtype`, untracked: the parameters a pass reads.
    pub fn tensors(&self, device: &Device, dtype: DType) -> Vec<Tensor<2>> {
        params::upload(self.trained_specs(), self.trained(), device, dtype)
    }

    /// Base weight `index` (layout order) as host f32 values in memfit's layout (a bf16 base
    /// widened): the full model is written one weight at a time from these.
    pub fn base_weight(&self, index: usize) -> Result<Vec<f32>, ModelError> {
        match &self.state {
            State::Full { weights } => Ok(weights[index].clone()),
            State::Lora { base, .. } => crate::layers::host::to_f32_vec(base[index].clone()),
        }
    }
}

/// Every weight of `layout` from `source`, in memfit's layout, read as the iterator is consumed.
fn read_weights<'a>(
    layout: &'a DecoderLayout,
    source: &'a mut HfWeights,
) -> impl Iterator<Item = Result<Vec<f32>, ModelError>> + 'a {
    layout.specs.iter().map(|spec| {
        let values = source.take_shaped(&spec.name, &spec.kind.hf_shape())?;
        Ok(spec.kind.from_hf(values))
    })
}

/// A host buffer as a device tensor of `shape` in the base precision.
fn device_tensor(
    values: Vec<f32>,
    shape: [usize; 2],
    precision: BasePrecision,
    device: &Device,
) -> Tensor<2> {
    let data = match precision {
        BasePrecision::F32 => TensorData::new(values, shape),
        BasePrecision::Bf16 => {
            let narrow: Vec<bf16> = values.into_iter().map(bf16::from_f32).collect();
            TensorData::new(narrow, shape)
        }
    };
    Tensor::from_data(data, (device, precision.dtype()))
}

/// The tensors of `source` the layout did not take: a tied head's copy and the rotary buffer older
/// checkpoints saved are reported; anything else is an error naming it.
fn check_unused(source: &HfWeights, layout: &DecoderLayout) -> Result<Vec<String>, ModelError> {
    let unused = source.untaken();
    let expected = |name: &str| {
        (name == "lm_head.weight" && layout.lm_head.is_none())
            || name.ends_with("rotary_emb.inv_freq")
    };
    match unused.iter().find(|n| !expected(n)) {
        Some(extra) => Err(ModelError::Format(format!(
            "{}: tensor {extra} does not belong to this decoder config",
            source.source().display()
        ))),
        None => Ok(unused),
    }
}
