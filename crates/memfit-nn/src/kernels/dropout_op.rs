//! Dropout, and dropout after ReLU, as operations with a hand-written backward that keep no mask:
//! a burn backend extension for the flex CPU backend, on f32 or bf16 tensors (scaled in f32).
//!
//! burn's `mask_fill` keeps its boolean mask for backward: one byte per element of every dropout
//! (each residual branch, the embeddings, the FFN). Here plain dropout keeps only its seed and draws
//! the mask again in backward; dropout after ReLU keeps nothing of its own either: its gradient
//! passes exactly where its output is positive (ReLU passed the element and dropout kept it), and
//! the output is kept anyway by the FFN's second linear layer, which shares the buffer.

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::prelude::*;
use burn_flex::FlexTensor;

use crate::kernels::autodiff_record::record;
use crate::kernels::dropout::{drop_and_scale, keep_scale};
use crate::kernels::flex_values::{map_in_place, values};

#[backend_extension(Flex, Cube: cfg(cube_kernels), Autodiff)]
pub trait DropoutOp: Backend {
    /// Inverted dropout with probability `p`, the mask drawn by `fill_dropped` from
    /// `SplitMix64::new(seed)` in row-major order.
    fn dropout(x: FloatTensor<Self>, seed: u64, p: f64) -> FloatTensor<Self>;

    /// `dropout(relu(x))`, the mask drawn as in [`DropoutOp::dropout`].
    fn relu_dropout(x: FloatTensor<Self>, seed: u64, p: f64) -> FloatTensor<Self>;
}

/// What backward needs of a backend beyond [`DropoutOp`] (backward draws plain dropout's mask
/// again with [`DropoutOp::dropout`] on the gradient).
pub trait DropoutGrad: Backend {
    /// The gradient of [`DropoutOp::relu_dropout`] from its output `out`: `grad / (1 − p)` where
    /// `out > 0`, else 0.
    fn relu_dropout_grad(
        grad: FloatTensor<Self>,
        out: FloatTensor<Self>,
        p: f64,
    ) -> FloatTensor<Self>;
}

/// Whether the ops run for `x`: f32 or bf16 on flex's hand-written path or on a cubecl device
/// (see [`super::device::runs_on`]); elsewhere burn's `mask_fill`.
pub fn supported<const D: usize>(x: &Tensor<D>) -> bool {
    super::flex_values::is_flex_float(x) || super::device::runs_on(x)
}

/// [`DropoutOp::dropout`] on a tensor (see [`supported`]).
pub fn dropout<const D: usize>(x: Tensor<D>, seed: u64, p: f64) -> Tensor<D> {
    Tensor::from_dispatch(<Dispatch as DropoutOp>::dropout(x.into_dispatch(), seed, p))
}

/// [`DropoutOp::relu_dropout`] on a tensor (see [`supported`]).
pub fn relu_dropout<const D: usize>(x: Tensor<D>, seed: u64, p: f64) -> Tensor<D> {
    Tensor::from_dispatch(<Dispatch as DropoutOp>::relu_dropout(
        x.into_dispatch(),
        seed,
        p,
    ))
}

impl DropoutOp for Flex {
    fn dropout(x: FlexTensor, seed: u64, p: f64) -> FlexTensor {
        map_in_place(x, |v| drop_and_scale(v, seed, p))
    }

    fn relu_dropout(x: FlexTensor, seed: u64, p: f64) -> FlexTensor {
        map_in_place(x, |v| {
            v.iter_mut()
                .for_each(|x| *x = if *x > 0.0 { *x } else { 0.0 });
            drop_and_scale(v, seed, p)
        })
    }
}

impl DropoutGrad for Flex {
    fn relu_dropout_grad(grad: FlexTensor, out: FlexTensor, p: f64) -> FlexTensor {
        let keep_scale = keep_scale(p) as f32;
        let out = values(&out);
        map_in_place(grad, |g| {
            for (g, &y) in g.iter_mut().zip(out.iter()) {
                *g = if y > 0.0 { *g * keep_scale } else { 0.0 };
            }
        })
    }
}

impl<B: DropoutOp + DropoutGrad, C: CheckpointStrategy> DropoutOp for Autodiff<B, C> {
    fn dropout(x: FloatTensor<Self>, seed: u64, p: f64) -> FloatTensor<Self> {
        record::<B, C, _, 1>(DropBackward, [x], |[x]| {
            (B::dropout(x, seed, p), Kept::Seed { seed, p })
        })
    }

