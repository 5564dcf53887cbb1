//! Packing one k-block: A's rows as u32 k-pairs (in place when they already lie so), B's columns
//! in panels of [`NR`] columns. Every loop is vectorised for AVX512-F and -BW.

use rayon::prelude::*;

use super::MR;
use super::operand::{Operand, Storage};

/// One k-block of A's rows as the kernel reads them: row `r`'s k-pair `p` (counted from the
/// block's first row and first k) is the u32 at byte `addr + r · row_step + p · pair_step`, the
/// lower k's bf16 in its low half. Either A's own memory (bf16, row-major) or `owned`.
pub(super) struct PairedRows {
    /// The packed values when they are not A's own (kept alive for `addr`).
    _owned: Vec<u32>,
    addr: usize,
    row_step: usize,
    pub(super) pair_step: usize,
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
    pub(super) fn rows(&self, r0: usize, valid: usize) -> [*const u32; MR] {
        std::array::from_fn(|r| {
            let r = if r < valid { r0 + r } else { r0 };
            (self.addr + r * self.row_step) as *const u32
        })
    }
}

/// A's rows `rows` of k-block `k0..k0 + kc`, in the layout that suits how they lie: read in place
/// when they are bf16 rows of whole k-pairs; interleaved k-pair by k-pair when A is transposed
/// (each k a run of rows); else converted row by row.
pub(super) fn pack_a(
    a: &Operand,
    i: usize,
    rows: std::ops::Range<usize>,
    k0: usize,
    kc: usize,
) -> PairedRows {
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
    unsafe {
        runs_as_pairs(
            a,
            first,
            (a.row_stride, a.col_stride),
            (kc, pairs),
            &mut owned,
        )
    };
    PairedRows::over(owned, pairs, 1)
}

