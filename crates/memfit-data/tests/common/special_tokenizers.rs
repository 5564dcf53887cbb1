//! Tokenizers with the post-processors and special tokens of real model families, built as
//! `tokenizer.json` files so that nothing needs a download: a WordLevel vocabulary with BERT's or
//! RoBERTa's post-processor (classification), and a byte-level BPE (GPT-2/Qwen/Llama 3's model)
//! with added special tokens and an optional chat template (causal-LM).
#![allow(dead_code)]

use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// Classification vocabulary: these specials, then word `wK` at `CLS_FIRST_WORD + K`.
pub const CLS_PAD: u32 = 0;
pub const CLS: u32 = 2;
pub const SEP: u32 = 3;
pub const ROBERTA_CLS: u32 = 4;
pub const ROBERTA_SEP: u32 = 5;
pub const CLS_FIRST_WORD: u32 = 10;
const CLS_SPECIALS: [&str; 6] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "<s>", "</s>"];

/// The post-processor a classification tokenizer gets.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Processor {
    /// `[CLS] a [SEP]` / `[CLS] a [SEP] b [SEP]`, types 0…0 1…1 (BertProcessing).
    Bert,
    /// `<s> a </s>` / `<s> a </s></s> b </s>`, all type 0 (RobertaProcessing).
    Roberta,
    /// None: the encoding is the words alone.
    None,
}

fn added(id: u32, content: &str) -> Value {
    json!({"id": id, "content": content, "single_word": false, "lstrip": false,
           "rstrip": false, "normalized": false, "special": true})
}

/// Ids of words `ks` in the classification vocabulary.
pub fn cls_words(ks: &[u32]) -> Vec<u32> {
    ks.iter().map(|k| CLS_FIRST_WORD + k).collect()
}

/// A WordLevel tokenizer over whitespace-split words `w0…w{words-1}` with `processor`, and a
/// tokenizer_config.json naming its CLS/SEP/PAD tokens.
pub fn classification_tokenizer(dir: &Path, words: u32, processor: Processor) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let mut vocab = serde_json::Map::new();
    let mut added_tokens = Vec::new();
    for (id, s) in CLS_SPECIALS.iter().enumerate() {
        vocab.insert(s.to_string(), id.into());
        added_tokens.push(added(id as u32, s));
    }
    for k in 0..words {
        vocab.insert(format!("w{k}"), (CLS_FIRST_WORD + k).into());
    }
    let post = match processor {
        Processor::Bert => {
            json!({"type": "BertProcessing", "sep": ["[SEP]", SEP], "cls": ["[CLS]", CLS]})
        }
        Processor::Roberta => json!({"type": "RobertaProcessing", "sep": ["</s>", ROBERTA_SEP],
            "cls": ["<s>", ROBERTA_CLS], "trim_offsets": true, "add_prefix_space": false}),
        Processor::None => Value::Null,
    };
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added_tokens,
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": post, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let (cls, sep) = match processor {
        Processor::Roberta => ("<s>", "</s>"),
        _ => ("[CLS]", "[SEP]"),
    };
    let config = json!({"cls_token": cls, "sep_token": sep, "pad_token": "[PAD]",
                        "unk_token": "[UNK]"});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    dir.to_path_buf()
}

/// A byte-level BPE tokenizer: the 256 byte symbols (ids 0…255 in the alphabet's order), then
/// `specials` as added special tokens, then one token per merge.
pub struct ByteTokenizer<'a> {
    pub specials: &'a [&'a str],
    /// Merges of two symbols (in the byte-level alphabet, e.g. `Ċ` for "\n").
    pub merges: &'a [(&'a str, &'a str)],
    /// A post-processor adding this token first (Llama's `<|begin_of_text|> $A`).
    pub bos_processor: Option<&'a str>,
    /// The pre-tokenizer splits words first (GPT-2's regex); off, merges may cross words.
    pub use_regex: bool,
    /// tokenizer_config.json (special token names, chat template).
    pub config: Value,
}

impl ByteTokenizer<'_> {
    pub fn alphabet() -> Vec<char> {
        let mut a: Vec<char> = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
            .into_iter()
            .collect();
        a.sort_unstable();
        a
    }

    pub fn write(&self, dir: &Path) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let mut vocab = serde_json::Map::new();
        for (id, c) in Self::alphabet().into_iter().enumerate() {
            vocab.insert(c.to_string(), id.into());
        }
        let mut added_tokens = Vec::new();
        for s in self.specials {
            let id = vocab.len() as u32;
            vocab.insert(s.to_string(), id.into());
            added_tokens.push(added(id, s));
        }
        for (a, b) in self.merges {
            let id = vocab.len();
            vocab.insert(format!("{a}{b}"), id.into());
        }
        let post = match self.bos_processor {
            Some(bos) => {
                let id = vocab[bos].clone();
                json!({"type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                    "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                             {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                    "special_tokens": {bos: {"id": bos, "ids": [id], "tokens": [bos]}}})
            }
            None => Value::Null,
        };
        let merges: Vec<Value> = self.merges.iter().map(|(a, b)| json!([a, b])).collect();
        let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false,
                                "trim_offsets": false, "use_regex": self.use_regex});
        let tokenizer = json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added_tokens,
            "normalizer": null, "pre_tokenizer": byte_level, "post_processor": post,
            "decoder": byte_level,
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab, "merges": merges}
        });
        std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
        std::fs::write(dir.join("tokenizer_config.json"), self.config.to_string()).unwrap();
        dir.to_path_buf()
    }
}

/// The templates of tests/templates/ (copied from Hugging Face model repositories, as data).
pub fn template(name: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/templates/");
    std::fs::read_to_string(format!("{path}{name}")).unwrap()
}

/// Qwen2.5-Instruct's tokens and chat template (in tokenizer_config.json, as Qwen ships it).
pub fn qwen_tokenizer(dir: &Path) -> PathBuf {
    ByteTokenizer {
        specials: &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        merges: &[],
        bos_processor: None,
        use_regex: true,
        config: json!({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": null,
                       "chat_template": template("qwen2.5-instruct.jinja")}),
    }
    .write(dir)
}

/// Llama 3.2-Instruct's tokens, with its chat template in chat_template.jinja (as transformers 5
/// saves it) and the BOS-adding post-processor.
pub fn llama_tokenizer(dir: &Path) -> PathBuf {
    let dir = ByteTokenizer {
        specials: &[
            "<|begin_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ],
        merges: &[],
        bos_processor: Some("<|begin_of_text|>"),
        use_regex: true,
        config: json!({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    }
    .write(dir);
    std::fs::write(
        dir.join("chat_template.jinja"),
        template("llama-3.2-instruct.jinja"),
    )
    .unwrap();
    dir
}
