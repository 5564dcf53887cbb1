//! f32 matrix products of flex tensors, each output allocated once and filled by `gemm` (the crate
//! burn-flex calls).
//!
//! burn-flex's matmul allocates every output twice: a zero-filled byte vector, then (to align it)
//! a copy of it, before `gemm` writes the result: two extra passes over, and a transient second
//! copy of, every activation and gradient a product makes (~11% of a t5-small step's profile, and
//! a 1.15× CPU difference on chatlm-mini). Here the output is uninitialised and written once.
//! Inputs are read in place, strided views (a transpose, heads split from a linear output)
//! included.

use burn::tensor::{DType, TensorData};
use burn_flex::FlexTensor;
use rayon::prelude::*;

/// Products at least this large (m·n·k) split one matrix over the rayon pool, smaller ones in a
/// batch run one matrix per task: burn-flex's threshold.
const PARALLEL_MIN: usize = 192 * 192 * 192;

/// `a · b` over the last two dimensions: a `[.., m, k]`, b `[.., k, n]` with the same leading
/// (batch) dimensions, any strides; the result is a new contiguous `[.., m, n]` tensor.
pub fn matmul(a: &FlexTensor, b: &FlexTensor) -> FlexTensor {
    let (a, b) = (Operand::of(a), Operand::of(b));
    assert_eq!(a.batch, b.batch, "batch dimensions of a product");
    assert_eq!(a.cols, b.rows, "inner dimensions of a product");
    let (m, n, k) = (a.rows, b.cols, a.cols);
    let count: usize = a.batch.iter().product();
    let mut out = Vec::<f32>::with_capacity(count * m * n);
    let per_matrix = m.saturating_mul(n).saturating_mul(k);
    if count == 1 || per_matrix >= PARALLEL_MIN {
        let parallelism = if per_matrix >= PARALLEL_MIN {
            gemm::Parallelism::Rayon(0)
        } else {
            gemm::Parallelism::None
        };
        for i in 0..count {
            // SAFETY: `out` has room for count·m·n elements; matrix i's m·n start at i·m·n.
            unsafe { product(&a, &b, i, out.as_mut_ptr().add(i * m * n), parallelism) };
        }
    } else {
        let spare = &mut out.spare_capacity_mut()[..count * m * n];
        spare
            .par_chunks_mut((m * n).max(1))
            .enumerate()
            .for_each(|(i, dst)| {
                // SAFETY: `dst` is matrix i's m·n elements of `out`'s capacity.
                unsafe { product(&a, &b, i, dst.as_mut_ptr().cast(), gemm::Parallelism::None) }
            });
    }
    // SAFETY: every one of the count·m·n elements was written by `product` above.
    unsafe { out.set_len(count * m * n) };
    let mut shape = a.batch.clone();
    shape.extend([m, n]);
    FlexTensor::from_data(TensorData::new(out, shape))
}

/// An f32 tensor read in place as a batch of matrices: its buffer, the offset of each matrix, and
/// the matrices' shape and strides (in elements).
struct Operand<'a> {
    data: &'a [f32],
    batch: Vec<usize>,
    /// Offset of the first element of each matrix of the batch, in row-major batch order.
    offsets: Vec<usize>,
    rows: usize,
    cols: usize,
    row_stride: isize,
    col_stride: isize,
}

impl<'a> Operand<'a> {
    fn of(t: &'a FlexTensor) -> Self {
        assert_eq!(t.dtype(), DType::F32, "gemm_f32 multiplies f32 tensors");
        let layout = t.layout();
        let (shape, strides) = (layout.shape(), layout.strides());
        let r = shape.num_dims();
        assert!(r >= 2, "a product needs at least 2-d tensors");
        let batch: Vec<usize> = (0..r - 2).map(|i| shape[i]).collect();
        let mut offsets = vec![layout.start_offset() as isize];
        for (dim, &size) in batch.iter().enumerate() {
            offsets = offsets
                .iter()
                .flat_map(|&o| (0..size as isize).map(move |j| o + j * strides[dim]))
                .collect();
        }
        let operand = Self {
            data: t.storage::<f32>(),
            offsets: offsets.into_iter().map(|o| o as usize).collect(),
            batch,
            rows: shape[r - 2],
            cols: shape[r - 1],
            row_stride: strides[r - 2],
            col_stride: strides[r - 1],
        };
        operand.check_bounds();
        operand
    }

