//! [`T5Engine`]: the T5 model, its optimizer and its accumulated gradients behind the [`Engine`]
//! trait the training loop drives.
//!
//! Construction: [`T5Engine::new`] (random init from a config) or [`T5Engine::from_checkpoint`]
//! (a memfit or transformers checkpoint directory), both with [`EngineOptions`].

use std::path::Path;
use std::sync::Mutex;

use burn::prelude::*;
use burn::tensor::{DType, FloatDType, Gradients, TensorData};

use crate::engine::{Engine, GenerateConfig, ParamCounts, Seq2SeqBatch, StepStats};
use crate::optim::{Optimizer, OptimizerConfig, ParamShape, clip_global_norm, global_norm};
use memfit_nn::ModelError;
use memfit_nn::kernels::dropout::Dropout;
use memfit_nn::layers::grad_sink::GradSink;
use memfit_nn::layers::loss::{masked_cross_entropy, shift_right};
use memfit_nn::t5::block_ckpt::{self, MicroBatch, Trainable};
use memfit_nn::t5::chunked_head::{CHUNK_LOGITS, HeadInputs, loss_through_head};
use memfit_nn::t5::embedding_leaf::EmbeddingLeaf;
use memfit_nn::t5::forward::{T5Forward, padding_mask};
use memfit_nn::t5::{Group, Kind, T5Config, T5Model};
use memfit_nn::weights::HfWeights;

/// Floating-point precision of the forward and backward passes. Master weights, gradients as
/// accumulated and optimizer state stay f32 on the host in both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    F32,
    /// bf16 activations (no loss scaling needed). On flex the weights stay f32 (the master copies,
    /// lent) and every product computes in f32; elsewhere the weights are uploaded as bf16.
    Bf16,
}

impl Precision {
    fn dtype(self) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::Bf16 => DType::BF16,
        }
    }
}

/// The burn backend the engine computes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// burn's `flex` CPU backend (default; multi-threaded through rayon's global pool).
    #[default]
    Flex,
    /// burn's CUDA backend, device index (cargo feature `cuda`).
    #[cfg(feature = "cuda")]
    Cuda(usize),
    /// burn's LibTorch backend on the CPU (cargo feature `tch`).
    #[cfg(feature = "tch")]
    LibTorch,
    /// burn's LibTorch backend on a CUDA device (cargo feature `tch`).
    #[cfg(feature = "tch")]
    LibTorchCuda(usize),
}

impl Backend {
    fn device(self) -> Device {
        match self {
            Backend::Flex => Device::flex(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(i) => Device::cuda(i),
            #[cfg(feature = "tch")]
            Backend::LibTorch => Device::libtorch(),
            #[cfg(feature = "tch")]
            Backend::LibTorchCuda(i) => Device::libtorch_cuda(i),
        }
    }
}

/// Everything about an engine except the model itself.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOptions {
    /// Module groups that get no gradient and no optimizer state.
    pub freeze: Vec<Group>,
    pub optimizer: OptimizerConfig,
    pub precision: Precision,
    /// Per-block gradient checkpointing: keep only each block's input between the forward and the
    /// backward pass and recompute the block in backward ([`memfit_nn::t5::block_ckpt`]).
    pub grad_ckpt: bool,
    pub backend: Backend,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            freeze: Vec::new(),
            optimizer: OptimizerConfig::AdamW(Default::default()),
            precision: Precision::F32,
            grad_ckpt: false,
            backend: Backend::Flex,
        }
    }
}

/// Parses `--freeze embeddings,encoder`.
pub fn parse_freeze(list: &str) -> Result<Vec<Group>, ModelError> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            Group::parse(s).ok_or_else(|| {
                ModelError::Input(format!(
                    "--freeze {s:?}: expected a comma-separated list of embeddings, encoder, decoder, lm_head"
                ))
            })
        })
        .collect()
}

/// Sets the size of rayon's global pool, which burn's flex backend and the optimizer use. Call once,
/// before the first engine is built; a second call with another size fails.
pub fn set_threads(threads: usize) -> Result<(), ModelError> {
    match rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
    {
        Ok(()) => Ok(()),
        Err(_) if rayon::current_num_threads() == threads => Ok(()),
        Err(e) => Err(ModelError::Input(format!(
            "--threads {threads}: the thread pool already runs {} threads ({e})",
            rayon::current_num_threads()
        ))),
    }
}

