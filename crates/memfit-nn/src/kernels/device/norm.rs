//! LayerNorm and RMS norm over the last dimension on the GPU's code path. On a cubecl device: one
//! launch forward, which also writes each row's mean (0 for RMS) and `r = rsqrt(var + ε)`
//! (`mean(x²)` for RMS); backward one launch for `dx` (per row) and one for γ's and β's partial
//! sums over blocks of rows, summed by burn's reduction. f32 arithmetic whatever the dtypes; kept
//! for backward: the input, γ and the row statistics. burn's composite LayerNorm is about ten
//! launches forward and twenty backward (RMS seven and fifteen) and keeps the normalised input
//! besides. flex runs the same op (same kept tensors, CPU loops) where the CPU runs the GPU's path.

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, TensorMetadata, backend_extension};
use burn::tensor::{DType, Shape, Tensor};
use burn_flex::FlexTensor;

use crate::kernels::autodiff_record::record;
use crate::kernels::flex_values::{from_values, tensor_like, values};
use crate::kernels::{fused_layer_norm, fused_rms_norm};

#[backend_extension(Flex, Cube: cfg(cube_kernels), Autodiff)]
pub trait NormOp: Backend {
    /// `(x − mean)·rsqrt(var + eps)·γ + β` over the last dimension (biased variance), or with `rms`
    /// `x·rsqrt(mean(x²) + eps)·γ` (β unread); γ and β hold `d` elements each (any shape).
    fn norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
        rms: bool,
    ) -> FloatTensor<Self>;
}

/// The norm's passes, per backend.
pub trait NormKernels: Backend {
    /// The output (in x's dtype) and each row's `[mean, r]` (f32 `[rows, 2]`).
    fn norm_rows(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
        rms: bool,
    ) -> [FloatTensor<Self>; 2];

    /// `dx = r·(u − mean(u) − x̂·mean(u ⊙ x̂))` per row, `u = dy ⊙ γ` (no `mean(u)` with `rms`).
    fn norm_rows_dx(
        x: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        stats: FloatTensor<Self>,
        rms: bool,
    ) -> FloatTensor<Self>;

    /// `Σ_rows dy ⊙ x̂` and `Σ_rows dy`, f32 `[d]` each.
    fn norm_rows_params(
        x: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        stats: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2];
}

/// LayerNorm on a tensor of the device path (`super::runs_on`).
pub fn layer_norm(x: Tensor<3>, gamma: Tensor<3>, beta: Tensor<3>, eps: f64) -> Tensor<3> {
    let [x, gamma, beta] = [x, gamma, beta].map(Tensor::into_dispatch);
    Tensor::from_dispatch(<Dispatch as NormOp>::norm(x, gamma, beta, eps, false))
}

/// RMS norm on a tensor of the device path (`super::runs_on`).
pub fn rms_norm(x: Tensor<3>, w: Tensor<3>, eps: f64) -> Tensor<3> {
    let (x, beta, w) = (
        x.into_dispatch(),
        w.clone().into_dispatch(),
        w.into_dispatch(),
    );
    Tensor::from_dispatch(<Dispatch as NormOp>::norm(x, w, beta, eps, true))
}

impl NormOp for Flex {
    fn norm(x: FlexTensor, gamma: FlexTensor, beta: FlexTensor, eps: f64, rms: bool) -> FlexTensor {
        let [y, _] = Flex::norm_rows(x, gamma, beta, eps, rms);
        y
    }
}

/// `x`'s values and its rows' length.
fn rows_of(x: &FlexTensor) -> (std::borrow::Cow<'_, [f32]>, usize) {
    let shape = x.layout().shape();
    (values(x), shape[shape.num_dims() - 1])
}

impl NormKernels for Flex {
    /// The CPU's own forward passes (`fused_layer_norm`, `fused_rms_norm`), their row statistics
    /// laid out as the kernels write them.
    fn norm_rows(
        x: FlexTensor,
        g: FlexTensor,
        b: FlexTensor,
        eps: f64,
        rms: bool,
    ) -> [FlexTensor; 2] {
        let (y, stats): (_, Vec<f32>) = if rms {
            let (y, r) = fused_rms_norm::forward(&x, &g, eps);
            (y, r.into_iter().flat_map(|r| [0.0, r]).collect())
        } else {
            let (y, rows) = fused_layer_norm::forward(&x, &g, &b, eps);
            (
                y,
                rows.into_iter().flat_map(|(mean, r)| [mean, r]).collect(),
            )
        };
        let rows = stats.len() / 2;
        [y, from_values(stats, Shape::new([rows, 2]), DType::F32)]
    }

