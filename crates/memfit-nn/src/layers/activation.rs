//! The activations transformers' `ACT2FN` names that memfit's families use.

use burn::prelude::*;
use burn::tensor::activation::{gelu, gelu_approximate, relu, silu};

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

    pub fn apply<const D: usize>(self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Self::Relu => relu(x),
            Self::Gelu => gelu(x),
            Self::GeluNew => gelu_approximate(x),
            Self::Silu => silu(x),
        }
    }
}
