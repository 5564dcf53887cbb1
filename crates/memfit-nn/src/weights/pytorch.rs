//! `pytorch_model.bin`: the state dict `torch.save` writes (a zip of `data.pkl` and one storage per
//! tensor, or its pre-1.6 layouts), read through burn's `pytorch-reader`. The pickle is parsed as data,
//! never executed: only tensors, dicts and plain values are understood, and anything else is refused by
//! the reader. Tensors are read one at a time, as the safetensors reader does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pytorch_reader::{DType, PytorchReader, Tensor};
use safetensors::tensor::Dtype;

use super::read::{LoadedTensor, convert_into};
use crate::ModelError;

/// An opened PyTorch checkpoint whose pickle has been parsed; no tensor bytes read yet.
pub struct PytorchFile {
    path: PathBuf,
    tensors: BTreeMap<String, Tensor>,
}

impl PytorchFile {
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let reader = PytorchReader::new(path).map_err(|e| {
            ModelError::Format(format!(
                "{}: not a PyTorch checkpoint memfit can read: {e}",
                path.display()
            ))
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            tensors: reader.into_tensors().into_iter().collect(),
        })
    }

    /// Tensor names (the state dict's keys), sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.tensors.get(name).map(Tensor::shape)
    }

    /// Reads one tensor (F32, F16 or BF16) as f32.
    pub fn read(&self, name: &str) -> Result<LoadedTensor, ModelError> {
        let at = |what: String| format!("{}: tensor {name}: {what}", self.path.display());
        let tensor = self
            .tensors
            .get(name)
            .ok_or_else(|| ModelError::Format(at("no such tensor".into())))?;
        let dtype = match tensor.dtype() {
            DType::F32 => Dtype::F32,
            DType::F16 => Dtype::F16,
            DType::BF16 => Dtype::BF16,
            other => {
                return Err(ModelError::Format(at(format!(
                    "dtype {other:?} is not supported (F32, F16, BF16)"
                ))));
            }
        };
        // The reader hands back native-endian bytes, which convert_into reads as little-endian.
        const { assert!(cfg!(target_endian = "little")) };
        // The reader's error names the tensor and its storage.
        let bytes = tensor
            .read()
            .map_err(|e| ModelError::Format(format!("{}: {e}", self.path.display())))?;
        let mut values = Vec::with_capacity(tensor.num_elements());
        convert_into(dtype, &bytes, &mut values);
        Ok(LoadedTensor {
            shape: tensor.shape().to_vec(),
            values,
        })
    }
}
