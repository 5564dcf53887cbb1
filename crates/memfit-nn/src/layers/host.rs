//! Tensors to and from host memory: token ids in, values out.

use burn::prelude::*;
use burn::tensor::{DType, FloatDType, TensorData};

use crate::ModelError;

/// `[batch, len]` token ids as a device tensor.
pub fn int_tensor(ids: &[u32], batch: usize, len: usize, device: &Device) -> Tensor<2, Int> {
    let data: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
    Tensor::from_data(TensorData::new(data, [batch, len]), device)
}

/// Host f32 `values` as a `dims` tensor of `dtype` on `device`.
pub fn float_tensor(values: &[f32], dims: [usize; 2], device: &Device, dtype: DType) -> Tensor<2> {
    Tensor::from_data(TensorData::new(values.to_vec(), dims), (device, dtype))
}

/// A tensor's values as host f32, whatever its float dtype.
pub fn to_f32_vec<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>, ModelError> {
    t.cast(FloatDType::F32)
        .into_data()
        .try_into_vec::<f32>()
        .map_err(|e| ModelError::Io(format!("reading a tensor back from the device: {e:?}")))
}

/// The first value of a one-element tensor (a loss) as f32; NaN when it is empty.
pub fn scalar(t: Tensor<1>) -> Result<f32, ModelError> {
    Ok(to_f32_vec(t)?.first().copied().unwrap_or(f32::NAN))
}
