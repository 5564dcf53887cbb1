//! A Hugging Face model directory's weights as one set of names: `model.safetensors`, or the shards
//! that `model.safetensors.index.json` lists (its `weight_map`, as transformers writes it). A family
//! takes the tensors it knows by name; what is left over is reported or refused by the family.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::read::{LoadedTensor, SafetensorsFile};
use crate::ModelError;

const SINGLE: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";

/// The weights of one model directory (or one file), read tensor by tensor.
pub struct HfWeights {
    source: PathBuf,
    files: Vec<SafetensorsFile>,
    /// Tensor name → index into `files`.
    by_name: BTreeMap<String, usize>,
    taken: BTreeSet<String>,
}

impl HfWeights {
    /// `dir/model.safetensors`, or the shards of `dir/model.safetensors.index.json`.
    pub fn open_dir(dir: &Path) -> Result<Self, ModelError> {
        let index = dir.join(INDEX);
        if index.is_file() {
            return Self::open_sharded(&index);
        }
        let single = dir.join(SINGLE);
        if single.is_file() {
            return Self::open_file(&single);
        }
        let hint = if dir.join("pytorch_model.bin").exists() {
            " (pytorch_model.bin is a pickle, which memfit does not read: save the model with \
             `save_pretrained(dir, safe_serialization=True)`)"
        } else {
            ""
        };
        Err(ModelError::Io(format!(
            "{}: no {SINGLE} or {INDEX}{hint}",
            dir.display()
        )))
    }

    /// One safetensors file.
    pub fn open_file(path: &Path) -> Result<Self, ModelError> {
        let file = SafetensorsFile::open(path)?;
        let by_name = file.names().map(|n| (n.to_string(), 0)).collect();
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
                    files.push(SafetensorsFile::open(&dir.join(shard))?);
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
