//! The boundary between the training loop and the tensor code.
//!
//! The loop (data order, accumulation bookkeeping, schedules, checkpoint directories, evaluation,
//! metrics, signals, the memory guard) is plain Rust and knows nothing of burn. It drives an
//! [`Engine`]: a model with its optimizer state and accumulated gradients, over micro-batches of
//! the engine's own type. [`ModelEngine`] is the engine of every memfit-nn family (any
//! [`memfit_nn::model::TrainModel`]); the loop's tests drive a tiny engine of their own.
//!
//! What a task needs on top of training is a capability trait: [`Generate`] (seq2seq),
//! [`Classify`] (sequence classification), [`Continue`] (causal-LM generation).

mod device_state;
mod gradient;
pub use gradient::Gradient;
mod host_state;
mod model_engine;
mod options;
mod out_of_memory;
mod sending;
pub use sending::{GradBucket, SendBucket};

pub use model_engine::ModelEngine;
pub use options::{Backend, EngineOptions, Placement, Precision, set_threads};
pub(crate) use out_of_memory::panic_text;

use crate::optim::Optimizer;
use burn::prelude::{Device, Tensor};
pub use memfit_nn::batch::{CausalLmBatch, ClassificationBatch, Seq2SeqBatch, TokenRows};
pub use memfit_nn::decoding::GenerateConfig;
use std::path::Path;

/// An embedding gradient's row ids all inside its table of `rows` rows.
fn check_row_ids(ids: &[usize], rows: usize) -> Result<(), memfit_nn::ModelError> {
    match ids.iter().find(|&&id| id >= rows) {
        Some(id) => Err(memfit_nn::ModelError::Input(format!(
            "embedding row {id} is outside the table ({rows} rows)"
        ))),
        None => Ok(()),
    }
}

/// One micro-batch of a step with what [`Engine::accumulate`] takes beside it.
pub struct MicroBatch<'a, B> {
    pub batch: &'a B,
    pub loss_scale: f32,
    pub seed: u64,
}

/// What one optimizer step reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    /// Global L2 norm of the accumulated gradients before clipping.
    pub grad_norm: f64,
}

/// Parameter counts, tied weights counted once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamCounts {
    pub total: u64,
    pub trainable: u64,
}

/// A model, its optimizer state and its accumulated gradients.
pub trait Engine {
    /// One micro-batch (`Send`: collated on a helper thread ahead of its step).
    type Batch: Send;
    type Error: std::error::Error + Send + Sync + 'static;

    /// Forward + backward on one micro-batch; the loss is multiplied by `loss_scale` (the
    /// micro-batch's share of the step) exactly once before backward, and the gradients are added to
    /// the accumulated ones. Returns the unscaled mean loss of this micro-batch. `seed` seeds every
    /// random draw of this micro-batch (dropout), so that a resumed run draws exactly what an
    /// uninterrupted one would have drawn.
    fn accumulate(
        &mut self,
        batch: &Self::Batch,
        loss_scale: f32,
        seed: u64,
    ) -> Result<f32, Self::Error>;

    /// How many micro-batches [`Engine::accumulate_group`] runs side by side: the data-parallel
    /// ranks (1: one device).
    fn ranks(&self) -> usize {
        1
    }

