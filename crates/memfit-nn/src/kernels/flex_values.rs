//! Float data of flex tensors for the hand-written ops, which compute in f32 whatever the storage:
//! f32 tensors are read (and, where they are not shared, written) in place; bf16 tensors —
//! activations kept at half the size — are converted on the way in and out.

use std::borrow::Cow;

use burn::prelude::*;
use burn::tensor::{DType, TensorData, bf16};
use burn_flex::FlexTensor;

use crate::kernels::vectorised::with_avx512;

/// Whether `t` is a flex tensor stored as f32 or bf16: where the hand-written ops run.
pub fn is_flex_float<const D: usize>(t: &Tensor<D>) -> bool {
    super::hand_written_on(&t.device()) && matches!(t.dtype(), DType::F32 | DType::BF16)
}

/// The values of `t` (f32 or bf16) as f32 in row-major order: borrowed when `t` is contiguous f32,
/// converted or gathered otherwise.
pub fn values(t: &FlexTensor) -> Cow<'_, [f32]> {
    match t.dtype() {
        DType::F32 => match t.as_slice::<f32>() {
            Some(v) => Cow::Borrowed(v),
            None => Cow::Owned(t.to_contiguous().as_slice::<f32>().unwrap().to_vec()),
        },
        DType::BF16 => Cow::Owned(match t.as_slice::<bf16>() {
            Some(v) => widened(v),
            None => widened(t.to_contiguous().as_slice::<bf16>().unwrap()),
        }),
        other => panic!("the hand-written ops take f32 or bf16 tensors, not {other:?}"),
    }
}

/// A tensor of `shape` in `dtype` (f32: `values`' own buffer; bf16: rounded to nearest even).
pub fn from_values(values: Vec<f32>, shape: Shape, dtype: DType) -> FlexTensor {
    match dtype {
        DType::F32 => FlexTensor::from_data(TensorData::new(values, shape)),
        _ => narrowed(&values, shape, dtype),
    }
}

/// `values` rounded into a new tensor of `shape` in `dtype` (bf16).
fn narrowed(values: &[f32], shape: Shape, dtype: DType) -> FlexTensor {
    assert_eq!(
        dtype,
        DType::BF16,
        "the hand-written ops store f32 or bf16, not {dtype:?}"
    );
    FlexTensor::from_data(TensorData::new(rounded(values), shape))
}

/// bf16 values as f32 (exact), vectorised: these conversions run over every activation of bf16
/// training.
fn widened(values: &[bf16]) -> Vec<f32> {
    with_avx512(|| values.iter().map(|&x| widen(x)).collect())
}

/// f32 values rounded to bf16 ([`bf16_bits`]), vectorised as [`widened`] is.
fn rounded(values: &[f32]) -> Vec<bf16> {
    with_avx512(|| values.iter().map(|&x| round(x)).collect())
}

/// One bf16 value as f32 (exact; written on the bits so that loops vectorise).
#[inline(always)]
fn widen(x: bf16) -> f32 {
    f32::from_bits((x.to_bits() as u32) << 16)
}

/// One f32 value rounded to bf16 ([`bf16_bits`]).
#[inline(always)]
fn round(x: f32) -> bf16 {
    bf16::from_bits(bf16_bits(x))
}

/// `x` rounded to bf16 bits (to nearest, ties to even; NaN stays a quiet NaN), branch-free so that
/// loops over tensors vectorise. Equals `half::bf16::from_f32` (tested).
#[inline(always)]
pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    let nan = ((b >> 16) | 0x40) as u16;
    if x.is_nan() { nan } else { rounded }
}

/// A tensor of `like`'s shape and dtype holding `values`.
pub fn tensor_like(values: Vec<f32>, like: &FlexTensor) -> FlexTensor {
    from_values(values, like.layout().shape().clone(), like.dtype())
}

