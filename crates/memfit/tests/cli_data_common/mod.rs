//! Helpers for the `memfit data` / `memfit tokenizer` / `memfit bench data` CLI tests: run the
//! binary, generate a JSONL corpus, train a small tokenizer with the CLI itself.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;

pub fn memfit(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_memfit"))
        .args(args)
        .output()
        .expect("run memfit")
}

/// `memfit` with a command line split on whitespace (the tests' paths have no spaces).
pub fn memfit_line(line: &str) -> Output {
    memfit(&line.split_whitespace().collect::<Vec<_>>())
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `n` prompt/response rows of English and Chinese text.
pub fn corpus(dir: &Path, n: usize) -> PathBuf {
    let sentences = [
        "the quick brown fox jumps over the lazy dog",
        "memory budgets keep training runs alive",
        "我要不要去当成都大运会志愿者？",
        "问自己，真喜欢吗？开心吗？值得吗？",
    ];
    let lines: Vec<String> = (0..n)
        .map(|i| {
            serde_json::json!({
                "prompt": format!("{} {i}", sentences[i % 4]),
                "response": sentences[(i + 1) % 4],
            })
            .to_string()
        })
        .collect();
    let path = dir.join("corpus.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// A BPE tokenizer trained by `memfit tokenizer train` on `input`.
pub fn trained_tokenizer(dir: &Path, input: &Path) -> PathBuf {
    let out = dir.join("tok");
    let o = memfit(&[
        "tokenizer",
        "train",
        "--input",
        input.to_str().unwrap(),
        "--vocab-size",
        "200",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    out
}

/// A `tokenizer.json` over whitespace-split `words` (ids from 4 on) with `specials` (ids 0…) as
/// added special tokens, `post_processor`, and `tokenizer_config.json` = `config`.
pub fn word_tokenizer(
    dir: &Path,
    specials: &[&str],
    words: &[&str],
    post_processor: serde_json::Value,
    config: serde_json::Value,
) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, s) in specials.iter().enumerate() {
        vocab.insert(s.to_string(), id.into());
        added.push(
            serde_json::json!({"id": id, "content": s, "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true}),
        );
    }
    for (k, w) in words.iter().enumerate() {
        vocab.insert(w.to_string(), (specials.len() + k).into());
    }
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": post_processor, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": specials[1]}
    });
    std::fs::write(dir.join("tokenizer.json"), json.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    dir.to_path_buf()
}

/// A BERT-style tokenizer: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3, BertProcessing.
pub fn bert_tokenizer(dir: &Path, words: &[&str]) -> PathBuf {
    let post =
        serde_json::json!({"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]});
    let config =
        serde_json::json!({"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]"});
    word_tokenizer(
        dir,
        &["[PAD]", "[UNK]", "[CLS]", "[SEP]"],
        words,
        post,
        config,
    )
}

/// A ChatML tokenizer (Qwen's special tokens) with a ChatML chat template in its config.
pub fn chatml_tokenizer(dir: &Path, words: &[&str]) -> PathBuf {
    let template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
                    {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let config = serde_json::json!({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                    "chat_template": template});
    let specials = ["<|endoftext|>", "<|unk|>", "<|im_start|>", "<|im_end|>"];
    word_tokenizer(dir, &specials, words, serde_json::Value::Null, config)
}
