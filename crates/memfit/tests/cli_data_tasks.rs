//! `memfit data prepare --task classification|causal-lm` and `memfit tokenizer encode --pair|chat`
//! through the binary.

mod cli_data_common;

use cli_data_common::{
    bert_tokenizer, chatml_tokenizer, corpus, memfit, stderr, stdout, trained_tokenizer,
};
use std::path::Path;

fn write_jsonl(path: &Path, rows: &[serde_json::Value]) {
    let lines: Vec<String> = rows.iter().map(|r| r.to_string()).collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

fn prepare(args: &[&str]) -> std::process::Output {
    memfit(&[&["data", "prepare"], args].concat())
}

#[test]
fn classification_pairs_from_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let words = ["the", "cat", "sat", "a", "dog", "ran"];
    let tok = bert_tokenizer(&tmp.path().join("bert"), &words);
    let input = tmp.path().join("nli.jsonl");
    write_jsonl(
        &input,
        &[
            serde_json::json!({"premise": "the cat sat", "hypothesis": "a cat", "y": "entail"}),
            serde_json::json!({"premise": "the dog ran", "hypothesis": "a cat sat", "y": "contradict"}),
        ],
    );
    let store = tmp.path().join("nli.store");
    let (i, t, s) = (
        input.to_str().unwrap(),
        tok.to_str().unwrap(),
        store.to_str().unwrap(),
    );
    let base = [
        "--input",
        i,
        "--tokenizer",
        t,
        "--task",
        "classification",
        "--out",
        s,
    ];
    let o = prepare(&[&base[..], &["--columns", "premise,hypothesis,y", "--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let meta: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(meta["segments"], serde_json::json!(["text", "text_pair"]));
    assert_eq!(meta["num_labels"], 2);
    assert_eq!(
        meta["label_names"],
        serde_json::json!(["entail", "contradict"])
    );
    // [CLS] the cat sat [SEP] | a cat [SEP]
    assert_eq!(meta["lengths"][0]["max"], 5);
    assert_eq!(meta["lengths"][1]["max"], 4);
    let o = memfit(&["data", "info", s]);
    assert!(
        stdout(&o).contains("2 labels: entail, contradict"),
        "{}",
        stdout(&o)
    );

    let o = memfit(&[
        "tokenizer",
        "encode",
        "--tokenizer",
        t,
        "the cat",
        "--pair",
        "a dog",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["ids"], serde_json::json!([2, 4, 5, 3, 7, 8, 3]));
    assert_eq!(
        v["token_type_ids"],
        serde_json::json!([0, 0, 0, 0, 1, 1, 1])
    );
}

#[test]
fn classification_refuses_a_tokenizer_without_cls_and_sep_tokens_added() {
    let tmp = tempfile::tempdir().unwrap();
    let input = corpus(tmp.path(), 20);
    let tok = trained_tokenizer(tmp.path(), &input);
    let rows = tmp.path().join("c.jsonl");
    write_jsonl(
        &rows,
        &[serde_json::json!({"text": "the quick fox", "label": 1})],
    );
    let store = tmp.path().join("c.store");
    let o = prepare(&[
        "--input",
        rows.to_str().unwrap(),
        "--tokenizer",
        tok.to_str().unwrap(),
        "--task",
        "classification",
        "--out",
        store.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("tok/tokenizer.json")
            && err.contains("does not add the classification specials"),
        "{err}"
    );
    assert!(!store.exists());
}

#[test]
fn causal_lm_conversations_from_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = chatml_tokenizer(
        &tmp.path().join("chatml"),
        &["user", "assistant", "Hi", "Hello"],
    );
    let t = tok.to_str().unwrap();
    let input = tmp.path().join("chat.jsonl");
    let hello = serde_json::json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]);
    write_jsonl(
        &input,
        &[
            serde_json::json!({"messages": hello}),
            serde_json::json!({"messages": hello}),
        ],
    );
    let store = tmp.path().join("chat.store");
    let (i, s) = (input.to_str().unwrap(), store.to_str().unwrap());
    let o = prepare(&[
        "--input",
        i,
        "--tokenizer",
        t,
        "--task",
        "causal-lm",
        "--out",
        s,
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let meta: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(meta["task"], "causal-lm");
    assert_eq!(meta["segments"], serde_json::json!(["prompt", "response"]));
    assert!(
        meta["prompt_format"]
            .as_str()
            .unwrap()
            .contains("tokenizer_config.json")
    );
    // <|im_start|> user Hi <|im_end|> <|im_start|> assistant | Hello <|im_end|> (no EOS added)
    assert_eq!(
        (
            meta["lengths"][0]["max"].as_u64(),
            meta["lengths"][1]["max"].as_u64()
        ),
        (Some(6), Some(2))
    );

    let o = memfit(&[
        "tokenizer",
        "chat",
        "--tokenizer",
        t,
        "--messages",
        &hello.to_string(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["prompt_len"], 6);
    assert_eq!(v["ids"].as_array().unwrap().len(), 8);

    // A conversation without the assistant's answer: exit 2 naming file, line and column.
    let bad = tmp.path().join("bad.jsonl");
    write_jsonl(
        &bad,
        &[serde_json::json!({"messages": [{"role": "user", "content": "Hi"}]})],
    );
    let o = prepare(&[
        "--input",
        bad.to_str().unwrap(),
        "--tokenizer",
        t,
        "--task",
        "causal-lm",
        "--out",
        tmp.path().join("bad.store").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o)
            .contains("bad.jsonl: line 1, column `messages`: the last message is a `user` message"),
        "{}",
        stderr(&o)
    );
}
