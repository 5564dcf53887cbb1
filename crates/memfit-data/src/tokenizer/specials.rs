//! Special tokens found by name: the transformers config files beside a `tokenizer.json` first
//! (`tokenizer_config.json`, then `special_tokens_map.json`), then the usual names of each role.
//! Ids are never assumed.

use super::SpecialToken;
use std::collections::BTreeMap;
use std::path::Path;

/// Names tried, in order, when the tokenizer's own config does not name the token.
/// Sources: ChatLM/BERT-style `[EOS]`/`[PAD]`, T5/BART `</s>`/`<pad>`, GPT-2 `<|endoftext|>`,
/// Gemma `<eos>`, Qwen `<|im_end|>`/`<|endoftext|>`, Llama 3 `<|begin_of_text|>`, BERT
/// `[CLS]`/`[SEP]`, RoBERTa `<s>`/`</s>`.
pub(super) const EOS_NAMES: &[&str] = &["[EOS]", "</s>", "<|endoftext|>", "<eos>", "<|im_end|>"];
pub(super) const PAD_NAMES: &[&str] = &["[PAD]", "<pad>", "<|pad|>", "<|endoftext|>"];
pub(super) const BOS_NAMES: &[&str] = &["<|begin_of_text|>", "<s>", "<bos>", "[BOS]"];
pub(super) const CLS_NAMES: &[&str] = &["[CLS]", "<s>"];
pub(super) const SEP_NAMES: &[&str] = &["[SEP]", "</s>"];

/// The config files that name special tokens, in the order transformers reads them.
const CONFIG_FILES: [&str; 2] = ["tokenizer_config.json", "special_tokens_map.json"];

/// The keys transformers passes to a chat template from its special tokens map.
const TEMPLATE_KEYS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// A role's token, or the names tried (for the error).
#[derive(Debug, Clone, Default)]
pub(super) struct Resolved {
    pub token: Option<SpecialToken>,
    pub tried: Vec<String>,
}

fn read_json(dir: &Path, file: &str) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join(file)).ok()?;
    serde_json::from_str(&text).ok()
}

/// `"eos_token": "[EOS]"` or `"eos_token": {"content": "[EOS]", ...}`.
fn token_name(json: &serde_json::Value, key: &str) -> Option<String> {
    match json.get(key)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// The config files of `dir`, parsed (missing or unreadable ones left out).
pub(super) fn config_files(dir: Option<&Path>) -> Vec<serde_json::Value> {
    dir.map(|d| {
        CONFIG_FILES
            .iter()
            .filter_map(|f| read_json(d, f))
            .collect()
    })
    .unwrap_or_default()
}

/// The token for `key` (e.g. `eos_token`): the configured name if the vocabulary has it, else the
/// first of `defaults` that it has.
pub(super) fn resolve(
    inner: &tokenizers::Tokenizer,
    configs: &[serde_json::Value],
    key: &str,
    defaults: &[&str],
) -> Resolved {
    let mut tried = Vec::new();
    let configured = configs.iter().filter_map(|c| token_name(c, key));
    for name in configured.chain(defaults.iter().map(|s| s.to_string())) {
        if let Some(id) = inner.token_to_id(&name) {
            return Resolved {
                token: Some(SpecialToken { token: name, id }),
                tried,
            };
        }
        if !tried.contains(&name) {
            tried.push(name);
        }
    }
    Resolved { token: None, tried }
}

/// What transformers passes to a chat template from the tokenizer's special tokens map:
/// `bos_token`, `eos_token`, … as configured (the first config file that names one wins), and
/// `additional_special_tokens` when configured.
pub(super) fn template_tokens(
    configs: &[serde_json::Value],
) -> BTreeMap<String, serde_json::Value> {
    let mut out = BTreeMap::new();
    for key in TEMPLATE_KEYS {
        if let Some(name) = configs.iter().find_map(|c| token_name(c, key)) {
            out.insert(key.to_string(), name.into());
        }
    }
    let additional = configs.iter().find_map(|c| {
        let list = c.get("additional_special_tokens")?.as_array()?;
        let names: Vec<serde_json::Value> = list
            .iter()
            .filter_map(|t| match t {
                serde_json::Value::String(s) => Some(s.clone().into()),
                serde_json::Value::Object(o) => o.get("content").cloned(),
                _ => None,
            })
            .collect();
        Some(serde_json::Value::Array(names))
    });
    if let Some(list) = additional {
        out.insert("additional_special_tokens".into(), list);
    }
    out
}
