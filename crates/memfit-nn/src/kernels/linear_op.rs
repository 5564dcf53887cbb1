//! A linear layer's `x · w` as one operation with a hand-written backward whose products are
//! [`gemm_f32::matmul`](crate::kernels::gemm_f32::matmul) calls (output allocated once, no zero fill
//! and copy as in burn-flex's matmul): a burn backend extension for the flex CPU backend.
//! The backward is the usual `dx = g · wᵀ`, `dw = xᵀ · g`; it keeps x and w, as burn's matmul does.
//!
//! x and w may each be stored as f32 or bf16; the output and dx leave in x's dtype, dw in w's. The
//! products are f32 or bf16 ([`Products`]: bf16 rounds both operands to bf16 and sums in f32, on
//! AVX512-BF16 where the CPU has it). So bf16 training keeps bf16 activations beside the f32 master
//! weights, with no bf16 copy of the weights, and multiplies as PyTorch's bf16 autocast does.

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::prelude::*;
use burn_flex::FlexTensor;

use crate::kernels::autodiff_record::record;
use crate::kernels::flex_values::is_flex_float;
pub use crate::kernels::gemm_bf16::Products;

#[backend_extension(Flex, Autodiff)]
pub trait LinearOp: Backend {
    /// `x · w`: x `[m, k]`, w `[k, n]`, both 2-d (any strides), multiplied as `products` says.
    /// `w_trains`: whether w's gradient is wanted; when it is not, backward does not keep x (as for
    /// a frozen layer). Pass `true` unless w is a leaf that requires no gradient.
    fn linear(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        w_trains: bool,
        products: Products,
    ) -> FloatTensor<Self>;
}

/// Whether [`linear`] runs for `x` (flex, f32 or bf16); other backends and dtypes use burn's
/// matmul.
pub fn supported(x: &Tensor<2>) -> bool {
    is_flex_float(x)
}

/// `x · w` through [`linear`] where it runs, burn's matmul elsewhere.
/// The result is in `x`'s dtype, as the hand-written op gives it.
pub fn product(x: Tensor<2>, w: Tensor<2>, products: Products) -> Tensor<2> {
    if supported(&x) {
        linear(x, w, true, products)
    } else {
        composite(x, w, products)
    }
}

/// `x` through the linear layer with weight `w`, a parameter: a leaf, frozen when it requires no
/// gradient (then x is not kept for backward).
pub fn layer(x: Tensor<2>, w: Tensor<2>, products: Products) -> Tensor<2> {
    if supported(&x) {
        let trains = w.is_require_grad();
        linear(x, w, trains, products)
    } else {
        composite(x, w, products)
    }
}

/// burn's matmul with both operands in the products' dtype (it wants one dtype: cubecl reads a
/// mismatched operand as garbage, flex panics), the result in `x`'s. Casts to the dtype a tensor
/// already has cost nothing.
fn composite(x: Tensor<2>, w: Tensor<2>, products: Products) -> Tensor<2> {
    let (out, operands) = (x.dtype(), products.dtype());
    x.cast(operands).matmul(w.cast(operands)).cast(out)
}

/// [`LinearOp::linear`] on tensors (see [`supported`]).
pub fn linear(x: Tensor<2>, w: Tensor<2>, w_trains: bool, products: Products) -> Tensor<2> {
    Tensor::from_dispatch(<Dispatch as LinearOp>::linear(
        x.into_dispatch(),
        w.into_dispatch(),
        w_trains,
        products,
    ))
}

impl LinearOp for Flex {
    fn linear(x: FlexTensor, w: FlexTensor, _w_trains: bool, products: Products) -> FlexTensor {
        forward(x, w, products)
    }
}

/// `x · w`, the result in x's dtype.
fn forward(x: FlexTensor, w: FlexTensor, products: Products) -> FlexTensor {
    let dtype = x.dtype();
    products.matmul_into(&x, &w, None, dtype)
}

