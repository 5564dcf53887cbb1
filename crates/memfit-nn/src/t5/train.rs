//! T5 as a [`TrainModel`]: one micro-batch's loss and gradients (plain or per-block checkpointed,
//! the LM head in chunks), the validation loss, and greedy generation over a KV cache.

use std::path::Path;

use burn::prelude::*;
use burn::tensor::DType;

use crate::ModelError;
use crate::batch::{Seq2SeqBatch, TokenRows};
use crate::decoding::GenerateConfig;
use crate::kernels::dropout::Dropout;
use crate::layers::chunked_head::head_loss;
use crate::layers::grad_sink::{GradTarget, LeafSink, leaves};
use crate::layers::host::{int_tensor, scalar, to_f32_vec};
use crate::layers::loss::shift_right;
use crate::layers::params;
use crate::model::{ParamShape, Pass, Precision, Seq2SeqGenerate, TrainModel};
use crate::t5::block_ckpt::{self, MicroBatch, Trainable};
use crate::t5::chunked_head::{HeadInputs, lm_head, loss_through_head, training_chunk_logits};
use crate::t5::embedding_leaf::EmbeddingLeaf;
use crate::t5::forward::{T5Forward, padding_mask};
use crate::t5::{Group, T5Config, T5Layout, T5Model};
use crate::weights::HfWeights;

/// The groups `--freeze` names for T5.
pub const GROUPS: &str = "embeddings, encoder, decoder, lm_head";

impl T5Model {
    /// The frozen groups named in `freeze`.
    pub fn parse_groups(freeze: &[String]) -> Result<Vec<Group>, ModelError> {
        freeze
            .iter()
            .map(|g| {
                Group::parse(g.trim()).ok_or_else(|| {
                    ModelError::Input(format!("--freeze {g:?}: T5's groups are {GROUPS}"))
                })
            })
            .collect()
    }

    fn check_ids(&self, ids: &[u32], what: &str) -> Result<(), ModelError> {
        let vocab = self.config.vocab_size;
        match ids.iter().position(|&id| id as usize >= vocab) {
            Some(i) => Err(ModelError::Input(format!(
                "{what}[{i}] = {} is outside the model's vocabulary ({vocab})",
                ids[i]
            ))),
            None => Ok(()),
        }
    }

    /// `batch`'s source ids, padding mask (in `mask_dtype`, the parameters') and decoder input ids
    /// (the labels shifted right) on `device`.
    fn device_inputs(&self, b: &Seq2SeqBatch, device: &Device, mask_dtype: DType) -> Inputs {
        let cfg = &self.config;
        let src = &b.source;
        let decoder_ids = shift_right(
            &b.labels,
            &b.label_mask,
            src.batch,
            b.tgt_len,
            cfg.decoder_start_token_id,
            cfg.pad_token_id,
        );
        Inputs {
            input_ids: int_tensor(&src.ids, src.batch, src.len, device),
            mask: padding_mask(&src.mask, src.batch, src.len, device, mask_dtype),
            decoder_ids: int_tensor(&decoder_ids, src.batch, b.tgt_len, device),
            decoder_host: decoder_ids,
        }
    }

    /// Logits `[batch·tgt_len, vocab]` of `b` (teacher-forced) under `params`, with `drop`.
    fn forward_logits(
        &self,
        params: &[Tensor<2>],
        b: &Seq2SeqBatch,
        precision: Precision,
        drop: &mut Dropout,
    ) -> Tensor<2> {
        let fwd = T5Forward::of(self, params, precision.dtype());
        let device = params[self.layout.shared].device();
        let inputs = self.device_inputs(b, &device, fwd.param_dtype());
        fwd.lm_logits(fwd.encode_decode(inputs.input_ids, &inputs.mask, inputs.decoder_ids, drop))
    }

    /// Logits `[batch·tgt_len, vocab]` in f32 (row-major) without dropout: for checks against
    /// transformers.
    pub fn logits(
        &self,
        params: &[Tensor<2>],
        b: &Seq2SeqBatch,
        precision: Precision,
    ) -> Result<Vec<f32>, ModelError> {
        self.check_batch(b)?;
        let logits = self.forward_logits(params, b, precision, &mut Dropout::disabled());
        to_f32_vec(logits)
    }

