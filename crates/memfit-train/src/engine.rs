//! The boundary between the training loop and the tensor code.
//!
//! The loop (data order, accumulation bookkeeping, schedules, checkpoint directories, evaluation,
//! metrics, signals, the memory guard) is plain Rust and knows nothing of burn. A model family plugs in
//! by implementing [`Engine`]; the T5 engine on burn is one implementation. This keeps the loop testable
//! with a tiny engine and the tensor code testable without the loop.

use crate::signals::StopFlag;
use std::path::Path;

/// One padded seq2seq micro-batch, row-major `[batch, len]`: memfit-data's padded batch, so the
/// store's rows reach the engine without a copy into a twin type. Labels end in EOS; the engine builds
/// the decoder input itself (labels shifted right, starting with the decoder start token).
pub type Seq2SeqBatch = memfit_data::PaddedSeq2Seq;

/// What one optimizer step reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    /// Global L2 norm of the accumulated gradients before clipping.
    pub grad_norm: f64,
}

/// Greedy decoding settings (the seed's evaluation: no-repeat n-gram 4, repetition penalty 1.3).
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateConfig {
    pub max_new_tokens: usize,
    pub no_repeat_ngram: usize,
    pub repetition_penalty: f32,
    pub eos_id: u32,
    /// Polled between tokens: once set, generation ends early and returns what it has (the caller,
    /// which set it to stop, discards the rows).
    pub stop: Option<StopFlag>,
}

impl GenerateConfig {
    /// Whether generation should end before its next token.
    pub fn stop_requested(&self) -> bool {
        self.stop.as_ref().is_some_and(StopFlag::is_requested)
    }
}

/// Parameter counts, tied weights counted once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamCounts {
    pub total: u64,
    pub trainable: u64,
}

/// A model, its optimizer state and its accumulated gradients.
pub trait Engine {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Forward + backward on one micro-batch; the loss is multiplied by `loss_scale` (1/accum) exactly
    /// once before backward, and the gradients are added to the accumulated ones. Returns the unscaled
    /// mean token loss of this micro-batch. `seed` seeds every random draw of this micro-batch
    /// (dropout), so that a resumed run draws exactly what an uninterrupted one would have drawn.
    fn accumulate(
        &mut self,
        batch: &Seq2SeqBatch,
        loss_scale: f32,
        seed: u64,
    ) -> Result<f32, Self::Error>;

    /// Clips the accumulated gradients to `max_grad_norm` by global norm (if `Some`), applies one
    /// optimizer update at learning rate `lr`, and clears the accumulated gradients.
    fn step(&mut self, lr: f64, max_grad_norm: Option<f64>) -> Result<StepStats, Self::Error>;

    /// Mean token loss without gradients.
    fn eval_loss(&self, batch: &Seq2SeqBatch) -> Result<f32, Self::Error>;

    /// Greedy generation for each row of `input_ids` (`[batch, src_len]`, masked by `input_mask`);
    /// returns the generated ids without the decoder start token, cut at (and without) EOS.
    fn generate(
        &self,
        batch: usize,
        src_len: usize,
        input_ids: &[u32],
        input_mask: &[bool],
        config: &GenerateConfig,
    ) -> Result<Vec<Vec<u32>>, Self::Error>;

    fn param_counts(&self) -> ParamCounts;

    /// Writes `config.json` and `model.safetensors` (Hugging Face names) and `optimizer.safetensors`
    /// into `dir`, which exists and is empty. The caller makes the write atomic.
    fn save(&self, dir: &Path) -> Result<(), Self::Error>;

    /// Loads model weights and, if `with_optimizer`, the optimizer state from a directory written by `save`.
    fn load(&mut self, dir: &Path, with_optimizer: bool) -> Result<(), Self::Error>;
}
