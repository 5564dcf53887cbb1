//! The decoder as a [`TrainModel`]: one micro-batch's masked next-token loss and its gradients (the
//! whole graph kept, or per-layer checkpointed; the LM head in chunks either way), the validation
//! loss, and the logits for checks against transformers.

use std::path::Path;

use burn::prelude::*;
use burn::tensor::DType;

use crate::ModelError;
use crate::batch::{CausalLmBatch, TokenRows};
use crate::decoder::attention::{Context, Visibility, positions};
use crate::decoder::block_ckpt;
use crate::decoder::forward::{DecoderForward, Dropouts, LoraTensors};
use crate::decoder::layout::{GROUPS, Group};
use crate::decoder::{DecoderConfig, DecoderLayout, DecoderModel, State};
use crate::layers::chunked_head::{
    HeadInputs, head_loss, loss_through_head, training_chunk_logits,
};
use crate::layers::embedding_leaf::EmbeddingLeaf;
use crate::layers::grad_sink::{GradTarget, LeafSink, leaves};
use crate::layers::host::{int_tensor, scalar, to_f32_vec};
use crate::layers::params;
use crate::model::{ParamShape, Pass, Precision, TrainModel};
use crate::weights::HfWeights;

/// The head's targets for a causal batch: the output at position `t` predicts token `t + 1`,
/// trained where `target_mask[t + 1]` (transformers' shifted labels; the last position predicts
/// nothing).
pub fn next_token_targets(batch: &CausalLmBatch) -> (Vec<u32>, Vec<bool>) {
    let len = batch.input.len;
    let mut labels = vec![0; batch.input.ids.len()];
    let mut mask = vec![false; batch.input.ids.len()];
    for row in 0..batch.input.batch {
        for t in 0..len.saturating_sub(1) {
            let (at, next) = (row * len + t, row * len + t + 1);
            labels[at] = batch.input.ids[next];
            mask[at] = batch.target_mask[next];
        }
    }
    (labels, mask)
}

impl DecoderModel {
    /// The forward pass over `params` ([`TrainModel::params`] on a device, tracked or not).
    pub fn forward<'a>(&'a self, params: &'a [Tensor<2>], dtype: DType) -> DecoderForward<'a> {
        let (base, lora) = match &self.state {
            State::Full { .. } => (params, None),
            State::Lora { base, layout, .. } => {
                (base.as_slice(), Some(LoraTensors { layout, params }))
            }
        };
        DecoderForward {
            cfg: &self.config,
            layout: &self.layout,
            base,
            lora,
            dtype,
        }
    }

    /// What every layer of a pass over `rows` shares: positions from the padding mask, the masks.
    pub fn context(&self, rows: &TokenRows, device: &Device, dtype: DType) -> Context {
        let visibility = Visibility {
            key_mask: &rows.mask,
            keys: rows.len,
            queries: rows.len,
        };
        Context::new(
            &self.config,
            &positions(&rows.mask, rows.len),
            visibility,
            device,
            dtype,
        )
    }

    /// What a training pass over `b` starts from: the ids on `device`, the context every layer
    /// shares, and the dropouts seeded by the pass.
    pub(crate) fn pass_start(
        &self,
        b: &CausalLmBatch,
        pass: &Pass,
        device: &Device,
    ) -> (Tensor<2, Int>, Context, Dropouts) {
        let rows = &b.input;
        let lora_dropout = self.lora_layout().map_or(0.0, |l| l.settings.dropout);
        (
            int_tensor(&rows.ids, rows.batch, rows.len, device),
            self.context(rows, device, pass.precision.dtype()),
            Dropouts::new(pass.seed, self.config.attention_dropout, lora_dropout),
        )
    }

    /// `last_hidden_state` `[b, t, d]` of `rows` without dropout.
    fn hidden(&self, params: &[Tensor<2>], rows: &TokenRows, dtype: DType) -> Tensor<3> {
        let fwd = self.forward(params, dtype);
        let device = fwd.device();
        let ctx = self.context(rows, &device, dtype);
        let x = fwd.embed(int_tensor(&rows.ids, rows.batch, rows.len, &device));
        fwd.hidden(x, &ctx, &mut Dropouts::disabled())
    }

