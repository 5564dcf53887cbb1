//! The activations on the GPU's code path, one launch forward and one backward on a cubecl device,
//! in f32 whatever the dtype, keeping only the input: exact (erf) GELU, its tanh approximation and
//! SiLU, and SwiGLU's gating `silu(gate) ⊙ up` (keeping gate and up). burn's composite ops run
//! three to five launches forward and about twice that backward, and keep their intermediates.
//! flex runs the same ops (same kept tensors, CPU loops) where the CPU runs the GPU's code path.

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::tensor::Tensor;
use burn_flex::FlexTensor;

use crate::kernels::autodiff_record::record;
use crate::kernels::flex_values::{tensor_like, values};
use crate::kernels::gelu::{gelu_f32, gelu_grad_f32};
use crate::kernels::swiglu_op::{self, sigmoid};
use crate::layers::activation::Activation;

#[backend_extension(Flex, Cube: cfg(cube_kernels), Autodiff)]
pub trait ActivationOp: Backend {
    /// The activation `kind` ([`kind_code`]) of `x`, element-wise.
    fn activation(x: FloatTensor<Self>, kind: u32) -> FloatTensor<Self>;

    /// `silu(gate) ⊙ up` for two tensors of one shape and dtype.
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// What backward needs of a backend beyond [`ActivationOp`].
pub trait ActivationGrad: Backend {
    /// `dy ⊙ act'(x)`.
    fn activation_grad(x: FloatTensor<Self>, dy: FloatTensor<Self>, kind: u32)
    -> FloatTensor<Self>;

    /// `[d gate, d up] = [dy ⊙ up ⊙ s·(1 + gate·(1 − s)), dy ⊙ gate·s]`, `s = sigmoid(gate)`.
    fn swiglu_grad(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2];
}

/// [`ActivationOp::activation`] on a tensor of the device path (`super::runs_on`); not ReLU.
pub fn activation<const D: usize>(x: Tensor<D>, act: Activation) -> Tensor<D> {
    let kind = kind_code(act);
    Tensor::from_dispatch(<Dispatch as ActivationOp>::activation(
        x.into_dispatch(),
        kind,
    ))
}

/// [`ActivationOp::swiglu`] on tensors of the device path (`super::runs_on`).
pub fn swiglu<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
    let (gate, up) = (gate.into_dispatch(), up.into_dispatch());
    Tensor::from_dispatch(<Dispatch as ActivationOp>::swiglu(gate, up))
}

pub(super) const GELU: u32 = 0;
pub(super) const GELU_TANH: u32 = 1;
pub(super) const SILU: u32 = 2;

/// The ops' code for `act` (ReLU is burn's own single launch).
fn kind_code(act: Activation) -> u32 {
    match act {
        Activation::Gelu => GELU,
        Activation::GeluNew => GELU_TANH,
        Activation::Silu => SILU,
        Activation::Relu => unreachable!("ReLU runs as burn's op"),
    }
}

/// The activation `kind` at `x` and its derivative there, on the CPU.
fn value_and_slope(x: f32, kind: u32) -> (f32, f32) {
    match kind {
        GELU => (gelu_f32(x), gelu_grad_f32(x)),
        GELU_TANH => {
            let t = (cube_consts::TANH_SCALE * (x + cube_consts::TANH_CUBIC * x * x * x)).tanh();
            let dt = (1.0 - t * t)
                * cube_consts::TANH_SCALE
                * (1.0 + 3.0 * cube_consts::TANH_CUBIC * x * x);
            (0.5 * x * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * x * dt)
        }
        _ => {
            let s = sigmoid(x);
            (x * s, s * (1.0 + x * (1.0 - s)))
        }
    }
}

mod cube_consts {
    /// `√(2/π)` and the cubic coefficient of the tanh approximation (transformers' `NewGELUActivation`).
    pub const TANH_SCALE: f32 = 0.797_884_6;
    pub const TANH_CUBIC: f32 = 0.044_715;
}

