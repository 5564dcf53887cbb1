//! Dropout on cubecl devices (CUDA, wgpu): one kernel that draws each element's keep bit from its
//! position and scales, so no mask is stored and backward draws the same bits again. The bits are
//! the CPU's: SplitMix64's `i`-th output (`SplitMix64::output`) with 64-bit arithmetic done on u32
//! pairs (WGSL has no u64), its low word for element `2i` and its high word for element `2i + 1`,
//! so a run draws the same masks on either device.

use burn::backend::Cube;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::FloatTensor;
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;

use super::launch::elementwise_like;
use crate::kernels::dropout::{SPLITMIX_GAMMA, keep_scale, keep_threshold};
use crate::kernels::dropout_op::{DropoutGrad, DropoutOp};

/// A u64 as two u32 words.
#[derive(CubeType, Clone, Copy)]
struct Word64 {
    hi: u32,
    lo: u32,
}

#[cube]
fn add64(a: Word64, b: Word64) -> Word64 {
    let lo = a.lo + b.lo;
    let carry = u32::cast_from(lo < a.lo);
    Word64 {
        hi: a.hi + b.hi + carry,
        lo,
    }
}

/// `a · b mod 2^64`.
#[cube]
fn mul64(a: Word64, b: Word64) -> Word64 {
    Word64 {
        hi: a.lo.mul_hi(b.lo) + a.lo * b.hi + a.hi * b.lo,
        lo: a.lo * b.lo,
    }
}

/// `a ^ (a >> s)` for `0 < s < 32`.
#[cube]
fn xor_shift(a: Word64, #[comptime] s: u32) -> Word64 {
    Word64 {
        hi: a.hi ^ (a.hi >> s),
        lo: a.lo ^ ((a.lo >> s) | (a.hi << (32 - s))),
    }
}

/// SplitMix64's finaliser (Stafford's Mix13), as `dropout::mix`.
#[cube]
fn mix(z: Word64) -> Word64 {
    let z = mul64(
        xor_shift(z, 30u32),
        Word64 {
            hi: 0xBF58_476D,
            lo: 0x1CE4_E5B9,
        },
    );
    let z = mul64(
        xor_shift(z, 27u32),
        Word64 {
            hi: 0x94D0_49BB,
            lo: 0x1331_11EB,
        },
    );
    xor_shift(z, 31u32)
}

/// The keep bits of element `e`: the low or high word of output `e / 2`.
#[cube]
fn bits_of(e: u32, seed: Word64, gamma: Word64) -> u32 {
    let step = Word64 {
        hi: 0,
        lo: e / 2 + 1,
    };
    let r = mix(add64(seed, mul64(step, gamma)));
    if (e & 1) == 0 { r.lo } else { r.hi }
}

/// `out[e] = x[e] · scale` where element `e` is kept (its bits at most `max_kept`), else 0; with
/// `after_relu`, also 0 where `x[e] ≤ 0`.
#[cube(launch_unchecked)]
fn dropout_kernel<F: Float>(
    x: &Tensor<F>,
    out: &mut Tensor<F>,
    seed_hi: u32,
    seed_lo: u32,
    max_kept: u32,
    scale: f32,
    #[comptime] after_relu: bool,
    #[define(F)] _dtype: ElemType,
) {
    if ABSOLUTE_POS >= out.len() {
        terminate!();
    }
    let e = u32::cast_from(ABSOLUTE_POS);
    let seed = Word64 {
        hi: seed_hi,
        lo: seed_lo,
    };
    let gamma = Word64 {
        hi: comptime!((SPLITMIX_GAMMA >> 32) as u32),
        lo: comptime!(SPLITMIX_GAMMA as u32),
    };
    let v = f32::cast_from(x[ABSOLUTE_POS]);
    let mut y = 0.0f32;
    if bits_of(e, seed, gamma) <= max_kept {
        y = v * scale;
    }
    if after_relu && v <= 0.0 {
        y = 0.0;
    }
    out[ABSOLUTE_POS] = F::cast_from(y);
}

/// `out[e] = g[e] · scale` where `y[e] > 0`, else 0: the gradient of dropout after ReLU from its
/// output `y`, which is positive exactly where ReLU passed the element and dropout kept it.
#[cube(launch_unchecked)]
fn positive_gate_kernel<F: Float>(
    g: &Tensor<F>,
    y: &Tensor<F>,
    out: &mut Tensor<F>,
    scale: f32,
    #[define(F)] _dtype: ElemType,
) {
    if ABSOLUTE_POS >= out.len() {
        terminate!();
    }
    let mut v = 0.0f32;
    if f32::cast_from(y[ABSOLUTE_POS]) > 0.0 {
        v = f32::cast_from(g[ABSOLUTE_POS]) * scale;
    }
    out[ABSOLUTE_POS] = F::cast_from(v);
}

/// [`elementwise_like`], for a tensor whose elements a u32 index can number (the draws' positions).
fn output_like(like: &CubeTensor) -> (CubeTensor, CubeCount, CubeDim) {
    let n = like.meta.num_elements();
    assert!(
        n < 1 << 33,
        "dropout on the GPU draws by a u32 element index"
    );
    elementwise_like(like)
}

