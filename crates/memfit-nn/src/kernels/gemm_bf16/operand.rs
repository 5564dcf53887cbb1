//! An operand read in place: a batch of strided matrices of f32 or bf16 values, read as bf16 bits.

use burn::tensor::{DType, bf16};
use burn_flex::FlexTensor;

use crate::kernels::flex_values::bf16_bits;

/// The values of one operand: f32 or bf16 storage.
#[derive(Clone, Copy)]
pub(super) enum Storage<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
}

/// A tensor read in place as a batch of matrices (as in `gemm_f32`), any float storage.
pub(super) struct Operand<'a> {
    pub(super) data: Storage<'a>,
    pub(super) batch: Vec<usize>,
    pub(super) offsets: Vec<usize>,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) row_stride: usize,
    pub(super) col_stride: usize,
}

impl<'a> Operand<'a> {
    pub(super) fn of(t: &'a FlexTensor) -> Self {
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
    pub(super) fn bits_at(&self, at: usize) -> u16 {
        match self.data {
            Storage::F32(v) => bf16_bits(v[at]),
            Storage::Bf16(v) => v[at].to_bits(),
        }
    }

    /// `out.len()` contiguous values from `lo` on, each paired with the value at the same place
    /// from `hi` on (zero without `hi`): one u32 per value, `lo`'s bf16 in the low half.
    #[inline(always)]
    pub(super) fn interleave(&self, lo: usize, hi: Option<usize>, out: &mut [u32]) {
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
    pub(super) fn run(&self, at: usize, out: &mut [u16]) {
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
