//! The fully resolved training setup, how it is layered (defaults ← preset ← `--config` file ← flags),
//! and the hash that decides whether a resume continues the same run.

use crate::schedule::{OneCycle, Schedule, ScheduleKind, WarmupCosine};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

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
}

/// Activation precision (master weights, gradients and optimizer state stay f32).
pub use memfit_nn::model::Precision;

/// What a run trains for (`--task`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum TaskKind {
    /// Source → target with an encoder-decoder (T5).
    #[default]
    Seq2seq,
    /// Text (or a text pair) → label with an encoder (BERT family).
    Classification,
    /// Next-token prediction with a decoder (Llama, Qwen2, Mistral).
    CausalLm,
}

impl TaskKind {
    pub fn name(self) -> &'static str {
        match self {
            TaskKind::Seq2seq => "seq2seq",
            TaskKind::Classification => "classification",
            TaskKind::CausalLm => "causal-lm",
        }
    }

    /// What picks `best/` unless the config says: the seed's BLEU-4 for seq2seq, accuracy for
    /// classification (transformers' text-classification examples), the loss otherwise.
    pub fn default_best_metric(self) -> BestMetric {
        match self {
            TaskKind::Seq2seq => BestMetric::Bleu4,
            TaskKind::Classification => BestMetric::Accuracy,
            TaskKind::CausalLm => BestMetric::ValidLoss,
        }
    }

    /// The metrics an evaluation of this task reports.
    pub fn metrics(self) -> &'static [BestMetric] {
        match self {
            TaskKind::Seq2seq => &[BestMetric::Bleu4, BestMetric::ValidLoss],
            TaskKind::Classification => &[
                BestMetric::Accuracy,
                BestMetric::MacroF1,
                BestMetric::ValidLoss,
            ],
            TaskKind::CausalLm => &[BestMetric::ValidLoss],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerKind {
    Adamw,
    Adafactor,
}

/// How the weights train (`--method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// Every weight (less the groups `freeze` names).
    #[default]
    Full,
    /// Full training with `freeze` naming the frozen groups (the planner's name for it).
    Freeze,
    /// Low-rank adapters on a frozen base (decoder models).
    Lora,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Full => "full",
            Method::Freeze => "freeze",
            Method::Lora => "lora",
        }
    }
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// What picks `best/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BestMetric {
    /// The seed's BLEU-4 formula on greedy generations (higher is better; the seed's choice).
    Bleu4,
    /// Validation loss (lower is better).
    ValidLoss,
    /// Share of validation rows classified right (higher is better).
    Accuracy,
    /// Mean F1 over the classes (higher is better).
    MacroF1,
}

