//! The LM head's token loss over a chunk of logits on the GPU's code path: per row, its NLL and
//! the logits' gradient `scale · (softmax(row) − onehot(target))`, in one launch on a cubecl device
//! (one cube per row: maximum, sum of exponentials, then the gradient), f32 arithmetic whatever the
//! logits' dtype. burn's ops take about twenty launches and two uploads per chunk for the same
//! (`xent::nll_and_grad_on_device`), and a 151k vocabulary at 4k tokens is 74 chunks a micro-batch.
//! flex runs the same op as a CPU loop where the CPU takes the GPU's code path.

use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Backend, Dispatch, Flex, backend_extension};
use burn::tensor::{DType, Int, Shape, Tensor, TensorData};
use burn_flex::FlexTensor;

use crate::kernels::flex_values::{from_values, values};
use crate::kernels::xent::nll_and_grad_in_place;

#[backend_extension(Flex, Cube: cfg(cube_kernels))]
pub trait XentOp: Backend {
    /// For logits `[rows, vocab]` and each row's target (`-1`: no target), the rows' NLL (f32
    /// `[rows]`, 0 without a target) and the logits' gradient `scale · (softmax − onehot)` (in
    /// the logits' dtype, zeros without a target).
    fn nll_and_grad_rows(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

/// The summed NLL of the rows where `mask` is true (a one-element tensor, nothing read back) and
/// the logits' gradient, for `logits` `[rows, vocab]` of the device path (`super::runs_on`, taken
/// without autodiff).
pub fn nll_and_grad(
    logits: Tensor<2>,
    labels: &[u32],
    mask: &[bool],
    scale: f32,
) -> (Tensor<1>, Tensor<2>) {
    let logits = logits.inner();
    let targets: Vec<i64> = (labels.iter().zip(mask))
        .map(|(&l, &m)| if m { i64::from(l) } else { -1 })
        .collect();
    let n = targets.len();
    let targets = Tensor::<1, Int>::from_data(TensorData::new(targets, [n]), &logits.device());
    let (nll, grad) = <Dispatch as XentOp>::nll_and_grad_rows(
        logits.into_dispatch(),
        targets.into_dispatch(),
        scale,
    );
    let nll: Tensor<1> = Tensor::from_dispatch(nll);
    (super::staged_sum(nll), Tensor::from_dispatch(grad))
}

impl XentOp for Flex {
    /// The CPU's own sweep ([`nll_and_grad_in_place`]) a row at a time, for each row's NLL.
    fn nll_and_grad_rows(
        logits: FlexTensor,
        targets: FlexTensor,
        scale: f32,
    ) -> (FlexTensor, FlexTensor) {
        let vocab = logits.layout().shape()[1];
        let targets = targets.into_data().convert::<i64>();
        let targets = targets.as_slice::<i64>().expect("i64 targets");
        let mut grad = values(&logits).into_owned();
        let nll: Vec<f32> = (grad.chunks_exact_mut(vocab).zip(targets))
            .map(|(row, &t)| {
                let label = [u32::try_from(t).unwrap_or(0)];
                nll_and_grad_in_place(row, vocab, &label, &[t >= 0], scale) as f32
            })
            .collect();
        let rows = nll.len();
        let shape = logits.layout().shape().clone();
        (
            from_values(nll, Shape::new([rows]), DType::F32),
            from_values(grad, shape, logits.dtype()),
        )
    }
}

#[cfg(cube_kernels)]
mod cube {
    use burn::backend::Cube;
    use burn::backend::cubecl::dtype_to_storage_type;
    use burn::tensor::{DType, Shape};
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::tensor::CubeTensor;

    use super::super::launch::{RowLaunch, empty_like, row_max_and_exp_sum, row_of_cube, rows_of};
    use super::XentOp;

    /// Every row runs the three passes (a row without a target with target 0, its outputs
    /// zeroed): the cube's barriers stay in uniform control flow.
    #[cube(launch_unchecked)]
    fn xent_kernel<F: Float, I: Int>(
        logits: &Tensor<F>,
        targets: &Tensor<I>,
        nll: &mut Tensor<f32>,
        grad: &mut Tensor<F>,
        rows: usize,
        n: usize,
        scale: f32,
        #[comptime] units: usize,
        #[define(F, I)] _dtypes: [ElemType; 2],
    ) {
        let row = row_of_cube();
        if row >= rows {
            terminate!();
        }
        let base = row * n;
        let raw = i32::cast_from(targets[row]);
        let valid = raw >= 0;
        let target = usize::cast_from(i32::max(raw, 0));
        let (top, sum) = row_max_and_exp_sum(logits, base, n, units);
        let inv = 1.0f32 / sum;
        let mut row_scale = 0.0f32;
        if valid {
            row_scale = scale;
        }
        let mut j = UNIT_POS as usize;
        while j < n {
            let mut g = f32::exp(f32::cast_from(logits[base + j]) - top) * inv;
            if j == target {
                g -= 1.0f32;
            }
            grad[base + j] = F::cast_from(g * row_scale);
            j += units;
        }
        if UNIT_POS == 0 {
            let mut loss = 0.0f32;
            if valid {
                loss = top + f32::ln(sum) - f32::cast_from(logits[base + target]);
            }
            nll[row] = loss;
        }
    }

    impl XentOp for Cube {
        fn nll_and_grad_rows(
            logits: CubeTensor,
            targets: CubeTensor,
            scale: f32,
        ) -> (CubeTensor, CubeTensor) {
            let (logits, targets) = (into_contiguous(logits), into_contiguous(targets));
            let (rows, n) = rows_of(&logits);
            let nll = empty_like(&logits, Shape::new([rows]), DType::F32);
            let grad = empty_like(&logits, logits.meta.shape().clone(), logits.dtype);
            let launch = RowLaunch::new(&logits, rows, n);
            let dtypes = [logits.dtype, targets.dtype].map(dtype_to_storage_type);
            unsafe {
                xent_kernel::launch_unchecked(
                    &grad.client,
                    launch.count,
                    launch.dim,
                    logits.into_tensor_arg(),
                    targets.into_tensor_arg(),
                    nll.clone().into_tensor_arg(),
                    grad.clone().into_tensor_arg(),
                    rows,
                    n,
                    scale,
                    launch.units,
                    dtypes,
                );
            }
            (nll, grad)
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::prelude::*;
    use burn::tensor::TensorData;

    use crate::kernels::test_tensors::{assert_close, device_op_devices, pattern};
    use crate::kernels::xent::nll_and_grad_on_device;

    /// Equal to burn's ops (`nll_and_grad_on_device`) on rows with and without a target, on a
    /// vocabulary longer than a cube: the summed NLL and the gradient.
    #[test]
    fn equals_burns_ops_in_loss_and_gradient() {
        let (rows, vocab) = (6, 1000);
        let labels = [3, 999, 0, 512, 7, 100];
        let mask = [true, true, false, true, true, false];
        for device in device_op_devices() {
            let logits = |device: &Device| {
                let values = pattern(rows * vocab, 2)
                    .into_iter()
                    .map(|x| 4.0 * x)
                    .collect();
                Tensor::<2>::from_data(TensorData::new(values, [rows, vocab]), device)
            };
            let (nll, grad) = super::nll_and_grad(logits(&device), &labels, &mask, 0.25);
            let (nll_ref, grad_ref) =
                nll_and_grad_on_device(logits(&Device::flex()), &labels, &mask, 0.25);
            let read = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().unwrap();
            let read1 = |t: Tensor<1>| t.into_data().try_to_vec::<f32>().unwrap();
            assert_close(
                &format!("nll {device:?}"),
                &read1(nll),
                &read1(nll_ref),
                1e-5,
            );
            assert_close(
                &format!("grad {device:?}"),
                &read(grad),
                &read(grad_ref),
                1e-6,
            );
        }
    }
}
