//! Matrix products with bf16 operands and f32 accumulation — what PyTorch's bf16 autocast computes —
//! on AVX512-BF16 (`vdpbf16ps`: per f32 lane, two bf16 products added to the lane, twice the work
//! of an f32 FMA per instruction).
//!
//! Operands may be f32 or bf16 flex tensors (any strides, batched like
//! [`gemm_f32::matmul`](crate::kernels::gemm_f32::matmul)); they are rounded to bf16 (to nearest
//! even) as they are packed, and the result is a new contiguous f32 tensor. Where the CPU lacks
//! AVX512-BF16, the same rounded operands are multiplied by the f32 `gemm` crate: the products are
//! the same (a product of two bf16 values is exact in f32), the summation order differs.
//!
//! The kernel is the usual packed GEMM (Goto/BLIS): for each block of 512 k-values, B is packed in
//! panels of [`NR`] columns holding each column's k-pair side by side, and A's rows are read as one
//! u32 per k-pair — in place when they are bf16 rows (the activations of the forward pass), else
//! converted row by row, or k-pair by k-pair when A is transposed (the weight gradients). A 6 × 64
//! micro-kernel keeps its C tile in 24 zmm registers and reads, per k-pair, four B vectors and six
//! broadcast A pairs. Every packing loop is vectorised (a transposed B through 16 × 16 register
//! transposes): packing is O(m·k + k·n) against O(m·n·k) products, but at d = 512 its scalar
//! form cost a fifth of the products' time. Work is split over rows and columns
//! only, never over k, so every output element is summed in the same order whatever the thread
//! count: results do not depend on it.

use burn::tensor::{DType, TensorData, bf16};
use burn_flex::FlexTensor;
use rayon::prelude::*;

use crate::kernels::flex_values::{bf16_bits, cast, in_f32};
use crate::kernels::gemm_f32;

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

    /// `a · b` (f32 or bf16 operands, any strides, batched) as a new contiguous f32 tensor.
    pub fn matmul(self, a: &FlexTensor, b: &FlexTensor) -> FlexTensor {
        match self {
            Products::F32 => gemm_f32::matmul(&in_f32(a.clone()), &in_f32(b.clone())),
            Products::Bf16 => matmul(a, b),
        }
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

/// `a · b` over the last two dimensions (a `[.., m, k]`, b `[.., k, n]`, f32 or bf16, any strides)
/// with both operands rounded to bf16 and the products summed in f32: a new contiguous f32
/// `[.., m, n]` tensor.
pub fn matmul(a: &FlexTensor, b: &FlexTensor) -> FlexTensor {
    if hardware_bf16() {
        matmul_packed(a, b)
    } else {
        matmul_rounded_f32(a, b)
    }
}

/// The fallback: the bf16-rounded operands multiplied in f32.
fn matmul_rounded_f32(a: &FlexTensor, b: &FlexTensor) -> FlexTensor {
    let rounded = |t: &FlexTensor| in_f32(cast(t.clone(), DType::BF16));
    gemm_f32::matmul(&rounded(a), &rounded(b))
}

/// The values of one operand: f32 or bf16 storage.
#[derive(Clone, Copy)]
enum Storage<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
}

