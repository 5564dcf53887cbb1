//! From a resolved [`TrainConfig`] to the options of its engine (optimizer, precision, frozen
//! groups, checkpointing) and the compute threads. The model itself comes from
//! `memfit_nn::families`; the loop only sees the `Engine` trait.

use crate::config::{OptimizerKind, TrainConfig};
use crate::device::ChosenDevice;
use crate::engine::{self, EngineOptions};
use crate::optim::{AdafactorConfig, AdafactorLr, AdamWConfig, OptimizerConfig};
use memfit_nn::ModelError;

/// The engine options a config asks for, computing on `device`.
pub fn engine_options(config: &TrainConfig, device: &ChosenDevice) -> EngineOptions {
    let optimizer = match config.optimizer {
        OptimizerKind::Adamw => OptimizerConfig::AdamW(AdamWConfig::default()),
        OptimizerKind::Adafactor => OptimizerConfig::Adafactor(AdafactorConfig {
            lr: if config.adafactor_relative_step {
                AdafactorLr::Relative
            } else {
                AdafactorLr::External
            },
            ..AdafactorConfig::default()
        }),
    };
    EngineOptions {
        freeze: config.freeze.clone(),
        optimizer,
        precision: config.precision,
        grad_ckpt: config.grad_ckpt,
        backend: device.backend,
        placement: device.placement,
    }
}

/// Sets the compute threads (0: leave the default, all cores). Call before anything starts the shared
/// thread pool (tokenizing data does).
pub fn set_threads(config: &TrainConfig) -> Result<(), ModelError> {
    if config.threads > 0 {
        engine::set_threads(config.threads)?;
    }
    Ok(())
}
