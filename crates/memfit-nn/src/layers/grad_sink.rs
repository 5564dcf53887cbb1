//! Where the parameter gradients of a micro-batch go as they are produced: most come out of burn's
//! autodiff (one backward pass per block or chunk), the LM head's are computed by hand.

use burn::prelude::*;
use burn::tensor::Gradients;

pub trait GradSink {
    type Error;

    /// After a backward pass: takes (and may remove) the gradients of the tracked parameters.
    fn gradients(&mut self, grads: &mut Gradients) -> Result<(), Self::Error>;

    /// A gradient computed without autodiff for parameter `index` (its shape), to add to the rest.
    fn parameter(&mut self, index: usize, grad: Tensor<2>) -> Result<(), Self::Error>;

    /// Gradients of some rows of parameter `index` (an embedding table): row `r` of `grad`
    /// `[ids.len(), width]` adds to the parameter's row `ids[r]` (ids may repeat).
    fn rows(&mut self, index: usize, ids: &[usize], grad: Tensor<2>) -> Result<(), Self::Error>;

    /// The parameters `params` receive nothing more in this micro-batch's backward: a
    /// data-parallel trainer may reduce their gradients between ranks while the rest of the
    /// backward runs. A model calls it where its structure says so; never calling it is correct
    /// (everything is final when the backward returns), calling it early is a bug the trainer
    /// reports.
    fn finished(&mut self, _params: &[usize]) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// Where a trainer collects a micro-batch's parameter gradients, indexed as the model's
/// parameters ([`crate::model::TrainModel::params`]).
pub trait GradTarget {
    /// The gradient of parameter `index` (its shape), to add to what it holds.
    fn parameter(&mut self, index: usize, grad: Tensor<2>) -> Result<(), crate::ModelError>;

    /// Gradients of some rows of parameter `index`, as [`GradSink::rows`].
    fn rows(
        &mut self,
        index: usize,
        ids: &[usize],
        grad: Tensor<2>,
    ) -> Result<(), crate::ModelError>;

    /// As [`GradSink::finished`].
    fn finished(&mut self, _params: &[usize]) -> Result<(), crate::ModelError> {
        Ok(())
    }
}

/// Each of `count` blocks' parameter indices, from the parameters' transformers names (in
/// parameter order): block `i`'s names contain `part(i)` (`model.layers.3.`, which its LoRA
/// adapters' names contain too); `except` are left out (a parameter of block 0 that every block
/// uses, as T5's relative attention bias).
pub fn block_params(
    names: &[&str],
    count: usize,
    part: impl Fn(usize) -> String,
    except: &[usize],
) -> Vec<Vec<usize>> {
    (0..count)
        .map(|block| {
            let part = part(block);
            (names.iter().enumerate())
                .filter(|(i, name)| name.contains(&part) && !except.contains(i))
                .map(|(i, _)| i)
                .collect()
        })
        .collect()
}

/// A [`GradSink`] over a model's tracked parameter leaves: takes each trainable leaf's gradient
/// out of autodiff's container (so a gradient never exists twice for long) and hands the
/// trainable parameters' gradients to a [`GradTarget`].
pub struct LeafSink<'a> {
    pub leaves: &'a [Tensor<2>],
    pub trainable: &'a [bool],
    pub target: &'a mut dyn GradTarget,
}

impl GradSink for LeafSink<'_> {
    type Error = crate::ModelError;

    fn gradients(&mut self, grads: &mut Gradients) -> Result<(), crate::ModelError> {
        for (i, leaf) in self.leaves.iter().enumerate() {
            if !self.trainable[i] {
                continue;
            }
            if let Some(g) = leaf.grad_remove(grads) {
                self.target.parameter(i, g)?;
            }
        }
        Ok(())
    }

    fn parameter(&mut self, index: usize, grad: Tensor<2>) -> Result<(), crate::ModelError> {
        if self.trainable[index] {
            self.target.parameter(index, grad)?;
        }
        Ok(())
    }

    fn rows(
        &mut self,
        index: usize,
        ids: &[usize],
        grad: Tensor<2>,
    ) -> Result<(), crate::ModelError> {
        if self.trainable[index] {
            self.target.rows(index, ids, grad)?;
        }
        Ok(())
    }

    fn finished(&mut self, params: &[usize]) -> Result<(), crate::ModelError> {
        self.target.finished(params)
    }
}

/// `params` as autodiff leaves; the trainable ones require a gradient.
pub fn leaves(params: &[Tensor<2>], trainable: &[bool]) -> Vec<Tensor<2>> {
    params
        .iter()
        .zip(trainable)
        .map(|(t, &train)| {
            let t = t.clone().autodiff();
            if train { t.require_grad() } else { t }
        })
        .collect()
}