impl ActivationOp for Flex {
    fn activation(x: FlexTensor, kind: u32) -> FlexTensor {
        let y = values(&x)
            .iter()
            .map(|&v| value_and_slope(v, kind).0)
            .collect();
        tensor_like(y, &x)
    }

    fn swiglu(gate: FlexTensor, up: FlexTensor) -> FlexTensor {
        swiglu_op::forward(&gate, &up)
    }
}

impl ActivationGrad for Flex {
    fn activation_grad(x: FlexTensor, dy: FlexTensor, kind: u32) -> FlexTensor {
        let (xs, dys) = (values(&x), values(&dy));
        let dx = xs
            .iter()
            .zip(dys.iter())
            .map(|(&x, &g)| g * value_and_slope(x, kind).1);
        tensor_like(dx.collect(), &x)
    }

    fn swiglu_grad(gate: FlexTensor, up: FlexTensor, dy: FlexTensor) -> [FlexTensor; 2] {
        swiglu_op::backward(&gate, &up, &dy)
    }
}

#[derive(Debug)]
struct ActivationBackward;

impl<B: ActivationOp + ActivationGrad> Backward<B, 1> for ActivationBackward {
    /// The input and the kind.
    type State = (FloatTensor<B>, u32);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [x_node] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        if let Some(node) = x_node {
            let (x, kind) = ops.state;
            grads.register::<B>(node.id, B::activation_grad(x, dy, kind));
        }
    }
}

#[derive(Debug)]
struct SwigluBackward;

impl<B: ActivationOp + ActivationGrad> Backward<B, 2> for SwigluBackward {
    /// Gate and up.
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let (gate, up) = ops.state;
        let [d_gate, d_up] = B::swiglu_grad(gate, up, dy);
        for (node, d) in ops.parents.into_iter().zip([d_gate, d_up]) {
            if let Some(node) = node {
                grads.register::<B>(node.id, d);
            }
        }
    }
}

impl<B: ActivationOp + ActivationGrad, C: CheckpointStrategy> ActivationOp for Autodiff<B, C> {
    fn activation(x: FloatTensor<Self>, kind: u32) -> FloatTensor<Self> {
        record::<B, C, _, 1>(ActivationBackward, [x], |[x]| {
            (B::activation(x.clone(), kind), (x, kind))
        })
    }

    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        record::<B, C, _, 2>(SwigluBackward, [gate, up], |[gate, up]| {
            (B::swiglu(gate.clone(), up.clone()), (gate, up))
        })
    }
}

#[cfg(cube_kernels)]
mod cube {
    use burn::backend::Cube;
    use burn::backend::cubecl::dtype_to_storage_type;
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::tensor::CubeTensor;

    use super::super::launch::elementwise_like;
    use super::cube_consts::{TANH_CUBIC, TANH_SCALE};
    use super::{ActivationGrad, ActivationOp, GELU, GELU_TANH};

    #[cube]
    fn sigmoid(x: f32) -> f32 {
        1.0f32 / (1.0f32 + f32::exp(-x))
    }

    /// The activation `kind` of `x` and its derivative there.
    #[cube]
    fn value_and_slope(x: f32, #[comptime] kind: u32) -> (f32, f32) {
        if comptime!(kind == GELU) {
            let cdf = 0.5f32 * (1.0f32 + Erf::erf(x * 0.707_106_77f32));
            let pdf = f32::exp(-0.5f32 * x * x) * 0.398_942_3f32;
            (x * cdf, cdf + x * pdf)
        } else if comptime!(kind == GELU_TANH) {
            let t = f32::tanh(TANH_SCALE * (x + TANH_CUBIC * x * x * x));
            let slope = 0.5f32 * (1.0f32 + t)
                + 0.5f32
                    * x
                    * (1.0f32 - t * t)
                    * TANH_SCALE
                    * (1.0f32 + 3.0f32 * TANH_CUBIC * x * x);
            (0.5f32 * x * (1.0f32 + t), slope)
        } else {
            let s = sigmoid(x);
            (x * s, s * (1.0f32 + x * (1.0f32 - s)))
        }
    }

