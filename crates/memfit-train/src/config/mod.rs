//! The fully resolved training setup, how it is layered (defaults ← preset ← `--config` file ← flags),
//! and the hash that decides whether a resume continues the same run.

mod hash;
mod kinds;
mod layer;
mod validate;

use crate::schedule::{OneCycle, Schedule, ScheduleKind, WarmupCosine};
use serde::{Deserialize, Serialize};
use std::path::Path;

pub use hash::fnv1a64;
pub use kinds::{BestMetric, Method, OptimizerKind, Precision, TaskKind};
pub use layer::ConfigLayer;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Parse { path: String, message: String },
    #[error("invalid setting {field} = {value}: {reason}")]
    Invalid {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    /// LoRA target names the decoder does not have (the message names them and lists the valid).
    #[error("{0}")]
    Targets(String),
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// The fully resolved setup of a run; `config.toml` in the run directory is this, serialized.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// `demo`, a preset name (`chatlm-mini`, …) or a path to a Hugging Face `config.json`.
    pub model: String,
    /// A Hugging Face model directory (config.json + safetensors) or a memfit checkpoint whose weights
    /// the run starts from (`--init`); none: transformers' random initialisation. Left out of
    /// config.toml when unset, so runs written before it keep their config hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<String>,
    pub task: TaskKind,
    /// Training data: a token store directory, or a parquet/JSONL file prepared on the fly.
    pub data: Option<String>,
    pub valid: Option<String>,
    /// A directory holding `tokenizer.json` (and its companions, copied into every checkpoint).
    pub tokenizer: Option<String>,
    pub batch: usize,
    pub accum: usize,
    pub seq: usize,
    pub tgt_seq: usize,
    pub precision: Precision,
    pub optimizer: OptimizerKind,
    /// Adafactor's own relative step size `min(1e-2, 1/√step)` (what the seed's `torch_optimizer`
    /// Adafactor ran: its scheduler's rate was ignored); `false`: the scheduled rate (external LR).
    pub adafactor_relative_step: bool,
    pub grad_ckpt: bool,
    /// `full`, `freeze` or `lora`. Left out of config.toml at its default (older runs keep their hash).
    #[serde(default, skip_serializing_if = "is_default")]
    pub method: Method,
    /// LoRA rank, scaling numerator, dropout and target projections (`q,k,v,o,gate,up,down` or
    /// PEFT's names); unset: PEFT-style defaults r 16, alpha 32, dropout 0.05, every projection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_r: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_alpha: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_dropout: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_targets: Option<Vec<String>>,
    /// The frozen base's precision under LoRA (`bf16` halves its memory); unset: fp32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_precision: Option<Precision>,
    /// Frozen parameter groups, in the family's names (T5: `embeddings`, `encoder`, `decoder`,
    /// `lm_head`; BERT: `embeddings`, `encoder`, `pooler`, `head`).
    pub freeze: Vec<String>,
    /// Peak learning rate (OneCycle's `max_lr`; the cosine schedule's base rate).
    pub lr: f64,
    pub schedule: ScheduleKind,
    pub warmup_steps: u64,
    /// Warm-up as a share of the run's optimizer steps (the cosine schedule warms up for the larger
    /// of this share and `warmup_steps`); set by the task defaults. Left out of config.toml when
    /// unset, so older runs keep their hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_ratio: Option<f64>,
    pub div_factor: f64,
    pub pct_start: f64,
    pub final_div_factor: f64,
    /// Global-norm gradient clipping (the seed: 1.0).
    pub max_grad_norm: Option<f64>,
    /// Decoupled weight decay; unset: the optimizer's own (AdamW 0.01 as torch's, Adafactor 0).
    /// Left out of config.toml when unset, so older runs keep their hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_decay: Option<f64>,
    pub epochs: u32,
    pub max_steps: Option<u64>,
    pub seed: u64,
    /// Compute threads (0: all cores).
    pub threads: usize,
    pub save_steps: Option<u64>,
    pub keep: usize,
    pub eval_steps: Option<u64>,
    /// Validation rows generated and scored by BLEU at each evaluation (the first ones of the set).
    pub eval_rows: usize,
    /// A cap on the validation rows whose loss each evaluation computes; none: the whole set
    /// (`eval::sizing`). Left out of config.toml when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_loss_rows: Option<usize>,
    /// Rows per evaluation batch, when evaluation alone would pass the memory budget at the
    /// training micro-batch (the planned start sets it); none: the micro-batch. Left out of
    /// config.toml when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_batch: Option<usize>,
    /// Evaluate before the first step too (the "before" of the summary's BLEU).
    #[serde(default, skip_serializing_if = "is_false")]
    pub eval_at_start: bool,
    pub gen_max_tokens: usize,
    pub best_metric: BestMetric,
    /// Host-memory budget: the memory guard's limits are fractions of it; the summary compares the peak
    /// RSS with it.
    pub memory_budget_bytes: Option<u64>,
    /// GPU-memory budget (`--budget-gpu`): the guard applies the same fractions to this process's GPU
    /// memory where NVML reads it (a CPU run uses none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_budget_bytes: Option<u64>,
    /// The memory guard's soft limit as a fraction of the budget: crossing it halves the micro-batch
    /// (see `memory_guard::DEFAULT_SOFT_FRACTION` for why 0.85).
    #[serde(default = "default_soft_fraction")]
    pub guard_soft_fraction: f64,
    /// The memory guard's hard limit as a fraction of the budget: crossing it checkpoints and stops.
    #[serde(default = "default_hard_fraction")]
    pub guard_hard_fraction: f64,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn default_soft_fraction() -> f64 {
    crate::memory_guard::DEFAULT_SOFT_FRACTION
}

fn default_hard_fraction() -> f64 {
    crate::memory_guard::DEFAULT_HARD_FRACTION
}

impl Default for TrainConfig {
    /// The demo task's setup (see `demo`): a tiny T5 that learns in about two minutes on 2 cores.
    fn default() -> Self {
        Self {
            model: "demo".into(),
            init: None,
            task: TaskKind::Seq2seq,
            data: None,
            valid: None,
            tokenizer: None,
            batch: 32,
            accum: 1,
            seq: 16,
            tgt_seq: 24,
            precision: Precision::Fp32,
            optimizer: OptimizerKind::Adamw,
            adafactor_relative_step: true,
            grad_ckpt: false,
            method: Method::Full,
            lora_r: None,
            lora_alpha: None,
            lora_dropout: None,
            lora_targets: None,
            base_precision: None,
            freeze: Vec::new(),
            lr: 3e-3,
            schedule: ScheduleKind::Onecycle,
            warmup_steps: 0,
            warmup_ratio: None,
            div_factor: 25.0,
            pct_start: 0.3,
            final_div_factor: 1e4,
            max_grad_norm: Some(1.0),
            weight_decay: None,
            epochs: 30,
            max_steps: None,
            seed: 23333,
            threads: 0,
            save_steps: None,
            keep: 3,
            eval_steps: None,
            eval_rows: 8,
            eval_loss_rows: None,
            eval_batch: None,
            eval_at_start: false,
            gen_max_tokens: 24,
            best_metric: BestMetric::Bleu4,
            memory_budget_bytes: Some(1 << 30),
            gpu_memory_budget_bytes: None,
            guard_soft_fraction: default_soft_fraction(),
            guard_hard_fraction: default_hard_fraction(),
        }
    }
}

/// A TOML error as one line: the file, the line, and what is wrong (toml's own message spans
/// several lines, with the file name far from the reason).
fn parse_error(path: &Path, text: &str, e: &toml::de::Error) -> ConfigError {
    let line = e
        .span()
        .map(|span| text[..span.start.min(text.len())].lines().count().max(1));
    let at = line.map_or(String::new(), |n| {
        let source = text.lines().nth(n - 1).unwrap_or("").trim();
        format!(", line {n} ({source})")
    });
    ConfigError::Parse {
        path: format!("{}{at}", path.display()),
        message: e.message().trim().to_string(),
    }
}

impl TrainConfig {
    /// The schedule over `total_steps` optimizer steps.
    pub fn schedule(&self, total_steps: u64) -> Schedule {
        match self.schedule {
            ScheduleKind::Onecycle => Schedule::OneCycle(OneCycle {
                max_lr: self.lr,
                total_steps,
                pct_start: self.pct_start,
                div_factor: self.div_factor,
                final_div_factor: self.final_div_factor,
            }),
            ScheduleKind::Cosine => Schedule::WarmupCosine(WarmupCosine {
                base_lr: self.lr,
                warmup_steps: self.warmup_steps_of(total_steps),
                total_steps,
            }),
        }
    }

    /// The warm-up of a run of `total_steps`: `warmup_steps`, or the share `warmup_ratio` of the run
    /// (rounded up) when that is more.
    pub fn warmup_steps_of(&self, total_steps: u64) -> u64 {
        let share = self
            .warmup_ratio
            .map_or(0, |r| (r * total_steps as f64).ceil() as u64);
        self.warmup_steps.max(share)
    }

    pub fn to_toml(&self) -> String {
        // Serializing plain data with no maps of non-string keys cannot fail.
        toml::to_string(self).unwrap_or_default()
    }

    pub fn from_toml(text: &str, path: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| parse_error(path, text, &e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolved_config_round_trips_through_toml() {
        let c = TrainConfig {
            max_steps: Some(7),
            freeze: vec!["encoder".into()],
            ..Default::default()
        };
        let back = TrainConfig::from_toml(&c.to_toml(), Path::new("x")).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.hash(), c.hash());
    }

    #[test]
    fn guard_fractions_default_when_absent_are_validated_and_leave_the_hash_alone() {
        let c = TrainConfig::default();
        let text: String = c
            .to_toml()
            .lines()
            .filter(|l| !l.starts_with("guard_"))
            .map(|l| format!("{l}\n"))
            .collect();
        // A config.toml written before the guard existed.
        let old = TrainConfig::from_toml(&text, Path::new("old.toml")).unwrap();
        assert_eq!(old, c);
        let tuned = TrainConfig {
            guard_soft_fraction: 0.7,
            guard_hard_fraction: 0.8,
            ..c.clone()
        };
        assert_eq!(tuned.hash(), c.hash());
        tuned.validate().unwrap();
        let bad = TrainConfig {
            guard_soft_fraction: 0.96,
            ..c
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("guard_soft_fraction")
        );
    }
}
