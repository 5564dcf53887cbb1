//! A Hugging Face model directory's weights as one set of names: `model.safetensors`, or the shards
//! that `model.safetensors.index.json` lists (its `weight_map`, as transformers writes it); without
//! safetensors, `pytorch_model.bin` or the shards of `pytorch_model.bin.index.json` (read as data
//! through burn's PyTorch reader, never run). A family takes the tensors it knows by name; what is
//! left over is reported or refused by the family.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::pytorch::PytorchFile;
use super::read::{LoadedTensor, SafetensorsFile};
use crate::ModelError;

/// Where a directory's weights may lie, in the order transformers looks: (single file, shard index).
const LAYOUTS: [(&str, &str); 2] = [
    ("model.safetensors", "model.safetensors.index.json"),
    ("pytorch_model.bin", "pytorch_model.bin.index.json"),
];

/// One weights file, in either format.
enum WeightFile {
    Safetensors(SafetensorsFile),
    Pytorch(PytorchFile),
}

impl WeightFile {
    /// A `.bin` (or `.pt`/`.pth`) file is a PyTorch checkpoint; anything else is read as safetensors.
    fn open(path: &Path) -> Result<Self, ModelError> {
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        if matches!(ext, "bin" | "pt" | "pth") {
            PytorchFile::open(path).map(Self::Pytorch)
        } else {
            SafetensorsFile::open(path).map(Self::Safetensors)
        }
    }

    fn names(&self) -> Vec<String> {
        match self {
            Self::Safetensors(f) => f.names().map(str::to_string).collect(),
            Self::Pytorch(f) => f.names().map(str::to_string).collect(),
        }
    }

    fn shape(&self, name: &str) -> Option<&[usize]> {
        match self {
            Self::Safetensors(f) => f.shape(name),
            Self::Pytorch(f) => f.shape(name),
        }
    }

    fn read(&self, name: &str) -> Result<LoadedTensor, ModelError> {
        match self {
            Self::Safetensors(f) => f.read(name),
            Self::Pytorch(f) => f.read(name),
        }
    }
}

/// The weights of one model directory (or one file), read tensor by tensor.
pub struct HfWeights {
    source: PathBuf,
    files: Vec<WeightFile>,
    /// Tensor name → index into `files`.
    by_name: BTreeMap<String, usize>,
    taken: BTreeSet<String>,
}

impl HfWeights {
    /// `dir/model.safetensors` or the shards of `dir/model.safetensors.index.json`; failing both,
    /// `dir/pytorch_model.bin` or the shards of `dir/pytorch_model.bin.index.json`.
    pub fn open_dir(dir: &Path) -> Result<Self, ModelError> {
        for (single, index) in LAYOUTS {
            let (single, index) = (dir.join(single), dir.join(index));
            if index.is_file() {
                return Self::open_sharded(&index);
            }
            if single.is_file() {
                return Self::open_file(&single);
            }
        }
        let names: Vec<&str> = LAYOUTS.iter().flat_map(|&(s, i)| [s, i]).collect();
        Err(ModelError::Io(format!(
            "{}: no {}",
            dir.display(),
            names.join(", ")
        )))
    }

    /// One weights file: safetensors, or a PyTorch checkpoint (`.bin`, `.pt`, `.pth`).
    pub fn open_file(path: &Path) -> Result<Self, ModelError> {
        let file = WeightFile::open(path)?;
        let by_name = file.names().into_iter().map(|n| (n, 0)).collect();
        Ok(Self {
            source: path.to_path_buf(),
            files: vec![file],
            by_name,
            taken: BTreeSet::new(),
        })
    }

    fn open_sharded(index: &Path) -> Result<Self, ModelError> {
        let bad = |what: String| ModelError::Format(format!("{}: {what}", index.display()));
        let text = std::fs::read_to_string(index)
            .map_err(|e| ModelError::Io(format!("{}: {e}", index.display())))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| bad("no \"weight_map\" object".into()))?;
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut shard_of: BTreeMap<String, usize> = BTreeMap::new();
        let (mut files, mut by_name) = (Vec::new(), BTreeMap::new());
        for (name, shard) in map {
            let shard = shard
                .as_str()
                .ok_or_else(|| bad(format!("weight_map[{name:?}] is not a file name")))?;
            let i = match shard_of.get(shard) {
                Some(&i) => i,
                None => {
                    files.push(WeightFile::open(&dir.join(shard))?);
                    shard_of.insert(shard.to_string(), files.len() - 1);
                    files.len() - 1
                }
            };
            if files[i].shape(name).is_none() {
                return Err(bad(format!(
                    "weight_map puts {name} in {shard}, which has no such tensor"
                )));
            }
            by_name.insert(name.clone(), i);
        }
        Ok(Self {
            source: index.to_path_buf(),
            files,
            by_name,
            taken: BTreeSet::new(),
        })
    }

    /// The file or index the weights come from (for messages).
    pub fn source(&self) -> &Path {
        &self.source
    }

    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.files[*self.by_name.get(name)?].shape(name)
    }

    /// Reads `name` as f32 and marks it used; `None` when the weights have no such tensor.
    pub fn take(&mut self, name: &str) -> Result<Option<LoadedTensor>, ModelError> {
        let Some(&i) = self.by_name.get(name) else {
            return Ok(None);
        };
        self.taken.insert(name.to_string());
        self.files[i].read(name).map(Some)
    }

    /// Reads `name` and checks its shape; a missing tensor or another shape is an error naming both.
    pub fn take_shaped(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        let source = self.source.display().to_string();
        let t = self
            .take(name)?
            .ok_or_else(|| ModelError::Format(format!("{source}: tensor {name} is missing")))?;
        if t.shape != shape {
            return Err(ModelError::Format(format!(
                "{source}: tensor {name} has shape {:?}, the config needs {shape:?}",
                t.shape
            )));
        }
        Ok(t.values)
    }

    /// Names not taken so far, sorted.
    pub fn untaken(&self) -> Vec<String> {
        self.by_name
            .keys()
            .filter(|n| !self.taken.contains(*n))
            .cloned()
            .collect()
    }
}

/// What loading pretrained weights did besides copying them, as transformers reports it: parameters
/// the checkpoint lacks that were initialised (a new head), and tensors it holds that the model does
/// not use (pretraining heads, tied aliases).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadReport {
    pub initialised: Vec<String>,
    pub unused: Vec<String>,
}
