//! `memfit tokenizer train|encode` through the binary.

mod cli_data_common;

use cli_data_common::{corpus, memfit, memfit_line, stderr, stdout};

#[test]
fn train_writes_the_transformers_files_and_encodes() {
    let tmp = tempfile::tempdir().unwrap();
    let input = corpus(tmp.path(), 200);
    let out = tmp.path().join("tok");
    let o = memfit_line(&format!(
        "tokenizer train --input {} --vocab-size 150 --model unigram --out {} --json",
        input.display(),
        out.display()
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(report["rows"], 200);
    assert_eq!(report["model"], "unigram");
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ] {
        assert!(out.join(f).exists(), "{f}");
    }
    let map: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("special_tokens_map.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(map["eos_token"], "[EOS]");
    let o = memfit(&[
        "tokenizer",
        "encode",
        "--tokenizer",
        out.to_str().unwrap(),
        "--json",
        "[EOS] the quick",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ids: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(ids["ids"][0], 1, "[EOS] is id 1: {ids}");
}

#[test]
fn bad_training_input_exits_2_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let input = corpus(tmp.path(), 10);
    let o = memfit_line(&format!(
        "tokenizer train --input {} --vocab-size 100 --columns question --out {}",
        input.display(),
        tmp.path().join("t").display()
    ));
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("no column `question`"),
        "{}",
        stderr(&o)
    );
    let o = memfit_line(&format!(
        "tokenizer encode --tokenizer {} x",
        tmp.path().display()
    ));
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("tokenizer.json"), "{}", stderr(&o));
}

#[test]
fn a_vocabulary_larger_than_asked_for_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let input = corpus(tmp.path(), 40);
    let o = memfit_line(&format!(
        "tokenizer train --input {} --vocab-size 20 --out {}",
        input.display(),
        tmp.path().join("tok").display()
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("more than --vocab-size 20"), "{text}");
    assert!(text.contains("alphabet"), "{text}");
}
