//! Cross-entropy's value and its gradient with respect to the logits in one sweep per row, written
//! over the logits themselves: what the LM head needs from the loss. Autodiff's composite
//! log-softmax allocates a `[rows, vocab]` tensor for each of `x − max`, `exp`, the result, the
//! gather's backward and the log-softmax backward, and runs glibc's scalar `expf` twice per logit;
//! here the buffer is read three times and written twice, with a vectorised `exp`.

use burn::prelude::*;
use burn::tensor::{IndexingUpdateOp, TensorData};

use crate::kernels::device::staged_sum;

/// Σ over the rows where `mask` is true of `logsumexp(row) − row[label]` (the token NLL, in f64),
/// after replacing every row by `scale · (softmax(row) − onehot(label))`, the gradient of
/// `scale · Σ NLL` — and rows that do not count by zeros.
///
/// `logits` is `[labels.len(), vocab]` row-major. A label outside the vocabulary panics (the
/// engine checks batches against the model before it runs them).
pub fn nll_and_grad_in_place(
    logits: &mut [f32],
    vocab: usize,
    labels: &[u32],
    mask: &[bool],
    scale: f32,
) -> f64 {
    assert_eq!(
        logits.len(),
        labels.len() * vocab,
        "logits are [rows, vocab]"
    );
    let mut nll = 0.0f64;
    for ((row, &label), &counts) in logits.chunks_exact_mut(vocab).zip(labels).zip(mask) {
        if !counts {
            row.fill(0.0);
            continue;
        }
        let label = label as usize;
        let target = row[label];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum = exp_shifted_in_place(row, max);
        nll += (max as f64 + sum.ln()) - target as f64;
        let k = (scale as f64 / sum) as f32;
        row.iter_mut().for_each(|p| *p *= k);
        row[label] -= scale;
    }
    nll
}

/// `row[i] = exp(row[i] − shift)` for every element; returns their sum (in f64). Dispatches to a
/// build of the same loop for the CPU's widest vector unit.
pub(crate) fn exp_shifted_in_place(row: &mut [f32], shift: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { exp_shifted_avx512(row, shift) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            return unsafe { exp_shifted_avx2(row, shift) };
        }
    }
    exp_shifted(row, shift)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn exp_shifted_avx512(row: &mut [f32], shift: f32) -> f64 {
    exp_shifted(row, shift)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn exp_shifted_avx2(row: &mut [f32], shift: f32) -> f64 {
    exp_shifted(row, shift)
}

/// Lanes summed side by side: independent partial sums let the loop vectorise (a single f32
/// accumulator would force the serial order) and keep the rounding error of a 32k-term sum small.
const LANES: usize = 16;

#[inline(always)]
fn exp_shifted(row: &mut [f32], shift: f32) -> f64 {
    let mut partial = [0.0f32; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for (x, acc) in chunk.iter_mut().zip(partial.iter_mut()) {
            *x = exp_f32(*x - shift);
            *acc += *x;
        }
    }
    let mut sum: f64 = partial.iter().map(|&p| p as f64).sum();
    for x in chunks.into_remainder() {
        *x = exp_f32(*x - shift);
        sum += *x as f64;
    }
    sum
}

/// `e^x` for f32 without a libm call, so that loops over it vectorise: Cody–Waite range reduction
/// `x = n·ln2 + r` (|r| ≤ ln2/2), Cephes' degree-6 polynomial for `e^r`, and `2^n` built in the
/// exponent bits. Relative error ≲ 2 ulp. Below −87.3 the result is exactly 0 (masked attention
/// scores must give zero probabilities: a tiny non-zero one would also be a subnormal after
/// normalising, and subnormals slow every GEMM that reads them by an order of magnitude); above
/// 88.3 it stays ~2e38 instead of ∞.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n·LN2_HI is exact for |n| < 2^9.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5·2^23 rounds to the nearest integer and leaves it in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let x_in = x;
    let x = x.clamp(-87.3, 88.3);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let er = p * r * r + r + 1.0;
    // n is in the low bits of t's mantissa (two's complement around ROUND's bit pattern).
    let n_int = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let two_n = f32::from_bits(((n_int + 127) << 23) as u32);
    if x_in < -87.3 { 0.0 } else { er * two_n }
}

