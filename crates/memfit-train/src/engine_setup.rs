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
    let optimizer = optimizer_config(config);
    EngineOptions {
        freeze: config.freeze.clone(),
        optimizer,
        precision: config.precision,
        grad_ckpt: config.grad_ckpt,
        backend: device.backend,
        placement: device.placement,
    }
}

/// The optimizer a config asks for, its weight decay the config's where it sets one.
fn optimizer_config(config: &TrainConfig) -> OptimizerConfig {
    match config.optimizer {
        OptimizerKind::Adamw => {
            let default = AdamWConfig::default();
            OptimizerConfig::AdamW(AdamWConfig {
                weight_decay: config.weight_decay.unwrap_or(default.weight_decay),
                ..default
            })
        }
        OptimizerKind::Adafactor => {
            let default = AdafactorConfig::default();
            OptimizerConfig::Adafactor(AdafactorConfig {
                lr: if config.adafactor_relative_step {
                    AdafactorLr::Relative
                } else {
                    AdafactorLr::External
                },
                weight_decay: config.weight_decay.unwrap_or(default.weight_decay),
                ..default
            })
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `weight_decay` reaches either optimizer; unset, each keeps its own default.
    #[test]
    fn the_configs_weight_decay_reaches_the_optimizer() {
        let with = |optimizer, weight_decay| {
            optimizer_config(&TrainConfig {
                optimizer,
                weight_decay,
                ..Default::default()
            })
        };
        let decay = |c: OptimizerConfig| match c {
            OptimizerConfig::AdamW(c) => c.weight_decay,
            OptimizerConfig::Adafactor(c) => c.weight_decay,
        };
        assert_eq!(decay(with(OptimizerKind::Adamw, None)), 0.01);
        assert_eq!(decay(with(OptimizerKind::Adamw, Some(0.1))), 0.1);
        assert_eq!(decay(with(OptimizerKind::Adafactor, None)), 0.0);
        assert_eq!(decay(with(OptimizerKind::Adafactor, Some(0.05))), 0.05);
    }
}
