//! `memfit data prepare|info` and `memfit bench data` through the binary.

mod cli_data_common;
#[path = "../../memfit-data/tests/common/shared.rs"]
mod shared;

use cli_data_common::{corpus, memfit_line, stderr, stdout, trained_tokenizer};

#[test]
fn prepare_info_and_bench_data() {
    let tmp = tempfile::tempdir().unwrap();
    let input = corpus(tmp.path(), 300);
    let tok = trained_tokenizer(tmp.path(), &input);
    let store = tmp.path().join("s.store");
    let line = format!(
        "data prepare --input {} --tokenizer {} --format seq2seq --max-len 6 --out {} --json",
        input.display(),
        tok.display(),
        store.display()
    );
    let o = memfit_line(&line);
    assert!(o.status.success(), "{}", stderr(&o));
    let meta: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(meta["reused"], false);
    assert_eq!(meta["rows"], 300);
    assert_eq!(meta["eos_id"], 1);
    assert_eq!(meta["token_width"], 2);
    assert!(meta["counts"]["truncated"].as_u64().unwrap() > 0);
    assert!(meta["lengths"][0]["max"].as_u64().unwrap() <= 6);

    let again = memfit_line(&line);
    let meta2: serde_json::Value = serde_json::from_str(&stdout(&again)).unwrap();
    assert_eq!(meta2["reused"], true);

    let o = memfit_line(&format!("data info {}", store.display()));
    assert!(o.status.success());
    assert!(stdout(&o).contains("300 rows"), "{}", stdout(&o));

    let o = memfit_line(&format!(
        "bench data --store {} --random 500 --json",
        store.display()
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(r["rows"], 500);
    assert!(r["ns_per_row_median"].as_f64().unwrap() > 0.0);
    assert!(r["peak_rss_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn bad_input_exits_2_with_the_row_and_column_and_no_store() {
    let tmp = tempfile::tempdir().unwrap();
    let input = corpus(tmp.path(), 50);
    let tok = trained_tokenizer(tmp.path(), &input);
    let bad = tmp.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"prompt\": \"a\", \"response\": \"b\"}\n{\"prompt\": \"a\", \"response\": null}\n",
    )
    .unwrap();
    let store = tmp.path().join("s.store");
    let run = |input: &std::path::Path, extra: &str| {
        memfit_line(&format!(
            "data prepare --input {} --tokenizer {} --out {} {extra}",
            input.display(),
            tok.display(),
            store.display()
        ))
    };
    let o = run(&bad, "");
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("bad.jsonl") && err.contains("line 2, column `response`: null"),
        "{err}"
    );
    assert!(!err.contains("panicked"));
    assert!(!store.exists());

    let o = run(&bad, "--on-invalid skip --json");
    assert!(o.status.success(), "{}", stderr(&o));
    let meta: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        (meta["rows"].as_u64(), meta["counts"]["invalid"].as_u64()),
        (Some(1), Some(1))
    );

    let o = run(&input, "--columns question,answer --force");
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("no column `question`"),
        "{}",
        stderr(&o)
    );

    let garbage = tmp.path().join("garbage.parquet");
    std::fs::write(&garbage, b"PAR1 this is not parquet").unwrap();
    let o = run(&garbage, "--force");
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("garbage.parquet"), "{}", stderr(&o));

    let o = memfit_line(&format!(
        "bench data --store {} --random 5",
        tmp.path().display()
    ));
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not a token store"), "{}", stderr(&o));
}

#[test]
fn chatlm_fixture_prepares_with_its_tokenizer() {
    let Some(shared) = shared::shared_dir_or_skip("chatlm_fixture_prepares_with_its_tokenizer")
    else {
        return;
    };
    let fx = shared.join("fixtures/chatlm");
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("valid.store");
    let o = memfit_line(&format!(
        "data prepare --input {} --tokenizer {} --max-len 256 --out {} --json",
        fx.join("my_valid_dataset_1k.parquet").display(),
        fx.join("tokenizer").display(),
        store.display()
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    let meta: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(meta["rows"], 1000);
    assert_eq!(meta["counts"]["read"], 1000);
    assert_eq!(meta["tokenizer"]["vocab_size"], 29298);
    assert_eq!(
        (meta["eos_id"].as_u64(), meta["pad_id"].as_u64()),
        (Some(1), Some(0))
    );
    // The first prompt (see the golden file) ends in EOS.
    let o = memfit_line(&format!(
        "tokenizer encode --tokenizer {} --json 我要不要去当2021成都大运会志愿者？",
        fx.join("tokenizer").display()
    ));
    let ids: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(ids["ids"].as_array().unwrap().len(), 21);
    assert!(
        meta["counts"]["truncated"].as_u64().unwrap() > 0,
        "responses above 256 tokens are cut"
    );
}
