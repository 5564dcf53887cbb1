//! Reading safetensors tensor by tensor with positioned reads into f32 buffers. A mapped file's pages
//! count in the process's RSS once touched, so reading a mapped checkpoint whole held it twice (the
//! file's pages and the f32 copies); here only the header is parsed and each tensor goes from the file
//! straight into its buffer through a small staging chunk, so loading peaks at the loaded size.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use burn::tensor::{bf16, f16};
use safetensors::tensor::{Dtype, Metadata};

use crate::ModelError;

/// A tensor read back as f32.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedTensor {
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// Tensors by name, and the file's string metadata.
pub type TensorsAndMetadata = (BTreeMap<String, LoadedTensor>, HashMap<String, String>);

/// Where one tensor lies in its file.
#[derive(Debug, Clone)]
struct Entry {
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte offsets in the file.
    start: u64,
    end: u64,
}

/// An open safetensors file whose header has been read and checked against the file's length.
pub struct SafetensorsFile {
    path: PathBuf,
    file: File,
    entries: BTreeMap<String, Entry>,
    metadata: HashMap<String, String>,
}

/// Values staged per read: 1 MiB, so converting f16/bf16 never holds a second copy of a tensor.
const STAGE_BYTES: usize = 1 << 20;

impl SafetensorsFile {
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let io = |e: std::io::Error| ModelError::Io(format!("{}: {e}", path.display()));
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let bad = |what: String| ModelError::Format(format!("{}: {what}", path.display()));
        let mut n = [0u8; 8];
        file.read_exact_at(&mut n, 0).map_err(|_| {
            bad("not a safetensors file (shorter than its 8-byte header length)".into())
        })?;
        let header_len = u64::from_le_bytes(n);
        if header_len > len.saturating_sub(8) {
            return Err(bad(format!(
                "header of {header_len} bytes does not fit the file's {len} bytes (truncated or not safetensors)"
            )));
        }
        let mut header = vec![0u8; 8 + header_len as usize];
        file.read_exact_at(&mut header, 0).map_err(io)?;
        let metadata = parse_header(&header, len).map_err(bad)?;
        let data_start = 8 + header_len;
        let entries = metadata
            .tensors()
            .into_iter()
            .map(|(name, info)| {
                let entry = Entry {
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start: data_start + info.data_offsets.0 as u64,
                    end: data_start + info.data_offsets.1 as u64,
                };
                (name, entry)
            })
            .collect();
        Ok(Self {
            path: path.to_path_buf(),
            file,
            entries,
            metadata: metadata.metadata().clone().unwrap_or_default(),
        })
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.entries.get(name).map(|e| e.shape.as_slice())
    }

    /// Reads one tensor (F32, F16 or BF16) as f32.
    pub fn read(&self, name: &str) -> Result<LoadedTensor, ModelError> {
        let entry = self.entries.get(name).ok_or_else(|| {
            ModelError::Format(format!("{}: no tensor {name}", self.path.display()))
        })?;
        let width = match entry.dtype {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
            other => {
                return Err(ModelError::Format(format!(
                    "{}: tensor {name}: dtype {other:?} is not supported (F32, F16, BF16)",
                    self.path.display()
                )));
            }
        };
        let count = ((entry.end - entry.start) / width) as usize;
        let mut values = Vec::with_capacity(count);
        let mut stage = vec![0u8; STAGE_BYTES.min(count * width as usize)];
        let mut at = entry.start;
        while at < entry.end {
            let take = (stage.len() as u64).min(entry.end - at) as usize;
            let chunk = &mut stage[..take];
            self.file.read_exact_at(chunk, at).map_err(|e| {
                ModelError::Io(format!("{}: tensor {name}: {e}", self.path.display()))
            })?;
            convert_into(entry.dtype, chunk, &mut values);
            at += take as u64;
        }
        Ok(LoadedTensor {
            shape: entry.shape.clone(),
            values,
        })
    }
}

/// The header's tensors, validated as safetensors validates them (offsets contiguous, sizes matching
/// dtype × shape), and the data ending exactly at the end of the file: a truncated file fails here.
fn parse_header(header: &[u8], file_len: u64) -> Result<Metadata, String> {
    let text =
        std::str::from_utf8(&header[8..]).map_err(|e| format!("header is not UTF-8: {e}"))?;
    let metadata: Metadata =
        serde_json::from_str(text.trim_end()).map_err(|e| format!("bad header: {e}"))?;
    let held = file_len - header.len() as u64;
    if metadata.data_len() as u64 != held {
        return Err(format!(
            "the header describes {} bytes of tensor data, the file holds {held} (truncated or corrupt)",
            metadata.data_len()
        ));
    }
    Ok(metadata)
}

/// Appends `bytes` (little-endian values of `dtype`) to `out` as f32.
pub(super) fn convert_into(dtype: Dtype, bytes: &[u8], out: &mut Vec<f32>) {
    match dtype {
        Dtype::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        Dtype::BF16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()),
        ),
        Dtype::F16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()),
        ),
        _ => unreachable!("dtype checked by the caller"),
    }
}

/// Reads every tensor of a safetensors file (F32, F16 or BF16) as f32, plus the file's metadata.
pub fn read_f32(path: &Path) -> Result<TensorsAndMetadata, ModelError> {
    let file = SafetensorsFile::open(path)?;
    let mut out = BTreeMap::new();
    for name in file.names() {
        out.insert(name.to_string(), file.read(name)?);
    }
    Ok((out, file.metadata.clone()))
}