pub struct T5Engine {
    model: T5Model,
    options: EngineOptions,
    trainable: Vec<bool>,
    optimizer: Optimizer,
    /// Accumulated gradients (host, f32), `None` for frozen parameters and before the first micro-batch.
    grads: Vec<Option<Vec<f32>>>,
    device: Device,
    train_device: Device,
    /// Device copies of the weights, rebuilt after each optimizer step or load.
    uploaded: Mutex<Option<Vec<Tensor<2>>>>,
}

impl T5Engine {
    /// A randomly initialised model (transformers' init scheme) from `config`, drawn from `init_seed`.
    pub fn new(
        config: T5Config,
        options: EngineOptions,
        init_seed: u64,
    ) -> Result<Self, ModelError> {
        Self::with_model(T5Model::init(config, init_seed), options)
    }

    /// Weights and config from a checkpoint directory (`config.json` + `model.safetensors`); the
    /// optimizer starts fresh (use [`Engine::load`] with `with_optimizer` to resume).
    pub fn from_checkpoint(dir: &Path, options: EngineOptions) -> Result<Self, ModelError> {
        Self::with_model(T5Model::load(dir)?.0, options)
    }

    pub fn with_model(model: T5Model, options: EngineOptions) -> Result<Self, ModelError> {
        let device = options.backend.device();
        let dtype = options.precision.dtype();
        if !device.supports_dtype(dtype) {
            return Err(ModelError::Input(format!(
                "precision {:?}: the {:?} backend does not support {dtype:?}",
                options.precision, options.backend
            )));
        }
        let train_device = device.clone().autodiff();
        let layout = &model.layout;
        let trainable: Vec<bool> = (0..layout.specs.len())
            .map(|i| layout.trainable(i, &options.freeze))
            .collect();
        let shapes = layout
            .specs
            .iter()
            .map(|s| ParamShape {
                name: s.name.clone(),
                hf_shape: s.kind.hf_shape(),
                transposed: matches!(s.kind, Kind::Linear { .. }),
            })
            .collect();
        let optimizer = Optimizer::new(options.optimizer.clone(), shapes, &trainable);
        Ok(Self {
            grads: vec![None; trainable.len()],
            model,
            options,
            trainable,
            optimizer,
            device,
            train_device,
            uploaded: Mutex::new(None),
        })
    }

    pub fn config(&self) -> &T5Config {
        &self.model.config
    }

    pub fn model(&self) -> &T5Model {
        &self.model
    }

    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// Optimizer steps taken (restored by `load` with the optimizer).
    pub fn optimizer_step(&self) -> u64 {
        self.optimizer.step
    }

    fn dtype(&self) -> DType {
        self.options.precision.dtype()
    }

    /// The weights on the device, uploaded once per optimizer step.
    fn weights_on_device(&self) -> Vec<Tensor<2>> {
        let mut guard = self.uploaded.lock().unwrap_or_else(|p| p.into_inner());
        guard
            .get_or_insert_with(|| self.model.tensors(&self.device, self.dtype()))
            .clone()
    }

