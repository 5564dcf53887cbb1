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

/// [`tracked`] pattern values rounded to bf16, held in `dtype`: the same numbers in either dtype.
pub fn tracked_in<const D: usize>(
    shape: [usize; D],
    salt: usize,
    dtype: burn::tensor::DType,
) -> Tensor<D> {
    use burn::tensor::DType;
    tracked(shape, salt)
        .inner()
        .cast(DType::BF16)
        .cast(dtype)
        .autodiff()
        .require_grad()
}

/// One quantity an op produced, as f32 values, and whether it is stored in the activation dtype
/// (output, input gradient) or stays f32 (a weight's gradient).
pub struct Produced {
    pub name: &'static str,
    pub values: Vec<f32>,
    pub in_activation_dtype: bool,
}

impl Produced {
    /// `t`'s values read as f32.
    pub fn of<const D: usize>(name: &'static str, t: Tensor<D>, in_activation_dtype: bool) -> Self {
        Self {
            name,
            values: values(t.cast(burn::tensor::DType::F32)),
            in_activation_dtype,
        }
    }
}

/// An op computes in f32 whatever the storage: with bf16 activations each result equals the f32
/// run's on the same values, rounded to bf16 where it is stored as bf16, bit for bit.
pub fn assert_bf16_is_rounded_f32(run: impl Fn(burn::tensor::DType) -> Vec<Produced>) {
    use burn::tensor::{DType, bf16};
    let (narrow, wide) = (run(DType::BF16), run(DType::F32));
    assert_eq!(narrow.len(), wide.len());
    for (n, w) in narrow.iter().zip(&wide) {
        let expected: Vec<f32> = if w.in_activation_dtype {
            w.values
                .iter()
                .map(|&x| bf16::from_f32(x).to_f32())
                .collect()
        } else {
            w.values.clone()
        };
        assert_eq!(n.values, expected, "{}", n.name);
    }
}

/// The devices the device ops are checked on: flex and, built with `--features wgpu`, burn's wgpu
/// backend (cubecl's kernels; here Mesa's software renderer).
pub fn device_op_devices() -> Vec<Device> {
    let flex = Device::flex();
    #[cfg(all(feature = "wgpu", cube_kernels))]
    return vec![flex, Device::wgpu(burn::tensor::DeviceKind::default())];
    #[cfg(not(all(feature = "wgpu", cube_kernels)))]
    vec![flex]
}