    /// Logits `[batch · len, vocab]` (row-major f32) of `rows` without dropout: for checks against
    /// transformers (the whole matrix at once; training never builds it).
    pub fn logits(
        &self,
        params: &[Tensor<2>],
        rows: &TokenRows,
        precision: Precision,
    ) -> Result<Vec<f32>, ModelError> {
        rows.check_shape("input")?;
        self.check_ids(&rows.ids)?;
        let hidden = self.hidden(params, rows, precision.dtype());
        to_f32_vec(self.forward(params, precision.dtype()).logits(hidden))
    }

    pub(crate) fn check_ids(&self, ids: &[u32]) -> Result<(), ModelError> {
        let vocab = self.config.vocab_size;
        match ids.iter().position(|&id| id as usize >= vocab) {
            Some(i) => Err(ModelError::Input(format!(
                "input_ids[{i}] = {} is outside the model's vocabulary ({vocab})",
                ids[i]
            ))),
            None => Ok(()),
        }
    }

    /// The frozen groups named in `freeze`.
    pub fn parse_groups(freeze: &[String]) -> Result<Vec<Group>, ModelError> {
        freeze
            .iter()
            .map(|g| {
                Group::parse(g.trim()).ok_or_else(|| {
                    ModelError::Input(format!("--freeze {g:?}: the decoder's groups are {GROUPS}"))
                })
            })
            .collect()
    }

    /// The loss of `b` with the whole graph kept: the embedding a leaf whose gradient rows go to
    /// the table (when it trains), the head and loss in chunks.
    fn plain_loss(
        &self,
        tracked: &[Tensor<2>],
        trainable: &[bool],
        b: &CausalLmBatch,
        pass: &Pass,
        target: &mut dyn GradTarget,
    ) -> Result<Tensor<1>, ModelError> {
        let fwd = self.forward(tracked, pass.precision.dtype());
        let (ids, ctx, mut drops) = self.pass_start(b, pass, &fwd.device());
        let trains = self.embedding_trains(trainable);
        let embedded = EmbeddingLeaf::new(&fwd, ids, &b.input.ids, trains);
        let out = fwd.hidden(embedded.input.clone(), &ctx, &mut drops);
        let (labels, label_mask) = next_token_targets(b);
        let head = HeadInputs {
            labels: &labels,
            label_mask: &label_mask,
            loss_scale: pass.loss_scale,
            chunk_logits: training_chunk_logits(&fwd.device()),
        };
        let mut sink = LeafSink {
            leaves: tracked,
            trainable,
            target,
        };
        let (loss, grads) = loss_through_head(&fwd.lm_head(), out, head, &mut sink)?;
        if let Some(mut grads) = grads {
            embedded.backward(&mut grads, &mut sink)?;
        }
        Ok(loss)
    }

    /// Whether the embedding table is a trained parameter of this pass.
    pub(crate) fn embedding_trains(&self, trainable: &[bool]) -> bool {
        matches!(self.state, State::Full { .. }) && trainable[self.layout.embed]
    }
}

impl TrainModel for DecoderModel {
    type Batch = CausalLmBatch;

    fn architecture(&self) -> String {
        self.config.architecture().into()
    }

    fn params(&self) -> &[Vec<f32>] {
        self.trained()
    }

    fn params_mut(&mut self) -> &mut [Vec<f32>] {
        self.trained_mut()
    }

    fn param_shapes(&self) -> Vec<ParamShape> {
        params::shapes(self.trained_specs())
    }

    fn trainable(&self, freeze: &[String]) -> Result<Vec<bool>, ModelError> {
        let groups = Self::parse_groups(freeze)?;
        match &self.state {
            State::Full { .. } => Ok((0..self.layout.specs.len())
                .map(|i| self.layout.trainable(i, &groups))
                .collect()),
            State::Lora { layout, .. } if groups.is_empty() => Ok(vec![true; layout.specs.len()]),
            State::Lora { .. } => Err(ModelError::Input(
                "--freeze applies to --method full: under LoRA only the adapters train".into(),
            )),
        }
    }

    fn total_params(&self) -> u64 {
        let base = self.layout.param_counts(&[]).0;
        base + self.lora_layout().map_or(0, |l| l.param_count())
    }

