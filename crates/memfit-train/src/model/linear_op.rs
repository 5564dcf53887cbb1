//! A linear layer's `x · w` as one operation with a hand-written backward whose products are
//! [`gemm_f32::matmul`](crate::model::gemm_f32::matmul) calls (output allocated once, no zero fill
//! and copy as in burn-flex's matmul): a burn backend extension for the flex CPU backend.
//! The backward is the usual `dx = g · wᵀ`, `dw = xᵀ · g`; it keeps x and w, as burn's matmul does.
//!
//! Products are f32 whatever the storage: x and w may each be f32 or bf16 (converted per use), the
//! output and dx leave in x's dtype, dw in w's. So bf16 training keeps bf16 activations beside the
//! f32 master weights, with no bf16 copy of the weights (autocast's mixed precision, computing in
//! f32: this CPU path has no faster bf16 GEMM).

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::prelude::*;
use burn_flex::FlexTensor;

use crate::model::flex_op::record;
use crate::model::flex_values::{cast, in_f32, is_flex_float};
use crate::model::gemm_f32::matmul;

#[backend_extension(Flex, Autodiff)]
pub trait LinearOp: Backend {
    /// `x · w`: x `[m, k]`, w `[k, n]`, both 2-d (any strides). `w_trains`: whether w's gradient
    /// is wanted; when it is not, backward does not keep x (as for a frozen layer). Pass `true`
    /// unless w is a leaf that requires no gradient.
    fn linear(x: FloatTensor<Self>, w: FloatTensor<Self>, w_trains: bool) -> FloatTensor<Self>;
}

/// Whether [`linear`] runs for `x` (flex, f32 or bf16); other backends and dtypes use burn's
/// matmul.
pub fn supported(x: &Tensor<2>) -> bool {
    is_flex_float(x)
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
        forward(x, w)
    }
}

/// `x · w` in f32, the result in x's dtype.
fn forward(x: FlexTensor, w: FlexTensor) -> FlexTensor {
    let dtype = x.dtype();
    cast(matmul(&in_f32(x), &in_f32(w)), dtype)
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
                let dx_dtype = grad.dtype();
                let grad = in_f32(grad);
                let (x, w) = ops.state;
                if let Some(node) = w_node {
                    let x = x.expect("the linear op was told its weight trains no gradient");
                    let dw_dtype = w.dtype();
                    let dw = matmul(&Flex::float_transpose(in_f32(x)), &grad);
                    grads.register::<Flex>(node.id, cast(dw, dw_dtype));
                }
                if let Some(node) = x_node {
                    let dx = matmul(&grad, &Flex::float_transpose(in_f32(w)));
                    grads.register::<Flex>(node.id, cast(dx, dx_dtype));
                }
            }
        }

        record::<C, _, 2>(Linear, [x, w], |[x, w]| {
            let out = forward(x.clone(), w.clone());
            (out, (w_trains.then_some(x), w))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_tensors::{
        Produced, assert_bf16_is_rounded_f32, assert_close, tracked as tensor, tracked_in, values,
    };
    use burn::tensor::{DType, TensorData};

    fn produced(name: &'static str, t: Tensor<2>, in_activation_dtype: bool) -> Produced {
        Produced {
            name,
            values: values(t.cast(DType::F32)),
            in_activation_dtype,
        }
    }

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
    fn bf16_activations_over_f32_weights_are_the_f32_op_rounded() {
        assert_bf16_is_rounded_f32(|dtype| {
            let (x, w) = (
                tracked_in([5, 6], 1, dtype),
                tracked_in([6, 40], 2, DType::F32),
            );
            let out = linear(x.clone(), w.clone(), true);
            assert_eq!(out.dtype(), dtype);
            let weight = tracked_in([5, 40], 3, DType::F32).inner();
            let grads = (out.clone().cast(DType::F32) * weight).sum().backward();
            let (dx, dw) = (x.grad(&grads).unwrap(), w.grad(&grads).unwrap());
            assert_eq!((dx.dtype(), dw.dtype()), (dtype, DType::F32));
            vec![
                produced("output", out.inner(), true),
                produced("dx", dx, true),
                produced("dw", dw, false),
            ]
        });
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
