//! The product on AMX, the tile unit of Intel Xeons since Sapphire Rapids: `tdpbf16ps` multiplies
//! a 16 × 32 bf16 tile of A by a 32 × 16 tile of B (16 k-pairs × 16 columns, each column's pair
//! side by side, the layout [`pack_b`] writes) into a 16 × 16 f32 tile, 16,384 FLOPs an
//! instruction: measured here 3.4–3.8 TFLOP/s on one core, against 0.23 for AVX-512 f32 FMAs and
//! 0.12 for `vdpbf16ps` (half the FMA rate on these cores). PyTorch's oneDNN runs bf16 on it.
//!
//! A C block of 32 × 32 is four tiles (tmm0–3), fed by two A tiles (tmm4–5) and two B tiles
//! (tmm6–7) per 16 k-pairs. Every tile the kernel loads is 1 KiB of contiguous, 64-byte-aligned
//! memory: A's rows are packed tile by tile ([`pack_a_tiles`]), B in panels of 32 columns, both in
//! [`Aligned`] buffers (a tile row that straddles two cache lines loads ~7× slower). A task is a
//! row block over one column panel: its sums stay in an L1 buffer while k goes in chunks of 64
//! pairs over every 32-row block, so the panel's chunk is read from L1 by all of them; the sums are
//! finished (bias, bf16) and stored once. As on the AVX-512 path, work is split over rows and
//! columns only, so sums do not depend on the thread count. Written with `asm!` (the AMX
//! intrinsics are not stable Rust); Linux hands a process the tile state only after
//! `arch_prctl(ARCH_REQ_XCOMP_PERM)`, asked for once in [`available`].

use std::arch::asm;

use rayon::prelude::*;

use super::operand::Operand;
use super::pack::{Aligned, interleave_runs, pack_b, runs_as_pairs, transpose};
use super::{Dst, packed_row_blocks};

/// Rows of the C block (two tiles).
const BLOCK_ROWS: usize = 32;
/// Columns of the C block (two tiles), the width of B's panels.
const BLOCK_COLS: usize = 32;
/// k-pairs per tile.
const TILE_PAIRS: usize = 16;
/// k-pairs per chunk of [`column_block`]: the panel's chunk (8 KiB) stays in L1.
const CHUNK_PAIRS: usize = 64;
/// k-values per packed block: C stays in tiles over a whole k-block, so one block covers the usual
/// hidden sizes (a block more costs a reload of C).
pub(super) const KC: usize = 2048;
/// Rows of A per task: whole C blocks.
const MC: usize = 96;
/// Columns of B packed at once.
const NC: usize = 1024;
const _: () = assert!(MC.is_multiple_of(BLOCK_ROWS));

/// Whether this CPU and kernel run AMX bf16 (CPUID leaf 7: AMX-BF16 and AMX-TILE, with the
/// AVX-512 the packing needs), and Linux granted the tile state; asked once.
pub fn available() -> bool {
    use std::sync::OnceLock;
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| {
        // CPUID leaf 7 exists on every x86_64 CPU that has AVX-512 (checked first).
        let cpu = super::hardware_bf16() && {
            let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
            leaf7.edx & (1 << 22) != 0 && leaf7.edx & (1 << 24) != 0
        };
        cpu && request_tile_state()
    })
}

#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes the process's permitted XSAVE state.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

