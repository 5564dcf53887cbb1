//! Checks on the values a user controls.

use super::{ConfigError, Method, TaskKind, TrainConfig};

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
        if let Some(r) = self.warmup_ratio.filter(|r| !(0.0..1.0).contains(r)) {
            return Err(ConfigError::Invalid {
                field: "warmup_ratio",
                value: r.to_string(),
                reason: "must lie in [0, 1)",
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
        if let Some(d) = self.weight_decay
            && !(d.is_finite() && (0.0..1.0).contains(&(d * self.lr)))
        {
            return Err(ConfigError::Invalid {
                field: "weight_decay",
                value: d.to_string(),
                reason: "must be ≥ 0, and lr × weight_decay below 1 (it shrinks every weight by that share a step)",
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
        // Checked here, before a run directory or a plan exists, by the decoder's own parser.
        if let Some(names) = &self.lora_targets {
            memfit_nn::decoder::lora::parse_targets(names)
                .map_err(|e| ConfigError::Targets(e.to_string()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        for bad in [-0.1, f64::NAN, 1.0 / TrainConfig::default().lr] {
            let c = TrainConfig {
                weight_decay: Some(bad),
                ..Default::default()
            };
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("weight_decay"), "{bad}: {err}");
        }
        let c = TrainConfig {
            weight_decay: Some(0.0),
            ..Default::default()
        };
        c.validate().unwrap();
    }

    #[test]
    fn lora_targets_are_checked_by_name() {
        let lora = |targets: &[&str]| TrainConfig {
            task: TaskKind::CausalLm,
            best_metric: crate::config::BestMetric::ValidLoss,
            method: Method::Lora,
            lora_targets: Some(targets.iter().map(|t| t.to_string()).collect()),
            ..Default::default()
        };
        let err = lora(&["q", "qq"]).validate().unwrap_err().to_string();
        assert!(err.contains("\"qq\"") && err.contains("gate"), "{err}");
        lora(&["q_proj", "mlp"]).validate().unwrap();
    }
}
