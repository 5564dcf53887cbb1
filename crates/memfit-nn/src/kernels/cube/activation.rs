//! The activations on cubecl devices, one launch forward and one backward, in f32 whatever the
//! dtype, keeping only the input: exact (erf) GELU, its tanh approximation and SiLU, and
//! SwiGLU's gating `silu(gate) ⊙ up` (keeping gate and up). burn's composite ops run three to
//! five launches forward and about twice that backward, and keep their intermediates.

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Cube, Dispatch, backend_extension};
use burn::tensor::Tensor as BurnTensor;
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::{calculate_cube_count_elemwise, prelude::*};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;

use super::rows::empty_like;
use crate::kernels::flex_op::record;
use crate::kernels::swiglu_op::SwigluOp;
use crate::layers::activation::Activation;

#[backend_extension(Cube, Autodiff)]
pub trait ActivationOp: Backend {
    /// The activation `kind` ([`kind_code`]) of `x`, element-wise.
    fn activation(x: FloatTensor<Self>, kind: u32) -> FloatTensor<Self>;
}

/// [`ActivationOp::activation`] on a tensor on a cubecl device (`super::runs_on`); not for ReLU.
pub fn activation<const D: usize>(x: BurnTensor<D>, act: Activation) -> BurnTensor<D> {
    let kind = kind_code(act);
    BurnTensor::from_dispatch(<Dispatch as ActivationOp>::activation(
        x.into_dispatch(),
        kind,
    ))
}

const GELU: u32 = 0;
const GELU_TANH: u32 = 1;
const SILU: u32 = 2;

/// The kernels' code for `act` (ReLU is burn's own single launch).
fn kind_code(act: Activation) -> u32 {
    match act {
        Activation::Gelu => GELU,
        Activation::GeluNew => GELU_TANH,
        Activation::Silu => SILU,
        Activation::Relu => unreachable!("ReLU runs as burn's op"),
    }
}

/// `√(2/π)` and the cubic coefficient of the tanh approximation (transformers' `NewGELUActivation`).
const TANH_SCALE: f32 = 0.797_884_6;
const TANH_CUBIC: f32 = 0.044_715;

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
            + 0.5f32 * x * (1.0f32 - t * t) * TANH_SCALE * (1.0f32 + 3.0f32 * TANH_CUBIC * x * x);
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

/// A new tensor of `like`'s shape and dtype, and the launch grid over its elements.
fn elementwise_like(like: &CubeTensor) -> (CubeTensor, CubeCount, CubeDim) {
    let out = empty_like(like, like.meta.shape().clone(), like.dtype);
    let n = out.meta.num_elements();
    let dim = CubeDim::new(&out.client, n);
    (
        out.clone(),
        calculate_cube_count_elemwise(&out.client, n, dim),
        dim,
    )
}

fn forward(x: CubeTensor, kind: u32) -> CubeTensor {
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

impl ActivationOp for Cube {
    fn activation(x: CubeTensor, kind: u32) -> CubeTensor {
        forward(into_contiguous(x), kind)
    }
}

#[derive(Debug)]
struct ActivationBackward;

impl Backward<Cube, 1> for ActivationBackward {
    /// The input (contiguous) and the kind.
    type State = (CubeTensor, u32);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [x_node] = ops.parents;
        let dy = into_contiguous(grads.consume::<Cube>(&ops.node));
        let Some(node) = x_node else { return };
        let (x, kind) = ops.state;
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
        grads.register::<Cube>(node.id, dx);
    }
}

impl<C: CheckpointStrategy> ActivationOp for Autodiff<Cube, C> {
    fn activation(x: FloatTensor<Self>, kind: u32) -> FloatTensor<Self> {
        record::<Cube, C, _, 1>(ActivationBackward, [x], |[x]| {
            let x = into_contiguous(x);
            (forward(x.clone(), kind), (x, kind))
        })
    }
}

fn swiglu_forward(gate: CubeTensor, up: CubeTensor) -> CubeTensor {
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

impl SwigluOp for Cube {
    fn swiglu(gate: CubeTensor, up: CubeTensor) -> CubeTensor {
        swiglu_forward(into_contiguous(gate), into_contiguous(up))
    }
}

#[derive(Debug)]
struct SwigluBackward;

impl Backward<Cube, 2> for SwigluBackward {
    /// Gate and up (contiguous, one dtype).
    type State = (CubeTensor, CubeTensor);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [gate_node, up_node] = ops.parents;
        let dy = into_contiguous(grads.consume::<Cube>(&ops.node));
        let (gate, up) = ops.state;
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
        for (node, d) in [(gate_node, d_gate), (up_node, d_up)] {
            if let Some(node) = node {
                grads.register::<Cube>(node.id, d);
            }
        }
    }
}

impl<C: CheckpointStrategy> SwigluOp for Autodiff<Cube, C> {
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        record::<Cube, C, _, 2>(SwigluBackward, [gate, up], |[gate, up]| {
            let (gate, up) = (into_contiguous(gate), into_contiguous(up));
            (swiglu_forward(gate.clone(), up.clone()), (gate, up))
        })
    }
}

#[cfg(all(test, feature = "wgpu"))]
mod tests {
    use burn::prelude::*;
    use burn::tensor::{DeviceKind, TensorData};

    use crate::kernels::swiglu_op::swiglu;
    use crate::kernels::test_tensors::{assert_close, pattern};
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

    /// Each activation and SwiGLU's gating equal the CPU's (burn's ops and flex's hand-written
    /// SwiGLU) in value and gradient.
    #[test]
    fn equal_the_cpus_activations_in_value_and_gradient() {
        let gpu = Device::wgpu(DeviceKind::default());
        for act in [Activation::Gelu, Activation::GeluNew, Activation::Silu] {
            let got = run(&gpu, |a, _| act.apply(a));
            let want = run(&Device::flex(), |a, _| act.apply(a));
            for (which, (g, w)) in ["y", "dx"].iter().zip(got.iter().zip(&want)) {
                assert_close(&format!("{act:?} {which}"), g, w, 1e-5);
            }
        }
        let got = run(&gpu, swiglu);
        let want = run(&Device::flex(), swiglu);
        for (which, (g, w)) in ["y", "d gate", "d up"].iter().zip(got.iter().zip(&want)) {
            assert_close(&format!("swiglu {which}"), g, w, 1e-5);
        }
    }
}
