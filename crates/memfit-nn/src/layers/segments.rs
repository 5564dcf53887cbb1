//! Back-propagation one segment at a time (per-block checkpointing, the chunked LM head): a saved
//! tensor becomes the leaf of the segment's graph, the segment's output is pulled back with the
//! cotangent that the segment after it produced, and the leaf's gradient is the cotangent for the
//! segment before.

use burn::prelude::*;
use burn::tensor::Gradients;

/// `t` as an autodiff leaf, retaining its gradient when `grad`.
pub fn leaf<const D: usize>(t: &Tensor<D>, grad: bool) -> Tensor<D> {
    let t = t.clone().autodiff();
    if grad { t.require_grad() } else { t }
}

/// Back-propagates `cotangent` through `out`; `None` when `out` depends on nothing tracked.
pub fn pull<const D: usize>(out: Tensor<D>, cotangent: &Tensor<D>) -> Option<Gradients> {
    if !out.is_tracked() {
        return None;
    }
    Some((out * cotangent.clone()).sum().backward())
}