    /// The loss of `b` without checkpointing: the embeddings are leaves whose gradient rows go to
    /// the table, the LM head and loss run in chunks.
    fn plain_loss(
        &self,
        leaves: &[Tensor<2>],
        trainable: &[bool],
        b: &Seq2SeqBatch,
        pass: &Pass,
        drop: &mut Dropout,
        target: &mut dyn GradTarget,
    ) -> Result<Tensor<1>, ModelError> {
        let fwd = T5Forward::of(self, leaves, pass.precision.dtype());
        let device = leaves[self.layout.shared].device();
        let inputs = self.device_inputs(b, &device, fwd.param_dtype());
        let shared_trains = trainable[self.layout.shared];
        let source = EmbeddingLeaf::new(&fwd, inputs.input_ids, &b.source.ids, shared_trains);
        let decoder_inputs = EmbeddingLeaf::new(
            &fwd,
            inputs.decoder_ids,
            &inputs.decoder_host,
            shared_trains,
        );
        let out = fwd.encode_decode_embedded(
            source.input.clone(),
            &inputs.mask,
            decoder_inputs.input.clone(),
            drop,
        );
        let mut sink = LeafSink {
            leaves,
            trainable,
            target,
        };
        let head = HeadInputs {
            labels: &b.labels,
            label_mask: &b.label_mask,
            loss_scale: pass.loss_scale,
            chunk_logits: training_chunk_logits(&device),
        };
        let (loss, grads) = loss_through_head(&fwd, out, head, &mut sink)?;
        if let Some(mut grads) = grads {
            decoder_inputs.backward(&mut grads, &mut sink)?;
            source.backward(&mut grads, &mut sink)?;
        }
        Ok(loss)
    }

    /// The loss of `b` under per-block gradient checkpointing.
    #[allow(clippy::too_many_arguments)] // the pass's parts, as plain_loss takes them, plus `plain`
    fn checkpointed_loss(
        &self,
        plain: &[Tensor<2>],
        leaves: &[Tensor<2>],
        trainable: &[bool],
        b: &Seq2SeqBatch,
        pass: &Pass,
        drop: &mut Dropout,
        target: &mut dyn GradTarget,
    ) -> Result<Tensor<1>, ModelError> {
        let layout = &self.layout;
        let dtype = pass.precision.dtype();
        let group_trainable =
            |group| (0..layout.specs.len()).any(|i| trainable[i] && layout.specs[i].group == group);
        let flags = Trainable {
            shared: trainable[layout.shared],
            encoder: group_trainable(Group::Encoder),
            encoder_rel_bias: trainable[layout.encoder_rel_bias],
            decoder_rel_bias: trainable[layout.decoder_rel_bias],
        };
        let device = plain[layout.shared].device();
        let inputs = self.device_inputs(b, &device, plain[layout.shared].dtype());
        let micro = MicroBatch {
            input_ids: inputs.input_ids,
            input_host: &b.source.ids,
            mask: inputs.mask,
            decoder_ids: inputs.decoder_ids,
            decoder_host: &inputs.decoder_host,
            labels: &b.labels,
            label_mask: &b.label_mask,
        };
        let mut sink = LeafSink {
            leaves,
            trainable,
            target,
        };
        block_ckpt::loss_and_grads(
            &T5Forward::of(self, plain, dtype),
            &T5Forward::of(self, leaves, dtype),
            flags,
            micro,
            drop,
            pass.loss_scale,
            &mut sink,
        )
    }
}

/// A batch's input tensors on a device.
struct Inputs {
    input_ids: Tensor<2, Int>,
    mask: Tensor<4>,
    decoder_ids: Tensor<2, Int>,
    /// The decoder's ids as the host made them (the source's are the batch's own).
    decoder_host: Vec<u32>,
}

impl TrainModel for T5Model {
    type Batch = Seq2SeqBatch;

