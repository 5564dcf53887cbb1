//! SwiGLU's gating `silu(gate) ⊙ up` as one operation that keeps only its two inputs: a burn
//! backend extension for the flex CPU backend, on f32 or bf16 tensors (computed in f32).
//!
//! As burn's composite ops (`gate · sigmoid(gate)`, then `⊙ up`) backward keeps gate, sigmoid(gate),
//! silu(gate) and up: four `[tokens, intermediate]` tensors, the largest activations of a Llama-class
//! block. Here it keeps gate and up and recomputes the sigmoid in backward:
//! `d gate = g ⊙ up ⊙ s·(1 + gate·(1 − s))`, `d up = g ⊙ gate·s`, with `s = sigmoid(gate)`.

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::prelude::*;
use burn_flex::FlexTensor;

use crate::kernels::autodiff_record::record;
use crate::kernels::flex_values::{is_flex_float, tensor_like, values};
use crate::kernels::xent::exp_f32;

#[backend_extension(Flex, Autodiff)]
pub trait SwigluOp: Backend {
    /// `silu(gate) ⊙ up` for two tensors of one shape; the result in gate's dtype.
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// Whether [`swiglu`] runs for these tensors (flex, f32 or bf16, one shape); the GPU's code path
/// takes the device op (`kernels/device/activation.rs`).
pub fn supported<const D: usize>(gate: &Tensor<D>, up: &Tensor<D>) -> bool {
    is_flex_float(gate) && is_flex_float(up) && gate.dims() == up.dims()
}

/// [`SwigluOp::swiglu`] on tensors (see [`supported`]).
pub fn swiglu<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
    Tensor::from_dispatch(<Dispatch as SwigluOp>::swiglu(
        gate.into_dispatch(),
        up.into_dispatch(),
    ))
}

#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

fn forward_loop(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &x), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = x * sigmoid(x) * u;
    }
}

/// `grad` becomes d up in place; d gate is written to `d_gate`.
fn backward_loop(gate: &[f32], up: &[f32], grad: &mut [f32], d_gate: &mut [f32]) {
    for (((g, dg), &x), &u) in grad.iter_mut().zip(d_gate.iter_mut()).zip(gate).zip(up) {
        let s = sigmoid(x);
        *dg = *g * u * s * (1.0 + x * (1.0 - s));
        *g *= x * s;
    }
}

// The same loops compiled for AVX-512 (16 lanes): x86-64's baseline build only has SSE2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn forward_avx512(gate: &[f32], up: &[f32], out: &mut [f32]) {
    forward_loop(gate, up, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn backward_avx512(gate: &[f32], up: &[f32], grad: &mut [f32], d_gate: &mut [f32]) {
    backward_loop(gate, up, grad, d_gate)
}

/// `silu(gate) ⊙ up` in gate's dtype.
pub(crate) fn forward(gate: &FlexTensor, up: &FlexTensor) -> FlexTensor {
    let (g, u) = (values(gate), values(up));
    let mut out = vec![0.0; g.len()];
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F (checked just above).
        unsafe { forward_avx512(&g, &u, &mut out) };
        return tensor_like(out, gate);
    }
    forward_loop(&g, &u, &mut out);
    tensor_like(out, gate)
}

impl SwigluOp for Flex {
    fn swiglu(gate: FlexTensor, up: FlexTensor) -> FlexTensor {
        forward(&gate, &up)
    }
}

#[derive(Debug)]
struct SwigluBackward;

impl Backward<Flex, 2> for SwigluBackward {
    /// The two inputs, shared with their producers: no copy.
    type State = (FlexTensor, FlexTensor);

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let [gate_node, up_node] = ops.parents;
        let grad = grads.consume::<Flex>(&ops.node);
        let (gate, up) = ops.state;
        let [d_gate, d_up] = backward(&gate, &up, &grad);
        if let Some(node) = gate_node {
            grads.register::<Flex>(node.id, d_gate);
        }
        if let Some(node) = up_node {
            grads.register::<Flex>(node.id, d_up);
        }
    }
}

/// `[d gate, d up]` for the gradient `grad` of `silu(gate) ⊙ up`, in gate's and up's dtypes.
pub(crate) fn backward(gate: &FlexTensor, up: &FlexTensor, grad: &FlexTensor) -> [FlexTensor; 2] {
    let mut d_up = values(grad).into_owned();
    let mut d_gate = vec![0.0; d_up.len()];
    let (g, u) = (values(gate), values(up));
    #[cfg(target_arch = "x86_64")]
    let done = std::arch::is_x86_feature_detected!("avx512f") && {
        // SAFETY: the CPU has AVX-512F (checked just above).
        unsafe { backward_avx512(&g, &u, &mut d_up, &mut d_gate) };
        true
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = false;
    if !done {
        backward_loop(&g, &u, &mut d_up, &mut d_gate);
    }
    [tensor_like(d_gate, gate), tensor_like(d_up, up)]
}

impl<C: CheckpointStrategy> SwigluOp for Autodiff<Flex, C> {
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        record::<_, C, _, 2>(SwigluBackward, [gate, up], |[gate, up]| {
            (forward(&gate, &up), (gate, up))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_tensors::{
        Produced, assert_bf16_is_rounded_f32, assert_close, tracked_in,
    };
    use burn::tensor::DType;
    use burn::tensor::activation::silu;

    /// Output and the gradients of gate and up through `f`, weighted by a fixed cotangent.
    fn run(dtype: DType, f: impl Fn(Tensor<2>, Tensor<2>) -> Tensor<2>) -> [Vec<f32>; 3] {
        let scale = |t: Tensor<2>| (t.inner() * 4.0).autodiff().require_grad();
        let (gate, up) = (
            scale(tracked_in([13, 37], 1, dtype)),
            tracked_in([13, 37], 2, dtype),
        );
        let out = f(gate.clone(), up.clone());
        let g = tracked_in([13, 37], 3, DType::F32).inner();
        let grads = (out.clone().cast(DType::F32) * g).sum().backward();
        let of = |t: Tensor<2>| t.cast(DType::F32).into_data().try_to_vec::<f32>().unwrap();
        [
            of(out.inner()),
            of(gate.grad(&grads).unwrap()),
            of(up.grad(&grads).unwrap()),
        ]
    }

    #[test]
    fn equals_burns_silu_times_up_in_value_and_gradients() {
        let fused = run(DType::F32, |g, u| {
            assert!(supported(&g, &u));
            swiglu(g, u)
        });
        let composite = run(DType::F32, |g, u| silu(g) * u);
        for (which, (a, b)) in ["out", "d gate", "d up"]
            .iter()
            .zip(fused.iter().zip(&composite))
        {
            assert_close(which, a, b, 1e-5);
        }
    }

    #[test]
    fn bf16_values_are_the_f32_op_rounded() {
        assert_bf16_is_rounded_f32(|dtype| {
            let (gate, up) = (tracked_in([9, 7], 1, dtype), tracked_in([9, 7], 2, dtype));
            let y = swiglu(gate.clone(), up.clone());
            assert_eq!(y.dtype(), dtype);
            let g = tracked_in([9, 7], 3, DType::F32).inner();
            let grads = (y.clone().cast(DType::F32) * g).sum().backward();
            vec![
                Produced::of("y", y.inner(), true),
                Produced::of("d gate", gate.grad(&grads).unwrap(), true),
                Produced::of("d up", up.grad(&grads).unwrap(), true),
            ]
        });
    }
}
