//! The GPU code path's own ops: what burn's composite ops run as several launches and keep several
//! tensors for, as one launch each way (and the LM head's token loss per chunk of logits). On a
//! cubecl device (CUDA; wgpu, where the same kernels are checked without a card) they are memfit's
//! kernels (`cfg(cube_kernels)`: builds with a GPU backend and without burn's fusion, which merges
//! the composite ops itself). On flex the same ops run as CPU loops where the CPU takes the GPU's
//! code path (`kernels::set_composite_ops_on_cpu`, `MEMFIT_CPU_KERNELS=off`): the same autodiff
//! graph and kept tensors, so CI checks their logic and the GPU memory model counts them. Each is
//! tested against the CPU's op on flex and, built with `--features wgpu`, on cubecl's kernels.

pub mod activation;
pub mod adamw;
pub mod attention;
#[cfg(cube_kernels)]
mod dropout;
#[cfg(cube_kernels)]
mod launch;
pub mod norm;
pub mod softmax;
mod staged_sum;
pub mod xent;

use burn::prelude::*;
use burn::tensor::DType;

use super::hand_written_on;

pub use staged_sum::staged_sum;

/// Whether `x` takes the device path's ops: a float tensor on a cubecl device of a build with
/// memfit's kernels (f32, bf16, f16), or on flex where the CPU runs the GPU's code path (f32, bf16).
pub fn runs_on<const D: usize>(x: &Tensor<D>) -> bool {
    let device = x.device().inner();
    let cpu_as_gpu = device == Device::flex() && !hand_written_on(&device);
    let cpu_float = matches!(x.dtype(), DType::F32 | DType::BF16);
    cpu_as_gpu && cpu_float || on_cube(&device) && (cpu_float || x.dtype() == DType::F16)
}

/// A cubecl device, unless `MEMFIT_GPU_KERNELS=off` sends it through burn's composite ops (the
/// way back where memfit's kernels would not compile or run on a card; `scripts/gpu/accept.sh`
/// takes it when its first run fails).
#[cfg(cube_kernels)]
fn on_cube(device: &Device) -> bool {
    static OFF_BY_ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let off =
        *OFF_BY_ENV.get_or_init(|| std::env::var("MEMFIT_GPU_KERNELS").is_ok_and(|v| v == "off"));
    !off && matches!(device.as_dispatch(), burn::backend::DispatchDevice::Cube(_))
}

#[cfg(not(cube_kernels))]
fn on_cube(_: &Device) -> bool {
    false
}

/// Softmax over the last dimension: the device op where [`runs_on`] says so, burn's composite ops
/// elsewhere.
pub fn softmax_last<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    if runs_on(&x) {
        return softmax::softmax_last(x);
    }
    burn::tensor::activation::softmax(x, D - 1)
}
