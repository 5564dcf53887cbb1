//! LoRA adapters as PEFT writes and reads them: `adapter_config.json` (the `LoraConfig` fields
//! PEFT 0.21 reads) and `adapter_model.safetensors` (or the `adapter_model.bin` older PEFT wrote), whose keys are the adapted modules' paths under
//! `base_model.model.` with `.lora_A.weight` `[r, in]` / `.lora_B.weight` `[out, r]`.
//! `PeftModel.from_pretrained(base, dir)` loads such a directory.

use std::path::Path;

use serde_json::{Value, json};

use crate::ModelError;
use crate::layers::lora::LoraSettings;

pub const CONFIG_FILE: &str = "adapter_config.json";
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// What PEFT before 0.7 wrote by default (torch.save's pickle, read as data, never run).
pub const PICKLE_WEIGHTS_FILE: &str = "adapter_model.bin";

/// The adapter's weights in `dir`: `adapter_model.safetensors`, else `adapter_model.bin` (as PEFT
/// looks for them); the safetensors name when neither exists, for the error.
pub fn weights_path(dir: &Path) -> std::path::PathBuf {
    let safetensors = dir.join(WEIGHTS_FILE);
    let pickle = dir.join(PICKLE_WEIGHTS_FILE);
    if !safetensors.is_file() && pickle.is_file() {
        pickle
    } else {
        safetensors
    }
}

/// The prefix PEFT's `PeftModelForCausalLM` puts before the base model's parameter names.
pub const KEY_PREFIX: &str = "base_model.model.";

/// What `adapter_config.json` says about a LoRA adapter.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterConfig {
    pub settings: LoraSettings,
    /// The adapted modules' names (`q_proj`, …).
    pub target_modules: Vec<String>,
    pub base_model_name_or_path: Option<String>,
    /// PEFT's `task_type` (`CAUSAL_LM`, `SEQ_2_SEQ_LM`, …).
    pub task_type: String,
}

impl AdapterConfig {
    /// The JSON PEFT writes for this adapter (LoRA on whole linear layers, no bias, no DoRA).
    pub fn to_json(&self) -> Value {
        json!({
            "peft_type": "LORA",
            "task_type": self.task_type,
            "base_model_name_or_path": self.base_model_name_or_path,
            "r": self.settings.r,
            // An integer where it is one, as PEFT's `LoraConfig.lora_alpha: int` writes it.
            "lora_alpha": if self.settings.alpha.fract() == 0.0 {
                json!(self.settings.alpha as i64)
            } else {
                json!(self.settings.alpha)
            },
            "lora_dropout": self.settings.dropout,
            "use_rslora": self.settings.use_rslora,
            "target_modules": self.target_modules,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "use_dora": false,
            "lora_bias": false,
            "modules_to_save": null,
            "layers_to_transform": null,
            "layers_pattern": null,
            "rank_pattern": {},
            "alpha_pattern": {},
            "revision": null,
        })
    }