    fn invalidate(&mut self) {
        *self.uploaded.get_mut().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn check_batch(&self, b: &Seq2SeqBatch) -> Result<(), ModelError> {
        let n_src = b.batch * b.src_len;
        let n_tgt = b.batch * b.tgt_len;
        if b.batch == 0 || b.src_len == 0 || b.tgt_len == 0 {
            return Err(ModelError::Input(format!(
                "empty batch (batch {}, src_len {}, tgt_len {})",
                b.batch, b.src_len, b.tgt_len
            )));
        }
        if b.input_ids.len() != n_src || b.input_mask.len() != n_src {
            return Err(ModelError::Input(format!(
                "input_ids/input_mask hold {}/{} values, batch × src_len is {n_src}",
                b.input_ids.len(),
                b.input_mask.len()
            )));
        }
        if b.labels.len() != n_tgt || b.label_mask.len() != n_tgt {
            return Err(ModelError::Input(format!(
                "labels/label_mask hold {}/{} values, batch × tgt_len is {n_tgt}",
                b.labels.len(),
                b.label_mask.len()
            )));
        }
        self.check_ids(&b.input_ids, "input_ids")?;
        let vocab = self.model.config.vocab_size;
        if let Some((i, id)) = b
            .labels
            .iter()
            .zip(&b.label_mask)
            .enumerate()
            .find(|(_, (id, m))| **m && **id as usize >= vocab)
            .map(|(i, (id, _))| (i, id))
        {
            return Err(ModelError::Input(format!(
                "labels[{i}] = {id} is outside the model's vocabulary ({vocab})"
            )));
        }
        Ok(())
    }

    fn check_ids(&self, ids: &[u32], what: &str) -> Result<(), ModelError> {
        let vocab = self.model.config.vocab_size;
        match ids.iter().position(|&id| id as usize >= vocab) {
            Some(i) => Err(ModelError::Input(format!(
                "{what}[{i}] = {} is outside the model's vocabulary ({vocab})",
                ids[i]
            ))),
            None => Ok(()),
        }
    }

    /// `batch`'s source ids, source padding mask (in `mask_dtype`, the parameters') and decoder input
    /// ids (the labels shifted right) on `device`.
    fn device_inputs(
        &self,
        batch: &Seq2SeqBatch,
        device: &Device,
        mask_dtype: DType,
    ) -> DeviceInputs {
        let cfg = &self.model.config;
        let decoder_ids = shift_right(
            &batch.labels,
            &batch.label_mask,
            batch.batch,
            batch.tgt_len,
            cfg.decoder_start_token_id,
            cfg.pad_token_id,
        );
        DeviceInputs {
            input_ids: int_tensor(&batch.input_ids, batch.batch, batch.src_len, device),
            mask: padding_mask(
                &batch.input_mask,
                batch.batch,
                batch.src_len,
                device,
                mask_dtype,
            ),
            decoder_ids: Tensor::from_data(
                TensorData::new(decoder_ids, [batch.batch, batch.tgt_len]),
                device,
            ),
        }
    }

    /// Logits `[batch·tgt_len, vocab]` of `batch` (teacher-forced) under `params` on `device`
    /// (tracked or not), with `drop` for dropout.
    fn forward_logits(
        &self,
        params: &[Tensor<2>],
        batch: &Seq2SeqBatch,
        device: &Device,
        drop: &mut Dropout,
    ) -> Tensor<2> {
        let fwd = T5Forward::of(&self.model, params, self.dtype());
        let inputs = self.device_inputs(batch, device, fwd.param_dtype());
        fwd.lm_logits(fwd.encode_decode(inputs.input_ids, &inputs.mask, inputs.decoder_ids, drop))
    }

    /// Mean token loss of `batch` under `params` on `device`.
    fn loss(
        &self,
        params: &[Tensor<2>],
        batch: &Seq2SeqBatch,
        device: &Device,
        drop: &mut Dropout,
    ) -> Tensor<1> {
        let logits = self.forward_logits(params, batch, device, drop);
        masked_cross_entropy(logits, &batch.labels, &batch.label_mask)
    }

    /// Whether a micro-batch runs on the master weights' own buffers: on the flex (CPU) backend a
    /// device tensor can take a host `Vec<f32>` without copying it, so the weights exist once instead
    /// of twice (master + device copy) while the step's activations are alive. In bf16 the
    /// hand-written ops take these f32 weights beside bf16 activations.
    fn lends_weights(&self) -> bool {
        self.options.backend == Backend::Flex
    }

    /// Moves the master weights into device tensors (no copy); [`Self::reclaim_weights`] moves them
    /// back. In between, `model.weights` holds empty vectors.
    fn lend_weights(&mut self) -> Vec<Tensor<2>> {
        let specs = &self.model.layout.specs;
        self.model
            .weights
            .iter_mut()
            .zip(specs)
            .map(|(w, spec)| {
                Tensor::from_data(
                    TensorData::new(std::mem::take(w), spec.kind.shape()),
                    (&self.device, DType::F32),
                )
            })
            .collect()
    }

    /// Moves lent weights back (no copy when nothing else holds them, a copy otherwise).
    fn reclaim_weights(&mut self, tensors: Vec<Tensor<2>>) -> Result<(), ModelError> {
        for (w, t) in self.model.weights.iter_mut().zip(tensors) {
            *w = to_f32_vec(t)?;
        }
        Ok(())
    }

    /// Forward + backward of one micro-batch on the untracked weights `plain`.
    fn accumulate_with(
        &mut self,
        plain: &[Tensor<2>],
        batch: &Seq2SeqBatch,
        loss_scale: f32,
        seed: u64,
    ) -> Result<f32, ModelError> {
        let leaves: Vec<Tensor<2>> = plain
            .iter()
            .zip(&self.trainable)
            .map(|(t, &train)| {
                let t = t.clone().autodiff();
                if train { t.require_grad() } else { t }
            })
            .collect();
        let mut drop = Dropout::new(seed, self.model.config.dropout_rate);
        let loss = if self.options.grad_ckpt {
            self.block_checkpointed_loss(plain, &leaves, batch, &mut drop, loss_scale)?
        } else {
            let fwd = T5Forward::of(&self.model, &leaves, self.dtype());
            let inputs = self.device_inputs(batch, &self.train_device, fwd.param_dtype());
            let shared_trains = self.trainable[self.model.layout.shared];
            let source = EmbeddingLeaf::new(&fwd, inputs.input_ids, shared_trains);
            let decoder_inputs = EmbeddingLeaf::new(&fwd, inputs.decoder_ids, shared_trains);
            let out = fwd.encode_decode_embedded(
                source.input.clone(),
                &inputs.mask,
                decoder_inputs.input.clone(),
                &mut drop,
            );
            let mut sink = Accumulators {
                acc: &mut self.grads,
                trainable: &self.trainable,
                leaves: &leaves,
            };
            // The one place the loss is scaled (by the loop's share for this micro-batch).
            let head = HeadInputs {
                labels: &batch.labels,
                label_mask: &batch.label_mask,
                loss_scale: loss_scale as f64,
                chunk_logits: CHUNK_LOGITS,
            };
            let (loss, grads) = loss_through_head(&fwd, out, head, &mut sink)?;
            if let Some(mut grads) = grads {
                decoder_inputs.backward(&mut grads, &mut sink)?;
                source.backward(&mut grads, &mut sink)?;
            }
            loss
        };
        Ok(to_f32_vec(loss)?.first().copied().unwrap_or(f32::NAN))
    }

    /// The loss of `batch` under per-block gradient checkpointing; its gradients (scaled by
    /// `loss_scale`) are added to the accumulators.
    fn block_checkpointed_loss(
        &mut self,
        plain: &[Tensor<2>],
        leaves: &[Tensor<2>],
        batch: &Seq2SeqBatch,
        drop: &mut Dropout,
        loss_scale: f32,
    ) -> Result<Tensor<1>, ModelError> {
        let (layout, dtype) = (&self.model.layout, self.dtype());
        let forward = |params| T5Forward::of(&self.model, params, dtype);
        let group_trainable = |group| {
            (0..layout.specs.len()).any(|i| self.trainable[i] && layout.specs[i].group == group)
        };
        let trainable = Trainable {
            shared: self.trainable[layout.shared],
            encoder: group_trainable(Group::Encoder),
            encoder_rel_bias: self.trainable[layout.encoder_rel_bias],
            decoder_rel_bias: self.trainable[layout.decoder_rel_bias],
        };
        let inputs = self.device_inputs(batch, &self.device, plain[layout.shared].dtype());
        let micro = MicroBatch {
            input_ids: inputs.input_ids,
            mask: inputs.mask,
            decoder_ids: inputs.decoder_ids,
            labels: &batch.labels,
            label_mask: &batch.label_mask,
        };
        let mut sink = Accumulators {
            acc: &mut self.grads,
            trainable: &self.trainable,
            leaves,
        };
        block_ckpt::loss_and_grads(
            &forward(plain),
            &forward(leaves),
            trainable,
            micro,
            drop,
            loss_scale as f64,
            &mut sink,
        )
    }

    /// Logits `[batch·tgt_len, vocab]` in f32 (row-major) for a batch, without dropout: for checks
    /// against transformers.
    pub fn logits(&self, batch: &Seq2SeqBatch) -> Result<Vec<f32>, ModelError> {
        self.check_batch(batch)?;
        let params = self.weights_on_device();
        let logits = self.forward_logits(&params, batch, &self.device, &mut Dropout::disabled());
        to_f32_vec(logits)
    }

    /// The gradients accumulated so far (host f32, memfit layout; `None`: frozen or none yet).
    pub fn accumulated_gradients(&self) -> &[Option<Vec<f32>>] {
        &self.grads
    }

    /// Global norm of the gradients accumulated so far (0 before the first micro-batch).
    pub fn accumulated_grad_norm(&self) -> f64 {
        global_norm(&self.grads)
    }
}

/// A batch's input tensors on a device.
struct DeviceInputs {
    input_ids: Tensor<2, Int>,
    mask: Tensor<4>,
    decoder_ids: Tensor<2, Int>,
}

/// Runs `work` on a thread of rayon's pool (the caller waits): the many parallel sections inside
/// a micro-batch then run as nested work in the pool, not as hand-offs from an outside thread that
/// sleeps and is woken for each (thousands of context switches per step with one thread).
fn in_pool<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    let mut out = None;
    rayon::scope(|_| out = Some(work()));
    out.expect("the scope ran its work")
}

