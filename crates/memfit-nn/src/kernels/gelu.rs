//! The exact (erf) GELU and its derivative over f32 slices, without libm calls so the loops
//! vectorise: `gelu(x) = x·Φ(x)`, `gelu'(x) = Φ(x) + x·φ(x)`, with `Φ(x) = (1 + erf(x/√2)) / 2`.
//! `erf` is Abramowitz & Stegun 7.1.26 (|error| 1.5e-7 in exact arithmetic, ≤ 5e-7 in f32 here;
//! the formula of PyTorch's vectorised CPU erf), its `exp` is [`exp_f32`].

use crate::kernels::xent::exp_f32;

const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// 1 / √(2π), φ's normalisation.
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

/// erf(x) by A&S 7.1.26: `1 − (a1·t + … + a5·t⁵)·e^(−x²)` with `t = 1 / (1 + p·|x|)`, odd.
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    erf_given_exp(x, exp_f32(-x * x))
}

/// erf(x) by A&S 7.1.26 with `e^(−x²)` given (GELU's derivative needs that value too).
#[inline(always)]
fn erf_given_exp(x: f32, exp_minus_x2: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_8,
        -1.453_152_1,
        1.061_405_4,
    ];
    let ax = x.abs();
    let t = 1.0 / (1.0 + P * ax);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let y = 1.0 - poly * exp_minus_x2;
    y.copysign(x)
}

/// Φ(x), the standard normal CDF.
#[inline(always)]
fn cdf(x: f32) -> f32 {
    0.5 * (1.0 + erf_f32(x * FRAC_1_SQRT_2))
}

/// GELU (erf) of one value.
#[inline(always)]
pub fn gelu_f32(x: f32) -> f32 {
    x * cdf(x)
}

/// d GELU / dx at one value: Φ(x) + x·φ(x), where φ(x)·√(2π) = e^(−x²/2) is also the
/// exponential in Φ's erf(x/√2), computed once.
#[inline(always)]
pub fn gelu_grad_f32(x: f32) -> f32 {
    let z = x * FRAC_1_SQRT_2;
    let e = exp_f32(-z * z);
    0.5 * (1.0 + erf_given_exp(z, e)) + x * FRAC_1_SQRT_2PI * e
}

/// `out[i] = gelu(x[i])`.
pub fn gelu(x: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { gelu_avx512(x, out) };
        }
    }
    gelu_loop(x, out)
}

/// `grad[i] *= gelu'(x[i])`: an upstream gradient turned into the input's.
pub fn times_gelu_grad(x: &[f32], grad: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { grad_avx512(x, grad) };
        }
    }
    grad_loop(x, grad)
}

#[inline(always)]
fn gelu_loop(x: &[f32], out: &mut [f32]) {
    x.iter()
        .zip(out.iter_mut())
        .for_each(|(x, o)| *o = gelu_f32(*x));
}

#[inline(always)]
fn grad_loop(x: &[f32], grad: &mut [f32]) {
    x.iter()
        .zip(grad.iter_mut())
        .for_each(|(x, g)| *g *= gelu_grad_f32(*x));
}

// The same loops compiled for AVX-512 (16 lanes): x86-64's baseline build only has SSE2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn gelu_avx512(x: &[f32], out: &mut [f32]) {
    gelu_loop(x, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn grad_avx512(x: &[f32], grad: &mut [f32]) {
    grad_loop(x, grad)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// erf in f64 by its Taylor series (|x| ≤ 3) — a reference independent of A&S.
    fn erf_f64(x: f64) -> f64 {
        let mut sum = 0.0;
        let mut term = x;
        for n in 0..200 {
            sum += term / (2 * n + 1) as f64;
            term *= -x * x / (n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }

    #[test]
    fn erf_is_within_5e7_of_the_series() {
        let mut worst = 0.0f64;
        for i in -3000..=3000 {
            let x = i as f64 / 1000.0;
            worst = worst.max((erf_f32(x as f32) as f64 - erf_f64(x)).abs());
        }
        assert!(worst < 5e-7, "worst |error| {worst}");
        assert_eq!(erf_f32(10.0), 1.0);
        assert_eq!(erf_f32(-10.0), -1.0);
    }

    #[test]
    fn the_derivative_matches_central_differences() {
        for i in -60..=60 {
            let x = i as f32 / 10.0;
            let h = 1e-2f32;
            let numeric = (gelu_f32(x + h) as f64 - gelu_f32(x - h) as f64) / (2.0 * h as f64);
            let analytic = gelu_grad_f32(x) as f64;
            assert!(
                (numeric - analytic).abs() < 2e-4,
                "x {x}: {numeric} vs {analytic}"
            );
        }
    }

    #[test]
    fn slices_equal_the_scalar_functions() {
        let x: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) / 77.0).collect();
        let mut out = vec![0.0; x.len()];
        gelu(&x, &mut out);
        let mut grad = vec![2.0; x.len()];
        times_gelu_grad(&x, &mut grad);
        for i in 0..x.len() {
            assert_eq!(out[i], gelu_f32(x[i]));
            assert_eq!(grad[i], 2.0 * gelu_grad_f32(x[i]));
        }
    }
}
