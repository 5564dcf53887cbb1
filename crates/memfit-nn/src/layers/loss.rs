//! The seq2seq loss: token cross-entropy over non-padding targets, and the decoder input built from
//! the labels (shifted right, starting with the decoder start token).

use burn::prelude::*;
use burn::tensor::activation::log_softmax;
use burn::tensor::{FloatDType, TensorData};

/// transformers' `_shift_right`: `[start, l0, l1, …, l_{n-2}]`, with masked labels replaced by `pad`.
pub fn shift_right(
    labels: &[u32],
    label_mask: &[bool],
    batch: usize,
    len: usize,
    start: u32,
    pad: u32,
) -> Vec<u32> {
    let mut out = Vec::with_capacity(batch * len);
    for b in 0..batch {
        out.push(start);
        for t in 0..len.saturating_sub(1) {
            let i = b * len + t;
            out.push(if label_mask[i] { labels[i] } else { pad });
        }
    }
    out
}

/// Mean negative log-likelihood of `targets` over positions where `mask` is true.
///
/// One log-softmax over the vocabulary, then a gather of the target column: no one-hot tensor.
/// Computed in f32 whatever the model's dtype (as transformers upcasts logits for the loss).
/// Returns a one-element tensor; 0 when no position counts.
pub fn masked_cross_entropy(logits: Tensor<2>, targets: &[u32], mask: &[bool]) -> Tensor<1> {
    let count = mask.iter().filter(|m| **m).count();
    masked_nll_sum(logits, targets, mask, count)
}

/// Σ −log p(target) over the positions where `mask` is true, divided by `count` (at least 1): one
/// part of a mean whose positions are split across several calls.
pub fn masked_nll_sum(
    logits: Tensor<2>,
    targets: &[u32],
    mask: &[bool],
    count: usize,
) -> Tensor<1> {
    let [n, _] = logits.dims();
    let device = logits.device();
    let count = count.max(1) as f32;
    let ids: Vec<i64> = targets
        .iter()
        .zip(mask)
        .map(|(&t, &m)| if m { t as i64 } else { 0 })
        .collect();
    let weights: Vec<f32> = mask
        .iter()
        .map(|&m| if m { -1.0 / count } else { 0.0 })
        .collect();
    let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [n, 1]), &device);
    let weights =
        Tensor::<2>::from_data(TensorData::new(weights, [n, 1]), &device).cast(FloatDType::F32);
    let logp = log_softmax(logits.cast(FloatDType::F32), 1);
    (logp.gather(1, ids) * weights).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shift_right_starts_with_start_and_pads_masked() {
        let labels = [5, 6, 7, 1, 8, 1, 0, 0];
        let mask = [true, true, true, true, true, true, false, false];
        let d = shift_right(&labels, &mask, 2, 4, 0, 0);
        assert_eq!(d, vec![0, 5, 6, 7, 0, 8, 1, 0]);
    }

    #[test]
    fn cross_entropy_matches_hand_value_and_ignores_padding() {
        let device = Device::flex();
        // Row 0: logits [0, ln 3] → p(target 1) = 3/4; row 1 is masked out.
        let logits = Tensor::<2>::from_data(
            TensorData::new(vec![0.0f32, 3f32.ln(), 9.0, -9.0], [2, 2]),
            &device,
        );
        let loss: f32 = masked_cross_entropy(logits, &[1, 1], &[true, false]).into_scalar();
        assert!((loss - (-(0.75f32).ln())).abs() < 1e-6, "{loss}");
    }
}