fn int_tensor(ids: &[u32], batch: usize, len: usize, device: &Device) -> Tensor<2, Int> {
    let data: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
    Tensor::from_data(TensorData::new(data, [batch, len]), device)
}

fn to_f32_vec<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>, ModelError> {
    t.cast(FloatDType::F32)
        .into_data()
        .try_into_vec::<f32>()
        .map_err(|e| ModelError::Io(format!("reading a tensor back from the device: {e:?}")))
}

/// The host accumulators a micro-batch's gradients are added to, one per parameter (`None`: frozen,
/// or nothing yet), and the tracked leaves whose gradients autodiff reports.
struct Accumulators<'a> {
    acc: &'a mut [Option<Vec<f32>>],
    trainable: &'a [bool],
    leaves: &'a [Tensor<2>],
}

impl Accumulators<'_> {
    fn add(&mut self, index: usize, grad: Tensor<2>) -> Result<(), ModelError> {
        // Read in place: flex's buffers are 16-byte aligned, so turning one into a `Vec<f32>`
        // would copy it; a later part of the same gradient is added without any temporary.
        let data = f32_data(grad);
        let g = gradient_values(&data)?;
        match &mut self.acc[index] {
            Some(a) => a.iter_mut().zip(g).for_each(|(a, b)| *a += b),
            slot @ None => *slot = Some(g.to_vec()),
        }
        Ok(())
    }
}

