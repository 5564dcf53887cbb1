//! f32 data of flex tensors for the hand-written ops: read in place, and build a tensor from a
//! `Vec<f32>` without a copy (`FlexTensor::from_data` keeps the vector's buffer).

use std::borrow::Cow;

use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use burn_flex::FlexTensor;

/// Whether `t` is an f32 tensor on the flex backend: where the hand-written ops run.
pub fn is_flex_f32<const D: usize>(t: &Tensor<D>) -> bool {
    t.dtype() == DType::F32 && t.device() == Device::flex()
}

/// The values of an f32 tensor in row-major order (a copy only when `t` is a strided view).
pub fn values(t: &FlexTensor) -> Cow<'_, [f32]> {
    assert_eq!(t.dtype(), DType::F32, "the fused ops run in f32");
    match t.as_slice::<f32>() {
        Some(v) => Cow::Borrowed(v),
        None => Cow::Owned(t.to_contiguous().as_slice::<f32>().unwrap().to_vec()),
    }
}

/// A tensor of `like`'s shape holding `values`.
pub fn tensor_like(values: Vec<f32>, like: &FlexTensor) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, like.layout().shape().clone()))
}

/// `t`'s values as contiguous f32 data to write to (no copy when `t` is contiguous and not shared).
pub fn into_values(t: FlexTensor) -> TensorData {
    assert_eq!(t.dtype(), DType::F32, "the fused ops run in f32");
    t.into_data()
}