/// A tensor read in place as a batch of matrices (as in `gemm_f32`), any float storage.
struct Operand<'a> {
    data: Storage<'a>,
    batch: Vec<usize>,
    offsets: Vec<usize>,
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> Operand<'a> {
    fn of(t: &'a FlexTensor) -> Self {
        let data = match t.dtype() {
            DType::F32 => Storage::F32(t.storage::<f32>()),
            DType::BF16 => Storage::Bf16(t.storage::<bf16>()),
            other => panic!("gemm_bf16 multiplies f32 or bf16 tensors, not {other:?}"),
        };
        let len = match data {
            Storage::F32(v) => v.len(),
            Storage::Bf16(v) => v.len(),
        };
        let layout = t.layout();
        let (shape, strides) = (layout.shape(), layout.strides());
        let r = shape.num_dims();
        assert!(r >= 2, "a product needs at least 2-d tensors");
        assert!(
            strides.iter().all(|&s| s >= 0),
            "negative strides are not supported"
        );
        let batch: Vec<usize> = (0..r - 2).map(|i| shape[i]).collect();
        let mut offsets = vec![layout.start_offset()];
        for (dim, &size) in batch.iter().enumerate() {
            let stride = strides[dim] as usize;
            offsets = offsets
                .iter()
                .flat_map(|&o| (0..size).map(move |j| o + j * stride))
                .collect();
        }
        let (rows, cols) = (shape[r - 2], shape[r - 1]);
        let (row_stride, col_stride) = (strides[r - 2] as usize, strides[r - 1] as usize);
        if rows > 0 && cols > 0 {
            let extent = (rows - 1) * row_stride + (cols - 1) * col_stride;
            assert!(
                offsets.iter().all(|&o| o + extent < len),
                "matrix view outside its buffer"
            );
        }
        Self {
            data,
            batch,
            offsets,
            rows,
            cols,
            row_stride,
            col_stride,
        }
    }

    #[inline(always)]
    fn bits_at(&self, at: usize) -> u16 {
        match self.data {
            Storage::F32(v) => bf16_bits(v[at]),
            Storage::Bf16(v) => v[at].to_bits(),
        }
    }

    /// `out.len()` contiguous values from `lo` on, each paired with the value at the same place
    /// from `hi` on (zero without `hi`): one u32 per value, `lo`'s bf16 in the low half.
    #[inline(always)]
    fn interleave(&self, lo: usize, hi: Option<usize>, out: &mut [u32]) {
        #[inline(always)]
        fn pairs<T>(lo: &[T], hi: Option<&[T]>, out: &mut [u32], bits: impl Fn(&T) -> u16) {
            match hi {
                Some(hi) => {
                    for ((o, l), h) in out.iter_mut().zip(lo).zip(hi) {
                        *o = bits(l) as u32 | (bits(h) as u32) << 16;
                    }
                }
                None => {
                    for (o, l) in out.iter_mut().zip(lo) {
                        *o = bits(l) as u32;
                    }
                }
            }
        }
        let n = out.len();
        match self.data {
            Storage::F32(v) => pairs(&v[lo..lo + n], hi.map(|h| &v[h..h + n]), out, |x| {
                bf16_bits(*x)
            }),
            Storage::Bf16(v) => pairs(&v[lo..lo + n], hi.map(|h| &v[h..h + n]), out, |x| {
                x.to_bits()
            }),
        }
    }

    /// `out.len()` contiguous values from `at` on, as bf16 bits.
    #[inline(always)]
    fn run(&self, at: usize, out: &mut [u16]) {
        let n = out.len();
        match self.data {
            Storage::F32(v) => {
                for (o, x) in out.iter_mut().zip(&v[at..at + n]) {
                    *o = bf16_bits(*x);
                }
            }
            Storage::Bf16(v) => {
                for (o, x) in out.iter_mut().zip(&v[at..at + n]) {
                    *o = x.to_bits();
                }
            }
        }
    }
}

fn matmul_packed(a: &FlexTensor, b: &FlexTensor) -> FlexTensor {
    let (a, b) = (Operand::of(a), Operand::of(b));
    assert_eq!(a.batch, b.batch, "batch dimensions of a product");
    assert_eq!(a.cols, b.rows, "inner dimensions of a product");
    let (m, n, k) = (a.rows, b.cols, a.cols);
    let count: usize = a.batch.iter().product();
    let out = if k == 0 || m == 0 || n == 0 {
        vec![0.0f32; count * m * n]
    } else {
        let mut out = Vec::<f32>::with_capacity(count * m * n);
        let spare = &mut out.spare_capacity_mut()[..count * m * n];
        let per_matrix = m.saturating_mul(n).saturating_mul(k);
        // SAFETY (both branches): `product` writes every element of its matrix in its first
        // k-block before it reads any (tiles cover the matrix; k > 0).
        if count == 1 || per_matrix >= PARALLEL_MIN {
            for (i, c) in spare.chunks_mut(m * n).enumerate() {
                unsafe { product(&a, &b, i, c.as_mut_ptr().cast(), true) };
            }
        } else {
            spare
                .par_chunks_mut(m * n)
                .enumerate()
                .for_each(|(i, c)| unsafe { product(&a, &b, i, c.as_mut_ptr().cast(), false) });
        }
        // SAFETY: all count·m·n elements written above.
        unsafe { out.set_len(count * m * n) };
        out
    };
    let mut shape = a.batch.clone();
    shape.extend([m, n]);
    FlexTensor::from_data(TensorData::new(out, shape))
}