    fn norm_rows_dx(
        x: FlexTensor,
        dy: FlexTensor,
        g: FlexTensor,
        s: FlexTensor,
        rms: bool,
    ) -> FlexTensor {
        let ((xs, n), dys, gs, stats) = (rows_of(&x), values(&dy), values(&g), values(&s));
        let mut dx = vec![0.0f32; xs.len()];
        for (i, (row, out)) in xs.chunks_exact(n).zip(dx.chunks_exact_mut(n)).enumerate() {
            let (mean, r, dy) = (stats[2 * i], stats[2 * i + 1], &dys[i * n..(i + 1) * n]);
            let u = |j: usize| dy[j] * gs[j];
            let xhat = |j: usize| (row[j] - mean) * r;
            let u_mean = if rms {
                0.0
            } else {
                (0..n).map(u).sum::<f32>() / n as f32
            };
            let ux_mean = (0..n).map(|j| u(j) * xhat(j)).sum::<f32>() / n as f32;
            for (j, o) in out.iter_mut().enumerate() {
                *o = r * (u(j) - u_mean - xhat(j) * ux_mean);
            }
        }
        tensor_like(dx, &x)
    }

    fn norm_rows_params(x: FlexTensor, dy: FlexTensor, s: FlexTensor) -> [FlexTensor; 2] {
        let ((xs, n), dys, stats) = (rows_of(&x), values(&dy), values(&s));
        let (mut dgamma, mut dbeta) = (vec![0.0f32; n], vec![0.0f32; n]);
        for (i, (row, dy)) in xs.chunks_exact(n).zip(dys.chunks_exact(n)).enumerate() {
            let (mean, r) = (stats[2 * i], stats[2 * i + 1]);
            for j in 0..n {
                dgamma[j] += dy[j] * (row[j] - mean) * r;
                dbeta[j] += dy[j];
            }
        }
        [dgamma, dbeta].map(|v| from_values(v, Shape::new([n]), DType::F32))
    }
}

/// What backward keeps: the input, γ, the row statistics, β's shape and dtype, and which norm.
#[derive(Debug, Clone)]
struct Saved<T> {
    x: T,
    gamma: T,
    stats: T,
    beta_like: (Shape, DType),
    rms: bool,
}

/// `total` (f32 `[d]`) in a parameter's shape and dtype.
fn as_param<B: Backend>(total: FloatTensor<B>, (shape, dtype): (Shape, DType)) -> FloatTensor<B> {
    B::float_cast(B::float_reshape(total, shape), dtype.into())
}

#[derive(Debug)]
struct NormBackward;

impl<B: NormKernels> Backward<B, 3> for NormBackward {
    type State = Saved<FloatTensor<B>>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let [x, g, b] = ops.parents.map(|p| p.map(|node| node.id));
        let s = ops.state;
        // RMS norm's β is γ again (unread): its node is γ's, which takes dγ only.
        let b = if s.rms { None } else { b };
        if g.is_some() || b.is_some() {
            let [dgamma, dbeta] = B::norm_rows_params(s.x.clone(), dy.clone(), s.stats.clone());
            let gamma_like = (s.gamma.shape(), s.gamma.dtype());
            register::<B>(grads, g, || as_param::<B>(dgamma, gamma_like));
            register::<B>(grads, b, || as_param::<B>(dbeta, s.beta_like.clone()));
        }
        register::<B>(grads, x, || {
            B::norm_rows_dx(s.x, dy, s.gamma, s.stats, s.rms)
        });
    }
}

/// `grad()` as `node`'s gradient, computed only where the graph tracks the node.
fn register<B: Backend>(
    grads: &mut Gradients,
    node: Option<NodeId>,
    grad: impl FnOnce() -> FloatTensor<B>,
) {
    if let Some(node) = node {
        grads.register::<B>(node, grad());
    }
}

