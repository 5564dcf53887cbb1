//! Tasks: what a run trains for. A task turns rows of its data into the engine's micro-batches,
//! says what a micro-batch's loss averages over (so accumulation weighs micro-batches right), and
//! evaluates with its own scores. The loop is generic over the task.
//!
//! - [`seq2seq`]        — source → target (T5): loss, greedy generation scored by BLEU-4.
//! - [`classification`] — text (or a text pair) → label (BERT family): loss, accuracy, macro-F1,
//!   per-class precision and recall.
//! - [`causal_lm`]      — next-token prediction with the prompt masked out (decoders): loss,
//!   perplexity, greedy continuations of validation prompts.

pub mod causal_lm;
pub mod classification;
pub mod seq2seq;

use crate::engine::Engine;
use crate::eval::{EvalError, EvalPlan, EvalProgress, EvalReport};
use memfit_data::DataError;

/// Rows of a task's data, addressable by index: a token store, or rows held in memory.
/// `Sync`: the loop reads the next step's rows on a helper thread while a step computes.
pub trait RowSource<R>: Sync {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Row `index` (`index < len()`); a store read can fail.
    fn row(&self, index: usize) -> Result<R, DataError>;
    /// Token count of every row (the sampler's length grouping and token budgets use it).
    fn lengths(&self) -> Result<Vec<u32>, DataError>;
}

/// What a run trains for, on an engine of type `E`. `Sync`: the next step's micro-batches are
/// collated on a helper thread while a step computes.
pub trait Task<E: Engine>: Sync {
    /// One row of the task's data.
    type Row: Send;

    /// Pads rows into one micro-batch.
    fn collate(&self, rows: &[Self::Row]) -> E::Batch;

    /// What the batch's loss is a mean over (target tokens, or rows): a micro-batch's share of a
    /// step is its weight over the step's.
    fn loss_weight(&self, batch: &E::Batch) -> usize;

    /// Tokens the batch holds, padding excluded (tokens/s counts these).
    fn tokens(&self, batch: &E::Batch) -> u64;

    /// The score the summary shows before → after (`bleu4`, `accuracy`).
    fn headline(&self) -> &'static str;

    /// One evaluation over `valid` as `plan` says; `None` when a stop was requested before it
    /// finished (its partial results are discarded).
    fn evaluate(
        &self,
        engine: &E,
        valid: &dyn RowSource<Self::Row>,
        plan: &EvalPlan<'_>,
        progress: EvalProgress<'_>,
    ) -> Result<Option<EvalReport>, EvalError>;
}

/// Rows held in memory (tests).
#[derive(Debug, Clone, Default)]
pub struct InMemory<R> {
    pub rows: Vec<R>,
    /// Each row's token count.
    pub lengths: Vec<u32>,
}

impl<R: Clone + Sync> RowSource<R> for InMemory<R> {
    fn len(&self) -> usize {
        self.rows.len()
    }
    fn row(&self, index: usize) -> Result<R, DataError> {
        Ok(self.rows[index].clone())
    }
    fn lengths(&self) -> Result<Vec<u32>, DataError> {
        Ok(self.lengths.clone())
    }
}

/// A token store prepared by memfit-data for the run's task.
pub struct StoreRows(pub memfit_data::TokenStore);

impl StoreRows {
    /// Rows in the store (whatever task reads them).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Each micro-batch's share of the step: its loss weight over the step's (1/k each when the step
/// has no weight at all). With this, a step's gradient is the mean over all its target tokens (or
/// rows) whatever way its rows are cut into micro-batches (transformers made the same fix in 4.46,
/// `num_items_in_batch`).
pub fn shares(weights: &[usize]) -> Vec<f64> {
    let k = weights.len().max(1) as f64;
    let total: usize = weights.iter().sum();
    weights
        .iter()
        .map(|&w| {
            if total == 0 {
                1.0 / k
            } else {
                w as f64 / total as f64
            }
        })
        .collect()
}

/// The rows at `indices` of `source`.
pub fn read_rows<R>(source: &dyn RowSource<R>, indices: &[usize]) -> Result<Vec<R>, DataError> {
    indices.iter().map(|&i| source.row(i)).collect()
}

/// Token-weighted mean loss over the loss rows of `plan`: (loss, rows); `None` on a stop.
pub fn mean_loss<E: Engine, T: Task<E>>(
    task: &T,
    engine: &E,
    valid: &dyn RowSource<T::Row>,
    plan: &EvalPlan<'_>,
    progress: EvalProgress<'_>,
) -> Result<Option<(f64, usize)>, EvalError> {
    let batches = plan.loss_batches(valid.len());
    let n: usize = batches.iter().map(Vec::len).sum();
    let (mut loss_sum, mut weight, mut done) = (0.0f64, 0.0f64, 0);
    progress(crate::eval::EvalPhase::Loss, 0, n);
    // one batch per data-parallel rank at a time (one on one device)
    for group in batches.chunks(engine.ranks().max(1)) {
        if plan.stopped() {
            return Ok(None);
        }
        let collated: Vec<E::Batch> = (group.iter())
            .map(|indices| Ok(task.collate(&read_rows(valid, indices)?)))
            .collect::<Result<_, DataError>>()?;
        for (b, loss) in collated.iter().zip(engine.eval_losses(&collated)?) {
            let w = task.loss_weight(b) as f64;
            loss_sum += f64::from(loss) * w;
            weight += w;
        }
        done += group.iter().map(Vec::len).sum::<usize>();
        progress(crate::eval::EvalPhase::Loss, done, n);
    }
    let loss = if weight > 0.0 {
        loss_sum / weight
    } else {
        f64::NAN
    };
    Ok(Some((loss, n)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_the_weights_and_fall_back_to_equal() {
        assert_eq!(shares(&[1, 3]), vec![0.25, 0.75]);
        assert_eq!(shares(&[2, 2]), vec![0.5, 0.5]);
        assert_eq!(shares(&[0, 0]), vec![0.5, 0.5]);
    }
}
