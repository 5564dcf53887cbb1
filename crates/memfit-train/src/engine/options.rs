//! How an engine computes: the backend, precision, frozen groups, optimizer, checkpointing, and
//! the size of the compute thread pool.

use crate::optim::OptimizerConfig;
use burn::prelude::Device;
use memfit_nn::ModelError;
pub use memfit_nn::model::Precision;

/// The burn backend the engine computes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// burn's `flex` CPU backend (default; multi-threaded through rayon's global pool).
    #[default]
    Flex,
    /// burn's portable ndarray CPU backend: none of the flex fast paths, so it runs the code a GPU
    /// runs (every kernel's burn-op fallback) on a CPU. For tests and checks; slow.
    Ndarray,
    /// burn's CUDA backend, device index (cargo feature `cuda`).
    #[cfg(feature = "cuda")]
    Cuda(usize),
    /// burn's wgpu backend on the best adapter wgpu finds (cargo feature `wgpu`).
    #[cfg(feature = "wgpu")]
    Wgpu,
}

impl Backend {
    pub fn device(self) -> Device {
        match self {
            Backend::Flex => Device::flex(),
            // burn 0.22 deprecates ndarray in favour of flex; memfit keeps it as the one CPU backend
            // that runs the GPU code path (flex takes memfit's fast paths).
            #[allow(deprecated)]
            Backend::Ndarray => Device::ndarray(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(i) => Device::cuda(i),
            #[cfg(feature = "wgpu")]
            Backend::Wgpu => Device::wgpu(burn::tensor::DeviceKind::default()),
        }
    }
}

/// Where the training state (f32 master weights, accumulated gradients, optimizer states) lives.
/// The loop, the tasks and the checkpoints do not know which one runs: a checkpoint is the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// Host RAM: the device holds the compute copy of the weights and the activations; gradients
    /// come back every micro-batch and the optimizer runs on host slices (on a GPU, what
    /// DeepSpeed's `offload_optimizer` does). On flex the weights are lent to the device, no copy.
    #[default]
    Host,
    /// The device: masters, gradients and optimizer states are tensors on it; per step, only the
    /// batch goes in and a few scalars (loss, gradient norm) come out.
    Device,
}

impl Placement {
    pub fn name(self) -> &'static str {
        match self {
            Placement::Host => "host",
            Placement::Device => "device",
        }
    }
}

/// Everything about an engine except the model itself.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOptions {
    /// Module groups (the family's names) that get no gradient and no optimizer state.
    pub freeze: Vec<String>,
    pub optimizer: OptimizerConfig,
    pub precision: Precision,
    /// Per-block gradient checkpointing: keep only each block's input between the forward and the
    /// backward pass and recompute the block in backward.
    pub grad_ckpt: bool,
    pub backend: Backend,
    pub placement: Placement,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            freeze: Vec::new(),
            optimizer: OptimizerConfig::AdamW(Default::default()),
            precision: Precision::Fp32,
            grad_ckpt: false,
            backend: Backend::Flex,
            placement: Placement::Host,
        }
    }
}

/// Sets the size of rayon's global pool, which burn's flex backend and the optimizer use. Call once,
/// before the first engine is built; a second call with another size fails.
pub fn set_threads(threads: usize) -> Result<(), ModelError> {
    match rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
    {
        Ok(()) => Ok(()),
        Err(_) if rayon::current_num_threads() == threads => Ok(()),
        Err(e) => Err(ModelError::Input(format!(
            "--threads {threads}: the thread pool already runs {} threads ({e})",
            rayon::current_num_threads()
        ))),
    }
}
