//! Named tensors in safetensors files with Hugging Face names: writing (`write`), reading any file
//! tensor by tensor without mapping it whole (`read`), and a Hugging Face model directory, single file
//! or sharded, as one set of names (`hf_dir`).

mod hf_dir;
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