    /// Per token and layer: q and o (d·h·hd each), k and v (d·kv·hd each), scores and context over
    /// the row's positions (2·t·h·hd), the gated MLP (3·d·f); the LM head (d·V). ×2 FLOPs per
    /// multiply-add; the backward pass doubles it where weights train (input and weight gradients),
    /// or adds one forward's worth under LoRA (input gradients only), plus the adapters' own
    /// products (their sizes, ×3).
    fn training_flops(&self, b: &CausalLmBatch, _trainable: &[bool]) -> f64 {
        let c = &self.config;
        let (d, f, t) = (
            c.hidden_size as f64,
            c.intermediate_size as f64,
            b.input.len as f64,
        );
        let (q, kv) = (
            (c.num_attention_heads * c.head_dim) as f64,
            (c.num_key_value_heads * c.head_dim) as f64,
        );
        let layer = 2.0 * d * q + 2.0 * d * kv + 2.0 * t * q + 3.0 * d * f;
        let per_token = c.num_hidden_layers as f64 * layer + d * c.vocab_size as f64;
        let tokens = (b.input.batch * b.input.len) as f64;
        let (passes, adapters) = match self.lora_layout() {
            Some(_) => (
                2.0,
                3.0 * self.params().iter().map(Vec::len).sum::<usize>() as f64,
            ),
            None => (3.0, 0.0),
        };
        2.0 * tokens * (passes * per_token + adapters)
    }

    fn check_batch(&self, b: &CausalLmBatch) -> Result<(), ModelError> {
        b.input.check_shape("input")?;
        let (len, n) = (b.input.len, b.input.ids.len());
        if b.target_mask.len() != n {
            return Err(ModelError::Input(format!(
                "target_mask: {} values for batch {} × len {len}",
                b.target_mask.len(),
                b.input.batch
            )));
        }
        let stray = (0..n).find(|&i| b.target_mask[i] && (i % len == 0 || !b.input.mask[i]));
        if let Some(i) = stray {
            return Err(ModelError::Input(format!(
                "target_mask[{}][{}] is set on {}",
                i / len,
                i % len,
                if i % len == 0 {
                    "the first position (it has no prefix)"
                } else {
                    "padding"
                }
            )));
        }
        self.check_ids(&b.input.ids)
    }

    fn accumulate(
        &self,
        params: &[Tensor<2>],
        trainable: &[bool],
        b: &CausalLmBatch,
        pass: &Pass,
        target: &mut dyn GradTarget,
    ) -> Result<f32, ModelError> {
        self.check_batch(b)?;
        let tracked = leaves(params, trainable);
        let loss = if pass.grad_ckpt {
            block_ckpt::loss(self, params, &tracked, trainable, b, pass, target)?
        } else {
            self.plain_loss(&tracked, trainable, b, pass, target)?
        };
        scalar(loss)
    }

    fn eval_loss(
        &self,
        params: &[Tensor<2>],
        b: &CausalLmBatch,
        precision: Precision,
    ) -> Result<f32, ModelError> {
        self.check_batch(b)?;
        let hidden = self.hidden(params, &b.input, precision.dtype());
        let (labels, label_mask) = next_token_targets(b);
        let head = HeadInputs {
            labels: &labels,
            label_mask: &label_mask,
            loss_scale: 1.0,
            chunk_logits: training_chunk_logits(&hidden.device()),
        };
        scalar(head_loss(
            &self.forward(params, precision.dtype()).lm_head(),
            hidden,
            head,
        ))
    }

    /// Full training: `config.json` + `model.safetensors`; LoRA: the adapter as PEFT writes it.
    fn save(&self, dir: &Path) -> Result<(), ModelError> {
        match self.state {
            State::Full { .. } => self.save_merged(dir),
            State::Lora { .. } => self.save_adapter(dir),
        }
    }

    fn load(&mut self, dir: &Path) -> Result<(), ModelError> {
        if matches!(self.state, State::Lora { .. }) {
            return self.load_adapter(dir);
        }
        let config = DecoderConfig::from_file(&dir.join("config.json"))?;
        if !DecoderLayout::new(&config).same_tensors(&self.layout) {
            return Err(ModelError::Input(format!(
                "{}: the checkpoint's config.json describes another model than this run's",
                dir.display()
            )));
        }
        let mut source = HfWeights::open_dir(dir)?;
        let weights = super::read_weights(&self.layout, &mut source).collect::<Result<_, _>>()?;
        super::check_unused(&source, &self.layout)?;
        *self.trained_mut() = weights;
        Ok(())
    }
}
