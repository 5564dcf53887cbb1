//! Reading and writing named f32 tensors as safetensors (model weights and optimizer state).
//! Writes go to a temporary file renamed into place (safetensors' `serialize_to_file` does this).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors};

use crate::model::ModelError;

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
            Some([rows, cols]) => crate::model::transpose(values, rows, cols)
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

/// A tensor read back as f32.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedTensor {
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// Tensors by name, and the file's string metadata.
pub type TensorsAndMetadata = (BTreeMap<String, LoadedTensor>, HashMap<String, String>);

/// Reads every tensor of a safetensors file (F32 or BF16) as f32, plus the file's metadata.
pub fn read_f32(path: &Path) -> Result<TensorsAndMetadata, ModelError> {
    let file = std::fs::File::open(path)
        .map_err(|e| ModelError::Io(format!("{}: {e}", path.display())))?;
    // SAFETY: the file is opened read-only and only read while mapped; a concurrent writer would
    // replace it by rename (safetensors' own writer does), which leaves this mapping intact.
    let map = unsafe { memmap2::Mmap::map(&file) }
        .map_err(|e| ModelError::Io(format!("{}: {e}", path.display())))?;
    let (_, meta) = SafeTensors::read_metadata(&map)
        .map_err(|e| ModelError::Format(format!("{}: {e}", path.display())))?;
    let metadata = meta.metadata().clone().unwrap_or_default();
    let st = SafeTensors::deserialize(&map)
        .map_err(|e| ModelError::Format(format!("{}: {e}", path.display())))?;
    let mut out = BTreeMap::new();
    for (name, view) in st.iter() {
        let data = view.data();
        let values: Vec<f32> = match view.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            // bf16 is the upper half of an f32.
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
                .collect(),
            other => {
                return Err(ModelError::Format(format!(
                    "{}: tensor {name}: dtype {other:?} is not supported (F32, BF16)",
                    path.display()
                )));
            }
        };
        out.insert(
            name.to_string(),
            LoadedTensor {
                shape: view.shape().to_vec(),
                values,
            },
        );
    }
    Ok((out, metadata))
}
