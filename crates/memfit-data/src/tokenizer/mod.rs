//! Tokenizers: load any Hugging Face `tokenizer.json` ([`Tokenizer::load`]), find the special tokens a
//! format needs by name (never by a hard-coded id), train new ones ([`train`]), and save a copy that
//! transformers encodes as memfit trained ([`export`]: [`Tokenizer::json_appending_eos`]).

pub mod export;
pub mod train;

use crate::error::{DataError, Result};
use crate::hash::sha256_bytes;
use std::path::{Path, PathBuf};

/// Names tried, in order, when the tokenizer's own config does not name the token.
/// Sources: ChatLM/BERT-style `[EOS]`/`[PAD]`, T5/BART `</s>`/`<pad>`, GPT-2 `<|endoftext|>`,
/// Gemma `<eos>`, Qwen `<|im_end|>`/`<|endoftext|>`.
const EOS_NAMES: &[&str] = &["[EOS]", "</s>", "<|endoftext|>", "<eos>", "<|im_end|>"];
const PAD_NAMES: &[&str] = &["[PAD]", "<pad>", "<|pad|>", "<|endoftext|>"];

/// A special token and its id in this tokenizer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SpecialToken {
    pub token: String,
    pub id: u32,
}

/// A loaded tokenizer with its content hash and resolved special tokens.
pub struct Tokenizer {
    path: PathBuf,
    sha256: String,
    inner: tokenizers::Tokenizer,
    eos: Option<SpecialToken>,
    pad: Option<SpecialToken>,
    eos_tried: Vec<String>,
    pad_tried: Vec<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.path)
            .field("sha256", &self.sha256)
            .field("eos", &self.eos)
            .field("pad", &self.pad)
            .finish()
    }
}

/// `"eos_token": "[EOS]"` or `"eos_token": {"content": "[EOS]", ...}` in a transformers config file.
fn configured_token(dir: &Path, file: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(file)).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    match json.get(key)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

impl Tokenizer {
    /// Loads `path`: a `tokenizer.json`, or a directory holding one (its `tokenizer_config.json` /
    /// `special_tokens_map.json`, when present, name the EOS and PAD tokens).
    pub fn load(path: &Path) -> Result<Self> {
        let (file, dir) = if path.is_dir() {
            (path.join("tokenizer.json"), Some(path.to_path_buf()))
        } else {
            (path.to_path_buf(), path.parent().map(Path::to_path_buf))
        };
        let bytes = std::fs::read(&file).map_err(|e| DataError::read(&file, e))?;
        let inner =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| DataError::Tokenizer {
                path: file.clone(),
                reason: format!("not a Hugging Face tokenizer.json: {e}"),
            })?;
        let resolve = |key: &str, defaults: &[&str]| -> (Option<SpecialToken>, Vec<String>) {
            let mut tried = Vec::new();
            if let Some(dir) = &dir {
                for cfg in ["tokenizer_config.json", "special_tokens_map.json"] {
                    if let Some(name) = configured_token(dir, cfg, key) {
                        if let Some(id) = inner.token_to_id(&name) {
                            return (Some(SpecialToken { token: name, id }), tried);
                        }
                        tried.push(name);
                    }
                }
            }
            for name in defaults {
                if let Some(id) = inner.token_to_id(name) {
                    return (
                        Some(SpecialToken {
                            token: name.to_string(),
                            id,
                        }),
                        tried,
                    );
                }
                tried.push(name.to_string());
            }
            (None, tried)
        };
        let (eos, eos_tried) = resolve("eos_token", EOS_NAMES);
        let (pad, pad_tried) = resolve("pad_token", PAD_NAMES);
        Ok(Tokenizer {
            path: file,
            sha256: sha256_bytes(&bytes),
            inner,
            eos,
            pad,
            eos_tried,
            pad_tried,
        })
    }

    /// The `tokenizer.json` this was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// SHA-256 of the `tokenizer.json` bytes.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The largest id any token has (ids need not be dense).
    pub fn max_id(&self) -> u32 {
        self.inner
            .get_vocab(true)
            .values()
            .copied()
            .max()
            .unwrap_or(0)
    }

    pub fn eos(&self) -> Option<&SpecialToken> {
        self.eos.as_ref()
    }

    pub fn pad(&self) -> Option<&SpecialToken> {
        self.pad.as_ref()
    }

    /// The EOS token, or an error naming what was looked for and which format needs it.
    pub fn require_eos(&self, format: &'static str) -> Result<&SpecialToken> {
        self.eos
            .as_ref()
            .ok_or_else(|| DataError::MissingSpecialToken {
                path: self.path.clone(),
                role: "EOS",
                tried: self.eos_tried.join(", "),
                format,
            })
    }

    /// The PAD token, or an error naming what was looked for and which format needs it.
    pub fn require_pad(&self, format: &'static str) -> Result<&SpecialToken> {
        self.pad
            .as_ref()
            .ok_or_else(|| DataError::MissingSpecialToken {
                path: self.path.clone(),
                role: "PAD",
                tried: self.pad_tried.join(", "),
                format,
            })
    }

    /// Token ids of `text` without the tokenizer's post-processor specials (callers append EOS by id).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| self.encode_error(e))
    }

    /// [`Tokenizer::encode`] for many texts at once (parallel over the available cores).
    pub fn encode_batch(
        &self,
        texts: Vec<String>,
        add_special_tokens: bool,
    ) -> Result<Vec<Vec<u32>>> {
        self.inner
            .encode_batch(texts, add_special_tokens)
            .map(|encs| encs.into_iter().map(|e| e.get_ids().to_vec()).collect())
            .map_err(|e| self.encode_error(e))
    }

    fn encode_error(&self, e: tokenizers::Error) -> DataError {
        DataError::Tokenizer {
            path: self.path.clone(),
            reason: format!("encoding failed: {e}"),
        }
    }

    /// Text of `ids` (specials skipped).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| self.encode_error(e))
    }
}
