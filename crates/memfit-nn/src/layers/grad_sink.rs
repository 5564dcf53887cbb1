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
