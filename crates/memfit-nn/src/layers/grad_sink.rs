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