/// `t` in `dtype` (itself when it already is).
pub fn cast(t: FlexTensor, dtype: DType) -> FlexTensor {
    if t.dtype() == dtype {
        return t;
    }
    let shape = t.layout().shape().clone();
    match dtype {
        // from bf16: the widened values are a fresh vector already
        DType::F32 => from_values(values(&t).into_owned(), shape, dtype),
        // from f32: rounded straight from the (borrowed) values
        _ => narrowed(&values(&t), shape, dtype),
    }
}

/// `t` in f32: itself when it is, else a converted copy.
pub fn in_f32(t: FlexTensor) -> FlexTensor {
    cast(t, DType::F32)
}

/// `f` applied to `t`'s values, the result in `t`'s dtype: in `t`'s own buffer when it is
/// contiguous unshared f32, through an f32 copy when it is bf16.
pub fn map_in_place(t: FlexTensor, f: impl FnOnce(&mut [f32])) -> FlexTensor {
    // `f`'s loops compiled for AVX-512 where the CPU has it
    match t.dtype() {
        DType::F32 => {
            let mut data = into_values(t);
            with_avx512(|| f(data.as_mut_slice::<f32>().expect("f32")));
            FlexTensor::from_data(data)
        }
        _ => {
            let mut v = values(&t).into_owned();
            with_avx512(|| f(&mut v));
            tensor_like(v, &t)
        }
    }
}

/// A new tensor of the inputs' shape in `dtype` (f32 or bf16) whose values `f` computes from
/// theirs, a chunk at a time: `f(inputs' chunks, out chunk)`. bf16 inputs are widened and the
/// output rounded one L1-sized chunk at a time, so no whole f32 copy of any of them is made.
pub fn map_chunks<const N: usize>(
    inputs: [&FlexTensor; N],
    dtype: DType,
    f: impl Fn([&[f32]; N], &mut [f32]),
) -> FlexTensor {
    const CHUNK: usize = 2048;
    let shape = inputs[0].layout().shape().clone();
    let contiguous: [FlexTensor; N] = inputs.map(|t| {
        assert_eq!(t.layout().shape(), &shape, "inputs of one shape");
        if t.is_contiguous() {
            t.clone()
        } else {
            t.to_contiguous()
        }
    });
    let len = shape.num_elements();
    let mut out_f32 = vec![0.0f32; if dtype == DType::F32 { len } else { 0 }];
    let mut out_bf16 = Vec::<bf16>::with_capacity(if dtype == DType::F32 { 0 } else { len });
    with_avx512(|| {
        let mut widened = [[0.0f32; CHUNK]; N];
        let mut rounded = [0.0f32; CHUNK];
        for start in (0..len).step_by(CHUNK) {
            let n = CHUNK.min(len - start);
            for (t, buf) in contiguous.iter().zip(widened.iter_mut()) {
                if let Some(v) = t.as_slice::<bf16>() {
                    let v = &v[start..start + n];
                    buf[..n].iter_mut().zip(v).for_each(|(w, &x)| *w = widen(x));
                }
            }
            let chunks: [&[f32]; N] =
                std::array::from_fn(|i| match contiguous[i].as_slice::<f32>() {
                    Some(v) => &v[start..start + n],
                    None => &widened[i][..n],
                });
            if dtype == DType::F32 {
                f(chunks, &mut out_f32[start..start + n]);
            } else {
                f(chunks, &mut rounded[..n]);
                out_bf16.extend(rounded[..n].iter().map(|&x| round(x)));
            }
        }
    });
    match dtype {
        DType::F32 => FlexTensor::from_data(TensorData::new(out_f32, shape)),
        DType::BF16 => FlexTensor::from_data(TensorData::new(out_bf16, shape)),
        other => panic!("the hand-written ops store f32 or bf16, not {other:?}"),
    }
}

