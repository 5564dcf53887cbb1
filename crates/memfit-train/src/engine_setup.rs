//! From a resolved [`TrainConfig`] and a model `config.json` to a [`T5Engine`]: optimizer, precision,
//! frozen groups, threads. The binary calls this; the loop only sees the `Engine` trait.

use crate::config::{OptimizerKind, Precision, TrainConfig};
use crate::model::{Group, ModelError, T5Config};
use crate::optim::{AdafactorConfig, AdafactorLr, AdamWConfig, OptimizerConfig};
use crate::t5_engine::{self, EngineOptions, T5Engine};
use serde_json::Value;

/// The engine options a config asks for.
pub fn engine_options(config: &TrainConfig) -> Result<EngineOptions, ModelError> {
    let freeze = config
        .freeze
        .iter()
        .map(|g| {
            Group::parse(g)
                .ok_or_else(|| ModelError::Input(format!("--freeze {g:?}: unknown group")))
        })
        .collect::<Result<Vec<_>, _>>()?;
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
    Ok(EngineOptions {
        freeze,
        optimizer,
        precision: match config.precision {
            Precision::Fp32 => t5_engine::Precision::F32,
            Precision::Bf16 => t5_engine::Precision::Bf16,
        },
        grad_ckpt: config.grad_ckpt,
        ..EngineOptions::default()
    })
}

/// Sets the compute threads (0: leave the default, all cores). Call before anything starts the shared
/// thread pool (tokenizing data does).
pub fn set_threads(config: &TrainConfig) -> Result<(), ModelError> {
    if config.threads > 0 {
        t5_engine::set_threads(config.threads)?;
    }
    Ok(())
}

/// A freshly initialised engine (weights drawn from the run seed).
pub fn build(config: &TrainConfig, model_config: &Value) -> Result<T5Engine, ModelError> {
    let t5 = T5Config::from_json(model_config)?;
    T5Engine::new(t5, engine_options(config)?, config.seed)
}
