//! Text as the loop needs it: decoding generated ids for BLEU, and the tokenizer files every
//! checkpoint carries. Loading and encoding are memfit-data's ([`memfit_data::Tokenizer`]).

use std::path::{Path, PathBuf};

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

impl TextDecoder for memfit_data::Tokenizer {
    fn decode(&self, ids: &[u32]) -> String {
        memfit_data::Tokenizer::decode(self, ids).unwrap_or_default()
    }
}

/// The tokenizer files present beside `tokenizer_json` (copied into checkpoints).
pub fn tokenizer_files(tokenizer_json: &Path) -> Vec<PathBuf> {
    let dir = tokenizer_json.parent().unwrap_or(Path::new("."));
    TOKENIZER_FILES
        .iter()
        .map(|n| dir.join(n))
        .filter(|p| p.is_file())
        .collect()
}
