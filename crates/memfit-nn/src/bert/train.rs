//! The BERT family as a [`TrainModel`] and a [`SequenceClassifier`]: one micro-batch's loss and
//! gradients through burn's autodiff, the validation loss, and the logits.

use std::path::Path;

use burn::prelude::*;

use crate::ModelError;
use crate::batch::ClassificationBatch;
use crate::bert::block_ckpt;
use crate::bert::forward::{BertForward, ClsInputs, Dropouts};
use crate::bert::{BertConfig, BertLayout, BertModel, Group};
use crate::layers::grad_sink::{GradSink, GradTarget, LeafSink, leaves};
use crate::layers::host::{scalar, to_f32_vec};
use crate::layers::params;
use crate::model::{ParamShape, Pass, Precision, SequenceClassifier, TrainModel};
use crate::weights::HfWeights;

/// The groups `--freeze` names for the BERT family.
pub const GROUPS: &str = "embeddings, encoder, pooler, head";

impl BertModel {
    /// The frozen groups named in `freeze`.
    pub fn parse_groups(freeze: &[String]) -> Result<Vec<Group>, ModelError> {
        freeze
            .iter()
            .map(|g| {
                Group::parse(g.trim()).ok_or_else(|| {
                    ModelError::Input(format!(
                        "--freeze {g:?}: the BERT family's groups are {GROUPS}"
                    ))
                })
            })
            .collect()
    }

    fn inputs<'a>(b: &'a ClassificationBatch) -> ClsInputs<'a> {
        ClsInputs {
            ids: &b.input.ids,
            mask: &b.input.mask,
            token_types: b.token_types.as_deref(),
            batch: b.input.batch,
            len: b.input.len,
        }
    }
}

impl TrainModel for BertModel {
    type Batch = ClassificationBatch;

    fn architecture(&self) -> String {
        self.config.architecture().into()
    }

    fn params(&self) -> &[Vec<f32>] {
        &self.weights
    }

    fn params_mut(&mut self) -> &mut [Vec<f32>] {
        &mut self.weights
    }

    fn param_shapes(&self) -> Vec<ParamShape> {
        params::shapes(&self.layout.specs)
    }

    fn trainable(&self, freeze: &[String]) -> Result<Vec<bool>, ModelError> {
        let groups = Self::parse_groups(freeze)?;
        Ok((0..self.layout.specs.len())
            .map(|i| self.layout.trainable(i, &groups))
            .collect())
    }

    fn total_params(&self) -> u64 {
        self.layout.param_counts(&[]).0
    }

    /// Per token and layer: q, k, v, o (4·d²), scores and context (2·t·d), the feed-forward
    /// (2·d·f); then the pooler and classifier per row. ×2 FLOPs per multiply-add, ×3 with the
    /// backward pass (the embedding lookups are not matmuls).
    fn training_flops(&self, b: &ClassificationBatch, _trainable: &[bool]) -> f64 {
        let c = &self.config;
        let (d, f, t) = (
            c.hidden_size as f64,
            c.intermediate_size as f64,
            b.input.len as f64,
        );
        let per_token = c.num_hidden_layers as f64 * (4.0 * d * d + 2.0 * t * d + 2.0 * d * f);
        let per_row = t * per_token + d * d + d * c.num_labels() as f64;
        3.0 * 2.0 * b.input.batch as f64 * per_row
    }

    fn check_batch(&self, b: &ClassificationBatch) -> Result<(), ModelError> {
        b.input.check_shape("input")?;
        let n = self.config.num_labels();
        if b.labels.len() != b.input.batch {
            return Err(ModelError::Input(format!(
                "{} labels for batch {}",
                b.labels.len(),
                b.input.batch
            )));
        }
        if let Some(l) = b.labels.iter().find(|l| **l as usize >= n) {
            return Err(ModelError::Input(format!(
                "label {l} is outside the model's {n} labels (num_labels)"
            )));
        }
        // ids, token types and the length against the tables: BertForward::check, in the pass
        Ok(())
    }

    fn accumulate(
        &self,
        params: &[Tensor<2>],
        trainable: &[bool],
        b: &ClassificationBatch,
        pass: &Pass,
        target: &mut dyn GradTarget,
    ) -> Result<f32, ModelError> {
        let tracked = leaves(params, trainable);
        let x = Self::inputs(b);
        if pass.grad_ckpt {
            // the plain pass checks the labels in its loss; this one computes the loss itself
            self.check_batch(b)?;
            let loss = block_ckpt::loss(
                self, params, &tracked, trainable, &x, &b.labels, pass, target,
            )?;
            return scalar(loss);
        }
        let fwd = BertForward::of(self, &tracked, pass.precision.dtype());
        fwd.check(&x)?;
        let (fwd, words) = fwd.with_word_leaf(&x, trainable[self.layout.word]);
        let mut drop = Dropouts::new(&self.config, pass.seed);
        let (loss, _) = fwd.loss(&x, &b.labels, &mut drop)?;
        // read once the backward is queued: a read waits for the device to finish what is queued
        let value = loss.clone().inner();
        // The one place the loss is scaled (by the trainer's share for this micro-batch).
        let mut grads = loss.mul_scalar(pass.loss_scale).backward();
        let mut sink = LeafSink {
            leaves: &tracked,
            trainable,
            target,
        };
        words.backward(&mut grads, &mut sink)?;
        sink.gradients(&mut grads)?;
        scalar(value)
    }