impl<B: NormOp + NormKernels, C: CheckpointStrategy> NormOp for Autodiff<B, C> {
    fn norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
        rms: bool,
    ) -> FloatTensor<Self> {
        record::<B, C, _, 3>(NormBackward, [x, gamma, beta], |[x, gamma, beta]| {
            let beta_like = (beta.shape(), beta.dtype());
            let [y, stats] = B::norm_rows(x.clone(), gamma.clone(), beta, eps, rms);
            let saved = Saved {
                x,
                gamma,
                stats,
                beta_like,
                rms,
            };
            (y, saved)
        })
    }
}

#[cfg(cube_kernels)]
mod cube {
    use burn::backend::Cube;
    use burn::backend::cubecl::dtype_to_storage_type;
    use burn::backend::ops::FloatTensorOps;
    use burn::tensor::{DType, Shape};
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::tensor::CubeTensor;

    use super::super::launch::{RowLaunch, cube_sum, empty_like, row_of_cube, rows_of};
    use super::{NormKernels, NormOp};

    #[cube(launch_unchecked)]
    fn norm_kernel<F: Float, G: Float>(
        x: &Tensor<F>,
        gamma: &Tensor<G>,
        beta: &Tensor<G>,
        y: &mut Tensor<F>,
        stats: &mut Tensor<f32>,
        rows: usize,
        n: usize,
        eps: f32,
        #[comptime] units: usize,
        #[comptime] rms: bool,
        #[define(F, G)] _dtypes: [ElemType; 2],
    ) {
        let row = row_of_cube();
        if row >= rows {
            terminate!();
        }
        let base = row * n;
        let inv_n = 1.0f32 / f32::cast_from(n);
        let mut mean = 0.0f32;
        if !rms {
            let mut sum = 0.0f32;
            let mut j = UNIT_POS as usize;
            while j < n {
                sum += f32::cast_from(x[base + j]);
                j += units;
            }
            mean = cube_sum(sum, units) * inv_n;
        }
        let mut squares = 0.0f32;
        let mut j = UNIT_POS as usize;
        while j < n {
            let deviation = f32::cast_from(x[base + j]) - mean;
            squares += deviation * deviation;
            j += units;
        }
        let r = f32::inverse_sqrt(cube_sum(squares, units) * inv_n + eps);
        j = UNIT_POS as usize;
        while j < n {
            let xhat = (f32::cast_from(x[base + j]) - mean) * r;
            let mut out = xhat * f32::cast_from(gamma[j]);
            if !rms {
                out += f32::cast_from(beta[j]);
            }
            y[base + j] = F::cast_from(out);
            j += units;
        }
        if UNIT_POS == 0 {
            stats[row * 2] = mean;
            stats[row * 2 + 1] = r;
        }
    }

    #[cube(launch_unchecked)]
    fn norm_dx_kernel<F: Float, G: Float>(
        x: &Tensor<F>,
        dy: &Tensor<F>,
        gamma: &Tensor<G>,
        stats: &Tensor<f32>,
        dx: &mut Tensor<F>,
        rows: usize,
        n: usize,
        #[comptime] units: usize,
        #[comptime] rms: bool,
        #[define(F, G)] _dtypes: [ElemType; 2],
    ) {
        let row = row_of_cube();
        if row >= rows {
            terminate!();
        }
        let base = row * n;
        let (mean, r) = (stats[row * 2], stats[row * 2 + 1]);
        let mut u_sum = 0.0f32;
        let mut ux_sum = 0.0f32;
        let mut j = UNIT_POS as usize;
        while j < n {
            let u = f32::cast_from(dy[base + j]) * f32::cast_from(gamma[j]);
            u_sum += u;
            ux_sum += u * (f32::cast_from(x[base + j]) - mean) * r;
            j += units;
        }
        let inv_n = 1.0f32 / f32::cast_from(n);
        let mut u_mean = 0.0f32;
        if !rms {
            u_mean = cube_sum(u_sum, units) * inv_n;
        }
        let ux_mean = cube_sum(ux_sum, units) * inv_n;
        j = UNIT_POS as usize;
        while j < n {
            let u = f32::cast_from(dy[base + j]) * f32::cast_from(gamma[j]);
            let xhat = (f32::cast_from(x[base + j]) - mean) * r;
            dx[base + j] = F::cast_from(r * (u - u_mean - xhat * ux_mean));
            j += units;
        }
    }

