//! `dropout(x) · a` as one operation that keeps x and the mask's seed, not the dropped copy: LoRA's
//! down-projection (`layers/lora.rs`). A burn backend extension for the flex CPU backend.
//!
//! As two ops (dropout, then the linear layer) backward keeps `dropout(x)`, a fresh `[n, in]` copy
//! per adapter: q, k and v (and gate and up) each keep their own copy of the same normed input. Here
//! each keeps x itself — one buffer the adapters share — and backward draws the mask again
//! (`dA = dropout(x)ᵀ · g` recomputes the dropped copy for the moment of the product;
//! `dx = dropout'(g · aᵀ)`, the mask applied to the gradient as dropout's own backward does).
//! Values and gradients equal the two ops' bit for bit: the same products and roundings in the same
//! order.

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::prelude::*;
use burn_flex::FlexTensor;

use crate::kernels::autodiff_record::record;
use crate::kernels::dropout::drop_and_scale;
use crate::kernels::flex_values::{cast, map_in_place, tensor_like, values};
use crate::kernels::gemm_bf16::Products;

#[backend_extension(Flex, Autodiff)]
pub trait DropoutLinearOp: Backend {
    /// `dropout(x) · a`: x `[n, in]`, a `[in, r]`; the mask drawn from `seed` as
    /// [`crate::kernels::dropout_op::DropoutOp::dropout`] draws it, the products as `products`
    /// says; the result in x's dtype.
    fn dropout_linear(
        x: FloatTensor<Self>,
        a: FloatTensor<Self>,
        seed: u64,
        p: f64,
        products: Products,
    ) -> FloatTensor<Self>;
}

/// [`DropoutLinearOp::dropout_linear`] on tensors (flex, f32 or bf16: see
/// [`crate::kernels::dropout_op::supported`]).
pub fn dropout_linear(
    x: Tensor<2>,
    a: Tensor<2>,
    seed: u64,
    p: f64,
    products: Products,
) -> Tensor<2> {
    Tensor::from_dispatch(<Dispatch as DropoutLinearOp>::dropout_linear(
        x.into_dispatch(),
        a.into_dispatch(),
        seed,
        p,
        products,
    ))
}

/// x with the mask applied, in a new buffer (x is left as it is).
fn dropped(x: &FlexTensor, seed: u64, p: f64) -> FlexTensor {
    let mut v = values(x).into_owned();
    drop_and_scale(&mut v, seed, p);
    tensor_like(v, x)
}

fn forward(x: &FlexTensor, a: &FlexTensor, seed: u64, p: f64, products: Products) -> FlexTensor {
    products.matmul_into(&dropped(x, seed, p), a, None, x.dtype())
}

impl DropoutLinearOp for Flex {
    fn dropout_linear(
        x: FlexTensor,
        a: FlexTensor,
        seed: u64,
        p: f64,
        products: Products,
    ) -> FlexTensor {
        forward(&x, &a, seed, p, products)
    }
}

#[derive(Debug)]
struct DropoutLinear {
    seed: u64,
    p: f64,
    products: Products,
}

impl Backward<Flex, 2> for DropoutLinear {
    /// The input and the weight, shared with their producers: no copy.
    type State = (FlexTensor, FlexTensor);

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let [x_node, a_node] = ops.parents;
        let grad = grads.consume::<Flex>(&ops.node);
        let (x, a) = ops.state;
        let DropoutLinear { seed, p, products } = self;
        if let Some(node) = a_node {
            let xd = Flex::float_transpose(dropped(&x, seed, p));
            grads.register::<Flex>(node.id, products.matmul_into(&xd, &grad, None, a.dtype()));
        }
        if let Some(node) = x_node {
            let dxd = cast(
                products.matmul(&grad, &Flex::float_transpose(a)),
                grad.dtype(),
            );
            let dx = map_in_place(dxd, |g| drop_and_scale(g, seed, p));
            grads.register::<Flex>(node.id, cast(dx, x.dtype()));
        }
    }
}

impl<C: CheckpointStrategy> DropoutLinearOp for Autodiff<Flex, C> {
    fn dropout_linear(
        x: FloatTensor<Self>,
        a: FloatTensor<Self>,
        seed: u64,
        p: f64,
        products: Products,
    ) -> FloatTensor<Self> {
        let op = DropoutLinear { seed, p, products };
        record::<_, C, _, 2>(op, [x, a], |[x, a]| {
            (forward(&x, &a, seed, p, products), (x, a))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dropout_op::dropout;
    use crate::kernels::linear_op::linear;
    use crate::kernels::test_tensors::{tracked_in, values as of};
    use burn::tensor::DType;

    /// Output and the gradients of x and a through `f`, weighted by a fixed cotangent.
    fn run(dtype: DType, f: impl Fn(Tensor<2>, Tensor<2>) -> Tensor<2>) -> [Vec<f32>; 3] {
        let (x, a) = (
            tracked_in([37, 24], 1, dtype),
            tracked_in([24, 5], 2, DType::F32),
        );
        let out = f(x.clone(), a.clone());
        let g = tracked_in([37, 5], 3, DType::F32).inner();
        let grads = (out.clone().cast(DType::F32) * g).sum().backward();
        [
            of(out.inner().cast(DType::F32)),
            of(x.grad(&grads).unwrap().cast(DType::F32)),
            of(a.grad(&grads).unwrap()),
        ]
    }

    #[test]
    fn equals_dropout_then_linear_bit_for_bit() {
        for (dtype, products) in [(DType::F32, Products::F32), (DType::BF16, Products::Bf16)] {
            let fused = run(dtype, |x, a| dropout_linear(x, a, 9, 0.3, products));
            let two_ops = run(dtype, |x, a| linear(dropout(x, 9, 0.3), a, true, products));
            assert_eq!(fused, two_ops, "{dtype:?}");
            let undropped = run(dtype, |x, a| linear(x, a, true, products));
            assert_ne!(fused[0], undropped[0], "the mask is applied");
        }
    }

    #[test]
    fn keeps_the_input_unchanged_and_runs_untracked() {
        let (x, a) = (
            tracked_in([8, 6], 4, DType::F32).inner(),
            tracked_in([6, 3], 5, DType::F32).inner(),
        );
        let before = of(x.clone());
        let out = dropout_linear(x.clone(), a.clone(), 2, 0.5, Products::F32);
        assert_eq!(of(x.clone()), before);
        assert_eq!(
            of(out),
            of(linear(dropout(x, 2, 0.5), a, true, Products::F32))
        );
    }
}
