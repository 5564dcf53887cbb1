//! Softmax over the last dimension on the GPU's code path: one launch forward and one backward on
//! a cubecl device, in f32 whatever the dtype, keeping its output, which backward needs:
//! `dx = y · (dy − Σ dy·y)` per row. burn's composite softmax is five launches forward (max,
//! subtract, exp, sum, divide) and more backward, and keeps two matrices. flex runs the same op
//! (same kept tensors, CPU loops) where the CPU runs the GPU's code path.

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::tensor::Tensor;
use burn_flex::FlexTensor;

use crate::kernels::autodiff_record::record;
use crate::kernels::flex_values::{tensor_like, values};
use crate::kernels::xent::exp_shifted_in_place;

#[backend_extension(Flex, Cube: cfg(cube_kernels), Autodiff)]
pub trait SoftmaxOp: Backend {
    /// `softmax(x)` over the last dimension.
    fn softmax_last(x: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// What backward needs of a backend beyond [`SoftmaxOp`].
pub trait SoftmaxGrad: Backend {
    /// `y · (dy − Σ dy·y)` over each last-dimension row, from the output `y`.
    fn softmax_last_grad(y: FloatTensor<Self>, dy: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// [`SoftmaxOp::softmax_last`] on a tensor of the device path (`super::runs_on`).
pub fn softmax_last<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    Tensor::from_dispatch(<Dispatch as SoftmaxOp>::softmax_last(x.into_dispatch()))
}

/// Row length of `t` (its last dimension).
fn row_len(t: &FlexTensor) -> usize {
    let shape = t.layout().shape();
    shape[shape.num_dims() - 1]
}

impl SoftmaxOp for Flex {
    fn softmax_last(x: FlexTensor) -> FlexTensor {
        let n = row_len(&x);
        let mut y = values(&x).into_owned();
        for row in y.chunks_exact_mut(n) {
            let top = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let inv = (1.0 / exp_shifted_in_place(row, top)) as f32;
            row.iter_mut().for_each(|v| *v *= inv);
        }
        tensor_like(y, &x)
    }
}

impl SoftmaxGrad for Flex {
    fn softmax_last_grad(y: FlexTensor, dy: FlexTensor) -> FlexTensor {
        let n = row_len(&y);
        let (ys, mut dx) = (values(&y), values(&dy).into_owned());
        for (row, d) in ys.chunks_exact(n).zip(dx.chunks_exact_mut(n)) {
            let dot: f32 = row.iter().zip(d.iter()).map(|(y, g)| y * g).sum();
            d.iter_mut().zip(row).for_each(|(g, y)| *g = y * (*g - dot));
        }
        tensor_like(dx, &y)
    }
}

#[derive(Debug)]
struct SoftmaxBackward;

impl<B: SoftmaxOp + SoftmaxGrad> Backward<B, 1> for SoftmaxBackward {
    /// The output.
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [x_node] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        if let Some(node) = x_node {
            grads.register::<B>(node.id, B::softmax_last_grad(ops.state, dy));
        }
    }
}

impl<B: SoftmaxOp + SoftmaxGrad, C: CheckpointStrategy> SoftmaxOp for Autodiff<B, C> {
    fn softmax_last(x: FloatTensor<Self>) -> FloatTensor<Self> {
        record::<B, C, _, 1>(SoftmaxBackward, [x], |[x]| {
            let y = B::softmax_last(x);
            (y.clone(), y)
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

    use super::super::launch::{
        RowLaunch, cube_sum, empty_like, row_max_and_exp_sum, row_of_cube, rows_of,
    };
    use super::{SoftmaxGrad, SoftmaxOp};

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
        let (top, sum) = row_max_and_exp_sum(x, base, n, units);
        let inv = 1.0f32 / sum;
        let mut j = UNIT_POS as usize;
        while j < n {
            y[base + j] = F::cast_from(f32::exp(f32::cast_from(x[base + j]) - top) * inv);
            j += units;
        }
    }

    #[cube(launch_unchecked)]
    fn softmax_grad_kernel<F: Float>(
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

    impl SoftmaxOp for Cube {
        fn softmax_last(x: CubeTensor) -> CubeTensor {
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
    }

    impl SoftmaxGrad for Cube {
        fn softmax_last_grad(y: CubeTensor, dy: CubeTensor) -> CubeTensor {
            let (y, dy) = (into_contiguous(y), into_contiguous(dy));
            let (rows, n) = rows_of(&y);
            let dx = empty_like(&y, y.meta.shape().clone(), y.dtype);
            let launch = RowLaunch::new(&y, rows, n);
            let dtype = dtype_to_storage_type(y.dtype);
            unsafe {
                softmax_grad_kernel::launch_unchecked(
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
    }
}

#[cfg(test)]
mod tests {
    use burn::prelude::*;
    use burn::tensor::TensorData;
    use burn::tensor::activation::softmax;

    use crate::kernels::test_tensors::{assert_close, device_op_devices, pattern};

    /// Output and input gradient (weighted by a fixed cotangent) of `f` on `[rows, n]` values.
    fn run(
        device: &Device,
        (rows, n): (usize, usize),
        f: impl Fn(Tensor<2>) -> Tensor<2>,
    ) -> [Vec<f32>; 2] {
        let x = Tensor::<2>::from_data(TensorData::new(pattern(rows * n, 1), [rows, n]), device);
        let x = (x * 3.0).autodiff().require_grad();
        let w = Tensor::<2>::from_data(TensorData::new(pattern(rows * n, 5), [rows, n]), device);
        let y = f(x.clone());
        let grads = (y.clone() * w).sum().backward();
        let dx = x.grad(&grads).unwrap();
        [y.inner(), dx].map(|t| t.into_data().try_to_vec().unwrap())
    }

    const SHAPES: [(usize, usize); 4] = [(5, 7), (3, 300), (70, 128), (4096, 64)];

    /// The op equals burn's composite softmax in value and gradient on flex; built with
    /// `--features wgpu`, on cubecl's kernels too (rows shorter and longer than a cube).
    #[test]
    fn equals_burns_softmax_in_value_and_gradient() {
        for device in device_op_devices() {
            for shape in SHAPES {
                let [y, dx] = run(&device, shape, super::softmax_last);
                let [y_ref, dx_ref] = run(&Device::flex(), shape, |x| softmax(x, 1));
                assert_close(&format!("softmax {shape:?} {device:?}"), &y, &y_ref, 1e-6);
                assert_close(&format!("grad {shape:?} {device:?}"), &dx, &dx_ref, 1e-5);
            }
        }
    }
}