fn f32_data(t: Tensor<2>) -> TensorData {
    t.cast(FloatDType::F32).into_data()
}

fn gradient_values(data: &TensorData) -> Result<&[f32], ModelError> {
    data.as_slice()
        .map_err(|e| ModelError::Io(format!("reading a gradient back from the device: {e:?}")))
}

impl GradSink for Accumulators<'_> {
    type Error = ModelError;

    /// Moves the trainable leaves' gradients out of `grads` (removing each as it goes, so a
    /// gradient never exists twice for long).
    fn gradients(&mut self, grads: &mut Gradients) -> Result<(), ModelError> {
        for i in 0..self.leaves.len() {
            if !self.trainable[i] {
                continue;
            }
            if let Some(g) = self.leaves[i].grad_remove(grads) {
                self.add(i, g)?;
            }
        }
        Ok(())
    }

    fn parameter(&mut self, index: usize, grad: Tensor<2>) -> Result<(), ModelError> {
        if self.trainable[index] {
            self.add(index, grad)?;
        }
        Ok(())
    }

    fn rows(&mut self, index: usize, ids: &[usize], grad: Tensor<2>) -> Result<(), ModelError> {
        if !self.trainable[index] {
            return Ok(());
        }
        let [_, width] = grad.dims();
        let len = self.leaves[index].shape().num_elements();
        let data = f32_data(grad);
        let g = gradient_values(&data)?;
        let acc = self.acc[index].get_or_insert_with(|| vec![0.0; len]);
        for (&id, row) in ids.iter().zip(g.chunks_exact(width)) {
            let target = acc.get_mut(id * width..(id + 1) * width).ok_or_else(|| {
                ModelError::Input(format!("embedding row {id} is outside the table"))
            })?;
            target.iter_mut().zip(row).for_each(|(a, b)| *a += b);
        }
        Ok(())
    }
}

