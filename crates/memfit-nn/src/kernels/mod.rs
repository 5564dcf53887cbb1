//! The CPU fast paths: burn backend extensions for the flex backend with hand-written backward
//! passes (attention without a kept score matrix, linear layers on `gemm` — with a fused bias and
//! GELU input for BERT's dense layers —, RMS norm and LayerNorm, dropout that keeps no mask,
//! cross-entropy over the logits in place) and the f32 / AVX512-BF16 matrix products
//! they call. Each is tested against burn's composite ops in value and gradient.

pub mod attention_core;
pub mod dense_op;
pub mod dropout;
pub mod dropout_linear_op;
pub mod dropout_op;
pub mod flex_op;
pub mod flex_values;
pub mod fused_layer_norm;
pub mod fused_rms_norm;
pub mod gelu;
pub mod gemm_bf16;
pub mod gemm_f32;
pub mod linear_op;
pub mod swiglu_op;
#[cfg(test)]
pub(crate) mod test_tensors;
pub mod vectorised;
pub mod xent;
