//! How the cubecl kernels are launched: element-wise ones one unit per element; row ones one cube
//! per row of a contiguous `[rows, n]` tensor, its units striding over the row, with sums and
//! maxima over a cube through shared memory (no plane operations, which not every adapter has).

use burn::tensor::{DType, Shape};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::{calculate_cube_count_elemwise, prelude::*};
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;

/// The sum of `partial` over the cube's `units` units (a power of two), in every unit.
#[cube]
pub fn cube_sum(partial: f32, #[comptime] units: usize) -> f32 {
    cube_reduce(partial, units, false)
}

/// The maximum of `partial` over the cube's `units` units (a power of two), in every unit.
#[cube]
pub fn cube_max(partial: f32, #[comptime] units: usize) -> f32 {
    cube_reduce(partial, units, true)
}

/// The sum (or with `take_max` the maximum) of `partial` over the cube, by halving in shared memory.
#[cube]
fn cube_reduce(partial: f32, #[comptime] units: usize, #[comptime] take_max: bool) -> f32 {
    let mut shared = Shared::<[f32]>::new_slice(units);
    let u = UNIT_POS as usize;
    // Every unit has read the previous reduction's result before any writes this one's: cubecl
    // packs shared memory by liveness (cubecl-opt's `alloc_shared_memory`), so this reduction's
    // buffer may be the last one's.
    sync_cube();
    shared[u] = partial;
    sync_cube();
    // From the launch (CUBE_DIM = units), so that the loop variable is a runtime one.
    let mut stride = CUBE_DIM as usize / 2;
    while stride > 0 {
        if u < stride {
            let (a, b) = (shared[u], shared[u + stride]);
            let mut both = a + b;
            if take_max {
                both = f32::max(a, b);
            }
            shared[u] = both;
        }
        sync_cube();
        stride /= 2;
    }
    shared[0]
}

/// A row's maximum and the sum of its elements' exponentials shifted by it (f32), in every unit of
/// the row's cube: softmax's and the loss's first two passes.
#[cube]
pub fn row_max_and_exp_sum<F: Float>(
    x: &Tensor<F>,
    base: usize,
    n: usize,
    #[comptime] units: usize,
) -> (f32, f32) {
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
    (top, cube_sum(sum, units))
}

/// How a row kernel is launched over `rows` rows of `n` elements: one cube per row (spread over
/// two grid axes past the first's limit), a power of two of units up to 256 and not past `n`.
pub struct RowLaunch {
    pub count: CubeCount,
    pub dim: CubeDim,
    pub units: usize,
}

impl RowLaunch {
    pub fn new(like: &CubeTensor, rows: usize, n: usize) -> Self {
        let max_units = like.client.properties().hardware.max_units_per_cube as usize;
        let units = n
            .next_power_of_two()
            .clamp(32, 256)
            .min(prev_power_of_two(max_units));
        let rows = u32::try_from(rows).expect("rows fit a u32");
        let (x, y) = (rows.min(65_535), rows.div_ceil(65_535));
        Self {
            count: CubeCount::Static(x, y, 1),
            dim: CubeDim::new_1d(units as u32),
            units,
        }
    }
}

fn prev_power_of_two(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.max(1).leading_zeros())
}

/// The row a cube works on ([`RowLaunch`]'s grid), or `rows` and beyond for the spare cubes.
#[cube]
pub fn row_of_cube() -> usize {
    CUBE_POS_Y as usize * CUBE_COUNT_X as usize + CUBE_POS_X as usize
}

/// The rows and row length of `x` taken as `[rows, last dim]`.
pub fn rows_of(x: &CubeTensor) -> (usize, usize) {
    let shape = x.meta.shape();
    let n = shape[shape.num_dims() - 1];
    (shape.num_elements() / n.max(1), n)
}

/// A new contiguous tensor on `like`'s device.
pub fn empty_like(like: &CubeTensor, shape: Shape, dtype: DType) -> CubeTensor {
    empty_device_dtype(like.client.clone(), like.device.clone(), shape, dtype)
}

/// A new tensor of `like`'s shape and dtype, and the grid of one unit per element.
pub fn elementwise_like(like: &CubeTensor) -> (CubeTensor, CubeCount, CubeDim) {
    let out = empty_like(like, like.meta.shape().clone(), like.dtype);
    let n = out.meta.num_elements();
    let dim = CubeDim::new(&out.client, n);
    let count = calculate_cube_count_elemwise(&out.client, n, dim);
    (out, count, dim)
}
