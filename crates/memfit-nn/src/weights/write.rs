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
    let several_keys = metadata.as_ref().is_some_and(|m| m.len() > 1);
    safetensors::serialize_to_file(views, metadata, path)
        .map_err(|e| ModelError::Io(format!("{}: {e}", path.display())))?;
    if several_keys {
        sort_metadata(path).map_err(|e| ModelError::Io(format!("{}: {e}", path.display())))?;
    }
    Ok(())
}

/// Rewrites the header's `__metadata__` with its keys in sorted order, so the same tensors and metadata
/// give the same bytes (safetensors writes them in a HashMap's random order). The header keeps its
/// length (the same keys and values, reordered), so it is patched in place.
fn sort_metadata(path: &Path) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let mut n = [0u8; 8];
    file.read_exact(&mut n)?;
    let mut header = vec![0u8; u64::from_le_bytes(n) as usize];
    file.read_exact(&mut header)?;
    let mut value: serde_json::Value = serde_json::from_slice(&header)?;
    let Some(meta) = value
        .get_mut("__metadata__")
        .and_then(|m| m.as_object_mut())
    else {
        return Ok(());
    };
    let sorted: std::collections::BTreeMap<String, serde_json::Value> =
        std::mem::take(meta).into_iter().collect();
    meta.extend(sorted);
    let text = serde_json::to_vec(&value)?;
    let trimmed = header.trim_ascii_end().len();
    if text.len() != trimmed {
        return Ok(()); // not the layout expected: leave the (valid) file as it is
    }
    file.seek(SeekFrom::Start(8))?;
    file.write_all(&text)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_tensors_and_metadata_give_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let tensors = [NamedTensor {
            name: "w.exp_avg".into(),
            shape: vec![3],
            values: std::borrow::Cow::Owned(vec![1.0, 2.0, 3.0]),
            transpose: None,
        }];
        // Each HashMap has its own random order of the 4 keys: 16 files agreeing by chance: (1/24)^15.
        let files: Vec<Vec<u8>> = (0..16)
            .map(|i| {
                let meta: HashMap<String, String> = [
                    ("optimizer", "adamw"),
                    ("step", "12"),
                    ("lr", "0.001"),
                    ("zeta", "z"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
                let path = dir.path().join(format!("o{i}.safetensors"));
                write_f32(&path, &tensors, Some(meta)).unwrap();
                std::fs::read(&path).unwrap()
            })
            .collect();
        assert!(files.iter().all(|f| f == &files[0]));
        let st = safetensors::SafeTensors::deserialize(&files[0]).unwrap();
        assert_eq!(st.tensor("w.exp_avg").unwrap().shape(), &[3]);
        let (_, meta) = safetensors::SafeTensors::read_metadata(&files[0]).unwrap();
        let keys: Vec<_> = meta.metadata().as_ref().unwrap().keys().cloned().collect();
        assert_eq!(keys.len(), 4);
    }
}