    fn relu_dropout(x: FloatTensor<Self>, seed: u64, p: f64) -> FloatTensor<Self> {
        record::<B, C, _, 1>(DropBackward, [x], |[x]| {
            let out = B::relu_dropout(x, seed, p);
            (out.clone(), Kept::Output { out, p })
        })
    }
}

/// What a dropout keeps for its backward.
#[derive(Debug, Clone)]
enum Kept<T> {
    /// Plain dropout: the mask's seed (the mask is drawn again).
    Seed { seed: u64, p: f64 },
    /// After ReLU: the output (shared with the next layer, which keeps it).
    Output { out: T, p: f64 },
}

#[derive(Debug)]
struct DropBackward;

impl<B: DropoutOp + DropoutGrad> Backward<B, 1> for DropBackward {
    type State = Kept<FloatTensor<B>>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [x_node] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let Some(node) = x_node else { return };
        let dx = match ops.state {
            Kept::Seed { seed, p } => B::dropout(grad, seed, p),
            Kept::Output { out, p } => B::relu_dropout_grad(grad, out, p),
        };
        grads.register::<B>(node.id, dx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dropout::{SplitMix64, fill_dropped};
    use crate::kernels::test_tensors::{Produced, assert_bf16_is_rounded_f32, tracked_in};
    use burn::tensor::{DType, TensorData};

    fn input() -> Tensor<2> {
        let values: Vec<f32> = (0..63)
            .map(|i| ((i * 13 % 11) as f32 - 5.0) / 2.0)
            .collect();
        assert!(values.contains(&0.0), "the tie at 0 is covered");
        Tensor::from_data(TensorData::new(values, [9, 7]), &Device::flex())
            .autodiff()
            .require_grad()
    }

    /// Output and input gradient of `f`, weighted by a fixed cotangent.
    fn run(f: impl Fn(Tensor<2>) -> Tensor<2>) -> (Vec<f32>, Vec<f32>) {
        let x = input();
        let weights: Vec<f32> = (0..63).map(|i| (i % 7) as f32 - 3.0).collect();
        let w = Tensor::<2>::from_data(TensorData::new(weights, [9, 7]), &Device::flex());
        let y = f(x.clone());
        let grads = (y.clone() * w).sum().backward();
        let grad = x
            .grad(&grads)
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        (y.inner().into_data().try_to_vec::<f32>().unwrap(), grad)
    }

    /// burn's composite ops with the same mask (the reference).
    fn composite(x: Tensor<2>, seed: u64, p: f64, relu: bool) -> Tensor<2> {
        let mut dropped = vec![false; 63];
        fill_dropped(&mut SplitMix64::new(seed), p, &mut dropped);
        let mut mask = Tensor::<2, Bool>::from_data(TensorData::new(dropped, [9, 7]), &x.device());
        if relu {
            mask = mask.bool_or(x.clone().inner().lower_equal_elem(0.0));
        }
        x.mask_fill(mask, 0.0) * (1.0 / (1.0 - p))
    }

    #[test]
    fn equal_burns_masked_fill_in_value_and_gradient() {
        for p in [0.0, 0.3] {
            assert_eq!(
                run(|x| dropout(x, 5, p)),
                run(|x| composite(x, 5, p, false)),
                "dropout, p = {p}"
            );
            assert_eq!(
                run(|x| relu_dropout(x, 5, p)),
                run(|x| composite(x, 5, p, true)),
                "relu + dropout, p = {p}"
            );
        }
    }

    #[test]
    fn bf16_values_are_the_f32_ops_rounded() {
        for relu in [false, true] {
            assert_bf16_is_rounded_f32(|dtype| {
                let x = tracked_in([9, 7], 1, dtype);
                let y = if relu {
                    relu_dropout(x.clone(), 5, 0.3)
                } else {
                    dropout(x.clone(), 5, 0.3)
                };
                assert_eq!(y.dtype(), dtype);
                let g = tracked_in([9, 7], 2, DType::F32).inner();
                let dx = x.grad(&(y.clone().cast(DType::F32) * g).sum().backward());
                vec![
                    Produced::of("y", y.inner(), true),
                    Produced::of("dx", dx.unwrap(), true),
                ]
            });
        }
    }

    #[test]
    fn run_untracked_too() {
        let x = input().inner();
        let fused: Vec<f32> = dropout(x.clone(), 3, 0.5)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let mut dropped = vec![false; 63];
        fill_dropped(&mut SplitMix64::new(3), 0.5, &mut dropped);
        let source: Vec<f32> = x.into_data().try_to_vec::<f32>().unwrap();
        for ((y, x), d) in fused.iter().zip(&source).zip(&dropped) {
            assert_eq!(*y, if *d { 0.0 } else { x * 2.0 });
        }
    }
}