    /// Rows in a block of [`norm_params_kernel`].
    const ROWS_PER_BLOCK: usize = 32;
    /// Columns (units) per cube of [`norm_params_kernel`].
    const COLUMNS_PER_CUBE: u32 = 64;

    /// For row block `b` (grid y) and column `c`: `dgamma[b, c] = Σ dy ⊙ x̂`, `dbeta[b, c] = Σ dy`
    /// over the block's rows.
    #[cube(launch_unchecked)]
    fn norm_params_kernel<F: Float>(
        x: &Tensor<F>,
        dy: &Tensor<F>,
        stats: &Tensor<f32>,
        dgamma: &mut Tensor<f32>,
        dbeta: &mut Tensor<f32>,
        rows: usize,
        n: usize,
        #[define(F)] _dtype: ElemType,
    ) {
        let c = ABSOLUTE_POS_X as usize;
        if c >= n {
            terminate!();
        }
        let block = CUBE_POS_Y as usize;
        let first = block * ROWS_PER_BLOCK;
        let mut g_sum = 0.0f32;
        let mut b_sum = 0.0f32;
        let mut i = first;
        while i < rows && i < first + ROWS_PER_BLOCK {
            let g = f32::cast_from(dy[i * n + c]);
            g_sum += g * (f32::cast_from(x[i * n + c]) - stats[i * 2]) * stats[i * 2 + 1];
            b_sum += g;
            i += 1;
        }
        dgamma[block * n + c] = g_sum;
        dbeta[block * n + c] = b_sum;
    }

    impl NormOp for Cube {
        fn norm(
            x: CubeTensor,
            gamma: CubeTensor,
            beta: CubeTensor,
            eps: f64,
            rms: bool,
        ) -> CubeTensor {
            let [y, _] = Cube::norm_rows(x, gamma, beta, eps, rms);
            y
        }
    }

    impl NormKernels for Cube {
        fn norm_rows(
            x: CubeTensor,
            gamma: CubeTensor,
            beta: CubeTensor,
            eps: f64,
            rms: bool,
        ) -> [CubeTensor; 2] {
            let [x, gamma, beta] = [x, gamma, beta].map(into_contiguous);
            let (rows, n) = rows_of(&x);
            let y = empty_like(&x, x.meta.shape().clone(), x.dtype);
            let stats = empty_like(&x, Shape::new([rows, 2]), DType::F32);
            let launch = RowLaunch::new(&x, rows, n);
            let dtypes = [x.dtype, gamma.dtype].map(dtype_to_storage_type);
            unsafe {
                norm_kernel::launch_unchecked(
                    &y.client,
                    launch.count,
                    launch.dim,
                    x.into_tensor_arg(),
                    gamma.into_tensor_arg(),
                    beta.into_tensor_arg(),
                    y.clone().into_tensor_arg(),
                    stats.clone().into_tensor_arg(),
                    rows,
                    n,
                    eps as f32,
                    launch.units,
                    rms,
                    dtypes,
                );
            }
            [y, stats]
        }

        fn norm_rows_dx(
            x: CubeTensor,
            dy: CubeTensor,
            gamma: CubeTensor,
            stats: CubeTensor,
            rms: bool,
        ) -> CubeTensor {
            let [x, dy, gamma] = [x, dy, gamma].map(into_contiguous);
            let (rows, n) = rows_of(&x);
            let dx = empty_like(&x, x.meta.shape().clone(), x.dtype);
            let launch = RowLaunch::new(&x, rows, n);
            let dtypes = [x.dtype, gamma.dtype].map(dtype_to_storage_type);
            unsafe {
                norm_dx_kernel::launch_unchecked(
                    &dx.client,
                    launch.count,
                    launch.dim,
                    x.into_tensor_arg(),
                    dy.into_tensor_arg(),
                    gamma.into_tensor_arg(),
                    stats.into_tensor_arg(),
                    dx.clone().into_tensor_arg(),
                    rows,
                    n,
                    launch.units,
                    rms,
                    dtypes,
                );
            }
            dx
        }

