//! A dense layer with a bias, `act(x) · w + b`, as one operation with a hand-written backward: the
//! bias is added into the product's fresh output (no second tensor, no broadcast pass) and its
//! gradient is the column sums of the output's; with [`Input::Gelu`] the layer's input is a
//! pre-activation `a` whose GELU (erf) is computed inside — in forward, and again in backward for the
//! weight's gradient — so only `a` is kept for backward, not both `a` (for GELU's derivative) and
//! `gelu(a)` (for the product), as two separate ops keep them: a BERT feed-forward keeps one
//! `[tokens, intermediate]` tensor per layer instead of two.
//!
//! Storage and products as [`crate::kernels::linear_op`]: x in f32 or bf16 (the output and dx in
//! its dtype), w and b in their own dtype, products f32 or bf16.

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::prelude::*;
use burn::tensor::DType;
use burn_flex::FlexTensor;

use crate::kernels::autodiff_record::record;
use crate::kernels::flex_values::{from_values, is_flex_float, map_chunks, map_in_place, values};
use crate::kernels::gelu;
pub use crate::kernels::gemm_bf16::Products;

/// What the layer applies to its input before the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    Plain,
    /// GELU (erf): the input is the pre-activation.
    Gelu,
}

#[backend_extension(Flex, Autodiff)]
pub trait DenseOp: Backend {
    /// `act(x) · w + b`: x `[m, k]`, w `[k, n]`, b `[1, n]`. `w_trains` as for
    /// [`crate::kernels::linear_op::LinearOp::linear`].
    fn dense(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        b: FloatTensor<Self>,
        input: Input,
        w_trains: bool,
        products: Products,
    ) -> FloatTensor<Self>;
}

/// Whether [`dense`] runs for `x` (flex, f32 or bf16).
pub fn supported(x: &Tensor<2>) -> bool {
    is_flex_float(x)
}

/// `act(x) · w + b` through [`DenseOp::dense`], with w a parameter (frozen when it requires no
/// gradient).
pub fn dense(
    x: Tensor<2>,
    w: Tensor<2>,
    b: Tensor<2>,
    input: Input,
    products: Products,
) -> Tensor<2> {
    let w_trains = w.is_require_grad();
    Tensor::from_dispatch(<Dispatch as DenseOp>::dense(
        x.into_dispatch(),
        w.into_dispatch(),
        b.into_dispatch(),
        input,
        w_trains,
        products,
    ))
}

impl DenseOp for Flex {
    fn dense(
        x: FlexTensor,
        w: FlexTensor,
        b: FlexTensor,
        input: Input,
        _w_trains: bool,
        products: Products,
    ) -> FlexTensor {
        forward(&x, &w, &b, input, products)
    }
}

/// `x`'s GELU, in x's dtype.
fn gelu_of(x: &FlexTensor) -> FlexTensor {
    map_chunks([x], x.dtype(), |[x], out| gelu::gelu(x, out))
}

/// The layer's input to the product: x, or its GELU.
fn activated(x: &FlexTensor, input: Input) -> FlexTensor {
    match input {
        Input::Plain => x.clone(),
        Input::Gelu => gelu_of(x),
    }
}

/// `act(x) · w + b`, the result in x's dtype.
fn forward(
    x: &FlexTensor,
    w: &FlexTensor,
    b: &FlexTensor,
    input: Input,
    products: Products,
) -> FlexTensor {
    let bias = values(b);
    products.matmul_into(&activated(x, input), w, Some(&bias), x.dtype())
}

/// The bias gradient: the column sums of `grad` `[m, n]`, as `[1, n]` in `dtype`.
fn column_sums(grad: &FlexTensor, dtype: DType) -> FlexTensor {
    let n = grad.layout().shape()[1];
    let mut sums = vec![0.0f32; n];
    values(grad)
        .chunks_exact(n)
        .for_each(|row| sums.iter_mut().zip(row).for_each(|(s, g)| *s += g));
    from_values(sums, Shape::new([1, n]), dtype)
}

