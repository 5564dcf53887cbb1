//! From a resolved [`TrainConfig`] and a model `config.json` to a [`T5Engine`]: optimizer, precision,
//! frozen groups, threads. The binary calls this; the loop only sees the `Engine` trait.

use crate::config::{OptimizerKind, Precision, TrainConfig};
use crate::optim::{AdafactorConfig, AdafactorLr, AdamWConfig, OptimizerConfig};
use crate::t5_engine::{self, EngineOptions, T5Engine};
use memfit_nn::ModelError;
use memfit_nn::t5::{Group, T5Config, T5Layout, T5Model};
use memfit_nn::weights::LoadReport;
use serde_json::Value;
use std::path::Path;

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

/// The engine a new run starts with: the `--init` weights where the config names a directory
/// (`load_init`; a resume loads its checkpoint instead), else weights drawn from the run seed.
/// Returns what loading left out (see [`LoadReport`]).
pub fn build(
    config: &TrainConfig,
    model_config: &Value,
    load_init: bool,
) -> Result<(T5Engine, Option<LoadReport>), ModelError> {
    // name the model's source (a preset, or the config.json it came from) in a config error
    let t5 = T5Config::from_json(model_config).map_err(|e| match e {
        ModelError::Config(m) => ModelError::Config(format!("model {}: {m}", config.model)),
        other => other,
    })?;
    let options = engine_options(config)?;
    match config.init.as_deref().filter(|_| load_init) {
        None => Ok((T5Engine::new(t5, options, config.seed)?, None)),
        Some(dir) => {
            // The weights of --init, the hyper-parameters of the run's model config (dropout, …).
            let (loaded, report) = T5Model::load(Path::new(dir))?;
            let layout = T5Layout::new(&t5);
            if !layout.same_tensors(&loaded.layout) || loaded.config.feed_forward != t5.feed_forward
            {
                return Err(ModelError::Input(format!(
                    "--init {dir}: its config.json describes another model than {:?} (tensors or feed-forward differ)",
                    config.model
                )));
            }
            let model = T5Model {
                config: t5,
                layout,
                weights: loaded.weights,
            };
            Ok((T5Engine::with_model(model, options)?, Some(report)))
        }
    }
}
