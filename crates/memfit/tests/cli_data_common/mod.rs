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