    /// At most [`Engine::ranks`] micro-batches accumulated side by side, one per rank; their
    /// unscaled mean losses in order. On one device, one after the other.
    fn accumulate_group(
        &mut self,
        group: &[MicroBatch<'_, Self::Batch>],
    ) -> Result<Vec<f32>, Self::Error> {
        (group.iter())
            .map(|m| self.accumulate(m.batch, m.loss_scale, m.seed))
            .collect()
    }

    /// [`Engine::accumulate_group`] for the last group of a step, just before [`Engine::step`]: a
    /// data-parallel engine reduces the gradients between ranks during this group's backward.
    fn accumulate_last_group(
        &mut self,
        group: &[MicroBatch<'_, Self::Batch>],
    ) -> Result<Vec<f32>, Self::Error> {
        self.accumulate_group(group)
    }

    /// Drops the gradients accumulated so far: a step abandoned part-way (the device ran out of
    /// memory) is redone from its first micro-batch.
    fn discard_gradients(&mut self);

    /// Whether `error` is the device running out of memory: the loop then redoes the step at half
    /// the micro-batch, or stops resumable at micro-batch 1.
    fn is_out_of_memory(_error: &Self::Error) -> bool {
        false
    }

    /// Whether `error` is a data-parallel rank, or a collective between ranks, failing part-way
    /// through a step (nothing of the step applied): the loop then checkpoints the last completed
    /// step and stops resumable (exit 75).
    fn is_rank_failure(_error: &Self::Error) -> bool {
        false
    }

    /// Clips the accumulated gradients to `max_grad_norm` by global norm (if `Some`), applies one
    /// optimizer update at learning rate `lr`, and clears the accumulated gradients.
    fn step(&mut self, lr: f64, max_grad_norm: Option<f64>) -> Result<StepStats, Self::Error>;

    /// Mean loss without gradients or dropout.
    fn eval_loss(&self, batch: &Self::Batch) -> Result<f32, Self::Error>;

    /// [`Engine::eval_loss`] of each batch, in order; at most [`Engine::ranks`] of them run side by
    /// side, one per rank. On one device, one after the other.
    fn eval_losses(&self, batches: &[Self::Batch]) -> Result<Vec<f32>, Self::Error> {
        batches.iter().map(|b| self.eval_loss(b)).collect()
    }

    fn param_counts(&self) -> ParamCounts;

    /// Writes the model's directory (what its family is loaded from) and `optimizer.safetensors`
    /// into `dir`, which exists and is empty. The caller makes the write atomic. `&mut`: a
    /// device-placed engine first brings its weights back to the host.
    fn save(&mut self, dir: &Path) -> Result<(), Self::Error>;

    /// Loads model weights and, if `with_optimizer`, the optimizer state from a directory written
    /// by `save`.
    fn load(&mut self, dir: &Path, with_optimizer: bool) -> Result<(), Self::Error>;
}

/// An engine that can be one rank of a data-parallel group
/// ([`DataParallel`](crate::data_parallel::DataParallel)): its accumulated gradients go out to a
/// collective and come back reduced before the optimizer step.
pub trait Replica: Engine + Send {
    /// [`Engine::accumulate`] for a rank's last micro-batch of a step: each trained parameter's
    /// accumulated gradient (this micro-batch's added) is taken out and handed to `send` as soon as
    /// the model declares it final, the rest after the backward, so that the reduction between
    /// ranks runs while the backward goes on. Every trained parameter is sent exactly once, in the
    /// same buckets on every rank (the model's structure decides them); the reduced gradients come
    /// back through [`Replica::put_gradients`].
    fn accumulate_and_send(
        &mut self,
        batch: &Self::Batch,
        loss_scale_and_seed: (f32, u64),
        send: &mut SendBucket<'_>,
    ) -> Result<f32, Self::Error>;

    /// The accumulated gradients taken out, dense f32 tensors on this replica's device in parameter
    /// order (a trained parameter without a gradient yet: zeros; frozen: `None`, on every rank).
    fn take_gradients(&mut self) -> Result<Vec<Option<Tensor<2>>>, Self::Error>;

    /// Gradients of the shapes [`Replica::take_gradients`] gave (reduced) as the accumulated ones.
    fn put_gradients(&mut self, grads: Vec<Option<Tensor<2>>>) -> Result<(), Self::Error>;

    /// Each parameter's element count, `None` for a frozen one (ZeRO-1 divides the trained ones).
    fn trained_sizes(&self) -> Vec<Option<usize>>;

    /// Keeps only the optimizer states of the parameters `keep` (this rank's ZeRO-1 shard): the
    /// others are not stepped here.
    fn keep_optimizer_states(&mut self, keep: &[bool]) -> Result<(), Self::Error>;

    /// The optimizer's state in the host format (this rank's shard under ZeRO-1).
    fn optimizer_state(&self) -> Result<Optimizer, Self::Error>;

    /// The f32 masters of the `owned` parameters and zeros for the other trained ones (frozen:
    /// `None`), on this replica's device: summed over the ranks, every owner's masters.
    fn masters_for_gather(&self, owned: &[bool]) -> Result<Vec<Option<Tensor<2>>>, Self::Error>;

    /// Masters of the shapes [`Replica::masters_for_gather`] gave as this replica's weights.
    fn put_masters(&mut self, masters: Vec<Option<Tensor<2>>>) -> Result<(), Self::Error>;

    /// The device this replica computes on: on a cubecl device (CUDA, wgpu) each thread queues
    /// its work on a stream of its own, which another thread's work does not wait for, so a rank's
    /// thread syncs it before its tensors pass to another thread ([`crate::data_parallel`]).
    fn device(&self) -> Device;
}

/// Encoder-decoder generation.
pub trait Generate: Engine {
    /// Greedy generation for each source row; the generated ids without the decoder start token,
    /// cut at (and without) EOS.
    fn generate(
        &self,
        sources: &TokenRows,
        config: &GenerateConfig,
    ) -> Result<Vec<Vec<u32>>, Self::Error>;
}

/// Sequence classification.
pub trait Classify: Engine {
    /// Label names by id (`id2label`).
    fn labels(&self) -> Vec<String>;
    /// Logits `[batch, labels]`, row-major, without dropout.
    fn logits(&self, batch: &Self::Batch) -> Result<Vec<f32>, Self::Error>;
}

/// Causal-LM generation: each prompt continued greedily.
pub trait Continue: Engine {
    fn continue_prompts(
        &self,
        prompts: &[Vec<u32>],
        config: &GenerateConfig,
    ) -> Result<Vec<Vec<u32>>, Self::Error>;
}