impl<C: CheckpointStrategy> DenseOp for Autodiff<Flex, C> {
    fn dense(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        b: FloatTensor<Self>,
        input: Input,
        w_trains: bool,
        products: Products,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Dense(Input, Products);

        impl Backward<Flex, 3> for Dense {
            /// x (when w trains or GELU's derivative needs it), w, and b's dtype.
            type State = (Option<FlexTensor>, FlexTensor, DType);

            fn backward(
                self,
                ops: Ops<Self::State, 3>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [x_node, w_node, b_node] = ops.parents;
                let grad = grads.consume::<Flex>(&ops.node);
                let Dense(input, products) = self;
                let (x, w, b_dtype) = ops.state;
                if let Some(node) = b_node {
                    grads.register::<Flex>(node.id, column_sums(&grad, b_dtype));
                }
                if let Some(node) = w_node {
                    let x = x
                        .as_ref()
                        .expect("the dense op was told its weight trains no gradient");
                    // the activation again, freed as soon as the product is done
                    let act = activated(x, input);
                    let dw =
                        products.matmul_into(&Flex::float_transpose(act), &grad, None, w.dtype());
                    grads.register::<Flex>(node.id, dw);
                }
                if let Some(node) = x_node {
                    let dtype = grad.dtype();
                    let wt = Flex::float_transpose(w);
                    let dx = match (input, &x) {
                        (Input::Gelu, Some(x)) => {
                            let dact = products.matmul(&grad, &wt);
                            if dtype == DType::F32 && x.dtype() == DType::F32 {
                                // in dact's own buffer
                                map_in_place(dact, |g| gelu::times_gelu_grad(&values(x), g))
                            } else {
                                map_chunks([x, &dact], dtype, |[x, dact], dx| {
                                    dx.copy_from_slice(dact);
                                    gelu::times_gelu_grad(x, dx)
                                })
                            }
                        }
                        _ => products.matmul_into(&grad, &wt, None, dtype),
                    };
                    grads.register::<Flex>(node.id, dx);
                }
            }
        }

        let keep_x = w_trains || input == Input::Gelu;
        record::<_, C, _, 3>(Dense(input, products), [x, w, b], |[x, w, b]| {
            let out = forward(&x, &w, &b, input, products);
            (out, (keep_x.then_some(x), w, b.dtype()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_tensors::{assert_close, tracked as tensor, tracked_in, values};
    use burn::tensor::activation;

    /// Output and gradients of x, w, b through `f` (weighted sum of the output as the loss).
    fn run(f: impl Fn(Tensor<2>, Tensor<2>, Tensor<2>) -> Tensor<2>) -> [Vec<f32>; 4] {
        let (x, w, b) = (tensor([7, 12], 1), tensor([12, 40], 2), tensor([1, 40], 3));
        let out = f(x.clone(), w.clone(), b.clone());
        let weight = tensor([7, 40], 4).inner();
        let grads = (out.clone() * weight).sum().backward();
        [
            values(out.inner()),
            values(x.grad(&grads).unwrap()),
            values(w.grad(&grads).unwrap()),
            values(b.grad(&grads).unwrap()),
        ]
    }

    #[test]
    fn equals_burns_ops_in_value_and_gradients() {
        let identity: fn(Tensor<2>) -> Tensor<2> = |x| x;
        let gelu: fn(Tensor<2>) -> Tensor<2> = activation::gelu::<2>;
        for (input, act) in [(Input::Plain, identity), (Input::Gelu, gelu)] {
            let fused = run(|x, w, b| dense(x, w, b, input, Products::F32));
            let reference = run(|x, w, b| act(x).matmul(w) + b);
            for (which, (a, r)) in ["output", "dx", "dw", "db"]
                .iter()
                .zip(fused.iter().zip(&reference))
            {
                assert_close(&format!("{input:?} {which}"), a, r, 1e-5);
            }
        }
    }

    #[test]
    fn bf16_activations_leave_in_bf16_and_the_weights_gradients_in_theirs() {
        let x = tracked_in([5, 6], 1, DType::BF16);
        let (w, b) = (
            tracked_in([6, 20], 2, DType::F32),
            tracked_in([1, 20], 3, DType::F32),
        );
        let out = dense(x.clone(), w.clone(), b.clone(), Input::Gelu, Products::Bf16);
        assert_eq!(out.dtype(), DType::BF16);
        let grads = out.cast(DType::F32).sum().backward();
        assert_eq!(x.grad(&grads).unwrap().dtype(), DType::BF16);
        assert_eq!(w.grad(&grads).unwrap().dtype(), DType::F32);
        assert_eq!(b.grad(&grads).unwrap().dtype(), DType::F32);
    }
}
