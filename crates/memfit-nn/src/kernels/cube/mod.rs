//! memfit's own kernels for cubecl devices (CUDA, and wgpu where the same code is checked without a
//! card): what burn's composite ops run as several launches and keep several tensors for, in one
//! launch. Each is tested against the CPU's hand-written op on wgpu (`--features wgpu`). Builds
//! with burn's fusion run the composite ops instead: fusion merges those itself.

#[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "fusion")))]
mod activation;
#[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "fusion")))]
mod dropout;
#[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "fusion")))]
mod norm;
#[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "fusion")))]
mod rows;
#[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "fusion")))]
mod softmax;

use burn::prelude::*;

/// Whether `x` is a float tensor on a cubecl device that memfit's kernels take (f32, bf16, f16);
/// never in builds without them.
pub fn runs_on<const D: usize>(x: &Tensor<D>) -> bool {
    #[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "fusion")))]
    {
        use burn::backend::DispatchDevice;
        use burn::tensor::DType;
        matches!(x.device().inner().as_dispatch(), DispatchDevice::Cube(_))
            && matches!(x.dtype(), DType::F32 | DType::BF16 | DType::F16)
    }
    #[cfg(not(all(any(feature = "cuda", feature = "wgpu"), not(feature = "fusion"))))]
    {
        let _ = x;
        false
    }
}

/// Softmax over the last dimension: memfit's kernel on a cubecl device (one launch each way),
/// burn's composite ops elsewhere.
pub fn softmax_last<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    #[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "fusion")))]
    if runs_on(&x) {
        return softmax::softmax_last(x);
    }
    burn::tensor::activation::softmax(x, D - 1)
}

/// An activation other than ReLU as memfit's kernel (one launch each way, keeping the input only),
/// for `x` where [`runs_on`] says so.
pub fn activation<const D: usize>(
    x: Tensor<D>,
    act: crate::layers::activation::Activation,
) -> Tensor<D> {
    #[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "fusion")))]
    return activation::activation(x, act);
    #[cfg(not(all(any(feature = "cuda", feature = "wgpu"), not(feature = "fusion"))))]
    unreachable!(
        "{act:?} on {:?}: no cubecl kernels in this build",
        x.device()
    )
}
