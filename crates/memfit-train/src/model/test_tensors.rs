//! Deterministic tensors for the hand-written ops' tests: a fixed pattern of values in [-2.6, 2.7]
//! (varied enough that no two neighbours repeat), shifted by a salt per tensor.

use burn::prelude::*;
use burn::tensor::TensorData;

/// `n` pattern values starting at `salt`.
pub fn pattern(n: usize, salt: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i + salt) * 7919 % 211) as f32 - 105.0) / 40.0)
        .collect()
}

/// A flex f32 tensor of pattern values that requires a gradient.
pub fn tracked<const D: usize>(shape: [usize; D], salt: usize) -> Tensor<D> {
    let values = pattern(shape.iter().product(), salt);
    Tensor::from_data(TensorData::new(values, shape), &Device::flex())
        .autodiff()
        .require_grad()
}

/// A tensor's values in row-major order.
pub fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec().unwrap()
}

/// Every `actual[i]` within `tol · (1 + |expected[i]|)` of `expected[i]`, the lengths equal;
/// `which` names the compared quantity in the failure.
pub fn assert_close(which: &str, actual: &[f32], expected: &[f32], tol: f32) {
    assert_eq!(actual.len(), expected.len(), "{which}: lengths");
    for (x, y) in actual.iter().zip(expected) {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "{which}: {x} vs {y}"
        );
    }
}
