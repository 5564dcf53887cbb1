//! Tokenizers: load any Hugging Face `tokenizer.json` ([`Tokenizer::load`]), find the special tokens a
//! format needs by name (never by a hard-coded id), train new ones ([`train`]), and save a copy that
//! transformers encodes as memfit trained ([`export`]: [`Tokenizer::json_appending_eos`]).

pub mod export;
mod specials;
pub mod train;

use crate::error::{DataError, Result};
use crate::hash::sha256_bytes;
use specials::Resolved;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
    eos: Resolved,
    pad: Resolved,
    bos: Resolved,
    cls: Resolved,
    sep: Resolved,
    /// What a chat template gets as `bos_token`, `eos_token`, … (transformers' special tokens map).
    template_tokens: BTreeMap<String, serde_json::Value>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.path)
            .field("sha256", &self.sha256)
            .field("eos", &self.eos.token)
            .field("pad", &self.pad.token)
            .finish()
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
        let mut inner =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| DataError::Tokenizer {
                path: file.clone(),
                reason: format!("not a Hugging Face tokenizer.json: {e}"),
            })?;
        // memfit counts and cuts tokens itself; a file's own truncation or padding would change
        // lengths behind its back (transformers turns them off per call in the same way).
        inner
            .with_truncation(None)
            .map_err(|e| DataError::Tokenizer {
                path: file.clone(),
                reason: e.to_string(),
            })?
            .with_padding(None);
        let configs = specials::config_files(dir.as_deref());
        let resolve = |key, names| specials::resolve(&inner, &configs, key, names);
        Ok(Tokenizer {
            eos: resolve("eos_token", specials::EOS_NAMES),
            pad: resolve("pad_token", specials::PAD_NAMES),
            bos: resolve("bos_token", specials::BOS_NAMES),
            cls: resolve("cls_token", specials::CLS_NAMES),
            sep: resolve("sep_token", specials::SEP_NAMES),
            template_tokens: specials::template_tokens(&configs),
            path: file,
            sha256: sha256_bytes(&bytes),
            inner,
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

    /// The directory the `tokenizer.json` is in (where its config files and chat template are).
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    pub fn eos(&self) -> Option<&SpecialToken> {
        self.eos.token.as_ref()
    }

    pub fn pad(&self) -> Option<&SpecialToken> {
        self.pad.token.as_ref()
    }

    /// The beginning-of-sequence token (Llama's `<|begin_of_text|>`), when it has one.
    pub fn bos(&self) -> Option<&SpecialToken> {
        self.bos.token.as_ref()
    }

    /// The classifier token BERT puts first (`[CLS]`; RoBERTa `<s>`).
    pub fn cls(&self) -> Option<&SpecialToken> {
        self.cls.token.as_ref()
    }

    /// The separator BERT puts last (`[SEP]`; RoBERTa `</s>`).
    pub fn sep(&self) -> Option<&SpecialToken> {
        self.sep.token.as_ref()
    }

    /// The special tokens a chat template gets as variables (`bos_token`, `eos_token`, …), as
    /// the config files name them.
    pub fn template_tokens(&self) -> &BTreeMap<String, serde_json::Value> {
        &self.template_tokens
    }

    /// The EOS token, or an error naming what was looked for and which format needs it.
    pub fn require_eos(&self, format: &'static str) -> Result<&SpecialToken> {
        self.require(&self.eos, "EOS", format)
    }

    /// The PAD token, or an error naming what was looked for and which format needs it.
    pub fn require_pad(&self, format: &'static str) -> Result<&SpecialToken> {
        self.require(&self.pad, "PAD", format)
    }

    /// The CLS token, or an error naming what was looked for and which format needs it.
    pub fn require_cls(&self, format: &'static str) -> Result<&SpecialToken> {
        self.require(&self.cls, "CLS", format)
    }

    /// The SEP token, or an error naming what was looked for and which format needs it.
    pub fn require_sep(&self, format: &'static str) -> Result<&SpecialToken> {
        self.require(&self.sep, "SEP", format)
    }

    fn require<'a>(
        &self,
        resolved: &'a Resolved,
        role: &'static str,
        format: &'static str,
    ) -> Result<&'a SpecialToken> {
        resolved
            .token
            .as_ref()
            .ok_or_else(|| DataError::MissingSpecialToken {
                path: self.path.clone(),
                role,
                tried: resolved.tried.join(", "),
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

    pub(crate) fn encode_error(&self, e: tokenizers::Error) -> DataError {
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