/// One k-block of A's rows as the kernel reads them: row `r`'s k-pair `p` (counted from the
/// block's first row and first k) is the u32 at byte `addr + r · row_step + p · pair_step`, the
/// lower k's bf16 in its low half. Either A's own memory (bf16, row-major) or `owned`.
struct PairedRows {
    /// The packed values when they are not A's own (kept alive for `addr`).
    _owned: Vec<u32>,
    addr: usize,
    row_step: usize,
    pair_step: usize,
}

impl PairedRows {
    /// Over `owned` (`row_step`, `pair_step` counted in u32).
    fn over(owned: Vec<u32>, row_step: usize, pair_step: usize) -> Self {
        let addr = owned.as_ptr() as usize;
        Self {
            _owned: owned,
            addr,
            row_step: 4 * row_step,
            pair_step: 4 * pair_step,
        }
    }

    /// The kernel's row addresses for rows `r0..r0 + MR` of which the first `valid` exist; the
    /// others repeat row `r0` (the kernel computes them, the caller drops them).
    fn rows(&self, r0: usize, valid: usize) -> [*const u32; MR] {
        std::array::from_fn(|r| {
            let r = if r < valid { r0 + r } else { r0 };
            (self.addr + r * self.row_step) as *const u32
        })
    }
}

/// A's rows `rows` of k-block `k0..k0 + kc`, in the layout that suits how they lie: read in place
/// when they are bf16 rows of whole k-pairs; interleaved k-pair by k-pair when A is transposed
/// (each k a run of rows); else converted row by row.
fn pack_a(a: &Operand, i: usize, rows: std::ops::Range<usize>, k0: usize, kc: usize) -> PairedRows {
    let pairs = kc.div_ceil(2);
    let first = a.offsets[i] + rows.start * a.row_stride + k0 * a.col_stride;
    if a.col_stride == 1
        && let Storage::Bf16(v) = a.data
        && kc.is_multiple_of(2)
    {
        // SAFETY (pointer only): `first` lies inside `v` (checked by `Operand::of`).
        let addr = unsafe { v.as_ptr().add(first) } as usize;
        return PairedRows {
            _owned: Vec::new(),
            addr,
            row_step: 2 * a.row_stride,
            pair_step: 4,
        };
    }
    let mut owned = vec![0u32; pairs * rows.len()];
    if a.col_stride != 1 && a.row_stride == 1 {
        let width = rows.len();
        // SAFETY: the packed path runs only where `hardware_bf16` found AVX512 (BW included).
        unsafe { interleave_runs(a, first, (a.col_stride, kc), width, &mut owned, width) };
        return PairedRows::over(owned, 1, width);
    }
    // SAFETY: as above.
    unsafe { runs_as_pairs(a, first, (a.row_stride, a.col_stride), kc, &mut owned) };
    PairedRows::over(owned, pairs, 1)
}