/// An f32 tensor's values as contiguous data to write to (no copy when `t` is contiguous and not
/// shared).
pub fn into_values(t: FlexTensor) -> TensorData {
    assert_eq!(t.dtype(), DType::F32, "in-place access is for f32 tensors");
    t.into_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_round_trips_through_f32_to_nearest_even() {
        // 1 + 2^-8 lies halfway between the bf16 neighbours 1 and 1 + 2^-7: it goes to the even 1.
        let v = vec![1.0, 1.0 + 1.0 / 256.0, -2.5, 1.0e-3, 3.0e38];
        let t = from_values(v.clone(), Shape::new([5]), DType::BF16);
        assert_eq!(t.dtype(), DType::BF16);
        let back = values(&t);
        assert_eq!(back[0], 1.0);
        assert_eq!(back[1], 1.0, "ties go to even");
        assert_eq!(back[2], -2.5);
        for (b, x) in back.iter().zip(&v) {
            assert!((b - x).abs() <= x.abs() / 128.0, "{b} vs {x}");
        }
    }

    #[test]
    fn rounding_equals_halfs_on_every_kind_of_value() {
        let specials = [
            0.0f32,
            -0.0,
            1.0,
            1.0 + 1.0 / 256.0,
            1.0 + 3.0 / 256.0,
            -2.5,
            f32::MAX,
            f32::MIN_POSITIVE,
            1e-40,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        let pattern = (0..100_000u32).map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761)));
        for x in specials.into_iter().chain(pattern) {
            let ours = bf16_bits(x);
            let theirs = bf16::from_f32(x).to_bits();
            if x.is_nan() {
                assert!(bf16::from_bits(ours).is_nan(), "{x:?}");
            } else {
                assert_eq!(ours, theirs, "{x:e} ({:#x})", x.to_bits());
            }
        }
    }

    #[test]
    fn f32_tensors_are_read_in_place() {
        let t = from_values(vec![1.0, 2.0, 3.0], Shape::new([3]), DType::F32);
        assert!(matches!(values(&t), Cow::Borrowed(_)));
        let doubled = map_in_place(t, |v| v.iter_mut().for_each(|x| *x *= 2.0));
        assert_eq!(&*values(&doubled), &[2.0, 4.0, 6.0]);
    }

    #[test]
    fn bf16_maps_keep_their_dtype() {
        let t = from_values(vec![1.5, -3.0], Shape::new([2]), DType::BF16);
        let out = map_in_place(t, |v| v.iter_mut().for_each(|x| *x += 1.0));
        assert_eq!(out.dtype(), DType::BF16);
        assert_eq!(&*values(&out), &[2.5, -2.0]);
        assert_eq!(cast(out, DType::F32).dtype(), DType::F32);
    }

    #[test]
    fn chunked_maps_equal_the_whole_tensor_computed_at_once() {
        // more than one chunk and a partial one; a transposed (non-contiguous) input
        let n = 2 * 2048 + 77;
        let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
        let shape = Shape::new([n / 3, 3]);
        let transposed = FlexTensor::from_data(TensorData::new(b.clone(), Shape::new([3, n / 3])))
            .transpose(0, 1);
        for (da, dout) in [
            (DType::F32, DType::F32),
            (DType::BF16, DType::BF16),
            (DType::BF16, DType::F32),
        ] {
            let x = from_values(a.clone(), shape.clone(), da);
            let y = cast(transposed.clone(), da);
            let out = map_chunks([&x, &y], dout, |[x, y], o| {
                o.iter_mut()
                    .zip(x)
                    .zip(y)
                    .for_each(|((o, x), y)| *o = x * y + 1.0)
            });
            let y_rows = y.to_contiguous();
            let (xv, yv) = (values(&x), values(&y_rows));
            let expected: Vec<f32> = xv.iter().zip(yv.iter()).map(|(x, y)| x * y + 1.0).collect();
            assert_eq!(out.dtype(), dout);
            assert_eq!(out.layout().shape(), &shape);
            assert_eq!(
                &*values(&out),
                &*values(&from_values(expected, shape.clone(), dout))
            );
        }
    }
}