    fn eval_loss(
        &self,
        params: &[Tensor<2>],
        b: &ClassificationBatch,
        precision: Precision,
    ) -> Result<f32, ModelError> {
        let fwd = BertForward::of(self, params, precision.dtype());
        let x = Self::inputs(b);
        fwd.check(&x)?;
        let (loss, _) = fwd.loss(&x, &b.labels, &mut Dropouts::disabled())?;
        scalar(loss)
    }

    fn save(&self, dir: &Path) -> Result<(), ModelError> {
        BertModel::save(self, dir)
    }

    fn load(&mut self, dir: &Path) -> Result<(), ModelError> {
        let config = BertConfig::from_file(&dir.join("config.json"))?;
        if !BertLayout::new(&config).same_tensors(&self.layout) {
            return Err(ModelError::Input(format!(
                "{}: the checkpoint's config.json describes another model than this run's",
                dir.display()
            )));
        }
        let mut model = self.clone();
        let report = model.load_weights(&mut HfWeights::open_dir(dir)?, crate::bert::HEAD_SEED)?;
        if let Some(name) = report.initialised.first() {
            return Err(ModelError::Format(format!(
                "{}: tensor {name} is missing",
                dir.display()
            )));
        }
        *self = model;
        Ok(())
    }
}

impl SequenceClassifier for BertModel {
    fn num_labels(&self) -> usize {
        self.config.num_labels()
    }

    fn labels(&self) -> Vec<String> {
        self.config.id2label.clone()
    }

    fn logits(
        &self,
        params: &[Tensor<2>],
        b: &ClassificationBatch,
        precision: Precision,
    ) -> Result<Vec<f32>, ModelError> {
        let fwd = BertForward::of(self, params, precision.dtype());
        let x = Self::inputs(b);
        fwd.check(&x)?;
        to_f32_vec(fwd.logits(&x, &mut Dropouts::disabled())?)
    }
}

impl BertConfig {
    /// Sets the labels the classifier predicts (`id2label`, by id).
    pub fn set_labels(&mut self, labels: &[String]) -> Result<(), ModelError> {
        if labels.is_empty() {
            return Err(ModelError::Input(
                "a classifier needs at least one label (the data has none)".into(),
            ));
        }
        self.id2label = labels.to_vec();
        Ok(())
    }
}

impl BertModel {
    /// The classifier in `dir` under `run`'s hyper-parameters (dropout, …): a fine-tuned classifier
    /// keeps its head and its labels (the caller maps the data's labels onto them); a pretrained
    /// encoder without a head gets a new one for `run`'s labels, drawn from `seed` and listed as
    /// initialised. The encoder in `dir` must have `run`'s shapes.
    pub fn load_for_labels(
        dir: &Path,
        run: &BertConfig,
        seed: u64,
    ) -> Result<(Self, crate::weights::LoadReport), ModelError> {
        let saved = BertConfig::from_file(&dir.join("config.json"))?;
        let mut source = HfWeights::open_dir(dir)?;
        let mut config = run.clone();
        let probe = BertLayout::new(&saved);
        if has_head(&probe, &source, &saved) {
            config.id2label = saved.id2label.clone();
        }
        let layout = BertLayout::new(&config);
        let mut saved_with_labels = saved.clone();
        saved_with_labels.id2label = config.id2label.clone();
        if !layout.same_tensors(&BertLayout::new(&saved_with_labels)) || saved.family != run.family
        {
            return Err(ModelError::Input(format!(
                "--init {}: its config.json describes another model than the run's ({} layers of {} vs {} of {})",
                dir.display(),
                saved.num_hidden_layers,
                saved.hidden_size,
                run.num_hidden_layers,
                run.hidden_size
            )));
        }
        let mut model = Self {
            config,
            layout,
            weights: Vec::new(),
        };
        let report = model.load_weights(&mut source, seed)?;
        Ok((model, report))
    }
}

/// Whether the checkpoint holds the classification head of `layout` (under any of the names
/// transformers finds it by).
fn has_head(layout: &BertLayout, source: &HfWeights, config: &BertConfig) -> bool {
    let prefix = format!("{}.", config.family.prefix());
    layout
        .specs
        .iter()
        .filter(|s| s.group == Group::Head)
        .all(|s| {
            crate::bert::checkpoint_names(&s.name, &prefix)
                .iter()
                .any(|n| source.shape(n).is_some())
        })
}