/// Runs of `kc` values, the j-th from `first + j · x_stride`, `k_stride` apart, as bf16 k-pairs:
/// run `j` into `dst[j · kc.div_ceil(2)..]`, one line per run until `dst` ends (its last
/// half-word stays as it is when `kc` is odd).
///
/// # Safety
/// The CPU must have AVX512-F and AVX512-BW (the loops are vectorised for them).
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f,avx512bw"))]
unsafe fn runs_as_pairs(
    op: &Operand,
    first: usize,
    (x_stride, k_stride): (usize, usize),
    kc: usize,
    dst: &mut [u32],
) {
    for (j, line) in dst.chunks_exact_mut(kc.div_ceil(2)).enumerate() {
        let (start, halves) = (first + j * x_stride, &mut as_halves(line)[..kc]);
        if k_stride == 1 {
            op.run(start, halves);
        } else {
            for (kk, h) in halves.iter_mut().enumerate() {
                *h = op.bits_at(start + kk * k_stride);
            }
        }
    }
}

/// A u32 buffer as its bf16 halves, in memory order (the lower k first: little-endian).
fn as_halves(words: &mut [u32]) -> &mut [u16] {
    // SAFETY: u16 has no invalid values and a smaller alignment; the length covers the same bytes.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), 2 * words.len()) }
}

/// Runs of `width` values side by side, the run of k at `first + k · step` for k < `kc`, paired
/// per k-pair: pair `p`'s u32s at `dst[p · dst_step..][..width]`, the lower k in the low half
/// (zero past `kc`).
///
/// # Safety
/// The CPU must have AVX512-F and AVX512-BW (the loops are vectorised for them).
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f,avx512bw"))]
unsafe fn interleave_runs(
    op: &Operand,
    first: usize,
    (step, kc): (usize, usize),
    width: usize,
    dst: &mut [u32],
    dst_step: usize,
) {
    for p in 0..kc.div_ceil(2) {
        let lo = first + 2 * p * step;
        let hi = (2 * p + 1 < kc).then_some(lo + step);
        op.interleave(lo, hi, &mut dst[p * dst_step..p * dst_step + width]);
    }
}

/// B's columns `cols` of k-block `k0..k0 + kc` packed: per panel of [`NR`] columns, per k-pair,
/// the pairs of the panel's columns side by side (`[panel][pair][column]`), zero-padded past
/// `cols` and `kc`; groups of panels over the pool.
fn pack_b(b: &Operand, i: usize, cols: std::ops::Range<usize>, k0: usize, kc: usize) -> Vec<u32> {
    const GROUP: usize = 4;
    let pairs = kc.div_ceil(2);
    let mut packed = vec![0u32; cols.len().div_ceil(NR) * pairs * NR];
    packed
        .par_chunks_mut(GROUP * pairs * NR)
        .enumerate()
        .for_each(|(g, group)| {
            let mut columns = vec![0u32; if b.col_stride != 1 { NR * pairs } else { 0 }];
            for (q, panel) in group.chunks_exact_mut(pairs * NR).enumerate() {
                let c0 = cols.start + (g * GROUP + q) * NR;
                let width = NR.min(cols.end - c0);
                let first = b.offsets[i] + k0 * b.row_stride + c0 * b.col_stride;
                if b.col_stride == 1 {
                    // each k a run of columns
                    let k_runs = (b.row_stride, kc);
                    // SAFETY: as in `pack_a`.
                    unsafe { interleave_runs(b, first, k_runs, width, panel, NR) };
                } else {
                    // each column's k-pairs in order (one run when B is transposed), then the
                    // panel transposed
                    let (valid, past) = columns.split_at_mut(width * pairs);
                    let strides = (b.col_stride, b.row_stride);
                    // SAFETY: as in `pack_a`.
                    unsafe { runs_as_pairs(b, first, strides, kc, valid) };
                    past.fill(0);
                    transpose_into_panel(&columns, pairs, panel);
                }
            }
        });
    packed
}

