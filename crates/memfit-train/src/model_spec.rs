//! Which model a run trains: its Hugging Face `config.json` value, from the demo, a memfit-plan
//! preset, or a file; and the check that the tokenizer fits its vocabulary.

use serde_json::Value;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ModelSpecError {
    #[error("unknown model {name:?}: not a preset ({presets}) and not a config.json path")]
    Unknown { name: String, presets: String },
    #[error("model config {path}: {message}")]
    Read { path: String, message: String },
    #[error(
        "the tokenizer {tokenizer} has ids up to {max_id}, but model {model} has vocab_size {vocab_size}: they do not belong together"
    )]
    VocabMismatch {
        tokenizer: String,
        max_id: u32,
        model: String,
        vocab_size: u64,
    },
}

/// The `config.json` of `model`: a preset name, or a path to a `config.json` (or a directory holding
/// one, e.g. a checkpoint). `demo_config` is where the demo wrote its model when `model == "demo"`.
pub fn model_config(model: &str, demo_config: Option<&Path>) -> Result<Value, ModelSpecError> {
    if model == "demo"
        && let Some(path) = demo_config
    {
        return read(path);
    }
    if let Some(v) = memfit_plan::arch::presets::preset_config_json(model) {
        return Ok(v);
    }
    let path = Path::new(model);
    if path.is_dir() {
        return read(&path.join("config.json"));
    }
    if path.is_file() {
        return read(path);
    }
    Err(ModelSpecError::Unknown {
        name: model.into(),
        presets: memfit_plan::arch::presets::PRESET_NAMES.join(", "),
    })
}

fn read(path: &Path) -> Result<Value, ModelSpecError> {
    let err = |message: String| ModelSpecError::Read {
        path: path.display().to_string(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    // A byte order mark (Windows editors write one) is no part of the JSON.
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    serde_json::from_str(text).map_err(|e| err(e.to_string()))
}

/// The model's `vocab_size`.
pub fn vocab_size(config: &Value) -> Option<u64> {
    config.get("vocab_size").and_then(Value::as_u64)
}

/// Every token id of the tokenizer must index the model's embedding.
pub fn check_vocab(
    config: &Value,
    model: &str,
    tokenizer: &memfit_data::Tokenizer,
) -> Result<(), ModelSpecError> {
    let vocab = vocab_size(config).unwrap_or(0);
    if u64::from(tokenizer.max_id()) >= vocab {
        return Err(ModelSpecError::VocabMismatch {
            tokenizer: tokenizer.path().display().to_string(),
            max_id: tokenizer.max_id(),
            model: model.into(),
            vocab_size: vocab,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_files_and_unknown_names() {
        assert_eq!(
            vocab_size(&model_config("chatlm-mini", None).unwrap()),
            Some(29298)
        );
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("config.json");
        std::fs::write(&f, "{\"model_type\": \"t5\", \"vocab_size\": 10}").unwrap();
        assert_eq!(
            vocab_size(&model_config(f.to_str().unwrap(), None).unwrap()),
            Some(10)
        );
        assert_eq!(
            vocab_size(&model_config(dir.path().to_str().unwrap(), None).unwrap()),
            Some(10)
        );
        assert!(matches!(
            model_config("no-such-model", None),
            Err(ModelSpecError::Unknown { .. })
        ));
    }

    #[test]
    fn a_tokenizer_larger_than_the_model_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let files = crate::demo::seq2seq::write(dir.path(), 1).unwrap();
        let tok = memfit_data::Tokenizer::load(&files.tokenizer_dir).unwrap();
        let small = serde_json::json!({"vocab_size": 20});
        let err = check_vocab(&small, "tiny", &tok).unwrap_err().to_string();
        assert!(
            err.contains("ids up to 30") && err.contains("vocab_size 20"),
            "{err}"
        );
        check_vocab(&serde_json::json!({"vocab_size": 31}), "demo", &tok).unwrap();
    }
}
