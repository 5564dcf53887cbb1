//! Matrix products with bf16 operands and f32 accumulation — what PyTorch's bf16 autocast computes —
//! on AMX tiles where the CPU has them (`amx.rs`), else on AVX512-BF16 (`vdpbf16ps`: per f32 lane,
//! two bf16 products added to the lane, twice the work of an f32 FMA per instruction).
//!
//! Operands may be f32 or bf16 flex tensors (any strides, batched like
//! [`gemm_f32::matmul`](crate::kernels::gemm_f32::matmul)); they are rounded to bf16 (to nearest
//! even) as they are packed, and the result is a new contiguous f32 tensor
//! ([`Products::matmul_into`]: a bias row added and the result in bf16, which the AMX kernel does
//! as it stores). Where the CPU lacks AVX512-BF16, the same rounded operands are multiplied by the
//! f32 `gemm` crate: the products are the same (a product of two bf16 values is exact in f32), the
//! summation order differs.
//!
//! The AVX512-BF16 kernel is the usual packed GEMM (Goto/BLIS): for each block of 512 k-values, B is packed in
//! panels of [`NR`] columns holding each column's k-pair side by side, and A's rows are read as one
//! u32 per k-pair — in place when they are bf16 rows (the activations of the forward pass), else
//! converted row by row, or k-pair by k-pair when A is transposed (the weight gradients). A 6 × 64
//! micro-kernel keeps its C tile in 24 zmm registers and reads, per k-pair, four B vectors and six
//! broadcast A pairs. Every packing loop is vectorised (a transposed B through 16 × 16 register
//! transposes): packing is O(m·k + k·n) against O(m·n·k) products, but at d = 512 its scalar
//! form cost a fifth of the products' time. Work is split over rows and columns
//! only, never over k, so every output element is summed in the same order whatever the thread
//! count: results do not depend on it.

#[cfg(target_arch = "x86_64")]
mod amx;
mod finish;
mod operand;
mod pack;
mod product;

use burn::tensor::{DType, TensorData, bf16};
use burn_flex::FlexTensor;
use rayon::prelude::*;

use crate::kernels::flex_values::{cast, in_f32};
use crate::kernels::gemm_f32;
use finish::{Dst, Finish};
use operand::Operand;
use product::product;

/// Rows of a micro-tile.
const MR: usize = 6;
/// Columns of a micro-tile (B panel width): four zmm vectors of 16 f32 lanes.
const NR: usize = 64;
/// k-values per packed block (even).
const KC: usize = 512;
/// Columns of B packed at once: 512 × 1024 bf16 = 1 MiB, Zen 4's L2.
const NC: usize = 1024;
/// Rows handled by one task: a multiple of [`MR`].
const MC: usize = 96;
/// Products below this size (m·n·k) in a batch run one matrix per task.
const PARALLEL_MIN: usize = 192 * 192 * 192;

/// How a hand-written op multiplies: f32 operands, or operands rounded to bf16 (the bf16 training
/// mode: activations stored as bf16, products as PyTorch's bf16 autocast computes them). Either
/// way the products are summed in f32 and the result is f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Products {
    F32,
    Bf16,
}

impl Products {
    /// bf16 products for bf16 activations, f32 otherwise.
    pub fn for_activations(dtype: DType) -> Self {
        if dtype == DType::BF16 {
            Products::Bf16
        } else {
            Products::F32
        }
    }

    /// The dtype the operands are rounded to.
    pub fn dtype(self) -> DType {
        match self {
            Products::F32 => DType::F32,
            Products::Bf16 => DType::BF16,
        }
    }

    /// `a · b` (f32 or bf16 operands, any strides, batched) as a new contiguous f32 tensor.
    pub fn matmul(self, a: &FlexTensor, b: &FlexTensor) -> FlexTensor {
        match self {
            Products::F32 => gemm_f32::matmul(&in_f32(a.clone()), &in_f32(b.clone())),
            Products::Bf16 => matmul(a, b),
        }
    }

