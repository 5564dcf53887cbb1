//! One layer of settings and how it lands on the resolved setup.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::parse_error;
use super::{BestMetric, ConfigError, Method, OptimizerKind, Precision, TaskKind, TrainConfig};
use crate::schedule::ScheduleKind;

/// One layer of settings (a `--config` file, a preset, or the command-line flags): only what it sets.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConfigLayer {
    pub model: Option<String>,
    pub init: Option<String>,
    pub task: Option<TaskKind>,
    pub data: Option<String>,
    pub valid: Option<String>,
    pub tokenizer: Option<String>,
    pub batch: Option<usize>,
    pub accum: Option<usize>,
    pub seq: Option<usize>,
    pub tgt_seq: Option<usize>,
    pub precision: Option<Precision>,
    pub optimizer: Option<OptimizerKind>,
    pub adafactor_relative_step: Option<bool>,
    pub grad_ckpt: Option<bool>,
    pub method: Option<Method>,
    pub lora_r: Option<usize>,
    pub lora_alpha: Option<f64>,
    pub lora_dropout: Option<f64>,
    pub lora_targets: Option<Vec<String>>,
    pub base_precision: Option<Precision>,
    pub freeze: Option<Vec<String>>,
    pub lr: Option<f64>,
    pub schedule: Option<ScheduleKind>,
    pub warmup_steps: Option<u64>,
    pub warmup_ratio: Option<f64>,
    pub div_factor: Option<f64>,
    pub pct_start: Option<f64>,
    pub final_div_factor: Option<f64>,
    pub max_grad_norm: Option<f64>,
    pub weight_decay: Option<f64>,
    pub epochs: Option<u32>,
    pub max_steps: Option<u64>,
    pub seed: Option<u64>,
    pub threads: Option<usize>,
    pub save_steps: Option<u64>,
    pub keep: Option<usize>,
    pub eval_steps: Option<u64>,
    pub eval_rows: Option<usize>,
    pub eval_loss_rows: Option<usize>,
    pub eval_at_start: Option<bool>,
    pub gen_max_tokens: Option<usize>,
    pub best_metric: Option<BestMetric>,
    pub memory_budget_bytes: Option<u64>,
    pub gpu_memory_budget_bytes: Option<u64>,
    pub guard_soft_fraction: Option<f64>,
    pub guard_hard_fraction: Option<f64>,
    /// Keys this trainer does not know (e.g. from a newer `memfit plan --emit memfit`): reported, unused.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, toml::Value>,
}

impl ConfigLayer {
    /// Reads a `run.toml` (the keys `memfit plan --emit memfit` writes, or a run's `config.toml`).
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| parse_error(path, &text, &e))
    }

    /// Applies the settings this layer holds on top of `config`.
    pub fn apply(&self, config: &mut TrainConfig) {
        macro_rules! set {
            ($($field:ident),*) => {$(
                if let Some(v) = &self.$field { config.$field = v.clone(); }
            )*};
        }
        macro_rules! set_opt {
            ($($field:ident),*) => {$(
                if let Some(v) = &self.$field { config.$field = Some(v.clone()); }
            )*};
        }
        set!(
            model,
            task,
            batch,
            accum,
            seq,
            tgt_seq,
            precision,
            optimizer,
            adafactor_relative_step,
            grad_ckpt,
            method,
            freeze,
            lr,
            schedule,
            warmup_steps,
            div_factor,
            pct_start,
            final_div_factor,
            epochs,
            seed,
            threads,
            keep,
            eval_rows,
            eval_at_start,
            gen_max_tokens,
            best_metric,
            guard_soft_fraction,
            guard_hard_fraction
        );
        set_opt!(
            lora_r,
            lora_alpha,
            lora_dropout,
            lora_targets,
            base_precision,
            warmup_ratio,
            init,
            data,
            valid,
            tokenizer,
            max_grad_norm,
            weight_decay,
            save_steps,
            eval_steps,
            eval_loss_rows,
            memory_budget_bytes,
            gpu_memory_budget_bytes
        );
        // 0 = no step limit: run the epochs (as `memfit plan --emit memfit` writes it)
        if let Some(n) = self.max_steps {
            config.max_steps = (n > 0).then_some(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_override_in_order_and_unknown_keys_are_kept_apart() {
        let file: ConfigLayer = toml::from_str(
            "model = \"t5-small\"\nbatch = 8\naccum = 4\nlr = 1e-4\nprecision = \"bf16\"\nmax_steps = 10\ngpus = 2\n",
        )
        .unwrap();
        assert_eq!(file.unknown.keys().collect::<Vec<_>>(), vec!["gpus"]);
        let flags = ConfigLayer {
            batch: Some(2),
            ..Default::default()
        };
        let mut c = TrainConfig::default();
        file.apply(&mut c);
        flags.apply(&mut c);
        assert_eq!(c.model, "t5-small");
        assert_eq!(c.batch, 2);
        assert_eq!(c.accum, 4);
        assert_eq!(c.precision, Precision::Bf16);
        assert_eq!(c.max_steps, Some(10));
    }

    #[test]
    fn max_steps_zero_runs_the_epochs() {
        let file: ConfigLayer = toml::from_str("max_steps = 0\nepochs = 2\n").unwrap();
        let mut c = TrainConfig {
            max_steps: Some(5),
            ..Default::default()
        };
        file.apply(&mut c);
        assert_eq!(c.max_steps, None);
        assert_eq!(c.epochs, 2);
        c.validate().unwrap();
    }

    #[test]
    fn a_bad_value_names_the_file_line_and_accepted_values() {
        let dir = std::env::temp_dir().join(format!("memfit-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.toml");
        std::fs::write(&path, "model = \"t5-small\"\nprecision = \"amp-fp16\"\n").unwrap();
        let err = ConfigLayer::from_file(&path).unwrap_err().to_string();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!err.contains('\n'), "one line: {err}");
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("line 2"), "{err}");
        assert!(err.contains("amp-fp16") && err.contains("bf16"), "{err}");
    }
}