/// Matrix `i` of `a · b` into `c` (`m × n`, row-major), over the rayon pool when `parallel`.
///
/// # Safety
/// [`available`] must hold; `c` must be valid for writing `m · n` values (uninitialised allowed:
/// the first k-block stores) and not accessed elsewhere during the call; `c` is plain f32 unless
/// `k` ≤ [`KC`] (one k-block: sums are finished as they are stored).
pub(super) unsafe fn product(a: &Operand, b: &Operand, i: usize, c: Dst, parallel: bool) {
    let (m, n, k) = (a.rows, b.cols, a.cols);
    assert!(
        k <= KC || c.is_plain(),
        "a product of several k-blocks stores plain f32"
    );
    for k0 in (0..k).step_by(KC) {
        let kc = KC.min(k - k0);
        let pairs = kc.div_ceil(2).next_multiple_of(TILE_PAIRS);
        let (row_blocks, a_blocks) = packed_row_blocks(m, MC, parallel, |rows| {
            pack_a_tiles(a, i, rows, (k0, kc), pairs)
        });
        for n0 in (0..n).step_by(NC) {
            let nc = NC.min(n - n0);
            let bp = pack_b(b, i, n0..n0 + nc, (k0, kc), (pairs, BLOCK_COLS));
            let blocks = nc.div_ceil(BLOCK_COLS);
            let tasks: Vec<(usize, usize)> = (0..row_blocks.len())
                .flat_map(|rb| (0..blocks).map(move |cb| (rb, cb)))
                .collect();
            let first = k0 == 0;
            let run = |tasks: &[(usize, usize)]| {
                let _tiles = TileConfig::load();
                let mut sums = Aligned::zeroed(MC * BLOCK_COLS);
                for &(rb, cb) in tasks {
                    let (rows, col0) = (row_blocks[rb].clone(), n0 + cb * BLOCK_COLS);
                    let panel = &bp[cb * pairs * BLOCK_COLS..][..pairs * BLOCK_COLS];
                    let at = c.at(rows.start * n + col0, col0);
                    let size = (rows.len(), BLOCK_COLS.min(n - col0));
                    // SAFETY: tasks write disjoint blocks of `c`, each inside it (`at`, `size`);
                    // A and B hold whole padded tiles (`pack_a_tiles`, `pack_b`); tiles
                    // configured.
                    unsafe {
                        if !first {
                            // a later k-block adds to the sums so far
                            load_sums((at, n), size, &mut sums);
                        }
                        column_block(&a_blocks[rb], panel, pairs, &mut sums, first);
                        at.store(sums.as_ptr().cast(), BLOCK_COLS, n, size);
                    }
                }
            };
            if parallel && tasks.len() > 1 {
                let per = tasks
                    .len()
                    .div_ceil(4 * rayon::current_num_threads())
                    .max(1);
                tasks.par_chunks(per).for_each(run);
            } else {
                run(&tasks);
            }
        }
    }
}

/// The `size` sums stored at `c` (plain f32, row stride `ld`) into `sums` (`[row][BLOCK_COLS]`).
///
/// # Safety
/// `c` readable for `size` at its stride.
unsafe fn load_sums((c, ld): (Dst, usize), (rows, cols): (usize, usize), sums: &mut [u32]) {
    debug_assert!(c.is_plain());
    let from = c.addr as *const f32;
    for (r, row) in sums.chunks_exact_mut(BLOCK_COLS).take(rows).enumerate() {
        // SAFETY: the caller's contract.
        let stored = unsafe { std::slice::from_raw_parts(from.add(r * ld), cols) };
        row[..cols]
            .iter_mut()
            .zip(stored)
            .for_each(|(s, v)| *s = v.to_bits());
    }
}