impl Engine for T5Engine {
    type Error = ModelError;

    fn accumulate(
        &mut self,
        batch: &Seq2SeqBatch,
        loss_scale: f32,
        seed: u64,
    ) -> Result<f32, ModelError> {
        self.check_batch(batch)?;
        if !self.lends_weights() {
            let plain = self.weights_on_device();
            return in_pool(|| self.accumulate_with(&plain, batch, loss_scale, seed));
        }
        self.invalidate();
        let plain = self.lend_weights();
        let loss = in_pool(|| self.accumulate_with(&plain, batch, loss_scale, seed));
        self.reclaim_weights(plain)?;
        loss
    }

    fn step(&mut self, lr: f64, max_grad_norm: Option<f64>) -> Result<StepStats, ModelError> {
        // Parameters that received no gradient this step (unused) take a zero gradient.
        for (i, g) in self.grads.iter_mut().enumerate() {
            if self.trainable[i] && g.is_none() {
                *g = Some(vec![0.0; self.model.weights[i].len()]);
            }
        }
        let grad_norm = match max_grad_norm {
            Some(max) => clip_global_norm(&mut self.grads, max),
            None => global_norm(&self.grads),
        };
        self.optimizer
            .step(&mut self.model.weights, &self.grads, lr);
        self.grads.iter_mut().for_each(|g| *g = None);
        self.invalidate();
        Ok(StepStats { grad_norm })
    }

    fn eval_loss(&self, batch: &Seq2SeqBatch) -> Result<f32, ModelError> {
        self.check_batch(batch)?;
        let params = self.weights_on_device();
        let loss = self.loss(&params, batch, &self.device, &mut Dropout::disabled());
        Ok(to_f32_vec(loss)?.first().copied().unwrap_or(f32::NAN))
    }