    #[cube(launch_unchecked)]
    fn activation_kernel<F: Float>(
        x: &Tensor<F>,
        y: &mut Tensor<F>,
        #[comptime] kind: u32,
        #[define(F)] _dtype: ElemType,
    ) {
        if ABSOLUTE_POS >= y.len() {
            terminate!();
        }
        let (value, _) = value_and_slope(f32::cast_from(x[ABSOLUTE_POS]), kind);
        y[ABSOLUTE_POS] = F::cast_from(value);
    }

    #[cube(launch_unchecked)]
    fn activation_grad_kernel<F: Float>(
        x: &Tensor<F>,
        dy: &Tensor<F>,
        dx: &mut Tensor<F>,
        #[comptime] kind: u32,
        #[define(F)] _dtype: ElemType,
    ) {
        if ABSOLUTE_POS >= dx.len() {
            terminate!();
        }
        let (_, slope) = value_and_slope(f32::cast_from(x[ABSOLUTE_POS]), kind);
        dx[ABSOLUTE_POS] = F::cast_from(f32::cast_from(dy[ABSOLUTE_POS]) * slope);
    }

    #[cube(launch_unchecked)]
    fn swiglu_kernel<F: Float>(
        gate: &Tensor<F>,
        up: &Tensor<F>,
        y: &mut Tensor<F>,
        #[define(F)] _dtype: ElemType,
    ) {
        if ABSOLUTE_POS >= y.len() {
            terminate!();
        }
        let g = f32::cast_from(gate[ABSOLUTE_POS]);
        y[ABSOLUTE_POS] = F::cast_from(g * sigmoid(g) * f32::cast_from(up[ABSOLUTE_POS]));
    }

    /// `d gate = dy ⊙ up ⊙ s·(1 + gate·(1 − s))`, `d up = dy ⊙ gate·s`, with `s = sigmoid(gate)`.
    #[cube(launch_unchecked)]
    fn swiglu_grad_kernel<F: Float>(
        gate: &Tensor<F>,
        up: &Tensor<F>,
        dy: &Tensor<F>,
        d_gate: &mut Tensor<F>,
        d_up: &mut Tensor<F>,
        #[define(F)] _dtype: ElemType,
    ) {
        if ABSOLUTE_POS >= d_gate.len() {
            terminate!();
        }
        let (g, u) = (
            f32::cast_from(gate[ABSOLUTE_POS]),
            f32::cast_from(up[ABSOLUTE_POS]),
        );
        let (dy, s) = (f32::cast_from(dy[ABSOLUTE_POS]), sigmoid(g));
        d_gate[ABSOLUTE_POS] = F::cast_from(dy * u * s * (1.0f32 + g * (1.0f32 - s)));
        d_up[ABSOLUTE_POS] = F::cast_from(dy * g * s);
    }

    impl ActivationOp for Cube {
        fn activation(x: CubeTensor, kind: u32) -> CubeTensor {
            let x = into_contiguous(x);
            let (y, count, dim) = elementwise_like(&x);
            let dtype = dtype_to_storage_type(x.dtype);
            unsafe {
                activation_kernel::launch_unchecked(
                    &y.client,
                    count,
                    dim,
                    x.into_tensor_arg(),
                    y.clone().into_tensor_arg(),
                    kind,
                    dtype,
                );
            }
            y
        }

        fn swiglu(gate: CubeTensor, up: CubeTensor) -> CubeTensor {
            let (gate, up) = (into_contiguous(gate), into_contiguous(up));
            let (y, count, dim) = elementwise_like(&gate);
            let dtype = dtype_to_storage_type(gate.dtype);
            unsafe {
                swiglu_kernel::launch_unchecked(
                    &y.client,
                    count,
                    dim,
                    gate.into_tensor_arg(),
                    up.into_tensor_arg(),
                    y.clone().into_tensor_arg(),
                    dtype,
                );
            }
            y
        }
    }

