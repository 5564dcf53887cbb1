//! `plan.json`: the estimate the run trained under — memfit-plan's memory model for this setup with
//! `--runtime memfit --device cpu`, beside the setup itself.

use crate::config::{OptimizerKind, Precision, TrainConfig};
use memfit_plan::memory::{
    self, DatasetMode, Device, Framework, FreezeGroup, Method, Runtime, Setup,
};
use serde_json::{Value, json};

/// The plan of `config` for the model described by `model_config` (a `config.json` value).
pub fn plan(
    config: &TrainConfig,
    model_config: &Value,
    dataset_rows: u64,
) -> Result<Value, String> {
    let arch = memfit_plan::arch::config::from_value("config.json", model_config, &config.model)
        .map_err(|e| e.to_string())?;
    let mut setup = Setup::new(&arch);
    setup.task = memfit_plan::Task::Seq2seq;
    setup.batch = config.batch as u64;
    setup.seq = config.seq as u64;
    setup.tgt_seq = config.tgt_seq as u64;
    setup.accum = config.accum as u64;
    setup.precision = match config.precision {
        Precision::Fp32 => memory::Precision::Fp32,
        Precision::Bf16 => memory::Precision::Bf16,
    };
    setup.optimizer = match config.optimizer {
        OptimizerKind::Adamw => memory::Optimizer::AdamW,
        OptimizerKind::Adafactor => memory::Optimizer::Adafactor,
    };
    setup.grad_ckpt = config.grad_ckpt;
    setup.freeze = config
        .freeze
        .iter()
        .filter_map(|g| FreezeGroup::parse(g))
        .collect();
    if !setup.freeze.is_empty() {
        setup.method = Method::Freeze;
    }
    setup.device = Device::Cpu;
    setup.runtime = Runtime::Memfit;
    setup.dataset = DatasetMode::TokenStore;
    setup.dataset_rows = dataset_rows;
    let estimate = memory::estimate(&arch, &setup, &Framework::default())?;
    Ok(json!({
        "model": {
            "name": config.model,
            "params_total": arch.params_total(),
        },
        "setup": setup,
        "gpu": estimate.gpu,
        "host": estimate.host,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatlm_mini_plan_has_a_host_peak_and_no_gpu() {
        let model = crate::model_spec::model_config("chatlm-mini", None).unwrap();
        let mut c = TrainConfig::default();
        crate::presets::profile("sft-small").unwrap().apply(&mut c);
        let p = plan(&c, &model, 3000).unwrap();
        assert!(p["gpu"].is_null());
        assert_eq!(p["model"]["params_total"], 187_692_288);
        assert!(p["host"]["peak_rss_bytes"].as_u64().unwrap() > 1 << 30);
        assert_eq!(p["setup"]["runtime"], "memfit");
    }
}
