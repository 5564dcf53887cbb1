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
            #[cfg(feature = "cuda")]
            Backend::Cuda(i) => Device::cuda(i),
            #[cfg(feature = "wgpu")]
            Backend::Wgpu => Device::wgpu(burn::tensor::DeviceKind::default()),
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
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            freeze: Vec::new(),
            optimizer: OptimizerConfig::AdamW(Default::default()),
            precision: Precision::Fp32,
            grad_ckpt: false,
            backend: Backend::Flex,
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