        fn norm_rows_params(x: CubeTensor, dy: CubeTensor, stats: CubeTensor) -> [CubeTensor; 2] {
            let [x, dy] = [x, dy].map(into_contiguous);
            let (rows, n) = rows_of(&x);
            let blocks = rows.div_ceil(ROWS_PER_BLOCK);
            let partial = || empty_like(&x, Shape::new([blocks, n]), DType::F32);
            let (dgamma, dbeta) = (partial(), partial());
            let count = CubeCount::Static(
                (n as u32).div_ceil(COLUMNS_PER_CUBE),
                u32::try_from(blocks).expect("row blocks fit a u32"),
                1,
            );
            let dtype = dtype_to_storage_type(x.dtype);
            unsafe {
                norm_params_kernel::launch_unchecked(
                    &dgamma.client,
                    count,
                    CubeDim::new_1d(COLUMNS_PER_CUBE),
                    x.into_tensor_arg(),
                    dy.into_tensor_arg(),
                    stats.into_tensor_arg(),
                    dgamma.clone().into_tensor_arg(),
                    dbeta.clone().into_tensor_arg(),
                    rows,
                    n,
                    dtype,
                );
            }
            [dgamma, dbeta].map(|partial| {
                Cube::float_reshape(Cube::float_sum_dim(partial, 0), Shape::new([n]))
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::prelude::*;
    use burn::tensor::TensorData;

    use crate::kernels::test_tensors::{assert_close, device_op_devices, pattern};

    /// Output and the gradients of x, γ and (LayerNorm's) β, weighted by a fixed cotangent, of the
    /// device op or (`reference`) flex's hand-written CPU op.
    fn run(device: &Device, [b, t, d]: [usize; 3], rms: bool, reference: bool) -> Vec<Vec<f32>> {
        let tensor = |shape: [usize; 3], salt, scale: f32, shift: f32| {
            let values = pattern(shape.iter().product(), salt);
            let t = Tensor::<3>::from_data(TensorData::new(values, shape), device);
            (t * scale + shift).autodiff().require_grad()
        };
        let x = tensor([b, t, d], 1, 2.0, 0.5);
        let (gamma, beta) = (
            tensor([1, 1, d], 2, 1.0, 0.0),
            tensor([1, 1, d], 3, 1.0, 0.0),
        );
        let w = Tensor::<3>::from_data(TensorData::new(pattern(b * t * d, 4), [b, t, d]), device);
        use crate::kernels::{fused_layer_norm, fused_rms_norm};
        let (y, params) = match (rms, reference) {
            (false, false) => (
                super::layer_norm(x.clone(), gamma.clone(), beta.clone(), 1e-12),
                vec![gamma, beta],
            ),
            (false, true) => (
                fused_layer_norm::layer_norm(x.clone(), gamma.clone(), beta.clone(), 1e-12),
                vec![gamma, beta],
            ),
            (true, false) => (super::rms_norm(x.clone(), gamma.clone(), 1e-6), vec![gamma]),
            (true, true) => (
                fused_rms_norm::rms_norm(x.clone(), gamma.clone(), 1e-6),
                vec![gamma],
            ),
        };
        let grads = (y.clone() * w).sum().backward();
        let mut out = vec![y.inner(), x.grad(&grads).unwrap()];
        out.extend(params.iter().map(|p| p.grad(&grads).unwrap()));
        out.into_iter()
            .map(|t| t.into_data().try_to_vec().unwrap())
            .collect()
    }

    /// The device op equals the CPU's hand-written LayerNorm and RMS norm in value and in every
    /// gradient, on flex and, built with `--features wgpu`, on cubecl's kernels: rows shorter and
    /// longer than a cube, row counts across several blocks of γ's partial sums.
    #[test]
    fn equal_the_cpus_norms_in_value_and_gradients() {
        for device in device_op_devices() {
            for (norm, rms) in [("layer norm", false), ("rms norm", true)] {
                for shape in [[2, 3, 7], [3, 25, 300], [1, 70, 16], [8, 64, 512]] {
                    let got = run(&device, shape, rms, false);
                    let want = run(&Device::flex(), shape, rms, true);
                    assert_eq!(got.len(), want.len());
                    let names = ["y", "dx", "dgamma", "dbeta"];
                    for (which, (g, w)) in names.iter().zip(got.iter().zip(&want)) {
                        let what = format!("{norm} {which} {shape:?} {device:?}");
                        assert_close(&what, g, w, 2e-5);
                    }
                }
            }
        }
    }
}