/// `columns` (`[NR][pairs]`: each column's k-pairs) written as `panel` (`[pairs][NR]`).
fn transpose_into_panel(columns: &[u32], pairs: usize, panel: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    let whole = {
        let whole = pairs - pairs % 16;
        for p0 in (0..whole).step_by(16) {
            for j0 in (0..NR).step_by(16) {
                // SAFETY: AVX512-F (the packed path's CPU); 16 × 16 inside both buffers.
                unsafe {
                    transpose16::block(
                        columns.as_ptr().add(j0 * pairs + p0),
                        pairs,
                        panel.as_mut_ptr().add(p0 * NR + j0),
                        NR,
                    )
                };
            }
        }
        whole
    };
    #[cfg(not(target_arch = "x86_64"))]
    let whole = 0;
    for p in whole..pairs {
        for j in 0..NR {
            panel[p * NR + j] = columns[j * pairs + p];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod transpose16 {
    use std::arch::x86_64::*;

    /// The 16 × 16 u32 block at `src` (row stride `lds`) written transposed at `dst` (row stride
    /// `ldd`): four rounds, each swapping the off-diagonal sub-blocks of half the previous size.
    ///
    /// # Safety
    /// AVX512-F; 16 rows of 16 u32 readable at `src`, writable at `dst`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn block(src: *const u32, lds: usize, dst: *mut u32, ldd: usize) {
        // SAFETY: the caller's contract; unaligned loads and stores.
        unsafe {
            let mut rows: [__m512i; 16] =
                std::array::from_fn(|r| _mm512_loadu_si512(src.add(r * lds).cast()));
            for size in [8usize, 4, 2, 1] {
                // row i (i / size even) keeps its even sub-blocks and takes row i + size's
                // even ones into its odd places; row i + size gets row i's odd ones
                let upper: [i32; 16] = std::array::from_fn(|c| {
                    (if (c / size) % 2 == 0 {
                        c
                    } else {
                        16 + c - size
                    }) as i32
                });
                let lower: [i32; 16] = std::array::from_fn(|c| {
                    (if (c / size) % 2 == 0 {
                        c + size
                    } else {
                        16 + c
                    }) as i32
                });
                let (upper, lower) = (
                    _mm512_loadu_si512(upper.as_ptr().cast()),
                    _mm512_loadu_si512(lower.as_ptr().cast()),
                );
                for i in (0..16).filter(|i| (i / size) % 2 == 0) {
                    let (x, y) = (rows[i], rows[i + size]);
                    rows[i] = _mm512_permutex2var_epi32(x, upper, y);
                    rows[i + size] = _mm512_permutex2var_epi32(x, lower, y);
                }
            }
            for (r, row) in rows.iter().enumerate() {
                _mm512_storeu_si512(dst.add(r * ldd).cast(), *row);
            }
        }
    }
}

/// Matrix `i` of `a · b` into `c` (`m × n`, row-major), over the rayon pool when `parallel`.
///
/// # Safety
/// `c` must be valid for writing `m · n` f32 (it may be uninitialised: the first k-block stores,
/// later ones add) and not accessed elsewhere during the call.
unsafe fn product(a: &Operand, b: &Operand, i: usize, c: *mut f32, parallel: bool) {
    let (m, n, k) = (a.rows, b.cols, a.cols);
    for k0 in (0..k).step_by(KC) {
        let kc = KC.min(k - k0);
        let pairs = kc.div_ceil(2);
        // A for this k-block, one block per task of MC rows
        let row_blocks: Vec<std::ops::Range<usize>> =
            (0..m).step_by(MC).map(|r| r..(r + MC).min(m)).collect();
        let a_blocks: Vec<PairedRows> = if parallel {
            row_blocks
                .par_iter()
                .map(|rows| pack_a(a, i, rows.clone(), k0, kc))
                .collect()
        } else {
            row_blocks
                .iter()
                .map(|rows| pack_a(a, i, rows.clone(), k0, kc))
                .collect()
        };
        for n0 in (0..n).step_by(NC) {
            let nc = NC.min(n - n0);
            let bp = pack_b(b, i, n0..n0 + nc, k0, kc);
            let panels = nc.div_ceil(NR);
            // Tasks: (row block, group of column panels); each writes its own C tiles.
            let groups = if parallel {
                let threads = rayon::current_num_threads();
                (threads.div_ceil(row_blocks.len())).clamp(1, panels)
            } else {
                1
            };
            let per_group = panels.div_ceil(groups);
            let tasks: Vec<(usize, usize)> = (0..row_blocks.len())
                .flat_map(|rb| (0..groups).map(move |g| (rb, g)))
                .collect();
            let c_addr = c as usize;
            let first = k0 == 0;
            let run = |&(rb, g): &(usize, usize)| {
                let rows = &row_blocks[rb];
                let ap = &a_blocks[rb];
                for panel in g * per_group..((g + 1) * per_group).min(panels) {
                    let bpanel = &bp[panel * pairs * NR..(panel + 1) * pairs * NR];
                    let col0 = n0 + panel * NR;
                    let ncols = NR.min(n - col0);
                    for r0 in (0..rows.len()).step_by(MR) {
                        let nrows = MR.min(rows.len() - r0);
                        let arows = ap.rows(r0, nrows);
                        let row0 = rows.start + r0;
                        // SAFETY: tasks cover disjoint (row, column) tiles of `c`, which outlives
                        // the scope; the tile lies inside `c` (row0 + nrows ≤ m, col0 + ncols ≤ n);
                        // `arows` hold `pairs` k-pairs each (`pack_a`).
                        unsafe {
                            let tile = (c_addr as *mut f32).add(row0 * n + col0);
                            let a_tile = (arows, ap.pair_step);
                            tile_product(a_tile, bpanel, pairs, tile, n, (nrows, ncols), first);
                        }
                    }
                }
            };
            if parallel && tasks.len() > 1 {
                tasks.par_iter().for_each(run);
            } else {
                tasks.iter().for_each(run);
            }
        }
    }
}

/// One tile of C: `c[r][j] (+)= Σ_p a[r][p] · bpanel[p][j]` for r < rows, j < cols of `size`,
/// A's row `r` pair `p` at byte `arows[r] + p · a_step`; stored when `first` (the first k-block),
/// added otherwise.
///
/// # Safety
/// `arows` must each be readable for `pairs` u32 `a_step` bytes apart; `c` must be valid for
/// writing (and, unless `first`, reading) `size.0` rows of `size.1` f32 at row stride `ldc`, with
/// no other access to them during the call; the CPU must have AVX512-BF16.
unsafe fn tile_product(
    (arows, a_step): ([*const u32; MR], usize),
    bpanel: &[u32],
    pairs: usize,
    c: *mut f32,
    ldc: usize,
    size: (usize, usize),
    first: bool,
) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract; the B panel holds `pairs` k-pairs of NR columns.
    unsafe {
        if size == (MR, NR) {
            kernel::tile(arows, a_step, bpanel, pairs, c, ldc, first);
            return;
        }
        // an edge tile: computed whole into a buffer, its valid part moved to C
        let mut tile = [[0.0f32; NR]; MR];
        kernel::tile(
            arows,
            a_step,
            bpanel,
            pairs,
            tile.as_mut_ptr().cast(),
            NR,
            true,
        );
        for (r, row) in tile.iter().enumerate().take(size.0) {
            let dst = std::slice::from_raw_parts_mut(c.add(r * ldc), size.1);
            if first {
                dst.copy_from_slice(&row[..size.1]);
            } else {
                dst.iter_mut().zip(row).for_each(|(d, v)| *d += v);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!(
        "the packed kernel runs on x86_64 only ({arows:?} {a_step} {bpanel:?} {pairs} {c:?} {ldc} {size:?} {first})"
    );
}

#[cfg(target_arch = "x86_64")]
mod kernel {
    use super::{MR, NR};
    use std::arch::x86_64::*;

    /// The 6 × 64 micro-kernel: `c (+)= Σ_p a[p] · bpanel[p]` over `pairs` k-pairs, A's row `r`
    /// pair `p` at byte `arows[r] + p · a_step`, the tile at `c` with row stride `ldc`, stored when
    /// `first`, added otherwise.
    ///
    /// # Safety
    /// The CPU must have AVX512-F and AVX512-BF16; each of `arows` is readable for `pairs` u32
    /// `a_step` bytes apart (unaligned), `bpanel` holds `pairs · NR` u32, and `c` is valid for MR
    /// rows of NR f32 (read too unless `first`).
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn tile(
        arows: [*const u32; MR],
        a_step: usize,
        bpanel: &[u32],
        pairs: usize,
        c: *mut f32,
        ldc: usize,
        first: bool,
    ) {
        assert!(bpanel.len() >= pairs * NR);
        // SAFETY (the whole body): in bounds by the assertion and the caller's contract;
        // unaligned loads and stores.
        unsafe {
            let mut acc: [[__m512; 4]; MR] = std::array::from_fn(|r| {
                std::array::from_fn(|v| {
                    if first {
                        _mm512_setzero_ps()
                    } else {
                        _mm512_loadu_ps(c.add(r * ldc + v * 16))
                    }
                })
            });
            let b = bpanel.as_ptr();
            let mut arows = arows.map(|p| p.cast::<u8>());
            for p in 0..pairs {
                let bp = b.add(p * NR);
                let bv: [__m512bh; 4] = std::array::from_fn(|v| {
                    std::mem::transmute(_mm512_loadu_si512(bp.add(v * 16).cast()))
                });
                for (row, a) in acc.iter_mut().zip(&mut arows) {
                    let bits = a.cast::<u32>().read_unaligned() as i32;
                    *a = a.add(a_step);
                    let pair: __m512bh = std::mem::transmute(_mm512_set1_epi32(bits));
                    for (lane, bv) in row.iter_mut().zip(&bv) {
                        *lane = _mm512_dpbf16_ps(*lane, pair, *bv);
                    }
                }
            }
            for (r, row) in acc.iter().enumerate() {
                for (v, x) in row.iter().enumerate() {
                    _mm512_storeu_ps(c.add(r * ldc + v * 16), *x);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_tensors::pattern;
    use burn::backend::Flex;
    use burn::backend::ops::FloatTensorOps;

    fn tensor(shape: &[usize], salt: usize, dtype: DType) -> FlexTensor {
        let values = pattern(shape.iter().product(), salt);
        cast(
            FlexTensor::from_data(TensorData::new(values, shape.to_vec())),
            dtype,
        )
    }

    /// `a · b` in f64 over the bf16-rounded operands (contiguous copies), with Σ|a||b| per element
    /// for the error bound.
    fn reference(a: &FlexTensor, b: &FlexTensor) -> (Vec<f64>, Vec<f64>) {
        let round = |t: &FlexTensor| {
            let t = in_f32(cast(t.clone(), DType::BF16)).to_contiguous();
            let dims = t.layout().shape().num_dims();
            let shape = t.layout().shape().clone();
            (
                t.as_slice::<f32>().unwrap().to_vec(),
                shape[dims - 2],
                shape[dims - 1],
            )
        };
        let ((av, m, k), (bv, _, n)) = (round(a), round(b));
        let count = av.len() / (m * k).max(1);
        let (mut out, mut abs) = (vec![0.0; count * m * n], vec![0.0; count * m * n]);
        for i in 0..count {
            for r in 0..m {
                for c in 0..n {
                    for p in 0..k {
                        let (x, y) = (
                            av[i * m * k + r * k + p] as f64,
                            bv[i * k * n + p * n + c] as f64,
                        );
                        out[i * m * n + r * n + c] += x * y;
                        abs[i * m * n + r * n + c] += (x * y).abs();
                    }
                }
            }
        }
        (out, abs)
    }

    fn check(product: FlexTensor, a: &FlexTensor, b: &FlexTensor, what: &str) {
        let (expected, abs) = reference(a, b);
        let got = product.as_slice::<f32>().unwrap().to_vec();
        assert_eq!(got.len(), expected.len(), "{what}: size");
        for (j, ((g, e), s)) in got.iter().zip(&expected).zip(&abs).enumerate() {
            // f32 accumulation over k terms: within a few ulps of Σ|a·b| per term
            let bound = 1e-6 * s * (1.0 + (abs.len() as f64).log2()) + 1e-30;
            assert!((*g as f64 - e).abs() <= bound, "{what}[{j}]: {g} vs {e}");
        }
    }

    #[test]
    fn bf16_products_of_every_shape_and_layout_match_the_rounded_reference() {
        // edges of the 6 × 64 tile, odd k, several k-blocks (k > 512) and column blocks (n > 1024)
        for &(m, k, n) in &[
            (1, 1, 1),
            (5, 7, 3),
            (6, 64, 64),
            (7, 65, 65),
            (13, 513, 100),
            (3, 40, 1100),
            (100, 1030, 70),
        ] {
            for (da, db) in [
                (DType::BF16, DType::F32),
                (DType::F32, DType::BF16),
                (DType::BF16, DType::BF16),
            ] {
                let (a, b) = (tensor(&[m, k], 1, da), tensor(&[k, n], 2, db));
                check(
                    matmul(&a, &b),
                    &a,
                    &b,
                    &format!("{m}×{k}·{k}×{n} {da:?}·{db:?}"),
                );
            }
        }
        // transposed operands and a batch of strided heads
        let at = Flex::float_transpose(tensor(&[9, 11], 3, DType::BF16));
        let b = tensor(&[9, 70], 4, DType::F32);
        check(matmul(&at, &b), &at, &b, "transposed a");
        // B transposed: whole 16 × 16 blocks, a partial one and a partial panel
        let a = tensor(&[13, 100], 11, DType::BF16);
        let bt = Flex::float_transpose(tensor(&[70, 100], 12, DType::F32));
        check(matmul(&a, &bt), &a, &bt, "transposed b");
        // neither dimension contiguous: [m, k, 2] and [k, n, 2] seen as [2, m, k] and [2, k, n]
        let strided = |shape: [usize; 3], salt| {
            Flex::float_permute(tensor(&shape, salt, DType::F32), &[2, 0, 1])
        };
        let (a, b) = (strided([7, 35, 2], 13), strided([35, 66, 2], 14));
        check(matmul(&a, &b), &a, &b, "strided both");
        let q = Flex::float_swap_dims(tensor(&[2, 5, 3, 8], 5, DType::BF16), 1, 2);
        let kt = Flex::float_transpose(tensor(&[2, 3, 7, 8], 6, DType::BF16));
        check(matmul(&q, &kt), &q, &kt, "batched heads");
    }

    #[test]
    fn large_products_split_over_the_pool_and_agree_with_one_thread() {
        let (a, b) = (
            tensor(&[300, 700], 7, DType::BF16),
            tensor(&[700, 1500], 8, DType::F32),
        );
        let pooled = matmul(&a, &b);
        check(pooled.clone(), &a, &b, "pooled");
        let single = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| matmul(&a, &b));
        assert_eq!(
            pooled.as_slice::<f32>().unwrap(),
            single.as_slice::<f32>().unwrap(),
            "the thread count changes no sum"
        );
    }

    #[test]
    fn the_fallback_multiplies_the_same_rounded_operands() {
        let (a, b) = (
            tensor(&[13, 70], 9, DType::F32),
            tensor(&[70, 9], 10, DType::F32),
        );
        check(matmul_rounded_f32(&a, &b), &a, &b, "fallback");
        // where this CPU has the instruction, the packed kernel is what `matmul` runs
        if hardware_bf16() {
            check(matmul_packed(&a, &b), &a, &b, "packed");
        }
    }

    #[test]
    fn an_empty_inner_dimension_gives_zeros() {
        let (a, b) = (
            tensor(&[3, 0], 0, DType::BF16),
            tensor(&[0, 4], 0, DType::F32),
        );
        assert_eq!(matmul(&a, &b).as_slice::<f32>().unwrap(), &[0.0; 12]);
    }
}
