//! Writing named f32 tensors as safetensors, one tensor's bytes at a time (model weights and
//! optimizer state). safetensors' `serialize_to_file` writes a temporary file renamed into place.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::Dtype;

use crate::ModelError;

/// One tensor to write: name, shape and row-major values.
pub struct NamedTensor<'a> {
    pub name: String,
    pub shape: Vec<usize>,
    pub values: std::borrow::Cow<'a, [f32]>,
    /// `Some([rows, cols])`: `values` are stored `[rows, cols]` and written transposed (`[cols, rows]`,
    /// which `shape` names) — memfit keeps linear weights `[in, out]`, transformers `[out, in]`.
    pub transpose: Option<[usize; 2]>,
}

/// A tensor serialised only when the writer reaches it, so a file never needs a second copy of
/// everything in memory: at most one tensor's bytes at a time.
struct LazyF32<'t, 'a> {
    tensor: &'t NamedTensor<'a>,
}

impl safetensors::View for LazyF32<'_, '_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        &self.tensor.shape
    }

    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        let values = &self.tensor.values;
        let bytes = match self.tensor.transpose {
            Some([rows, cols]) => super::transpose(values, rows, cols)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            None => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        std::borrow::Cow::Owned(bytes)
    }

    fn data_len(&self) -> usize {
        self.tensor.values.len() * 4
    }
}

/// Writes `tensors` (f32, little-endian) with optional string metadata, one tensor's bytes at a time.
pub fn write_f32(
    path: &Path,
    tensors: &[NamedTensor<'_>],
    metadata: Option<HashMap<String, String>>,
) -> Result<(), ModelError> {
    for t in tensors {
        let expected: usize = t.shape.iter().product();
        if expected != t.values.len() {
            return Err(ModelError::Io(format!(
                "{}: tensor {}: shape {:?} holds {expected} values, got {}",
                path.display(),
                t.name,
                t.shape,
                t.values.len()
            )));
        }
    }
    let views = tensors
        .iter()
        .map(|t| (t.name.clone(), LazyF32 { tensor: t }));
    safetensors::serialize_to_file(views, metadata, path)
        .map_err(|e| ModelError::Io(format!("{}: {e}", path.display())))
}