impl<C: CheckpointStrategy> LinearOp for Autodiff<Flex, C> {
    fn linear(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        w_trains: bool,
        products: Products,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Linear(Products);

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
                let products = self.0;
                let (x, w) = ops.state;
                if let Some(node) = w_node {
                    let x = x.expect("the linear op was told its weight trains no gradient");
                    let dw_dtype = w.dtype();
                    let xt = Flex::float_transpose(x);
                    let dw = products.matmul_into(&xt, &grad, None, dw_dtype);
                    grads.register::<Flex>(node.id, dw);
                }
                if let Some(node) = x_node {
                    let dx_dtype = grad.dtype();
                    let wt = Flex::float_transpose(w);
                    let dx = products.matmul_into(&grad, &wt, None, dx_dtype);
                    grads.register::<Flex>(node.id, dx);
                }
            }
        }

        record::<_, C, _, 2>(Linear(products), [x, w], |[x, w]| {
            let out = forward(x.clone(), w.clone(), products);
            (out, (w_trains.then_some(x), w))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_tensors::{assert_close, tracked as tensor, tracked_in, values};
    use burn::tensor::{DType, TensorData};

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
                linear(x, w, true, Products::F32)
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
    fn bf16_products_over_f32_weights_equal_f32_products_of_the_rounded_operands() {
        // bf16 activations, f32 weights, bf16 products: the output and dx leave as bf16, dw as f32,
        // each equal to f32 products of the same operands rounded to bf16 (up to the final bf16
        // rounding of the output and dx; the summation order differs).
        let rounded = |t: Tensor<2>| t.cast(DType::BF16).cast(DType::F32);
        let run = |products: Products, x: Tensor<2>, w: Tensor<2>| {
            let out = linear(x.clone(), w.clone(), true, products);
            let g = tracked_in([5, 40], 3, DType::F32).inner();
            let grads = (out.clone().cast(DType::F32) * g).sum().backward();
            let (dx, dw) = (x.grad(&grads).unwrap(), w.grad(&grads).unwrap());
            [out.inner(), dx, dw]
        };
        let x16 = tracked_in([5, 6], 1, DType::BF16);
        let w = tracked_in([6, 40], 2, DType::F32);
        let bf16 = run(Products::Bf16, x16, w.clone());
        assert_eq!(
            bf16.each_ref().map(|t| t.dtype()),
            [DType::BF16, DType::BF16, DType::F32]
        );
        let x32 = tracked_in([5, 6], 1, DType::F32);
        let w_rounded = rounded(w.inner()).autodiff().require_grad();
        let f32 = run(Products::F32, x32, w_rounded);
        for (which, (b, f)) in ["output", "dx", "dw"].iter().zip(bf16.into_iter().zip(f32)) {
            let tol = if *which == "dw" { 1e-5 } else { 8e-3 };
            assert_close(which, &values(b.cast(DType::F32)), &values(f), tol);
        }
    }

    #[test]
    fn a_frozen_weight_still_passes_the_input_gradient() {
        // `layer` reads the weight's requirement: frozen, x is not kept, dx is still exact.
        let (x, frozen) = (tensor([5, 6], 1), tensor([6, 300], 2).inner().autodiff());
        assert!(!frozen.is_require_grad());
        let weight = tensor([5, 300], 3).inner();
        let dx = |out: Tensor<2>| values(x.grad(&(out * weight.clone()).sum().backward()).unwrap());
        let fused = dx(layer(x.clone(), frozen.clone(), Products::F32));
        let reference = dx(x.clone().matmul(frozen));
        assert_close("dx", &fused, &reference, 1e-5);
    }

    #[test]
    fn large_products_use_the_pool_and_agree() {
        // m·n·k above the parallel threshold.
        let (x, w) = (tensor([256, 192], 4).inner(), tensor([192, 200], 5).inner());
        let fused = values(linear(x.clone(), w.clone(), true, Products::F32));
        let reference = values(x.matmul(w));
        assert_close("x·w", &fused, &reference, 1e-4);
    }

    #[test]
    fn an_empty_inner_dimension_gives_zeros() {
        let x = Tensor::<2>::from_data(TensorData::new(Vec::<f32>::new(), [3, 0]), &Device::flex());
        let w = Tensor::<2>::from_data(TensorData::new(Vec::<f32>::new(), [0, 4]), &Device::flex());
        assert_eq!(values(linear(x, w, true, Products::F32)), vec![0.0; 12]);
    }
}
