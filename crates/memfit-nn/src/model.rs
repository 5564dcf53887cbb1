//! What a model family implements so that a trainer can train it without knowing the family.
//!
//! A family keeps the parameters it trains as f32 master copies on the host, one row-major buffer
//! each ([`TrainModel::params`]); the trainer owns the optimizer and the accumulated gradients, lends
//! the buffers to the device for a micro-batch and gets them back. The family computes the forward
//! and backward pass of a micro-batch ([`TrainModel::accumulate`]) and hands each trainable
//! parameter's gradient to a [`GradTarget`] as it is produced. What the family holds beyond its
//! trained parameters (a frozen base in bf16 under LoRA, say) is its own business.
//!
//! The capabilities a task needs on top of training are separate traits: [`Seq2SeqGenerate`],
//! [`SequenceClassifier`], [`CausalGenerate`].

use std::path::Path;

use burn::prelude::*;
use burn::tensor::DType;
use serde::{Deserialize, Serialize};

use crate::ModelError;
use crate::decoding::GenerateConfig;
use crate::layers::grad_sink::GradTarget;

/// Floating-point precision of the activations. Master weights, accumulated gradients and
/// optimizer state stay f32 on the host in both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Precision {
    #[default]
    Fp32,
    /// bf16 activations (no loss scaling needed). On flex the weights stay f32 (the master copies,
    /// lent) and the hand-written products multiply bf16-rounded operands with f32 sums; elsewhere
    /// the weights are uploaded as bf16.
    Bf16,
}

impl Precision {
    pub fn dtype(self) -> DType {
        match self {
            Precision::Fp32 => DType::F32,
            Precision::Bf16 => DType::BF16,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
        }
    }
}

/// How one training pass computes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pass {
    /// Seeds every random draw of the micro-batch (dropout), so a resumed run draws what an
    /// uninterrupted one would have.
    pub seed: u64,
    /// The loss is multiplied by this exactly once before backward (the micro-batch's share of the
    /// step).
    pub loss_scale: f64,
    pub precision: Precision,
    /// Per-block gradient checkpointing: keep each block's input, recompute the block in backward.
    pub grad_ckpt: bool,
}

/// One trained parameter as an optimizer sees it: its Hugging Face name and shape, and whether
/// memory holds the transpose of that layout (linear weights are stored `[in, out]`).
#[derive(Debug, Clone, PartialEq)]
pub struct ParamShape {
    pub name: String,
    /// Shape as transformers stores it (1-D or 2-D).
    pub hf_shape: Vec<usize>,
    /// Memory holds `[hf_cols, hf_rows]` instead of `[hf_rows, hf_cols]`.
    pub transposed: bool,
    /// The 2-D shape of the buffer in memory (what a device tensor of it is).
    pub dims: [usize; 2],
}

impl ParamShape {
    pub fn numel(&self) -> usize {
        self.dims[0] * self.dims[1]
    }
}

/// A model a trainer can train: its trained parameters, one micro-batch's loss and gradients, and
/// its checkpoint directory.
pub trait TrainModel: Send + Sync {
    /// One micro-batch, as the family reads it.
    type Batch: Sync + Send;

    /// A short name for messages (`T5ForConditionalGeneration`, `BertForSequenceClassification`).
    fn architecture(&self) -> String;

    /// The parameters the optimizer updates, f32, in memfit's memory layout.
    fn params(&self) -> &[Vec<f32>];
    fn params_mut(&mut self) -> &mut [Vec<f32>];
    /// Shapes and names of [`Self::params`], in the same order.
    fn param_shapes(&self) -> Vec<ParamShape>;

    /// Which of [`Self::params`] train when the groups named in `freeze` are frozen (an unknown
    /// group is an error listing the family's groups).
    fn trainable(&self, freeze: &[String]) -> Result<Vec<bool>, ModelError>;

    /// Every weight of the model, trained or not (tied weights once).
    fn total_params(&self) -> u64;

    /// Model FLOPs of one forward + backward pass over `batch` (the matmuls; no recomputation),
    /// with gradients flowing where `trainable` needs them: for MFU.
    fn training_flops(&self, batch: &Self::Batch, trainable: &[bool]) -> f64;

    /// Checks a batch before it reaches a kernel: shapes, ids within the vocabulary, labels.
    fn check_batch(&self, batch: &Self::Batch) -> Result<(), ModelError>;

    /// Forward and backward pass of one micro-batch over `params` ([`Self::params`] on a device,
    /// untracked). The gradients of the parameters with `trainable[i]`, scaled by
    /// `pass.loss_scale`, go to `target` (indexed as [`Self::params`]) as they are produced.
    /// Returns the unscaled mean loss of the micro-batch.
    fn accumulate(
        &self,
        params: &[Tensor<2>],
        trainable: &[bool],
        batch: &Self::Batch,
        pass: &Pass,
        target: &mut dyn GradTarget,
    ) -> Result<f32, ModelError>;

    /// Mean loss of a batch without dropout or gradients.
    fn eval_loss(
        &self,
        params: &[Tensor<2>],
        batch: &Self::Batch,
        precision: Precision,
    ) -> Result<f32, ModelError>;

    /// Writes the directory the family is loaded from (`config.json` and `model.safetensors` with
    /// transformers' names, or an adapter as PEFT writes it) into `dir`, which exists and is empty.
    fn save(&self, dir: &Path) -> Result<(), ModelError>;

    /// Replaces the weights with those in `dir` (written by [`Self::save`]); an error, leaving the
    /// model as it was, when they describe another model.
    fn load(&mut self, dir: &Path) -> Result<(), ModelError>;
}

/// Encoder-decoder generation (greedy, over a KV cache).
pub trait Seq2SeqGenerate: TrainModel {
    /// Greedy generation for each row of `input_ids` (`[batch, src_len]`, masked by `input_mask`);
    /// returns the generated ids without the decoder start token, cut at (and without) EOS.
    fn generate(
        &self,
        params: &[Tensor<2>],
        inputs: &crate::batch::TokenRows,
        config: &GenerateConfig,
        precision: Precision,
    ) -> Result<Vec<Vec<u32>>, ModelError>;
}

/// Sequence classification.
pub trait SequenceClassifier: TrainModel {
    fn num_labels(&self) -> usize;
    /// Label names by id (`id2label`).
    fn labels(&self) -> Vec<String>;
    /// Logits `[batch, num_labels]`, row-major f32, without dropout.
    fn logits(
        &self,
        params: &[Tensor<2>],
        batch: &Self::Batch,
        precision: Precision,
    ) -> Result<Vec<f32>, ModelError>;
}

/// Decoder-only generation (greedy, over a KV cache): the prompts are continued.
pub trait CausalGenerate: TrainModel {
    fn generate(
        &self,
        params: &[Tensor<2>],
        prompts: &[Vec<u32>],
        config: &GenerateConfig,
        precision: Precision,
    ) -> Result<Vec<Vec<u32>>, ModelError>;
}