/// A's rows `rows` of k-block `k0..k0 + kc` as tiles: per block of [`BLOCK_ROWS`] rows, per
/// [`TILE_PAIRS`] k-pairs, the block's rows' 16 pairs one after another (`[block][step][row]
/// [pair]`), so that each tile the kernel loads is 1 KiB of contiguous memory; zeros past `kc` and
/// the last row.
fn pack_a_tiles(
    a: &Operand,
    i: usize,
    rows: std::ops::Range<usize>,
    (k0, kc): (usize, usize),
    pairs: usize,
) -> Aligned {
    let height = rows.len().next_multiple_of(BLOCK_ROWS);
    let mut packed = Aligned::zeroed(height * pairs);
    let first = a.offsets[i] + rows.start * a.row_stride + k0 * a.col_stride;
    // where row r's step t lies (a block of rows holds BLOCK_ROWS · pairs u32)
    let tile_row = |r: usize, t: usize| {
        r / BLOCK_ROWS * BLOCK_ROWS * pairs + (t * BLOCK_ROWS + r % BLOCK_ROWS) * TILE_PAIRS
    };
    if a.col_stride != 1 && a.row_stride == 1 {
        // A transposed (a weight gradient's activations): each k is a run of rows; per 16 pairs
        // of a block's rows, interleave them as [pair][row] into an L1 square, then transpose it
        // into the block's tile
        let mut square = [0u32; TILE_PAIRS * BLOCK_ROWS];
        for r0 in (0..rows.len()).step_by(BLOCK_ROWS) {
            let block_rows = BLOCK_ROWS.min(rows.len() - r0);
            for t in 0..kc.div_ceil(2 * TILE_PAIRS) {
                let values = (kc - 2 * TILE_PAIRS * t).min(2 * TILE_PAIRS);
                if values < 2 * TILE_PAIRS || block_rows < BLOCK_ROWS {
                    square.fill(0);
                }
                let at = first + 2 * TILE_PAIRS * t * a.col_stride + r0;
                let runs = (a.col_stride, values);
                // SAFETY: `available` found AVX-512 (BW included).
                unsafe { interleave_runs(a, at, runs, block_rows, &mut square, BLOCK_ROWS) };
                let dst = &mut packed[tile_row(r0, t)..];
                transpose(
                    (&square, BLOCK_ROWS),
                    (TILE_PAIRS, block_rows),
                    (dst, TILE_PAIRS),
                );
            }
        }
    } else {
        let mut line = vec![0u32; pairs];
        for r in 0..rows.len() {
            let strides = (a.row_stride, a.col_stride);
            // SAFETY: as above.
            unsafe { runs_as_pairs(a, first + r * a.row_stride, strides, (kc, pairs), &mut line) };
            for (t, step) in line.chunks_exact(TILE_PAIRS).enumerate() {
                packed[tile_row(r, t)..][..TILE_PAIRS].copy_from_slice(step);
            }
        }
    }
    packed
}

/// `iterations` rounds of four independent `tdpbf16ps` (16 × 16 × 32 products each, into
/// tmm0–3 from zeroed tmm4–7): the tile unit's peak, what MFU divides by. Returns the FLOPs done.
///
/// # Safety
/// [`available`] must hold.
pub(super) unsafe fn dot_products(iterations: u64) -> f64 {
    let _tiles = TileConfig::load();
    // SAFETY: tiles configured; tmm0–7 belong to this function until `_tiles` drops.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "tilezero tmm4",
            "tilezero tmm5",
            "tilezero tmm6",
            "tilezero tmm7",
            options(nostack, nomem)
        );
        for _ in 0..iterations {
            asm!(
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                options(nostack, nomem)
            );
        }
    }
    // per instruction 16 × 16 outputs of 32 products and 32 additions
    iterations as f64 * 4.0 * (16 * 16 * 32 * 2) as f64
}

/// The tile configuration (every tile 16 rows of 64 bytes), loaded for this thread while the
/// value lives; the tile state is released after.
struct TileConfig;

impl TileConfig {
    fn load() -> Self {
        #[repr(C, align(64))]
        struct Palette {
            palette: u8,
            start_row: u8,
            reserved: [u8; 14],
            bytes_per_row: [u16; 16],
            rows: [u8; 16],
        }
        let mut config = Palette {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            bytes_per_row: [0; 16],
            rows: [0; 16],
        };
        config.bytes_per_row[..8].fill(64);
        config.rows[..8].fill(16);
        // SAFETY: a valid palette-1 configuration (`available` held before any product).
        unsafe { asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly)) };
        TileConfig
    }
}