    /// `a · b + bias` (a row of `n` added to every row, when given) as a new contiguous tensor in
    /// `dtype` (f32 or bf16): what a layer's forward stores. The AMX kernel adds and rounds as
    /// it stores each block; elsewhere the f32 product is finished in one more pass.
    pub fn matmul_into(
        self,
        a: &FlexTensor,
        b: &FlexTensor,
        bias: Option<&[f32]>,
        dtype: DType,
    ) -> FlexTensor {
        #[cfg(target_arch = "x86_64")]
        if self == Products::Bf16 && Kernel::fastest() == Some(Kernel::Amx) {
            return matmul_packed(a, b, Kernel::Amx, Finish { bias, dtype });
        }
        Finish { bias, dtype }.apply(self.matmul(a, b))
    }
}

/// Whether this CPU runs the bf16 kernel (AVX512-F, -BW and -BF16, detected once).
pub fn hardware_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static DETECTED: OnceLock<bool> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512bf16")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the products run on AMX tiles (Intel Xeon since Sapphire Rapids, granted by Linux).
pub fn uses_amx() -> bool {
    Kernel::fastest().is_some_and(|k| k != Kernel::Avx512)
}

/// FLOPs of `iterations` rounds of the AMX dot-product instruction on registers (see
/// [`uses_amx`]): what a peak-rate measurement times.
///
/// # Panics
/// Where [`uses_amx`] does not hold.
pub fn amx_dot_products(iterations: u64) -> f64 {
    assert!(uses_amx(), "AMX dot products where the CPU has no AMX");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `uses_amx` found the tile unit available.
    return unsafe { amx::dot_products(iterations) };
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("{iterations}")
}

/// `a · b` over the last two dimensions (a `[.., m, k]`, b `[.., k, n]`, f32 or bf16, any strides)
/// with both operands rounded to bf16 and the products summed in f32: a new contiguous f32
/// `[.., m, n]` tensor.
pub fn matmul(a: &FlexTensor, b: &FlexTensor) -> FlexTensor {
    match Kernel::fastest() {
        Some(kernel) => matmul_packed(a, b, kernel, Finish::NONE),
        None => matmul_rounded_f32(a, b),
    }
}

/// The packed kernels: AVX512-BF16's 6 × 64 micro-kernel, or AMX tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Amx,
}

impl Kernel {
    /// AMX where the CPU and the kernel give it, else AVX512-BF16 where the CPU has it.
    fn fastest() -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        if amx::available() {
            return Some(Kernel::Amx);
        }
        hardware_bf16().then_some(Kernel::Avx512)
    }

    /// Matrix `i` of `a · b` into `c` (see [`product::product`]).
    ///
    /// # Safety
    /// As [`product::product`], and the kernel's hardware present; only AMX finishes (`c`
    /// plain f32 for the others).
    unsafe fn product(self, a: &Operand, b: &Operand, i: usize, c: Dst, parallel: bool) {
        // SAFETY: the caller's contract.
        unsafe {
            match self {
                Kernel::Avx512 => {
                    assert!(c.is_plain(), "the AVX-512 kernel stores plain f32");
                    product(a, b, i, c.addr as *mut f32, parallel)
                }
                #[cfg(target_arch = "x86_64")]
                Kernel::Amx => amx::product(a, b, i, c, parallel),
            }
        }
    }
}

/// A's `m` rows in blocks of `height` (one task each), and `pack` applied to every block, over the
/// rayon pool when `parallel`: what each kernel does with A at the start of a k-block.
fn packed_row_blocks<T: Send>(
    m: usize,
    height: usize,
    parallel: bool,
    pack: impl Fn(std::ops::Range<usize>) -> T + Sync,
) -> (Vec<std::ops::Range<usize>>, Vec<T>) {
    let blocks: Vec<std::ops::Range<usize>> = (0..m)
        .step_by(height)
        .map(|r| r..(r + height).min(m))
        .collect();
    let packed = if parallel {
        blocks.par_iter().map(|rows| pack(rows.clone())).collect()
    } else {
        blocks.iter().map(|rows| pack(rows.clone())).collect()
    };
    (blocks, packed)
}