    fn generate(
        &self,
        batch: usize,
        src_len: usize,
        input_ids: &[u32],
        input_mask: &[bool],
        config: &GenerateConfig,
    ) -> Result<Vec<Vec<u32>>, ModelError> {
        if input_ids.len() != batch * src_len || input_mask.len() != batch * src_len || batch == 0 {
            return Err(ModelError::Input(format!(
                "generate: {} ids / {} mask values for batch {batch} × src_len {src_len}",
                input_ids.len(),
                input_mask.len()
            )));
        }
        self.check_ids(input_ids, "input_ids")?;
        let cfg = &self.model.config;
        let params = self.weights_on_device();
        let fwd = T5Forward::of(&self.model, &params, self.dtype());
        let device = &self.device;
        let mut drop = Dropout::disabled();
        let mask = padding_mask(input_mask, batch, src_len, device, fwd.param_dtype());
        // The encoder runs once; the decoder runs one position per token over its KV cache.
        let encoded = fwd.encode(
            int_tensor(input_ids, batch, src_len, device),
            &mask,
            &mut drop,
        );
        let mut cache = fwd.decoder_cache(&encoded);
        let start = cfg.decoder_start_token_id;
        let mut seqs: Vec<Vec<u32>> = vec![vec![start]; batch];
        let mut done = vec![false; batch];
        let vocab = cfg.vocab_size;
        for _ in 0..config.max_new_tokens {
            let last: Vec<u32> = seqs.iter().filter_map(|s| s.last().copied()).collect();
            let hidden = fwd.decode_step(int_tensor(&last, batch, 1, device), &mut cache, &mask);
            let logits = to_f32_vec(fwd.lm_logits(hidden))?;
            for (row, seq) in seqs.iter_mut().enumerate() {
                if done[row] {
                    seq.push(cfg.pad_token_id);
                    continue;
                }
                let mut scores = logits[row * vocab..(row + 1) * vocab].to_vec();
                crate::t5_engine::decoding::apply_repetition_penalty(
                    &mut scores,
                    seq,
                    config.repetition_penalty,
                );
                crate::t5_engine::decoding::ban_repeated_ngrams(
                    &mut scores,
                    seq,
                    config.no_repeat_ngram,
                );
                let next = crate::t5_engine::decoding::argmax(&scores);
                seq.push(next);
                if next == config.eos_id {
                    done[row] = true;
                }
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

    fn param_counts(&self) -> ParamCounts {
        let (total, trainable) = self.model.param_counts(&self.options.freeze);
        ParamCounts { total, trainable }
    }

    fn save(&self, dir: &Path) -> Result<(), ModelError> {
        self.model.save(dir)?;
        self.optimizer.save(&dir.join("optimizer.safetensors"))
    }

    fn load(&mut self, dir: &Path, with_optimizer: bool) -> Result<(), ModelError> {
        let config = T5Config::from_file(&dir.join("config.json"))?;
        // Same tensors (names and shapes); init scales and other hyper-parameters may differ.
        if !memfit_nn::t5::T5Layout::new(&config).same_tensors(&self.model.layout) {
            return Err(ModelError::Input(format!(
                "{}: the checkpoint's config.json describes another model than this engine's",
                dir.display()
            )));
        }
        let mut model = self.model.clone();
        model.load_weights(&mut HfWeights::open_dir(dir)?)?;
        let mut optimizer = self.optimizer.clone();
        if with_optimizer {
            optimizer.load(&dir.join("optimizer.safetensors"))?;
        }
        // Replace only once everything has loaded: a failed load leaves the engine as it was.
        self.model = model;
        self.optimizer = optimizer;
        self.grads.iter_mut().for_each(|g| *g = None);
        self.invalidate();
        Ok(())
    }
}

/// Greedy-decoding logits processors (transformers' `RepetitionPenaltyLogitsProcessor` and
/// `NoRepeatNGramLogitsProcessor`), applied to one row of scores given the decoder input so far.
pub mod decoding {
    use std::collections::HashSet;

    /// Divides positive (multiplies negative) scores of tokens already in `seq` by `penalty`.
    pub fn apply_repetition_penalty(scores: &mut [f32], seq: &[u32], penalty: f32) {
        if penalty == 1.0 {
            return;
        }
        let seen: HashSet<u32> = seq.iter().copied().collect();
        for id in seen {
            if let Some(s) = scores.get_mut(id as usize) {
                *s = if *s < 0.0 { *s * penalty } else { *s / penalty };
            }
        }
    }

    /// Bans every token that would complete an `n`-gram already present in `seq`.
    pub fn ban_repeated_ngrams(scores: &mut [f32], seq: &[u32], n: usize) {
        if n == 0 || seq.len() + 1 < n {
            return;
        }
        let prefix = &seq[seq.len() + 1 - n..];
        for w in seq.windows(n) {
            if &w[..n - 1] == prefix
                && let Some(s) = scores.get_mut(w[n - 1] as usize)
            {
                *s = f32::NEG_INFINITY;
            }
        }
    }

    /// Index of the largest score (the first on ties, as `torch.argmax`).
    pub fn argmax(scores: &[f32]) -> u32 {
        let mut best = 0;
        for (i, &s) in scores.iter().enumerate() {
            if s > scores[best] {
                best = i;
            }
        }
        best as u32
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn no_repeat_ngram_bans_the_completing_token() {
            let mut s = vec![0.0; 6];
            // seq ends in (2, 3); the 3-gram (2, 3, 4) occurred: 4 is banned, nothing else.
            ban_repeated_ngrams(&mut s, &[0, 2, 3, 4, 1, 2, 3], 3);
            assert_eq!(s[4], f32::NEG_INFINITY);
            assert_eq!(s.iter().filter(|x| x.is_infinite()).count(), 1);
        }

        #[test]
        fn repetition_penalty_follows_sign() {
            let mut s = vec![2.0, -2.0, 2.0];
            apply_repetition_penalty(&mut s, &[0, 1], 2.0);
            assert_eq!(s, vec![1.0, -4.0, 2.0]);
            assert_eq!(argmax(&s), 2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lent_weights_come_back_without_a_copy() {
        // The point of lending: a Vec<f32> moved into a flex tensor and back keeps its buffer.
        let w: Vec<f32> = (0..4096).map(|i| i as f32).collect();
        let ptr = w.as_ptr();
        let t = Tensor::<2>::from_data(TensorData::new(w, [64, 64]), (&Device::flex(), DType::F32));
        let back = to_f32_vec(t).unwrap();
        assert_eq!(back.as_ptr(), ptr, "the buffer was copied");
        assert_eq!(back[4095], 4095.0);
    }
}
