//! One matrix of the product: k-blocks packed, tasks over rows and column panels, the 6 × 64
//! micro-kernel per tile.

use rayon::prelude::*;

use super::operand::Operand;
use super::pack::{pack_a, pack_b};
use super::{KC, MC, MR, NC, NR, packed_row_blocks};

/// Matrix `i` of `a · b` into `c` (`m × n`, row-major), over the rayon pool when `parallel`.
///
/// # Safety
/// `c` must be valid for writing `m · n` f32 (it may be uninitialised: the first k-block stores,
/// later ones add) and not accessed elsewhere during the call.
pub(super) unsafe fn product(a: &Operand, b: &Operand, i: usize, c: *mut f32, parallel: bool) {
    let (m, n, k) = (a.rows, b.cols, a.cols);
    for k0 in (0..k).step_by(KC) {
        let kc = KC.min(k - k0);
        let pairs = kc.div_ceil(2);
        // A for this k-block, one block per task of MC rows
        let (row_blocks, a_blocks) =
            packed_row_blocks(m, MC, parallel, |rows| pack_a(a, i, rows, k0, kc));
        for n0 in (0..n).step_by(NC) {
            let nc = NC.min(n - n0);
            let bp = pack_b(b, i, n0..n0 + nc, (k0, kc), (pairs, NR));
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