    /// Every element the offsets, shape and strides address lies inside the buffer.
    fn check_bounds(&self) {
        if self.rows == 0 || self.cols == 0 {
            return;
        }
        assert!(
            self.row_stride >= 0 && self.col_stride >= 0,
            "negative strides are not supported"
        );
        let extent =
            (self.rows - 1) * self.row_stride as usize + (self.cols - 1) * self.col_stride as usize;
        for &o in &self.offsets {
            assert!(
                o + extent < self.data.len(),
                "matrix view outside its buffer"
            );
        }
    }

    fn ptr(&self, i: usize) -> *const f32 {
        self.data[self.offsets[i]..].as_ptr()
    }
}

/// Matrix `i` of `a · b` into the `m·n` row-major elements at `dst`.
///
/// # Safety
/// `dst` must be valid for writing `a.rows · b.cols` elements. With `read_dst` false gemm never
/// reads the destination (it zeroes the destination's factor and overwrites; k = 0 writes zeros),
/// so `dst` may be uninitialised and is fully initialised afterwards.
unsafe fn product(
    a: &Operand,
    b: &Operand,
    i: usize,
    dst: *mut f32,
    parallelism: gemm::Parallelism,
) {
    let (m, n, k) = (a.rows, b.cols, a.cols);
    // SAFETY: both operands lie inside their buffers (checked by `Operand::of`) and outlive the
    // call; `dst` is the caller's to guarantee.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            n as isize,
            false,
            a.ptr(i),
            a.col_stride,
            a.row_stride,
            b.ptr(i),
            b.col_stride,
            b.row_stride,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_tensors::{assert_close, pattern};
    use burn::backend::Flex;
    use burn::backend::ops::FloatTensorOps;

    fn tensor(shape: &[usize], salt: usize) -> FlexTensor {
        let values = pattern(shape.iter().product(), salt);
        FlexTensor::from_data(TensorData::new(values, shape.to_vec()))
    }

    fn close(a: &FlexTensor, b: FlexTensor) {
        assert_eq!(a.layout().shape(), b.layout().shape());
        let b = b.to_contiguous();
        let values = |t: &FlexTensor| t.as_slice::<f32>().unwrap().to_vec();
        assert_close("product", &values(a), &values(&b), 1e-4);
    }

    #[test]
    fn equals_burn_flex_on_plain_transposed_and_batched_operands() {
        let (a, b) = (tensor(&[5, 6], 1), tensor(&[6, 7], 2));
        close(&matmul(&a, &b), Flex::float_matmul(a.clone(), b.clone()));
        let at = Flex::float_transpose(tensor(&[6, 5], 3));
        close(&matmul(&at, &b), Flex::float_matmul(at.clone(), b.clone()));
        // [b, h, q, d] · [b, h, k, d]ᵀ with q split from a [b, q, h, d] tensor (strided batch).
        let q = Flex::float_swap_dims(tensor(&[2, 4, 3, 8], 4), 1, 2);
        let kt = Flex::float_transpose(tensor(&[2, 3, 5, 8], 5));
        close(&matmul(&q, &kt), Flex::float_matmul(q.clone(), kt.clone()));
    }

    #[test]
    fn large_products_split_over_the_pool_and_agree() {
        let (a, b) = (tensor(&[2, 256, 192], 6), tensor(&[2, 192, 200], 7));
        close(&matmul(&a, &b), Flex::float_matmul(a.clone(), b.clone()));
    }

    #[test]
    fn an_empty_inner_dimension_gives_zeros() {
        let (a, b) = (tensor(&[3, 0], 0), tensor(&[0, 4], 0));
        assert_eq!(matmul(&a, &b).as_slice::<f32>().unwrap(), &[0.0; 12]);
    }
}
