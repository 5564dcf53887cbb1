//! The CPU fast paths: burn backend extensions for the flex backend with hand-written backward
//! passes (attention without a kept score matrix, linear layers on `gemm` — with a fused bias and
//! GELU input for BERT's dense layers —, RMS norm and LayerNorm, dropout that keeps no mask,
//! cross-entropy over the logits in place) and the f32 / AVX512-BF16 matrix products
//! they call. Each is tested against burn's composite ops in value and gradient. `device` holds the
//! GPU code path's own ops (cubecl kernels, mirrored on flex).

pub mod attention_core;
pub mod autodiff_record;
pub mod dense_op;
pub mod device;
pub mod dropout;
pub mod dropout_linear_op;
pub mod dropout_op;
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

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use burn::prelude::*;

static COMPOSITE_ON_CPU: AtomicBool = AtomicBool::new(false);

/// Whether the hand-written ops run for tensors on `device`: on flex, unless
/// [`set_composite_ops_on_cpu`] or `MEMFIT_CPU_KERNELS=off` sent the CPU down the GPU's code path.
pub fn hand_written_on(device: &Device) -> bool {
    static OFF_BY_ENV: OnceLock<bool> = OnceLock::new();
    let off_by_env =
        *OFF_BY_ENV.get_or_init(|| std::env::var("MEMFIT_CPU_KERNELS").is_ok_and(|v| v == "off"));
    *device == Device::flex() && !off_by_env && !COMPOSITE_ON_CPU.load(Ordering::Relaxed)
}

/// Whether the CPU runs the GPU's code path — burn's ops and the device ops (`device`), with the
/// weights in the compute dtype — instead of the hand-written ones, for the whole process from now
/// on: the GPU's numerics (bf16 above all) and kept tensors checked where no GPU is (also
/// `MEMFIT_CPU_KERNELS=off`, docs/gpu.md).
pub fn set_composite_ops_on_cpu(on: bool) {
    COMPOSITE_ON_CPU.store(on, Ordering::Relaxed);
}
