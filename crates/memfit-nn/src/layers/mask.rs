//! Additive attention masks: 0 where a key is seen, a large negative number where it is not.

use burn::prelude::*;
use burn::tensor::{DType, TensorData};

/// Added to the scores of masked positions. transformers adds `torch.finfo(dtype).min`; any value
/// whose `exp` underflows to 0 gives the same probabilities, and this one stays finite in bf16.
pub const MASKED: f32 = -1e9;

/// Additive key-padding mask `[b, 1, 1, s]`: 0 where `mask` is true, [`MASKED`] elsewhere.
pub fn padding_mask(
    mask: &[bool],
    batch: usize,
    len: usize,
    device: &Device,
    dtype: DType,
) -> Tensor<4> {
    let data: Vec<f32> = mask.iter().map(|&m| if m { 0.0 } else { MASKED }).collect();
    Tensor::from_data(TensorData::new(data, [batch, 1, 1, len]), (device, dtype))
}
