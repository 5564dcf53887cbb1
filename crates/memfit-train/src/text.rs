//! Text as the loop needs it: decoding generated ids for BLEU, and the tokenizer files every
//! checkpoint carries. Loading and encoding are memfit-data's ([`memfit_data::Tokenizer`]).

use memfit_data::{DataError, Tokenizer};

/// transformers' tokenizer configuration files, copied into checkpoints from beside the run's
/// `tokenizer.json` (which itself is rewritten: [`checkpoint_tokenizer_files`]).
pub const TOKENIZER_CONFIG_FILES: [&str; 3] = [
    "tokenizer_config.json",
    "special_tokens_map.json",
    // transformers 5 writes a tokenizer's chat template here
    "chat_template.jinja",
];

/// Turns generated ids back into text (the seed decodes with `skip_special_tokens=True`).
/// `Sync`: tasks that hold one are shared with the loop's read-ahead thread.
pub trait TextDecoder: Sync {
    fn decode(&self, ids: &[u32]) -> String;
}

impl TextDecoder for memfit_data::Tokenizer {
    fn decode(&self, ids: &[u32]) -> String {
        memfit_data::Tokenizer::decode(self, ids).unwrap_or_default()
    }
}

/// A file a checkpoint carries beside the weights: its name in the checkpoint and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointFile {
    pub name: &'static str,
    pub bytes: Vec<u8>,
}

/// The tokenizer files of a checkpoint, made so that transformers' `AutoTokenizer` encodes a text into
/// exactly the ids training read for it: `tokenizer.json` appends `eos_id` (the store's EOS, which
/// memfit-data appends to every segment) through its post-processor; `tokenizer_config.json` and
/// `special_tokens_map.json` are those beside the run's tokenizer, and where it has no
/// `tokenizer_config.json` one naming `PreTrainedTokenizerFast` is written.
pub fn checkpoint_tokenizer_files(
    tokenizer: &Tokenizer,
    eos_id: u32,
) -> Result<Vec<CheckpointFile>, DataError> {
    let json = tokenizer.json_appending_eos(eos_id)?.into_bytes();
    tokenizer_files(tokenizer, json)
}

/// The tokenizer files of a checkpoint whose data the tokenizer encoded as it is (classification:
/// the tokenizer's own post-processor adds the specials): its `tokenizer.json` unchanged, and the
/// config files as [`checkpoint_tokenizer_files`] writes them.
pub fn unchanged_tokenizer_files(tokenizer: &Tokenizer) -> Result<Vec<CheckpointFile>, DataError> {
    let path = tokenizer.path().to_path_buf();
    let json = std::fs::read(&path).map_err(|source| DataError::Read { path, source })?;
    tokenizer_files(tokenizer, json)
}

/// `tokenizer.json` (these bytes) and the config files from beside the run's tokenizer.
fn tokenizer_files(tokenizer: &Tokenizer, json: Vec<u8>) -> Result<Vec<CheckpointFile>, DataError> {
    let mut files = vec![CheckpointFile {
        name: "tokenizer.json",
        bytes: json,
    }];
    let dir = tokenizer
        .path()
        .parent()
        .unwrap_or(std::path::Path::new("."));
    for name in TOKENIZER_CONFIG_FILES {
        let path = dir.join(name);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(DataError::Read { path, source: e });
            }
            Err(_) if name == "tokenizer_config.json" => {
                tokenizer.transformers_config().into_bytes()
            }
            Err(_) => continue,
        };
        files.push(CheckpointFile { name, bytes });
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A word-level tokenizer: [PAD]=0 [EOS]=1 [UNK]=2, then `a`=3, `b`=4.
    fn tokenizer(dir: &Path) -> Tokenizer {
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "unk_token": "[UNK]",
                      "vocab": {"[PAD]": 0, "[EOS]": 1, "[UNK]": 2, "a": 3, "b": 4}}
        });
        std::fs::write(dir.join("tokenizer.json"), json.to_string()).unwrap();
        Tokenizer::load(dir).unwrap()
    }

    fn names(files: &[CheckpointFile]) -> Vec<&str> {
        files.iter().map(|f| f.name).collect()
    }

    #[test]
    fn a_bare_tokenizer_gets_a_transformers_config_and_an_eos_post_processor() {
        let dir = tempfile::tempdir().unwrap();
        let files = checkpoint_tokenizer_files(&tokenizer(dir.path()), 1).unwrap();
        assert_eq!(names(&files), ["tokenizer.json", "tokenizer_config.json"]);
        let saved = tokenizers::Tokenizer::from_bytes(&files[0].bytes).unwrap();
        assert_eq!(saved.encode("a b", true).unwrap().get_ids(), [3, 4, 1]);
        let config = String::from_utf8(files[1].bytes.clone()).unwrap();
        assert!(config.contains("PreTrainedTokenizerFast"), "{config}");
    }

    #[test]
    fn configs_beside_the_tokenizer_are_carried_as_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let tok = tokenizer(dir.path());
        std::fs::write(dir.path().join("tokenizer_config.json"), b"{\"mine\": 1}").unwrap();
        std::fs::write(dir.path().join("special_tokens_map.json"), b"{}").unwrap();
        let files = checkpoint_tokenizer_files(&tok, 1).unwrap();
        assert_eq!(
            names(&files),
            [
                "tokenizer.json",
                "tokenizer_config.json",
                "special_tokens_map.json"
            ]
        );
        assert_eq!(files[1].bytes, b"{\"mine\": 1}");
    }
}
