//! The activations transformers' `ACT2FN` names that memfit's families use.

use burn::prelude::*;
use burn::tensor::activation::{gelu, gelu_approximate, relu, silu};

use crate::kernels::{device, hand_written_on};

/// The exact (erf) GELU with its exact derivative on every backend. burn 0.22's default
/// `gelu_backward` — what CUDA, wgpu and ndarray run — is the derivative of the *tanh approximation*
/// while the forward is erf's (gradients off by up to ~1e-3 relative); flex overrides it with the
/// exact one. Elsewhere the composite `x · ½(1 + erf(x/√2))` lets autodiff differentiate erf itself.
pub fn gelu_exact<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    if hand_written_on(&x.device()) {
        return gelu(x);
    }
    if device::runs_on(&x) {
        return device::activation::activation(x, Activation::Gelu);
    }
    let cdf = x
        .clone()
        .div_scalar(std::f32::consts::SQRT_2)
        .erf()
        .add_scalar(1.0)
        .mul_scalar(0.5);
    x * cdf
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Relu,
    /// Exact (erf) GELU: `"gelu"`.
    Gelu,
    /// Tanh approximation: `"gelu_new"`, `"gelu_pytorch_tanh"`, `"gelu_fast"` (the same formula).
    GeluNew,
    Silu,
}

impl Activation {
    /// The activation `ACT2FN[name]` is, among those above.
    pub fn from_hf_name(name: &str) -> Option<Self> {
        match name {
            "relu" => Some(Self::Relu),
            "gelu" => Some(Self::Gelu),
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Some(Self::GeluNew),
            "silu" | "swish" => Some(Self::Silu),
            _ => None,
        }
    }

    /// The activation of `x`; on the GPU's code path the device op (`kernels/device`), but ReLU.
    pub fn apply<const D: usize>(self, x: Tensor<D>) -> Tensor<D> {
        if self != Self::Relu && device::runs_on(&x) {
            return device::activation::activation(x, self);
        }
        match self {
            Self::Relu => relu(x),
            Self::Gelu => gelu_exact(x),
            Self::GeluNew => gelu_approximate(x),
            Self::Silu => silu(x),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    /// On the portable backend (a GPU's code path) the exact GELU's gradient is erf's derivative,
    /// `Φ(x) + x·φ(x)`, as on flex; burn's own `gelu` there is off by up to 1e-3.
    #[test]
    fn gelu_gradient_is_exact_off_flex() {
        let xs = vec![-3.0f32, -1.5, -0.4, 0.0, 0.3, 1.0, 2.2];
        #[allow(deprecated)]
        let device = Device::ndarray();
        let grad_of = |f: fn(Tensor<1>) -> Tensor<1>| {
            let x = Tensor::<1>::from_data(TensorData::new(xs.clone(), [xs.len()]), &device)
                .autodiff()
                .require_grad();
            let g = f(x.clone()).sum().backward();
            x.grad(&g).unwrap().into_data().try_to_vec::<f32>().unwrap()
        };
        let exact: Vec<f64> = xs
            .iter()
            .map(|&x| {
                let x = f64::from(x);
                let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
                0.5 * (1.0 + erf_series(x / std::f64::consts::SQRT_2)) + x * pdf
            })
            .collect();
        let ours = grad_of(gelu_exact);
        for (a, b) in ours.iter().zip(&exact) {
            assert!((f64::from(*a) - b).abs() < 1e-6, "{a} vs {b}");
        }
        let burns = grad_of(gelu);
        let worst = burns
            .iter()
            .zip(&exact)
            .map(|(a, b)| (f64::from(*a) - b).abs())
            .fold(0.0, f64::max);
        assert!(
            worst > 1e-5,
            "burn's gelu backward became exact ({worst}): gelu_exact can go"
        );
    }

    /// erf by its Taylor series (|x| ≤ 3 here: 60 terms are exact to f64).
    fn erf_series(x: f64) -> f64 {
        let (mut term, mut sum) = (x, x);
        for n in 1..60 {
            term *= -x * x / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }
}
