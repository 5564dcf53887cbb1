//! The tokenizer as the loop needs it: encode rows (each ending in EOS, as the seed's dataset appends
//! `[EOS]`), decode generations for BLEU, the special ids, and the files a checkpoint carries.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("tokenizer {path}: {message}")]
    Load { path: String, message: String },
    #[error("tokenizer {path}: no {token} token (the trainer needs [PAD] and [EOS])")]
    MissingSpecial { path: String, token: &'static str },
    #[error("tokenizer: cannot encode {text:?}: {message}")]
    Encode { text: String, message: String },
}

/// Files of a Hugging Face tokenizer directory that are copied into every checkpoint.
pub const TOKENIZER_FILES: [&str; 3] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
];

/// Turns generated ids back into text (the seed decodes with `skip_special_tokens=True`).
pub trait TextDecoder {
    fn decode(&self, ids: &[u32]) -> String;
}

/// A loaded `tokenizer.json` and where it came from.
pub struct Text {
    tokenizer: tokenizers::Tokenizer,
    pub dir: PathBuf,
    pub pad_id: u32,
    pub eos_id: u32,
}

impl Text {
    /// Loads `dir/tokenizer.json` (or a `tokenizer.json` path) and finds `[PAD]` and `[EOS]`.
    pub fn load(path: &Path) -> Result<Self, TextError> {
        let (dir, file) = if path.is_dir() {
            (path.to_path_buf(), path.join("tokenizer.json"))
        } else {
            (
                path.parent().unwrap_or(Path::new(".")).to_path_buf(),
                path.to_path_buf(),
            )
        };
        let tokenizer = tokenizers::Tokenizer::from_file(&file).map_err(|e| TextError::Load {
            path: file.display().to_string(),
            message: e.to_string(),
        })?;
        let special = |token: &'static str| {
            tokenizer
                .token_to_id(token)
                .ok_or_else(|| TextError::MissingSpecial {
                    path: file.display().to_string(),
                    token,
                })
        };
        Ok(Self {
            pad_id: special("[PAD]")?,
            eos_id: special("[EOS]")?,
            tokenizer,
            dir,
        })
    }

    /// Vocabulary size including added tokens (what the model's embedding must cover).
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// Token ids of `text` followed by EOS.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TextError> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| TextError::Encode {
                text: text.chars().take(40).collect(),
                message: e.to_string(),
            })?;
        let mut ids = enc.get_ids().to_vec();
        ids.push(self.eos_id);
        Ok(ids)
    }

    /// The tokenizer files present in its directory (copied into checkpoints).
    pub fn files(&self) -> Vec<PathBuf> {
        TOKENIZER_FILES
            .iter()
            .map(|n| self.dir.join(n))
            .filter(|p| p.is_file())
            .collect()
    }
}

impl TextDecoder for Text {
    fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids, true).unwrap_or_default()
    }
}