    impl ActivationGrad for Cube {
        fn activation_grad(x: CubeTensor, dy: CubeTensor, kind: u32) -> CubeTensor {
            let (x, dy) = (into_contiguous(x), into_contiguous(dy));
            let (dx, count, dim) = elementwise_like(&x);
            let dtype = dtype_to_storage_type(x.dtype);
            unsafe {
                activation_grad_kernel::launch_unchecked(
                    &dx.client,
                    count,
                    dim,
                    x.into_tensor_arg(),
                    dy.into_tensor_arg(),
                    dx.clone().into_tensor_arg(),
                    kind,
                    dtype,
                );
            }
            dx
        }

        fn swiglu_grad(gate: CubeTensor, up: CubeTensor, dy: CubeTensor) -> [CubeTensor; 2] {
            let [gate, up, dy] = [gate, up, dy].map(into_contiguous);
            let (d_gate, count, dim) = elementwise_like(&gate);
            let (d_up, _, _) = elementwise_like(&up);
            let dtype = dtype_to_storage_type(gate.dtype);
            unsafe {
                swiglu_grad_kernel::launch_unchecked(
                    &d_gate.client,
                    count,
                    dim,
                    gate.into_tensor_arg(),
                    up.into_tensor_arg(),
                    dy.into_tensor_arg(),
                    d_gate.clone().into_tensor_arg(),
                    d_up.clone().into_tensor_arg(),
                    dtype,
                );
            }
            [d_gate, d_up]
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::prelude::*;
    use burn::tensor::TensorData;

    use crate::kernels::swiglu_op;
    use crate::kernels::test_tensors::{assert_close, device_op_devices, pattern};
    use crate::layers::activation::Activation;

    /// Output and the inputs' gradients (weighted by a fixed cotangent) of `f` on `device`.
    fn run(device: &Device, f: impl Fn(Tensor<2>, Tensor<2>) -> Tensor<2>) -> Vec<Vec<f32>> {
        let input = |salt| {
            let t = Tensor::<2>::from_data(TensorData::new(pattern(777, salt), [7, 111]), device);
            (t * 1.5).autodiff().require_grad()
        };
        let (a, b) = (input(1), input(2));
        let w = Tensor::<2>::from_data(TensorData::new(pattern(777, 3), [7, 111]), device);
        let y = f(a.clone(), b.clone());
        let grads = (y.clone() * w).sum().backward();
        let mut out = vec![y.inner(), a.grad(&grads).unwrap()];
        out.extend(b.grad(&grads));
        out.into_iter()
            .map(|t| t.into_data().try_to_vec().unwrap())
            .collect()
    }

    /// Each device op equals the CPU's (burn's activations, flex's hand-written SwiGLU) in value and
    /// gradient, on flex and, built with `--features wgpu`, on cubecl's kernels.
    #[test]
    fn equal_the_cpus_activations_in_value_and_gradient() {
        for device in device_op_devices() {
            for act in [Activation::Gelu, Activation::GeluNew, Activation::Silu] {
                let got = run(&device, |a, _| super::activation(a, act));
                let want = run(&Device::flex(), |a, _| act.apply(a));
                for (which, (g, w)) in ["y", "dx"].iter().zip(got.iter().zip(&want)) {
                    assert_close(&format!("{act:?} {which} {device:?}"), g, w, 1e-5);
                }
            }
            let got = run(&device, super::swiglu);
            let want = run(&Device::flex(), swiglu_op::swiglu);
            for (which, (g, w)) in ["y", "d gate", "d up"].iter().zip(got.iter().zip(&want)) {
                assert_close(&format!("swiglu {which} {device:?}"), g, w, 1e-5);
            }
        }
    }
}
