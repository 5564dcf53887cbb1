//! What a product does with its f32 sums as it stores them: where they go (f32 or bf16 values), a
//! bias row added, the rounding — done by the AMX kernel from each block's L1 buffer, or in a pass
//! over an f32 result where a kernel cannot.

use burn::tensor::{DType, bf16};
use burn_flex::FlexTensor;

use crate::kernels::flex_values::{bf16_bits, cast, map_in_place};

/// What a product does to its f32 sums before they are stored: a bias row added, the values
/// rounded to `dtype`.
#[derive(Clone, Copy)]
pub(super) struct Finish<'a> {
    pub(super) bias: Option<&'a [f32]>,
    pub(super) dtype: DType,
}

impl Finish<'_> {
    /// Nothing: f32 sums stored as they are.
    pub(super) const NONE: Self = Finish {
        bias: None,
        dtype: DType::F32,
    };

    /// Applied to a finished f32 product.
    pub(super) fn apply(self, out: FlexTensor) -> FlexTensor {
        let out = match self.bias {
            Some(bias) => map_in_place(out, |v| {
                v.chunks_exact_mut(bias.len())
                    .for_each(|row| row.iter_mut().zip(bias).for_each(|(o, b)| *o += b))
            }),
            None => out,
        };
        cast(out, self.dtype)
    }
}

/// Where a kernel stores a matrix's sums: its address, whether as bf16 (rounded as
/// [`bf16_bits`](crate::kernels::flex_values::bf16_bits) does), and a bias row added first.
#[derive(Clone, Copy)]
pub(super) struct Dst<'a> {
    pub(super) addr: usize,
    pub(super) bf16: bool,
    pub(super) bias: Option<&'a [f32]>,
}

impl<'a> Dst<'a> {
    pub(super) fn f32(out: &mut [std::mem::MaybeUninit<f32>], bias: Option<&'a [f32]>) -> Self {
        Dst {
            addr: out.as_mut_ptr() as usize,
            bf16: false,
            bias,
        }
    }

    pub(super) fn bf16(out: &mut [std::mem::MaybeUninit<bf16>], bias: Option<&'a [f32]>) -> Self {
        Dst {
            addr: out.as_mut_ptr() as usize,
            bf16: true,
            bias,
        }
    }

    /// f32 sums stored as they are.
    pub(super) fn is_plain(&self) -> bool {
        !self.bf16 && self.bias.is_none()
    }

    /// The element size in bytes.
    fn size(&self) -> usize {
        if self.bf16 { 2 } else { 4 }
    }

    /// Matrix `i` of those `len` values long.
    pub(super) fn matrix(self, i: usize, len: usize) -> Self {
        Dst {
            addr: self.addr + i * len * self.size(),
            ..self
        }
    }

    /// The place `offset` values on, in column `col` (where the bias row starts).
    pub(super) fn at(self, offset: usize, col: usize) -> Self {
        Dst {
            addr: self.addr + offset * self.size(),
            bias: self.bias.map(|b| &b[col..]),
            ..self
        }
    }

    /// `size` rows × columns of f32 sums from `src` (row stride `lds`) finished and stored here
    /// (row stride `ld`).
    ///
    /// # Safety
    /// `src` readable and this place writable for `size` at their strides; the bias (when
    /// given) holds `size.1` values; the CPU has AVX512-F and -BW (the loops are vectorised
    /// for them).
    #[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f,avx512bw"))]
    pub(super) unsafe fn store(
        self,
        src: *const f32,
        lds: usize,
        ld: usize,
        (rows, cols): (usize, usize),
    ) {
        // -0.0: the sum that leaves every value as it is (-0.0 included)
        let zeros = [-0.0f32; 64];
        let bias = match self.bias {
            Some(b) => &b[..cols],
            None => &zeros[..cols.min(64)],
        };
        assert_eq!(bias.len(), cols, "blocks are at most 64 columns wide");
        for r in 0..rows {
            // SAFETY (the slices and the row functions): the caller's contract.
            let row = unsafe { std::slice::from_raw_parts(src.add(r * lds), cols) };
            #[cfg(target_arch = "x86_64")]
            if cols == 32 {
                // whole rows of the AMX blocks: two vectors each
                let at = self.addr + r * ld * self.size();
                unsafe {
                    if self.bf16 {
                        whole_row::bf16(row, bias, at as *mut u16)
                    } else {
                        whole_row::f32(row, bias, at as *mut f32)
                    }
                }
                continue;
            }
            if self.bf16 {
                let at = unsafe { (self.addr as *mut u16).add(r * ld) };
                let dst = unsafe { std::slice::from_raw_parts_mut(at, cols) };
                dst.iter_mut()
                    .zip(row.iter().zip(bias))
                    .for_each(|(d, (v, b))| *d = bf16_bits(v + b));
            } else {
                let at = unsafe { (self.addr as *mut f32).add(r * ld) };
                let dst = unsafe { std::slice::from_raw_parts_mut(at, cols) };
                dst.iter_mut()
                    .zip(row.iter().zip(bias))
                    .for_each(|(d, (v, b))| *d = v + b);
            }
        }
    }
}

/// Rows of 32 sums finished and stored with AVX-512 (the loops above did not vectorise when the
/// width was a constant).
#[cfg(target_arch = "x86_64")]
pub(super) mod whole_row {
    use std::arch::x86_64::*;

    /// `row[h..h + 16] + bias[h..h + 16]`.
    ///
    /// # Safety
    /// AVX512-F; both hold `h + 16` values.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn sums(row: &[f32], bias: &[f32], h: usize) -> __m512 {
        // SAFETY: the caller's contract; unaligned loads.
        unsafe {
            _mm512_add_ps(
                _mm512_loadu_ps(row.as_ptr().add(h)),
                _mm512_loadu_ps(bias.as_ptr().add(h)),
            )
        }
    }

    /// `dst[j] = row[j] + bias[j]` for j < 32.
    ///
    /// # Safety
    /// AVX512-F; `row` and `bias` hold 32 values, `dst` is valid for writing 32 f32.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn f32(row: &[f32], bias: &[f32], dst: *mut f32) {
        assert!(row.len() >= 32 && bias.len() >= 32);
        // SAFETY: in bounds (asserted; the caller's contract); unaligned loads and stores.
        unsafe {
            for h in [0, 16] {
                let v = sums(row, bias, h);
                _mm512_storeu_ps(dst.add(h), v);
            }
        }
    }

    /// `dst[j] = bf16(row[j] + bias[j])` for j < 32, rounded as
    /// [`bf16_bits`](crate::kernels::flex_values::bf16_bits) rounds: to nearest, ties to even,
    /// NaN a quiet NaN.
    ///
    /// # Safety
    /// AVX512-F and -BW; `row` and `bias` hold 32 values, `dst` is valid for writing 32 u16.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn bf16(row: &[f32], bias: &[f32], dst: *mut u16) {
        assert!(row.len() >= 32 && bias.len() >= 32);
        // SAFETY: in bounds (asserted; the caller's contract); unaligned loads and stores.
        unsafe {
            for h in [0, 16] {
                let v = sums(row, bias, h);
                let bits = _mm512_castps_si512(v);
                let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
                let bias = _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF));
                let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(bits, bias));
                let quiet = _mm512_or_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(0x40));
                let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
                let out = _mm512_mask_blend_epi32(nan, rounded, quiet);
                _mm256_storeu_si256(dst.add(h).cast(), _mm512_cvtepi32_epi16(out));
            }
        }
    }
}