impl Drop for TileConfig {
    fn drop(&mut self) {
        // SAFETY: releases the tile state this thread configured.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// A row block's C over one column block, `sums` (`[row][BLOCK_COLS]` f32, rows a multiple of
/// 32): `sums (+)= A · B` over `pairs` k-pairs, A as [`pack_a_tiles`] lays it out, B a panel of
/// [`BLOCK_COLS`] columns ([`pack_b`]); stored when `first`, added otherwise. The k-pairs go in
/// chunks, each chunk over every 32-row block: the panel's chunk stays in L1 for all of them and
/// the sums in between, so only A streams from L2 (a 32 × 32 block over the whole k would stream
/// both, and ran at a third of the tile unit's rate).
///
/// # Safety
/// Tiles configured ([`TileConfig`]); `a` holds `sums.len() / BLOCK_COLS` rows and the panel
/// `pairs` (a multiple of 16) k-pairs.
unsafe fn column_block(a: &[u32], panel: &[u32], pairs: usize, sums: &mut [u32], first: bool) {
    let rows = a.len() / pairs;
    assert!(panel.len() >= pairs * BLOCK_COLS && sums.len() >= rows * BLOCK_COLS);
    for p0 in (0..pairs).step_by(CHUNK_PAIRS) {
        let chunk = CHUNK_PAIRS.min(pairs - p0);
        let b = &panel[p0 * BLOCK_COLS..];
        for r0 in (0..rows).step_by(BLOCK_ROWS) {
            // A's block r0 holds its steps one after another (`pack_a_tiles`)
            let a = &a[r0 * pairs + p0 * BLOCK_ROWS..];
            let c = &mut sums[r0 * BLOCK_COLS..];
            // SAFETY: the chunk's tiles lie inside `a` and `b`; `c` is 64-byte aligned (an
            // `Aligned` buffer, blocks 4 KiB apart); tiles configured.
            unsafe { block(a, b, chunk, c.as_mut_ptr().cast(), first && p0 == 0) };
        }
    }
}

/// One 32 × 32 block of f32 sums at `c` (64-byte aligned, rows of 32): `c (+)= A · B` over
/// `pairs` k-pairs, A's 32 rows and B's 32 columns one tile-step (16 pairs) after another;
/// stored when `first`, added otherwise.
///
/// # Safety
/// Tiles configured ([`TileConfig`]); `a` and `b` hold `pairs` (a multiple of 16) k-pairs of
/// 32 rows and 32 columns at their steps; `c` aligned and valid for 32 × 32 f32.
unsafe fn block(a: &[u32], b: &[u32], pairs: usize, c: *mut f32, first: bool) {
    assert!(a.len() >= BLOCK_ROWS * pairs && b.len() >= pairs * BLOCK_COLS);
    // A's tiles are 16 rows of 64 contiguous bytes; B's rows hold two tiles' columns
    let (c_stride, a_stride, b_stride) = (4 * BLOCK_COLS, 4 * TILE_PAIRS, 4 * BLOCK_COLS);
    // SAFETY (the asm blocks): the tiles read 16 rows of 64 bytes at the given strides, inside
    // `a`, `b` and the C block (checked above and by the caller); tmm0–7 belong to this
    // function between ldtilecfg and tilerelease.
    unsafe {
        let c1 = c.add(16 * BLOCK_COLS);
        if first {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
        } else {
            asm!("tileloadd tmm0, [{c0} + {s}*1]", "tileloadd tmm1, [{c0} + {s}*1 + 64]",
                 "tileloadd tmm2, [{c1} + {s}*1]", "tileloadd tmm3, [{c1} + {s}*1 + 64]",
                 c0 = in(reg) c, c1 = in(reg) c1, s = in(reg) c_stride,
                 options(nostack, readonly));
        }
        for t in 0..pairs / TILE_PAIRS {
            let a0 = a.as_ptr().add(t * BLOCK_ROWS * TILE_PAIRS);
            let a1 = a0.add(16 * TILE_PAIRS);
            let b0 = b.as_ptr().add(t * TILE_PAIRS * BLOCK_COLS);
            asm!("tileloadd tmm4, [{a0} + {sa}*1]", "tileloadd tmm6, [{b0} + {sb}*1]",
                 "tdpbf16ps tmm0, tmm4, tmm6",
                 "tileloadd tmm7, [{b0} + {sb}*1 + 64]",
                 "tdpbf16ps tmm1, tmm4, tmm7",
                 "tileloadd tmm5, [{a1} + {sa}*1]",
                 "tdpbf16ps tmm2, tmm5, tmm6", "tdpbf16ps tmm3, tmm5, tmm7",
                 a0 = in(reg) a0, a1 = in(reg) a1, b0 = in(reg) b0,
                 sa = in(reg) a_stride, sb = in(reg) b_stride, options(nostack, readonly));
        }
        asm!("tilestored [{c0} + {s}*1], tmm0", "tilestored [{c0} + {s}*1 + 64], tmm1",
             "tilestored [{c1} + {s}*1], tmm2", "tilestored [{c1} + {s}*1 + 64], tmm3",
             c0 = in(reg) c, c1 = in(reg) c1, s = in(reg) c_stride, options(nostack));
    }
}
