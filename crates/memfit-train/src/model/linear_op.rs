//! A linear layer's `x · w` as one operation with a hand-written backward whose products are
//! [`gemm_f32::matmul`](crate::model::gemm_f32::matmul) calls (output allocated once, no zero fill
//! and copy as in burn-flex's matmul): a burn backend extension for the flex CPU backend, in f32.
//! The backward is the usual `dx = g · wᵀ`, `dw = xᵀ · g`; it keeps x and w, as burn's matmul does.

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::prelude::*;
use burn_flex::FlexTensor;

use crate::model::flex_f32::is_flex_f32;
use crate::model::flex_op::record;
use crate::model::gemm_f32::matmul;

#[backend_extension(Flex, Autodiff)]
pub trait LinearOp: Backend {
    /// `x · w`: x `[m, k]`, w `[k, n]`, both 2-d (any strides). `w_trains`: whether w's gradient
    /// is wanted; when it is not, backward does not keep x (as for a frozen layer). Pass `true`
    /// unless w is a leaf that requires no gradient.
    fn linear(x: FloatTensor<Self>, w: FloatTensor<Self>, w_trains: bool) -> FloatTensor<Self>;
}

/// Whether [`linear`] runs for `x` (flex, f32); other backends and dtypes use burn's matmul.
pub fn supported(x: &Tensor<2>) -> bool {
    is_flex_f32(x)
}

/// `x · w` through [`linear`] where it runs, burn's matmul elsewhere.
pub fn product(x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
    if supported(&x) {
        linear(x, w, true)
    } else {
        x.matmul(w)
    }
}

/// `x` through the linear layer with weight `w`, a parameter: a leaf, frozen when it requires no
/// gradient (then x is not kept for backward).
pub fn layer(x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
    if supported(&x) {
        let trains = w.is_require_grad();
        linear(x, w, trains)
    } else {
        x.matmul(w)
    }
}

/// [`LinearOp::linear`] on tensors (see [`supported`]).
pub fn linear(x: Tensor<2>, w: Tensor<2>, w_trains: bool) -> Tensor<2> {
    Tensor::from_dispatch(<Dispatch as LinearOp>::linear(
        x.into_dispatch(),
        w.into_dispatch(),
        w_trains,
    ))
}

impl LinearOp for Flex {
    fn linear(x: FlexTensor, w: FlexTensor, _w_trains: bool) -> FlexTensor {
        matmul(&x, &w)
    }
}

impl<C: CheckpointStrategy> LinearOp for Autodiff<Flex, C> {
    fn linear(x: FloatTensor<Self>, w: FloatTensor<Self>, w_trains: bool) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Linear;

        impl Backward<Flex, 2> for Linear {
            /// The input (when w trains) and the weight, shared with their producers: no copy.
            type State = (Option<FlexTensor>, FlexTensor);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [x_node, w_node] = ops.parents;
                let grad = grads.consume::<Flex>(&ops.node);
                let (x, w) = ops.state;
                if let Some(node) = w_node {
                    let x = x.expect("the linear op was told its weight trains no gradient");
                    let dw = matmul(&Flex::float_transpose(x), &grad);
                    grads.register::<Flex>(node.id, dw);
                }
                if let Some(node) = x_node {
                    let dx = matmul(&grad, &Flex::float_transpose(w));
                    grads.register::<Flex>(node.id, dx);
                }
            }
        }

        record::<C, _, 2>(Linear, [x, w], |[x, w]| {
            let out = matmul(&x, &w);
            (out, (w_trains.then_some(x), w))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_tensors::{assert_close, tracked as tensor, values};
    use burn::tensor::TensorData;

    /// Output and gradients of (x, w) through `f`; x is given transposed (a strided view) when
    /// `strided`.
    fn run(strided: bool, f: impl Fn(Tensor<2>, Tensor<2>) -> Tensor<2>) -> [Vec<f32>; 3] {
        let (x, w) = if strided {
            (tensor([6, 5], 1), tensor([6, 300], 2))
        } else {
            (tensor([5, 6], 1), tensor([6, 300], 2))
        };
        let input = if strided {
            x.clone().transpose()
        } else {
            x.clone()
        };
        let out = f(input, w.clone());
        let weight = tensor([5, 300], 3).inner();
        let grads = (out.clone() * weight).sum().backward();
        [
            values(out.inner()),
            values(x.grad(&grads).unwrap()),
            values(w.grad(&grads).unwrap()),
        ]
    }

    #[test]
    fn equals_burns_matmul_in_value_and_gradients() {
        for strided in [false, true] {
            let fused = run(strided, |x, w| {
                assert!(supported(&x));
                linear(x, w, true)
            });
            let reference = run(strided, |x, w| x.matmul(w));
            for (which, (a, b)) in ["output", "dx", "dw"]
                .iter()
                .zip(fused.iter().zip(&reference))
            {
                assert_close(which, a, b, 1e-5);
            }
        }
    }

    #[test]
    fn a_frozen_weight_still_passes_the_input_gradient() {
        // `layer` reads the weight's requirement: frozen, x is not kept, dx is still exact.
        let (x, frozen) = (tensor([5, 6], 1), tensor([6, 300], 2).inner().autodiff());
        assert!(!frozen.is_require_grad());
        let weight = tensor([5, 300], 3).inner();
        let dx = |out: Tensor<2>| values(x.grad(&(out * weight.clone()).sum().backward()).unwrap());
        let fused = dx(layer(x.clone(), frozen.clone()));
        let reference = dx(x.clone().matmul(frozen));
        assert_close("dx", &fused, &reference, 1e-5);
    }

    #[test]
    fn large_products_use_the_pool_and_agree() {
        // m·n·k above the parallel threshold.
        let (x, w) = (tensor([256, 192], 4).inner(), tensor([192, 200], 5).inner());
        let fused = values(linear(x.clone(), w.clone(), true));
        let reference = values(x.matmul(w));
        assert_close("x·w", &fused, &reference, 1e-4);
    }

    #[test]
    fn an_empty_inner_dimension_gives_zeros() {
        let x = Tensor::<2>::from_data(TensorData::new(Vec::<f32>::new(), [3, 0]), &Device::flex());
        let w = Tensor::<2>::from_data(TensorData::new(Vec::<f32>::new(), [0, 4]), &Device::flex());
        assert_eq!(values(linear(x, w, true)), vec![0.0; 12]);
    }
}