/// Inverted dropout of `x` (after ReLU when `after_relu`) with the CPU's mask for `seed` and `p`.
pub fn dropout(x: CubeTensor, seed: u64, p: f64, after_relu: bool) -> CubeTensor {
    let x = into_contiguous(x);
    let (out, count, dim) = output_like(&x);
    // Kept where the bits are below the threshold, i.e. at most threshold − 1: that bound fits a
    // u32 for every 0 ≤ p < 1 (p = 0 keeps all: 2^32 − 1).
    let max_kept = u32::try_from(keep_threshold(p) - 1).expect("0 <= p < 1");
    let dtype = dtype_to_storage_type(x.dtype);
    unsafe {
        dropout_kernel::launch_unchecked(
            &out.client,
            count,
            dim,
            x.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            (seed >> 32) as u32,
            seed as u32,
            max_kept,
            keep_scale(p) as f32,
            after_relu,
            dtype,
        );
    }
    out
}

/// The gradient of [`dropout`] after ReLU: `grad · scale` where `out > 0`, else 0.
pub fn relu_dropout_backward(grad: CubeTensor, out: CubeTensor, p: f64) -> CubeTensor {
    let (grad, y) = (into_contiguous(grad), into_contiguous(out));
    let (dx, count, dim) = output_like(&grad);
    let dtype = dtype_to_storage_type(grad.dtype);
    unsafe {
        positive_gate_kernel::launch_unchecked(
            &dx.client,
            count,
            dim,
            grad.into_tensor_arg(),
            y.into_tensor_arg(),
            dx.clone().into_tensor_arg(),
            keep_scale(p) as f32,
            dtype,
        );
    }
    dx
}

impl DropoutOp for Cube {
    fn dropout(x: FloatTensor<Self>, seed: u64, p: f64) -> FloatTensor<Self> {
        dropout(x, seed, p, false)
    }

    fn relu_dropout(x: FloatTensor<Self>, seed: u64, p: f64) -> FloatTensor<Self> {
        dropout(x, seed, p, true)
    }
}

impl DropoutGrad for Cube {
    fn relu_dropout_grad(
        grad: FloatTensor<Self>,
        out: FloatTensor<Self>,
        p: f64,
    ) -> FloatTensor<Self> {
        relu_dropout_backward(grad, out, p)
    }
}

#[cfg(all(test, feature = "wgpu", cube_kernels))]
mod tests {
    use burn::prelude::*;
    use burn::tensor::{DType, DeviceKind, TensorData};

    use crate::kernels::dropout_op;
    use crate::kernels::test_tensors::pattern;

    /// Output and input gradient (weighted by a fixed cotangent) of dropout on `device`.
    fn run(
        device: &Device,
        dtype: DType,
        n: usize,
        seed: u64,
        p: f64,
        relu: bool,
    ) -> [Vec<f32>; 2] {
        let x = Tensor::<2>::from_data(TensorData::new(pattern(n, 3), [1, n]), device)
            .cast(dtype)
            .autodiff()
            .require_grad();
        let w = Tensor::<2>::from_data(TensorData::new(pattern(n, 11), [1, n]), device).cast(dtype);
        assert!(
            dropout_op::supported(&x),
            "the hand-written op runs on {device:?}"
        );
        let y = match relu {
            false => dropout_op::dropout(x.clone(), seed, p),
            true => dropout_op::relu_dropout(x.clone(), seed, p),
        };
        let grads = (y.clone() * w).sum().backward();
        let dx = x.grad(&grads).unwrap();
        [y.inner(), dx].map(|t| t.cast(DType::F32).into_data().try_to_vec().unwrap())
    }

    /// The kernel draws the CPU's masks (SplitMix64 on u32 pairs, the low word first) and scales
    /// as the CPU does: bit for bit in f32, in value and gradient, for odd and even lengths, with
    /// and without ReLU, p = 0 included; and in bf16 where the adapter has it.
    #[test]
    fn draws_the_cpus_masks_in_value_and_gradient() {
        let gpu = Device::wgpu(DeviceKind::default());
        for (n, seed, p, relu) in [
            (63, 7, 0.1, false),
            (1000, 0x9E37_79B9_0000_0001, 0.5, false),
            (999, u64::MAX - 3, 0.3, true),
            (64, 5, 0.0, true),
        ] {
            let cpu = run(&Device::flex(), DType::F32, n, seed, p, relu);
            let on_gpu = run(&gpu, DType::F32, n, seed, p, relu);
            assert_eq!(on_gpu, cpu, "n {n}, p {p}, relu {relu}");
            let dropped = cpu[0].iter().filter(|&&y| y == 0.0).count() as f64 / n as f64;
            assert!(
                p == 0.0 || dropped > p / 2.0,
                "the masks drop ({dropped} at p {p})"
            );
        }
        // Mesa's software adapter has no bf16; a card's bf16 runs in accept.sh's parity section.
        if gpu.supports_dtype(DType::BF16) {
            let cpu = run(&Device::flex(), DType::BF16, 999, 42, 0.2, false);
            assert_eq!(run(&gpu, DType::BF16, 999, 42, 0.2, false), cpu);
        } else {
            println!("bf16: not on this adapter ({gpu:?}), not compared");
        }
    }
}