    /// Reads a config PEFT (or memfit) wrote; an option memfit does not implement (DoRA, biases,
    /// per-module ranks, regex targets, …) is an error naming the field.
    pub fn from_json(v: &Value) -> Result<Self, ModelError> {
        let bad = |field: &str, what: String| ModelError::Format(format!("{field}: {what}"));
        let get = |k: &str| v.get(k).filter(|x| !x.is_null());
        match get("peft_type").and_then(Value::as_str) {
            Some("LORA") => {}
            other => {
                return Err(bad(
                    "peft_type",
                    format!("{other:?}: only LORA adapters are read"),
                ));
            }
        }
        let r = get("r")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("r", "missing or not a positive integer".into()))?
            as usize;
        let number = |k: &str, default: f64| match get(k) {
            None => Ok(default),
            Some(x) => x
                .as_f64()
                .ok_or_else(|| bad(k, format!("{x} is not a number"))),
        };
        let flag = |k: &str| get(k).and_then(Value::as_bool).unwrap_or(false);
        for k in ["use_dora", "fan_in_fan_out", "lora_bias"] {
            if flag(k) {
                return Err(bad(k, "true is not implemented".into()));
            }
        }
        if let Some(b) = get("bias").and_then(Value::as_str).filter(|b| *b != "none") {
            return Err(bad("bias", format!("{b:?}: only \"none\" is implemented")));
        }
        for k in ["rank_pattern", "alpha_pattern"] {
            if get(k)
                .and_then(Value::as_object)
                .is_some_and(|m| !m.is_empty())
            {
                return Err(bad(
                    k,
                    "per-module ranks and alphas are not implemented".into(),
                ));
            }
        }
        for k in [
            "layers_to_transform",
            "modules_to_save",
            "target_parameters",
        ] {
            if get(k).is_some_and(|x| x.as_array().is_none_or(|a| !a.is_empty())) {
                return Err(bad(
                    k,
                    format!("{} is not implemented", get(k).expect("set")),
                ));
            }
        }
        let target_modules = match get("target_modules") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|t| t.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("target_modules", "expected module names".into()))?,
            Some(other) => {
                return Err(bad(
                    "target_modules",
                    format!("{other}: a regular expression is not implemented; list the modules"),
                ));
            }
            None => return Err(bad("target_modules", "missing".into())),
        };
        let settings = LoraSettings {
            r,
            alpha: number("lora_alpha", 8.0)?,
            dropout: number("lora_dropout", 0.0)?,
            use_rslora: flag("use_rslora"),
        };
        settings
            .validate()
            .map_err(|e| ModelError::Format(e.to_string()))?;
        Ok(Self {
            settings,
            target_modules,
            base_model_name_or_path: get("base_model_name_or_path")
                .and_then(Value::as_str)
                .map(str::to_string),
            task_type: get("task_type")
                .and_then(Value::as_str)
                .unwrap_or("CAUSAL_LM")
                .to_string(),
        })
    }

    /// Reads `dir/adapter_config.json`; errors name the file.
    pub fn from_dir(dir: &Path) -> Result<Self, ModelError> {
        let path = dir.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| ModelError::Io(format!("{}: {e}", path.display())))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| ModelError::Format(format!("{}: {e}", path.display())))?;
        Self::from_json(&v).map_err(|e| ModelError::Format(format!("{}: {e}", path.display())))
    }

    /// Writes `dir/adapter_config.json` atomically.
    pub fn write(&self, dir: &Path) -> Result<(), ModelError> {
        let path = dir.join(CONFIG_FILE);
        let text = serde_json::to_string_pretty(&self.to_json())
            .map_err(|e| ModelError::Io(format!("{}: {e}", path.display())))?;
        super::write_atomic(&path, text.as_bytes())
    }
}

/// Whether `dir` holds a PEFT adapter.
pub fn is_adapter_dir(dir: &Path) -> bool {
    dir.join(CONFIG_FILE).is_file()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> AdapterConfig {
        AdapterConfig {
            settings: LoraSettings {
                r: 8,
                alpha: 16.0,
                dropout: 0.05,
                use_rslora: false,
            },
            target_modules: vec!["q_proj".into(), "v_proj".into()],
            base_model_name_or_path: Some("Qwen/Qwen2.5-0.5B".into()),
            task_type: "CAUSAL_LM".into(),
        }
    }

    #[test]
    fn round_trips_through_json() {
        let c = config();
        assert_eq!(AdapterConfig::from_json(&c.to_json()).unwrap(), c);
    }

    #[test]
    fn unimplemented_options_are_named() {
        for (field, value) in [
            ("use_dora", json!(true)),
            ("bias", json!("all")),
            ("rank_pattern", json!({"q_proj": 4})),
            ("target_modules", json!(".*proj")),
            ("peft_type", json!("IA3")),
            ("modules_to_save", json!(["lm_head"])),
        ] {
            let mut v = config().to_json();
            v[field] = value;
            let e = AdapterConfig::from_json(&v).unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
    }
}
