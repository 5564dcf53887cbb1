//! LayerNorm and RMS norm over the last dimension on cubecl devices: one launch forward, which also
//! writes each row's mean (0 for RMS) and `r = rsqrt(var + ε)` (`mean(x²)` for RMS); backward one
//! launch for `dx` (per row) and one for γ's and β's partial sums over blocks of rows, summed by
//! burn's reduction. They compute in f32 whatever the dtypes and keep the input and the row
//! statistics; burn's composite LayerNorm is about ten launches forward and twenty backward (RMS
//! seven and fifteen), and keeps the normalised input besides.

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Cube};
use burn::tensor::{DType, Shape};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;

use super::rows::{RowLaunch, cube_sum, empty_like, row_of_cube, rows_of};
use crate::kernels::flex_op::record;
use crate::kernels::fused_layer_norm::LayerNormOp;
use crate::kernels::fused_rms_norm::RmsNormOp;

#[cube(launch_unchecked)]
fn layer_norm_kernel<F: Float, G: Float>(
    x: &Tensor<F>,
    gamma: &Tensor<G>,
    beta: &Tensor<G>,
    y: &mut Tensor<F>,
    stats: &mut Tensor<f32>,
    rows: usize,
    n: usize,
    eps: f32,
    #[comptime] units: usize,
    #[comptime] centred: bool,
    #[define(F, G)] _dtypes: [ElemType; 2],
) {
    let row = row_of_cube();
    if row >= rows {
        terminate!();
    }
    let base = row * n;
    let inv_n = 1.0f32 / f32::cast_from(n);
    let mut mean = 0.0f32;
    if centred {
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
        if centred {
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

/// `dx = r·(u − mean(u) − x̂·mean(u ⊙ x̂))` per row, with `u = dy ⊙ γ` (no `mean(u)` for RMS).
#[cube(launch_unchecked)]
fn layer_norm_dx_kernel<F: Float, G: Float>(
    x: &Tensor<F>,
    dy: &Tensor<F>,
    gamma: &Tensor<G>,
    stats: &Tensor<f32>,
    dx: &mut Tensor<F>,
    rows: usize,
    n: usize,
    #[comptime] units: usize,
    #[comptime] centred: bool,
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
    let mut u_mean = cube_sum(u_sum, units) * inv_n;
    if !centred {
        u_mean = 0.0;
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

/// Rows in a block of [`layer_norm_params_kernel`].
const ROWS_PER_BLOCK: usize = 32;
/// Columns (units) per cube of [`layer_norm_params_kernel`].
const COLUMNS_PER_CUBE: u32 = 64;

/// For row block `b` (grid y) and column `c`: `dgamma[b, c] = Σ dy ⊙ x̂`, `dbeta[b, c] = Σ dy`
/// over the block's rows.
#[cube(launch_unchecked)]
fn layer_norm_params_kernel<F: Float>(
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

/// Which norm: LayerNorm (centred, with β) or RMS norm (neither).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Norm {
    Layer,
    Rms,
}

/// The output (in x's dtype) and each row's `[mean, r]` (f32); `beta` is read by LayerNorm only.
fn forward(
    norm: Norm,
    x: CubeTensor,
    gamma: CubeTensor,
    beta: CubeTensor,
    eps: f64,
) -> [CubeTensor; 2] {
    let (x, gamma, beta) = (
        into_contiguous(x),
        into_contiguous(gamma),
        into_contiguous(beta),
    );
    let (rows, n) = rows_of(&x);
    let y = empty_like(&x, x.meta.shape().clone(), x.dtype);
    let stats = empty_like(&x, Shape::new([rows, 2]), DType::F32);
    let launch = RowLaunch::new(&x, rows, n);
    let dtypes = [x.dtype, gamma.dtype].map(dtype_to_storage_type);
    unsafe {
        layer_norm_kernel::launch_unchecked(
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
            norm == Norm::Layer,
            dtypes,
        );
    }
    [y, stats]
}

/// What backward keeps: the norm, the input, γ, the row statistics and β's shape and dtype.
#[derive(Debug, Clone)]
struct Saved {
    norm: Norm,
    x: CubeTensor,
    gamma: CubeTensor,
    stats: CubeTensor,
    beta_like: (Shape, DType),
}

fn dx(s: &Saved, dy: CubeTensor) -> CubeTensor {
    let (rows, n) = rows_of(&s.x);
    let dx = empty_like(&s.x, s.x.meta.shape().clone(), s.x.dtype);
    let launch = RowLaunch::new(&s.x, rows, n);
    let dtypes = [s.x.dtype, s.gamma.dtype].map(dtype_to_storage_type);
    unsafe {
        layer_norm_dx_kernel::launch_unchecked(
            &dx.client,
            launch.count,
            launch.dim,
            s.x.clone().into_tensor_arg(),
            dy.into_tensor_arg(),
            into_contiguous(s.gamma.clone()).into_tensor_arg(),
            s.stats.clone().into_tensor_arg(),
            dx.clone().into_tensor_arg(),
            rows,
            n,
            launch.units,
            s.norm == Norm::Layer,
            dtypes,
        );
    }
    dx
}

/// `dγ` and `dβ` (for RMS norm `dβ` is of no parameter), in their parameters' shapes and dtypes.
fn dgamma_dbeta(s: &Saved, dy: CubeTensor) -> [CubeTensor; 2] {
    let (rows, n) = rows_of(&s.x);
    let blocks = rows.div_ceil(ROWS_PER_BLOCK);
    let partial = || empty_like(&s.x, Shape::new([blocks, n]), DType::F32);
    let (dgamma, dbeta) = (partial(), partial());
    let count = CubeCount::Static(
        (n as u32).div_ceil(COLUMNS_PER_CUBE),
        u32::try_from(blocks).expect("row blocks fit a u32"),
        1,
    );
    unsafe {
        layer_norm_params_kernel::launch_unchecked(
            &dgamma.client,
            count,
            CubeDim::new_1d(COLUMNS_PER_CUBE),
            s.x.clone().into_tensor_arg(),
            dy.into_tensor_arg(),
            s.stats.clone().into_tensor_arg(),
            dgamma.clone().into_tensor_arg(),
            dbeta.clone().into_tensor_arg(),
            rows,
            n,
            dtype_to_storage_type(s.x.dtype),
        );
    }
    let like = [
        (s.gamma.meta.shape().clone(), s.gamma.dtype),
        s.beta_like.clone(),
    ];
    [dgamma, dbeta]
        .into_iter()
        .zip(like)
        .map(|(partial, (shape, dtype))| {
            let total = Cube::float_reshape(Cube::float_sum_dim(partial, 0), shape);
            Cube::float_cast(total, dtype.into())
        })
        .collect::<Vec<_>>()
        .try_into()
        .expect("two parameters")
}

impl LayerNormOp for Cube {
    fn layer_norm(x: CubeTensor, gamma: CubeTensor, beta: CubeTensor, eps: f64) -> CubeTensor {
        let [y, _] = forward(Norm::Layer, x, gamma, beta, eps);
        y
    }
}

impl RmsNormOp for Cube {
    fn rms_norm(x: CubeTensor, w: CubeTensor, eps: f64) -> CubeTensor {
        let [y, _] = forward(Norm::Rms, x, w.clone(), w, eps);
        y
    }
}

/// The gradients of the inputs the graph tracks: x's, γ's and (LayerNorm's) β's.
fn register(s: &Saved, dy: CubeTensor, nodes: [Option<NodeId>; 3], grads: &mut Gradients) {
    let [x_node, g_node, b_node] = nodes;
    if g_node.is_some() || b_node.is_some() {
        let [dgamma, dbeta] = dgamma_dbeta(s, dy.clone());
        for (node, d) in [(g_node, dgamma), (b_node, dbeta)] {
            if let Some(node) = node {
                grads.register::<Cube>(node, d);
            }
        }
    }
    if let Some(node) = x_node {
        grads.register::<Cube>(node, dx(s, dy));
    }
}

#[derive(Debug)]
struct NormBackward;

impl Backward<Cube, 3> for NormBackward {
    type State = Saved;

    fn backward(self, ops: Ops<Saved, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = into_contiguous(grads.consume::<Cube>(&ops.node));
        let [x, g, b] = ops.parents.map(|p| p.map(|node| node.id));
        register(&ops.state, dy, [x, g, b], grads);
    }
}

impl Backward<Cube, 2> for NormBackward {
    type State = Saved;

    fn backward(self, ops: Ops<Saved, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = into_contiguous(grads.consume::<Cube>(&ops.node));
        let [x, w] = ops.parents.map(|p| p.map(|node| node.id));
        register(&ops.state, dy, [x, w, None], grads);
    }
}

/// Runs the norm forward and keeps what backward needs.
fn forward_kept(
    norm: Norm,
    x: CubeTensor,
    gamma: CubeTensor,
    beta: CubeTensor,
    eps: f64,
) -> (CubeTensor, Saved) {
    let (x, gamma) = (into_contiguous(x), into_contiguous(gamma));
    let beta_like = (beta.meta.shape().clone(), beta.dtype);
    let [y, stats] = forward(norm, x.clone(), gamma.clone(), beta, eps);
    let saved = Saved {
        norm,
        x,
        gamma,
        stats,
        beta_like,
    };
    (y, saved)
}

impl<C: CheckpointStrategy> LayerNormOp for Autodiff<Cube, C> {
    fn layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
    ) -> FloatTensor<Self> {
        record::<Cube, C, _, 3>(NormBackward, [x, gamma, beta], |[x, gamma, beta]| {
            forward_kept(Norm::Layer, x, gamma, beta, eps)
        })
    }
}

impl<C: CheckpointStrategy> RmsNormOp for Autodiff<Cube, C> {
    fn rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        record::<Cube, C, _, 2>(NormBackward, [x, w], |[x, w]| {
            forward_kept(Norm::Rms, x, w.clone(), w, eps)
        })
    }
}

#[cfg(all(test, feature = "wgpu"))]
mod tests {
    use burn::prelude::*;
    use burn::tensor::{DeviceKind, TensorData};

    use crate::kernels::fused_layer_norm::layer_norm;
    use crate::kernels::fused_rms_norm::rms_norm;
    use crate::kernels::test_tensors::{assert_close, pattern};

    /// Output and the gradients of x, γ and (LayerNorm's) β, weighted by a fixed cotangent, on
    /// `device`.
    fn run(device: &Device, [b, t, d]: [usize; 3], centred: bool) -> Vec<Vec<f32>> {
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
        let (y, params) = match centred {
            true => (
                layer_norm(x.clone(), gamma.clone(), beta.clone(), 1e-12),
                vec![gamma, beta],
            ),
            false => (rms_norm(x.clone(), gamma.clone(), 1e-6), vec![gamma]),
        };
        let grads = (y.clone() * w).sum().backward();
        let mut out = vec![y.inner(), x.grad(&grads).unwrap()];
        out.extend(params.iter().map(|p| p.grad(&grads).unwrap()));
        out.into_iter()
            .map(|t| t.into_data().try_to_vec().unwrap())
            .collect()
    }

    /// Equal to the CPU's hand-written LayerNorm and RMS norm in value and in every gradient, on
    /// rows shorter and longer than a cube and row counts across several blocks of γ's partial sums.
    #[test]
    fn equal_the_cpus_norms_in_value_and_gradients() {
        let gpu = Device::wgpu(DeviceKind::default());
        for (norm, centred) in [("layer norm", true), ("rms norm", false)] {
            for shape in [[2, 3, 7], [3, 25, 300], [1, 70, 16]] {
                let (got, want) = (
                    run(&gpu, shape, centred),
                    run(&Device::flex(), shape, centred),
                );
                let names = ["y", "dx", "dgamma", "dbeta"];
                for (which, (g, w)) in names.iter().zip(got.iter().zip(&want)) {
                    assert_close(&format!("{norm} {which} {shape:?}"), g, w, 2e-5);
                }
            }
        }
    }
}