    fn architecture(&self) -> String {
        "T5ForConditionalGeneration".into()
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

    fn training_flops(&self, b: &Seq2SeqBatch, trainable: &[bool]) -> f64 {
        let layout = &self.layout;
        // no backward through the encoder when it and the shared embedding are frozen
        let encoder_backward = (0..layout.specs.len()).any(|i| {
            trainable[i] && matches!(layout.specs[i].group, Group::Embeddings | Group::Encoder)
        });
        crate::t5::flops::t5_training_flops(
            &self.config,
            b.source.batch,
            b.source.len,
            b.tgt_len,
            encoder_backward,
        )
    }

    fn check_batch(&self, b: &Seq2SeqBatch) -> Result<(), ModelError> {
        b.source.check_shape("source")?;
        let n_tgt = b.source.batch * b.tgt_len;
        if b.tgt_len == 0 || b.labels.len() != n_tgt || b.label_mask.len() != n_tgt {
            return Err(ModelError::Input(format!(
                "labels/label_mask hold {}/{} values, batch × tgt_len is {n_tgt}",
                b.labels.len(),
                b.label_mask.len()
            )));
        }
        self.check_ids(&b.source.ids, "input_ids")?;
        let vocab = self.config.vocab_size;
        let outside = b
            .labels
            .iter()
            .zip(&b.label_mask)
            .position(|(id, m)| *m && *id as usize >= vocab);
        match outside {
            Some(i) => Err(ModelError::Input(format!(
                "labels[{i}] = {} is outside the model's vocabulary ({vocab})",
                b.labels[i]
            ))),
            None => Ok(()),
        }
    }

    fn accumulate(
        &self,
        params: &[Tensor<2>],
        trainable: &[bool],
        b: &Seq2SeqBatch,
        pass: &Pass,
        target: &mut dyn GradTarget,
    ) -> Result<f32, ModelError> {
        let tracked = leaves(params, trainable);
        let mut drop = Dropout::new(pass.seed, self.config.dropout_rate);
        let loss = if pass.grad_ckpt {
            self.checkpointed_loss(params, &tracked, trainable, b, pass, &mut drop, target)?
        } else {
            self.plain_loss(&tracked, trainable, b, pass, &mut drop, target)?
        };
        scalar(loss)
    }

    fn eval_loss(
        &self,
        params: &[Tensor<2>],
        b: &Seq2SeqBatch,
        precision: Precision,
    ) -> Result<f32, ModelError> {
        // The head in chunks as in training (issue 29: whole `[batch·tgt, vocab]` logits and their
        // log-softmax made validation the run's peak, 0.57 GiB for a run that trained at 196 MiB).
        let fwd = T5Forward::of(self, params, precision.dtype());
        let device = params[self.layout.shared].device();
        let inputs = self.device_inputs(b, &device, fwd.param_dtype());
        let out = fwd.encode_decode(
            inputs.input_ids,
            &inputs.mask,
            inputs.decoder_ids,
            &mut Dropout::disabled(),
        );
        let head = HeadInputs {
            labels: &b.labels,
            label_mask: &b.label_mask,
            loss_scale: 1.0,
            chunk_logits: training_chunk_logits(&device),
        };
        scalar(head_loss(&lm_head(&fwd), out, head))
    }

    fn save(&self, dir: &Path) -> Result<(), ModelError> {
        T5Model::save(self, dir)
    }

    fn load(&mut self, dir: &Path) -> Result<(), ModelError> {
        let config = T5Config::from_file(&dir.join("config.json"))?;
        // Same tensors (names and shapes); init scales and other hyper-parameters may differ.
        if !T5Layout::new(&config).same_tensors(&self.layout) {
            return Err(ModelError::Input(format!(
                "{}: the checkpoint's config.json describes another model than this run's",
                dir.display()
            )));
        }
        let mut model = self.clone();
        model.load_weights(&mut HfWeights::open_dir(dir)?)?;
        *self = model;
        Ok(())
    }
}

impl Seq2SeqGenerate for T5Model {
    fn generate(
        &self,
        params: &[Tensor<2>],
        inputs: &TokenRows,
        config: &GenerateConfig,
        precision: Precision,
    ) -> Result<Vec<Vec<u32>>, ModelError> {
        inputs.check_shape("generate")?;
        self.check_ids(&inputs.ids, "input_ids")?;
        let cfg = &self.config;
        let fwd = T5Forward::of(self, params, precision.dtype());
        let device = params[self.layout.shared].device();
        let (batch, len) = (inputs.batch, inputs.len);
        let mut drop = Dropout::disabled();
        let mask = padding_mask(&inputs.mask, batch, len, &device, fwd.param_dtype());
        // The encoder runs once; the decoder runs one position per token over its KV cache.
        let encoded = fwd.encode(
            int_tensor(&inputs.ids, batch, len, &device),
            &mask,
            &mut drop,
        );
        let mut cache = fwd.decoder_cache(&encoded);
        let mut seqs: Vec<Vec<u32>> = vec![vec![cfg.decoder_start_token_id]; batch];
        let mut done = vec![false; batch];
        let vocab = cfg.vocab_size;
        for _ in 0..config.max_new_tokens {
            let last: Vec<u32> = seqs.iter().filter_map(|s| s.last().copied()).collect();
            let hidden = fwd.decode_step(int_tensor(&last, batch, 1, &device), &mut cache, &mask);
            let logits = to_f32_vec(fwd.lm_logits(hidden))?;
            for (row, seq) in seqs.iter_mut().enumerate() {
                if done[row] {
                    seq.push(cfg.pad_token_id);
                    continue;
                }
                let mut scores = logits[row * vocab..(row + 1) * vocab].to_vec();
                let next = config.next_token(&mut scores, seq);
                seq.push(next);
                done[row] = next == config.eos_id;
            }
            if done.iter().all(|d| *d) || config.stop_requested() {
                break;
            }
        }
        Ok(seqs
            .into_iter()
            .map(|s| {
                s.into_iter()
                    .skip(1)
                    .take_while(|&id| id != config.eos_id)
                    .collect()
            })
            .collect())
    }
}
