//! Named tensors in safetensors files with Hugging Face names: writing (`write`), reading any file
//! tensor by tensor without mapping it whole (`read`), PyTorch's `pytorch_model.bin` (`pytorch`), and a
//! Hugging Face model directory, single file or sharded, as one set of names (`hf_dir`); LoRA adapters
//! as PEFT writes them (`peft`).

mod hf_dir;
pub mod peft;
mod pytorch;
mod read;
mod write;

pub use hf_dir::{HfWeights, LoadReport};
pub use read::{LoadedTensor, SafetensorsFile, TensorsAndMetadata, read_f32};
pub use write::{NamedTensor, write_f32};

use std::path::Path;

use crate::ModelError;

/// `[rows, cols]` → `[cols, rows]`.
pub fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; values.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = values[r * cols + c];
        }
    }
    out
}

/// Writes `bytes` to a sibling temporary file and renames it over `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ModelError> {
    let tmp = path.with_extension("tmp-write");
    std::fs::write(&tmp, bytes)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|e| ModelError::Io(format!("{}: {e}", path.display())))
}

/// Writes a Hugging Face model directory: `config.json` (pretty-printed) and `model.safetensors`
/// (f32, with the `format: pt` metadata transformers writes), each atomically.
pub fn save_hf_dir(
    dir: &Path,
    config: &serde_json::Value,
    tensors: &[NamedTensor],
) -> Result<(), ModelError> {
    let path = dir.join("config.json");
    let text = serde_json::to_string_pretty(config)
        .map_err(|e| ModelError::Io(format!("{}: {e}", path.display())))?;
    write_atomic(&path, text.as_bytes())?;
    let metadata = [("format".to_string(), "pt".to_string())]
        .into_iter()
        .collect();
    write_f32(&dir.join("model.safetensors"), tensors, Some(metadata))
}

/// Reads the `config.json` at `path` and parses it with `parse`; configuration errors name the file.
pub fn read_config<T>(
    path: &Path,
    parse: impl FnOnce(&serde_json::Value) -> Result<T, ModelError>,
) -> Result<T, ModelError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ModelError::Io(format!("{}: {e}", path.display())))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ModelError::Config(format!("{}: {e}", path.display())))?;
    parse(&value).map_err(|e| match e {
        ModelError::Config(m) => ModelError::Config(format!("{}: {m}", path.display())),
        other => other,
    })
}

/// A config's size fields that must be positive: the first that is 0 is an error naming it.
pub fn require_positive(fields: &[(&str, usize)]) -> Result<(), ModelError> {
    match fields.iter().find(|(_, v)| *v == 0) {
        Some((name, _)) => Err(ModelError::Config(format!("{name}: must be > 0"))),
        None => Ok(()),
    }
}