/// Runs of `kc` values, the j-th from `first + j · x_stride`, `k_stride` apart, as bf16 k-pairs:
/// run `j` into `dst[j · line..]`, one line of `line` ≥ `kc.div_ceil(2)` u32 per run until `dst`
/// ends (what lies past the run's `kc` halves stays as it is).
///
/// # Safety
/// The CPU must have AVX512-F and AVX512-BW (the loops are vectorised for them).
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f,avx512bw"))]
pub(super) unsafe fn runs_as_pairs(
    op: &Operand,
    first: usize,
    (x_stride, k_stride): (usize, usize),
    (kc, line): (usize, usize),
    dst: &mut [u32],
) {
    for (j, line) in dst.chunks_exact_mut(line).enumerate() {
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
pub(super) unsafe fn interleave_runs(
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

/// B's columns `cols` of k-block `k0..k0 + kc` packed: per panel of `width` columns, per k-pair,
/// the pairs of the panel's columns side by side (`[panel][pair][column]`, `pairs` k-pairs per
/// panel), zero-padded past `cols` and `kc`; groups of panels over the pool.
pub(super) fn pack_b(
    b: &Operand,
    i: usize,
    cols: std::ops::Range<usize>,
    (k0, kc): (usize, usize),
    (pairs, width): (usize, usize),
) -> Aligned {
    debug_assert!(pairs >= kc.div_ceil(2));
    let panel_len = pairs * width;
    let mut packed = Aligned::zeroed(cols.len().div_ceil(width) * panel_len);
    let first = b.offsets[i] + k0 * b.row_stride + cols.start * b.col_stride;
    if b.col_stride == 1 {
        // row-major B: each k-pair's two rows read across all the columns, long runs that the
        // prefetchers follow (a panel's 32 columns a row apart were read at a third of the
        // rate), dealt to the panels; tasks over ranges of k-pairs
        let out = Panels {
            addr: packed.as_mut_ptr() as usize,
            panel_len,
            width,
        };
        let ranges: Vec<std::ops::Range<usize>> = (0..kc.div_ceil(2))
            .step_by(PAIRS_PER_TASK)
            .map(|p| p..(p + PAIRS_PER_TASK).min(kc.div_ceil(2)))
            .collect();
        // SAFETY: the CPU has AVX-512 (as in `pack_a`); each task writes its own k-pairs of
        // every panel, inside `packed`.
        ranges
            .par_iter()
            .for_each(|ps| unsafe { deal_rows(b, first, (ps.clone(), kc), cols.len(), out) });
        return packed;
    }
    packed
        .par_chunks_mut(GROUP_PANELS * panel_len)
        .enumerate()
        .for_each(|(g, panels)| {
            let mut by_column = vec![0u32; if b.row_stride == 1 { 0 } else { panel_len }];
            for (q, panel) in panels.chunks_exact_mut(panel_len).enumerate() {
                let c0 = (g * GROUP_PANELS + q) * width;
                let valid = width.min(cols.len() - c0);
                if b.row_stride == 1 {
                    // SAFETY: as in `pack_a`.
                    let at = first + c0 * b.col_stride;
                    unsafe { transpose_columns(b, at, (kc, valid), panel, width) };
                    continue;
                }
                // each column's k-pairs in order (one run when B is transposed), then the
                // panel transposed
                let (valid, past) = by_column.split_at_mut(valid * pairs);
                let strides = (b.col_stride, b.row_stride);
                let at = first + c0 * b.col_stride;
                // SAFETY: as in `pack_a`.
                unsafe { runs_as_pairs(b, at, strides, (kc, pairs), valid) };
                past.fill(0);
                // `by_column` is `[width][pairs]`, the panel `[pairs][width]`
                transpose((&by_column, pairs), (width, pairs), (panel, width));
            }
        });
    packed
}

/// A panel of transposed B (each column a run of k-values from `first + c · col_stride`):
/// 16 columns × 16 k-pairs at a time converted into an L1 buffer and transposed into `panel`
/// (`[pair][width]`), zeros past `kc` and past the `valid` columns; not the whole panel
/// converted first and transposed after, a round trip through L2.
///
/// # Safety
/// The CPU must have AVX512-F and AVX512-BW (the loops are vectorised for them).
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f,avx512bw"))]
unsafe fn transpose_columns(
    b: &Operand,
    first: usize,
    (kc, valid): (usize, usize),
    panel: &mut [u32],
    width: usize,
) {
    const SIDE: usize = 16;
    debug_assert!(width.is_multiple_of(SIDE));
    let pairs = panel.len() / width;
    let mut square = [0u32; SIDE * SIDE];
    for p0 in (0..kc.div_ceil(2)).step_by(SIDE) {
        let (values, rows) = ((kc - 2 * p0).min(2 * SIDE), SIDE.min(pairs - p0));
        for c0 in (0..valid).step_by(SIDE) {
            let halves = as_halves(&mut square);
            for (c, line) in halves.chunks_exact_mut(2 * SIDE).enumerate() {
                let (run, past) = line.split_at_mut(if c0 + c < valid { values } else { 0 });
                if !run.is_empty() {
                    b.run(first + (c0 + c) * b.col_stride + 2 * p0, run);
                }
                past.fill(0);
            }
            // `square` is [column][pair], the panel [pair][column]
            let to = &mut panel[p0 * width + c0..];
            transpose((&square, SIDE), (SIDE, rows), (to, width));
        }
    }
}

/// k-pairs of row-major B per packing task.
const PAIRS_PER_TASK: usize = 32;
/// Panels of transposed B per packing task.
const GROUP_PANELS: usize = 4;

/// Where packed panels lie: `[panel][pair][column]`, `panel_len` u32 a panel, `width` columns.
#[derive(Clone, Copy)]
struct Panels {
    addr: usize,
    panel_len: usize,
    width: usize,
}

/// Row-major B's k-pairs `ps` (of a block of `kc` k-values from `first`), each pair's two rows
/// read over `columns` columns and dealt to `out`'s panels.
///
/// # Safety
/// The CPU must have AVX512-F and AVX512-BW (the loops are vectorised for them); `out` holds
/// `columns.div_ceil(width)` panels with these pairs, written by nothing else meanwhile.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f,avx512bw"))]
unsafe fn deal_rows(
    b: &Operand,
    first: usize,
    (ps, kc): (std::ops::Range<usize>, usize),
    columns: usize,
    out: Panels,
) {
    let mut pair_row = vec![0u32; columns];
    for p in ps {
        let lo = first + 2 * p * b.row_stride;
        let hi = (2 * p + 1 < kc).then_some(lo + b.row_stride);
        b.interleave(lo, hi, &mut pair_row);
        for (q, from) in pair_row.chunks(out.width).enumerate() {
            // SAFETY: pair p of panel q lies inside `out` (the caller's contract).
            let to = unsafe {
                let at = (out.addr as *mut u32).add(q * out.panel_len + p * out.width);
                std::slice::from_raw_parts_mut(at, from.len())
            };
            to.iter_mut().zip(from).for_each(|(t, f)| *t = *f);
        }
    }
}

/// A zeroed u32 buffer that starts on a 64-byte boundary: AMX loads tile rows of 64 bytes, and
/// a row split over two cache lines costs several times as much (allocators align to 16).
pub(super) struct Aligned {
    words: Vec<u32>,
    start: usize,
    len: usize,
}

impl Aligned {
    pub(super) fn zeroed(len: usize) -> Self {
        let words = vec![0u32; len + 15];
        let start = (64 - words.as_ptr() as usize % 64) % 64 / 4;
        Self { words, start, len }
    }
}

impl std::ops::Deref for Aligned {
    type Target = [u32];
    fn deref(&self) -> &[u32] {
        &self.words[self.start..self.start + self.len]
    }
}

impl std::ops::DerefMut for Aligned {
    fn deref_mut(&mut self) -> &mut [u32] {
        &mut self.words[self.start..self.start + self.len]
    }
}

/// `src` (`[rows][cols]` u32, row stride `lds`) written transposed into `dst` (`[cols][rows]`,
/// row stride `ldd`).
pub(super) fn transpose(
    (src, lds): (&[u32], usize),
    (rows, cols): (usize, usize),
    (dst, ldd): (&mut [u32], usize),
) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(src.len() >= (rows - 1) * lds + cols && dst.len() >= (cols - 1) * ldd + rows);
    #[cfg(target_arch = "x86_64")]
    let (whole_r, whole_c) = {
        let (whole_r, whole_c) = (rows - rows % 16, cols - cols % 16);
        for r0 in (0..whole_r).step_by(16) {
            for c0 in (0..whole_c).step_by(16) {
                // SAFETY: AVX512-F (the packed paths' CPU); 16 × 16 inside both buffers.
                unsafe {
                    let from = src.as_ptr().add(r0 * lds + c0);
                    transpose16::block(from, lds, dst.as_mut_ptr().add(c0 * ldd + r0), ldd)
                };
            }
        }
        (whole_r, whole_c)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let (whole_r, whole_c) = (0, 0);
    for r in 0..rows {
        let first_c = if r < whole_r { whole_c } else { 0 };
        for c in first_c..cols {
            dst[c * ldd + r] = src[r * lds + c];
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