/// [`nll_and_grad_in_place`] in tensor ops, for logits that live on a GPU (or any non-flex device):
/// the summed NLL of the rows where `mask` is true, as a one-element device tensor (nothing is read
/// back), and `scale · (softmax(row) − onehot(label))` for those rows, zeros for the others.
/// `logits` is f32 `[rows, vocab]`.
pub fn nll_and_grad_on_device(
    logits: Tensor<2>,
    labels: &[u32],
    mask: &[bool],
    scale: f32,
) -> (Tensor<1>, Tensor<2>) {
    let [rows, _] = logits.dims();
    let device = logits.device();
    let ids: Vec<i64> = labels.iter().map(|&l| i64::from(l)).collect();
    let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [rows, 1]), &device);
    let weights: Vec<f32> = mask.iter().map(|&m| if m { 1.0 } else { 0.0 }).collect();
    let counts = Tensor::<2>::from_data(TensorData::new(weights, [rows, 1]), &device);
    let max = logits.clone().max_dim(1);
    let exp = (logits.clone() - max.clone()).exp();
    let sum = exp.clone().sum_dim(1);
    let target = logits.gather(1, ids.clone());
    let nll = staged_sum((max + sum.clone().log() - target) * counts.clone());
    let row_scale = counts.mul_scalar(scale);
    let grad = (exp / sum) * row_scale.clone();
    let grad = grad.scatter(1, ids, row_scale.neg(), IndexingUpdateOp::Add);
    (nll, grad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_libm_to_a_few_ulp() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = exp_f32(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(
            worst < 3.0 * f32::EPSILON as f64,
            "worst relative error {worst}"
        );
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-1e9), 0.0, "masked scores give exactly 0");
        assert_eq!(exp_f32(-87.4), 0.0);
        assert!(exp_f32(-87.2) > 0.0 && exp_f32(-87.2).is_normal());
    }

    #[test]
    fn every_vector_build_gives_the_same_row() {
        let row: Vec<f32> = (0..1003)
            .map(|i| ((i * 7919) % 211) as f32 / 9.0 - 11.0)
            .collect();
        let mut plain = row.clone();
        let s_plain = exp_shifted(&mut plain, 3.0);
        let mut dispatched = row.clone();
        let s_disp = exp_shifted_in_place(&mut dispatched, 3.0);
        assert!((s_plain - s_disp).abs() <= 1e-6 * s_plain);
        for (a, b) in plain.iter().zip(&dispatched) {
            assert!((a - b).abs() <= 2.0 * f32::EPSILON * a.abs(), "{a} vs {b}");
        }
    }

    /// The textbook definition in f64: −log softmax(row)[label], and (softmax − onehot)·scale.
    fn reference(row: &[f32], label: usize, scale: f64) -> (f64, Vec<f64>) {
        let max = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
        let z: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
        let lse = max + z.ln();
        let grad = row
            .iter()
            .enumerate()
            .map(|(i, &x)| scale * ((x as f64 - lse).exp() - if i == label { 1.0 } else { 0.0 }))
            .collect();
        (lse - row[label] as f64, grad)
    }

    /// Four rows of 37 logits, the second masked out.
    fn four_rows() -> (usize, [u32; 4], [bool; 4], Vec<f32>) {
        let vocab = 37;
        let logits = (0..4 * vocab)
            .map(|i| ((i * 31 % 97) as f32 - 48.0) / 6.0)
            .collect();
        (vocab, [3, 36, 0, 12], [true, false, true, true], logits)
    }

    #[test]
    fn loss_and_gradient_match_the_definition_and_skip_masked_rows() {
        let (vocab, labels, mask, logits) = four_rows();
        let mut work = logits.clone();
        let scale = 0.25f32;
        let nll = nll_and_grad_in_place(&mut work, vocab, &labels, &mask, scale);
        let mut want_nll = 0.0;
        for r in 0..labels.len() {
            let row = &logits[r * vocab..(r + 1) * vocab];
            let got = &work[r * vocab..(r + 1) * vocab];
            if !mask[r] {
                assert!(
                    got.iter().all(|g| *g == 0.0),
                    "masked row {r} has no gradient"
                );
                continue;
            }
            let (l, g) = reference(row, labels[r] as usize, scale as f64);
            want_nll += l;
            for (a, b) in got.iter().zip(&g) {
                assert!((*a as f64 - b).abs() < 1e-6, "row {r}: {a} vs {b}");
            }
        }
        assert!(
            (nll - want_nll).abs() < 1e-5 * want_nll,
            "{nll} vs {want_nll}"
        );
    }

    /// The tensor-op version gives the host sweep's loss and gradient, on the portable backend a
    /// GPU's code path runs on.
    #[test]
    fn the_device_version_equals_the_host_sweep() {
        let (vocab, labels, mask, logits) = four_rows();
        let mut host = logits.clone();
        let nll = nll_and_grad_in_place(&mut host, vocab, &labels, &mask, 0.25);
        #[allow(deprecated)]
        let device = Device::ndarray();
        let t = Tensor::<2>::from_data(TensorData::new(logits, [labels.len(), vocab]), &device);
        let (dev_nll, dev_grad) = nll_and_grad_on_device(t, &labels, &mask, 0.25);
        let dev_nll = dev_nll.into_data().try_to_vec::<f32>().unwrap()[0];
        assert!(
            (dev_nll as f64 - nll).abs() < 1e-5 * nll,
            "{dev_nll} vs {nll}"
        );
        let dev_grad = dev_grad.into_data().try_to_vec::<f32>().unwrap();
        for (a, b) in dev_grad.iter().zip(&host) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }
}