/// The fallback: the bf16-rounded operands multiplied in f32.
fn matmul_rounded_f32(a: &FlexTensor, b: &FlexTensor) -> FlexTensor {
    let rounded = |t: &FlexTensor| in_f32(cast(t.clone(), DType::BF16));
    gemm_f32::matmul(&rounded(a), &rounded(b))
}

/// `a · b` by `kernel`, finished as `finish` says: by the AMX kernel itself when the product is
/// one k-block, else in a pass over the f32 result.
fn matmul_packed(a: &FlexTensor, b: &FlexTensor, kernel: Kernel, finish: Finish) -> FlexTensor {
    let (a, b) = (Operand::of(a), Operand::of(b));
    assert_eq!(a.batch, b.batch, "batch dimensions of a product");
    assert_eq!(a.cols, b.rows, "inner dimensions of a product");
    let (m, n, k) = (a.rows, b.cols, a.cols);
    if let Some(bias) = finish.bias {
        assert_eq!(bias.len(), n, "a bias row of the product's width");
    }
    #[cfg(target_arch = "x86_64")]
    let fused = kernel == Kernel::Amx && k <= amx::KC && k > 0;
    #[cfg(not(target_arch = "x86_64"))]
    let fused = false;
    let mut shape = a.batch.clone();
    shape.extend([m, n]);
    let count: usize = a.batch.iter().product();
    let len = count * m * n;
    if !fused {
        let out = if k == 0 || m == 0 || n == 0 {
            vec![0.0f32; len]
        } else {
            fill(len, |spare| products(&a, &b, kernel, Dst::f32(spare, None)))
        };
        return finish.apply(FlexTensor::from_data(TensorData::new(out, shape)));
    }
    match finish.dtype {
        DType::BF16 => {
            let out: Vec<bf16> = fill(len, |spare| {
                products(&a, &b, kernel, Dst::bf16(spare, finish.bias))
            });
            FlexTensor::from_data(TensorData::new(out, shape))
        }
        _ => {
            let out = fill(len, |spare| {
                products(&a, &b, kernel, Dst::f32(spare, finish.bias))
            });
            cast(
                FlexTensor::from_data(TensorData::new(out, shape)),
                finish.dtype,
            )
        }
    }
}

/// A vector of `len` values that `write` fills whole.
fn fill<T>(len: usize, write: impl FnOnce(&mut [std::mem::MaybeUninit<T>])) -> Vec<T> {
    let mut out = Vec::<T>::with_capacity(len);
    write(&mut out.spare_capacity_mut()[..len]);
    // SAFETY: `write` initialises every element (its contract with the callers here).
    unsafe { out.set_len(len) };
    out
}

/// Every matrix of `a · b` into `dst` (count · m · n values): one matrix at a time over the pool,
/// or one matrix per task when they are small.
fn products(a: &Operand, b: &Operand, kernel: Kernel, dst: Dst) {
    let (m, n, k) = (a.rows, b.cols, a.cols);
    let count: usize = a.batch.iter().product();
    let per_matrix = m.saturating_mul(n).saturating_mul(k);
    // SAFETY (both branches): each matrix's values lie in its own part of `dst`, which `product`
    // writes whole in its first k-block before it reads any (tiles cover the matrix; k > 0).
    if count == 1 || per_matrix >= PARALLEL_MIN {
        for i in 0..count {
            unsafe { kernel.product(a, b, i, dst.matrix(i, m * n), true) };
        }
    } else {
        (0..count)
            .into_par_iter()
            .for_each(|i| unsafe { kernel.product(a, b, i, dst.matrix(i, m * n), false) });
    }
}

#[cfg(test)]
mod tests;
