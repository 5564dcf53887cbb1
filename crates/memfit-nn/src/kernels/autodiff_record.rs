//! How the hand-written ops enter burn's autodiff graph: one place for the recording that every
//! op's `Autodiff` implementation would otherwise repeat (flex's ops, and the cubecl kernels').

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::ops::{Backward, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend};

/// Runs `forward` on the inputs' inner tensors and, when any input is tracked, records the result
/// with `op`'s backward and the state `forward` returned (dropped otherwise). The op is marked
/// compute-bound: its state is kept, never recomputed by a checkpointing strategy.
pub fn record<B, C, O, const N: usize>(
    op: O,
    inputs: [FloatTensor<Autodiff<B, C>>; N],
    forward: impl FnOnce([FloatTensor<B>; N]) -> (FloatTensor<B>, O::State),
) -> FloatTensor<Autodiff<B, C>>
where
    B: Backend,
    C: CheckpointStrategy,
    O: Backward<B, N>,
{
    // The graph references come before the inputs are consumed.
    let nodes = inputs.each_ref().map(|x| x.node());
    let primitives = inputs.map(|x| x.into_primitive());
    match op.prepare::<C>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let (out, state) = forward(primitives);
            prep.finish(state, out)
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(primitives).0),
    }
}