impl BestMetric {
    /// The score's name in an evaluation report, `best` records and events.
    pub fn key(self) -> &'static str {
        match self {
            BestMetric::Bleu4 => "bleu4",
            BestMetric::ValidLoss => "valid_loss",
            BestMetric::Accuracy => "accuracy",
            BestMetric::MacroF1 => "macro_f1",
        }
    }

    /// The flag value (`--best-metric`).
    pub fn flag(self) -> &'static str {
        match self {
            BestMetric::Bleu4 => "bleu4",
            BestMetric::ValidLoss => "valid-loss",
            BestMetric::Accuracy => "accuracy",
            BestMetric::MacroF1 => "macro-f1",
        }
    }

    pub fn higher_is_better(self) -> bool {
        self != BestMetric::ValidLoss
    }
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
    pub div_factor: f64,
    pub pct_start: f64,
    pub final_div_factor: f64,
    /// Global-norm gradient clipping (the seed: 1.0).
    pub max_grad_norm: Option<f64>,
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
    /// Validation rows whose loss each evaluation computes; none: sized to a small share of the
    /// training between two evaluations (`eval::sizing`). Left out of config.toml when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_loss_rows: Option<usize>,
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
            div_factor: 25.0,
            pct_start: 0.3,
            final_div_factor: 1e4,
            max_grad_norm: Some(1.0),
            epochs: 30,
            max_steps: None,
            seed: 23333,
            threads: 0,
            save_steps: None,
            keep: 3,
            eval_steps: None,
            eval_rows: 8,
            eval_loss_rows: None,
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
    pub div_factor: Option<f64>,
    pub pct_start: Option<f64>,
    pub final_div_factor: Option<f64>,
    pub max_grad_norm: Option<f64>,
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
            init,
            data,
            valid,
            tokenizer,
            max_grad_norm,
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
    /// Checks values a user controls; every message names the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_method()?;
        if !self.task.metrics().contains(&self.best_metric) {
            return Err(ConfigError::Invalid {
                field: "best_metric",
                value: self.best_metric.flag().into(),
                reason: match self.task {
                    TaskKind::Seq2seq => "a seq2seq run picks best/ by bleu4 or valid-loss",
                    TaskKind::Classification => {
                        "a classification run picks best/ by accuracy, macro-f1 or valid-loss"
                    }
                    TaskKind::CausalLm => "a causal-lm run picks best/ by valid-loss",
                },
            });
        }
        let positive = |field: &'static str, v: usize| {
            if v == 0 {
                Err(ConfigError::Invalid {
                    field,
                    value: v.to_string(),
                    reason: "must be at least 1",
                })
            } else {
                Ok(())
            }
        };
        positive("batch", self.batch)?;
        positive("accum", self.accum)?;
        positive("seq", self.seq)?;
        if self.task == TaskKind::Seq2seq {
            positive("tgt_seq", self.tgt_seq)?;
        }
        positive("keep", self.keep)?;
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(ConfigError::Invalid {
                field: "lr",
                value: self.lr.to_string(),
                reason: "must be a positive number",
            });
        }
        if !(self.pct_start > 0.0 && self.pct_start < 1.0) {
            return Err(ConfigError::Invalid {
                field: "pct_start",
                value: self.pct_start.to_string(),
                reason: "must lie strictly between 0 and 1",
            });
        }
        if !(self.div_factor >= 1.0 && self.final_div_factor >= 1.0) {
            return Err(ConfigError::Invalid {
                field: "div_factor",
                value: format!("{} / {}", self.div_factor, self.final_div_factor),
                reason: "div_factor and final_div_factor must be at least 1",
            });
        }
        if self.epochs == 0 && self.max_steps.is_none() {
            return Err(ConfigError::Invalid {
                field: "epochs",
                value: "0".into(),
                reason: "give at least one epoch or --max-steps",
            });
        }
        if !(self.guard_soft_fraction > 0.0
            && self.guard_soft_fraction < self.guard_hard_fraction
            && self.guard_hard_fraction <= 1.0)
        {
            return Err(ConfigError::Invalid {
                field: "guard_soft_fraction",
                value: format!(
                    "{} / {}",
                    self.guard_soft_fraction, self.guard_hard_fraction
                ),
                reason: "need 0 < guard_soft_fraction < guard_hard_fraction ≤ 1",
            });
        }
        if let Some(n) = self.max_grad_norm
            && !(n.is_finite() && n > 0.0)
        {
            return Err(ConfigError::Invalid {
                field: "max_grad_norm",
                value: n.to_string(),
                reason: "must be a positive number",
            });
        }
        Ok(())
    }

    /// LoRA's settings only with `method = "lora"`, which only decoders (causal-lm) take.
    fn validate_method(&self) -> Result<(), ConfigError> {
        let invalid = |field, value: String, reason| {
            Err(ConfigError::Invalid {
                field,
                value,
                reason,
            })
        };
        if self.method == Method::Lora && self.task != TaskKind::CausalLm {
            return invalid(
                "method",
                "lora".into(),
                "LoRA adapters train decoder models (task causal-lm); this task trains with full or freeze",
            );
        }
        if self.method != Method::Lora {
            let lora_set = self.lora_r.is_some()
                || self.lora_alpha.is_some()
                || self.lora_dropout.is_some()
                || self.lora_targets.is_some()
                || self.base_precision.is_some();
            if lora_set {
                return invalid(
                    "method",
                    self.method.name().into(),
                    "--lora-* and --base-precision need --method lora",
                );
            }
        }
        if self.lora_r == Some(0) {
            return invalid("lora_r", "0".into(), "must be at least 1");
        }
        if let Some(a) = self.lora_alpha.filter(|a| !(a.is_finite() && *a > 0.0)) {
            return invalid("lora_alpha", a.to_string(), "must be a positive number");
        }
        if let Some(d) = self.lora_dropout.filter(|d| !(0.0..1.0).contains(d)) {
            return invalid("lora_dropout", d.to_string(), "must lie in [0, 1)");
        }
        Ok(())
    }

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
                warmup_steps: self.warmup_steps,
                total_steps,
            }),
        }
    }

    pub fn to_toml(&self) -> String {
        // Serializing plain data with no maps of non-string keys cannot fail.
        toml::to_string(self).unwrap_or_default()
    }

    pub fn from_toml(text: &str, path: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| parse_error(path, text, &e))
    }

    /// The settings that decide the trajectory of the weights, as name → value. Bookkeeping
    /// (save/eval cadence, retention, threads, budget) may change across a resume.
    fn trajectory(&self) -> BTreeMap<String, serde_json::Value> {
        const BOOKKEEPING: [&str; 13] = [
            "threads",
            "save_steps",
            "keep",
            "eval_steps",
            "eval_rows",
            "eval_loss_rows",
            "eval_at_start",
            "gen_max_tokens",
            "best_metric",
            "memory_budget_bytes",
            "gpu_memory_budget_bytes",
            "guard_soft_fraction",
            "guard_hard_fraction",
        ];
        let value = serde_json::to_value(self).unwrap_or_default();
        let mut map = BTreeMap::new();
        if let serde_json::Value::Object(fields) = value {
            for (k, v) in fields {
                if !BOOKKEEPING.contains(&k.as_str()) {
                    map.insert(k, v);
                }
            }
        }
        map
    }

    /// FNV-1a 64 over the canonical JSON of the trajectory settings, as 16 hex digits.
    pub fn hash(&self) -> String {
        let canonical = serde_json::to_string(&self.trajectory()).unwrap_or_default();
        format!("{:016x}", fnv1a64(canonical.as_bytes()))
    }

    /// The trajectory settings that differ: `(name, old, new)`.
    pub fn changes_from(&self, old: &TrainConfig) -> Vec<(String, String, String)> {
        let (a, b) = (old.trajectory(), self.trajectory());
        a.iter()
            .filter_map(|(k, va)| {
                let vb = b.get(k).cloned().unwrap_or(serde_json::Value::Null);
                (va != &vb).then(|| (k.clone(), va.to_string(), vb.to_string()))
            })
            .collect()
    }
}

/// FNV-1a, 64-bit (offset basis 0xcbf29ce484222325, prime 0x100000001b3: the published FNV constants).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
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
    fn hash_ignores_bookkeeping_but_not_the_trajectory() {
        let a = TrainConfig::default();
        let b = TrainConfig {
            keep: 9,
            threads: 1,
            save_steps: Some(5),
            eval_loss_rows: Some(10),
            eval_at_start: true,
            ..a.clone()
        };
        assert_eq!(a.hash(), b.hash());
        let c = TrainConfig {
            lr: 1.0,
            ..a.clone()
        };
        assert_ne!(a.hash(), c.hash());
        let changes = c.changes_from(&a);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].0, "lr");
    }

    #[test]
    fn validation_names_the_field() {
        let c = TrainConfig {
            batch: 0,
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("batch"));
        let c = TrainConfig {
            task: TaskKind::Classification,
            ..Default::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("best_metric") && err.contains("bleu4"),
            "{err}"
        );
        TrainConfig::default().validate().unwrap();
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

    #[test]
    fn fnv_matches_published_test_vector() {
        // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c (Fowler/Noll/Vo test vectors).
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
