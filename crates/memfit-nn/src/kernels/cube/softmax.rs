//! Softmax over the last dimension on cubecl devices, one launch forward and one backward, in f32
//! whatever the tensor's dtype. burn's composite softmax is five launches forward (max, subtract,
//! exp, sum, divide) and more in backward, and keeps its `exp` output; this keeps its output,
//! which backward needs: `dx = y · (dy − Σ dy·y)` per row.

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Cube, Dispatch, backend_extension};
use burn::tensor::Tensor as BurnTensor;
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;

use super::rows::{RowLaunch, cube_max, cube_sum, empty_like, row_of_cube, rows_of};
use crate::kernels::flex_op::record;

#[backend_extension(Cube, Autodiff)]
pub trait SoftmaxOp: Backend {
    /// `softmax(x)` over the last dimension.
    fn softmax_last(x: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// [`SoftmaxOp::softmax_last`] on a tensor on a cubecl device (`super::runs_on`).
pub fn softmax_last<const D: usize>(x: BurnTensor<D>) -> BurnTensor<D> {
    BurnTensor::from_dispatch(<Dispatch as SoftmaxOp>::softmax_last(x.into_dispatch()))
}

#[cube(launch_unchecked)]
fn softmax_kernel<F: Float>(
    x: &Tensor<F>,
    y: &mut Tensor<F>,
    rows: usize,
    n: usize,
    #[comptime] units: usize,
    #[define(F)] _dtype: ElemType,
) {
    let row = row_of_cube();
    if row >= rows {
        terminate!();
    }
    let base = row * n;
    // The lowest finite f32: WGSL has no infinity literal.
    let mut top = f32::new(-3.402_823_5e38);
    let mut j = UNIT_POS as usize;
    while j < n {
        top = f32::max(top, f32::cast_from(x[base + j]));
        j += units;
    }
    let top = cube_max(top, units);
    let mut sum = 0.0f32;
    j = UNIT_POS as usize;
    while j < n {
        sum += f32::exp(f32::cast_from(x[base + j]) - top);
        j += units;
    }
    let inv = 1.0f32 / cube_sum(sum, units);
    j = UNIT_POS as usize;
    while j < n {
        y[base + j] = F::cast_from(f32::exp(f32::cast_from(x[base + j]) - top) * inv);
        j += units;
    }
}

#[cube(launch_unchecked)]
fn softmax_backward_kernel<F: Float>(
    y: &Tensor<F>,
    dy: &Tensor<F>,
    dx: &mut Tensor<F>,
    rows: usize,
    n: usize,
    #[comptime] units: usize,
    #[define(F)] _dtype: ElemType,
) {
    let row = row_of_cube();
    if row >= rows {
        terminate!();
    }
    let base = row * n;
    let mut dot = 0.0f32;
    let mut j = UNIT_POS as usize;
    while j < n {
        dot += f32::cast_from(dy[base + j]) * f32::cast_from(y[base + j]);
        j += units;
    }
    let dot = cube_sum(dot, units);
    j = UNIT_POS as usize;
    while j < n {
        let yj = f32::cast_from(y[base + j]);
        dx[base + j] = F::cast_from(yj * (f32::cast_from(dy[base + j]) - dot));
        j += units;
    }
}

fn forward(x: CubeTensor) -> CubeTensor {
    let x = into_contiguous(x);
    let (rows, n) = rows_of(&x);
    let y = empty_like(&x, x.meta.shape().clone(), x.dtype);
    let launch = RowLaunch::new(&x, rows, n);
    let dtype = dtype_to_storage_type(x.dtype);
    unsafe {
        softmax_kernel::launch_unchecked(
            &y.client,
            launch.count,
            launch.dim,
            x.into_tensor_arg(),
            y.clone().into_tensor_arg(),
            rows,
            n,
            launch.units,
            dtype,
        );
    }
    y
}

fn backward(y: CubeTensor, dy: CubeTensor) -> CubeTensor {
    let dy = into_contiguous(dy);
    let (rows, n) = rows_of(&y);
    let dx = empty_like(&y, y.meta.shape().clone(), y.dtype);
    let launch = RowLaunch::new(&y, rows, n);
    let dtype = dtype_to_storage_type(y.dtype);
    unsafe {
        softmax_backward_kernel::launch_unchecked(
            &dx.client,
            launch.count,
            launch.dim,
            y.into_tensor_arg(),
            dy.into_tensor_arg(),
            dx.clone().into_tensor_arg(),
            rows,
            n,
            launch.units,
            dtype,
        );
    }
    dx
}

impl SoftmaxOp for Cube {
    fn softmax_last(x: CubeTensor) -> CubeTensor {
        forward(x)
    }
}

#[derive(Debug)]
struct SoftmaxBackward;

impl Backward<Cube, 1> for SoftmaxBackward {
    /// The output, contiguous (as the forward wrote it).
    type State = CubeTensor;

    fn backward(self, ops: Ops<CubeTensor, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [x_node] = ops.parents;
        let dy = grads.consume::<Cube>(&ops.node);
        if let Some(node) = x_node {
            grads.register::<Cube>(node.id, backward(ops.state, dy));
        }
    }
}

impl<C: CheckpointStrategy> SoftmaxOp for Autodiff<Cube, C> {
    fn softmax_last(x: FloatTensor<Self>) -> FloatTensor<Self> {
        record::<Cube, C, _, 1>(SoftmaxBackward, [x], |[x]| {
            let y = forward(x);
            (y.clone(), y)
        })
    }
}

#[cfg(all(test, feature = "wgpu"))]
mod tests {
    use burn::prelude::*;
    use burn::tensor::activation::softmax;
    use burn::tensor::{DeviceKind, TensorData};

    use crate::kernels::test_tensors::{assert_close, pattern};

    /// Output and input gradient (weighted by a fixed cotangent) of `f` on `[rows, n]` pattern values.
    fn run(
        device: &Device,
        rows: usize,
        n: usize,
        f: impl Fn(Tensor<2>) -> Tensor<2>,
    ) -> [Vec<f32>; 2] {
        let x = Tensor::<2>::from_data(TensorData::new(pattern(rows * n, 1), [rows, n]), device);
        let x = (x * 3.0).autodiff().require_grad();
        let w = Tensor::<2>::from_data(TensorData::new(pattern(rows * n, 5), [rows, n]), device);
        let y = f(x.clone());
        let grads = (y.clone() * w).sum().backward();
        let dx = x.grad(&grads).unwrap();
        [y.inner(), dx].map(|t| match t.try_into_data() {
            Ok(d) => d.try_to_vec().unwrap(),
            Err(e) => panic!("{e:#?}"),
        })
    }

    /// Equal to burn's composite softmax in value and gradient, on rows shorter and longer than a
    /// cube, one of them past the units' multiple.
    #[test]
    fn equals_burns_softmax_in_value_and_gradient() {
        let gpu = Device::wgpu(DeviceKind::default());
        for (rows, n) in [(5, 7), (3, 300), (70, 128)] {
            let [y, dx] = run(&gpu, rows, n, super::softmax_last);
            let [y_ref, dx_ref] = run(&Device::flex(), rows, n, |x| softmax(x, 1));
            assert_close(&format!("softmax {rows}x{n}"), &y, &y_ref, 1e-6);
            assert_close(&format!("softmax grad {rows}x{n}"), &dx, &dx_ref, 1e-5);
        }
    }
}
