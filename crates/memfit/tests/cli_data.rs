//! `memfit data prepare|info` and `memfit bench data` through the binary.

mod cli_data_common;

use cli_data_common::{corpus, memfit, stderr, stdout, trained_tokenizer};

#[test]
fn prepare_info_and_bench_data() {
    let tmp = tempfile::tempdir().unwrap();
    let input = corpus(tmp.path(), 300);
    let tok = trained_tokenizer(tmp.path(), &input);
    let store = tmp.path().join("s.store");
    let args = [
        "data",
        "prepare",
        "--input",
        input.to_str().unwrap(),
        "--tokenizer",
        tok.to_str().unwrap(),
        "--format",
        "seq2seq",
        "--max-len",
        "6",
        "--out",
        store.to_str().unwrap(),
        "--json",
    ];
    let o = memfit(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let meta: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(meta["reused"], false);
    assert_eq!(meta["rows"], 300);
    assert_eq!(meta["eos_id"], 1);
    assert_eq!(meta["token_width"], 2);
    assert!(meta["counts"]["truncated"].as_u64().unwrap() > 0);
    assert!(meta["lengths"][0]["max"].as_u64().unwrap() <= 6);

    let again = memfit(&args);
    let meta2: serde_json::Value = serde_json::from_str(&stdout(&again)).unwrap();
    assert_eq!(meta2["reused"], true);

    let o = memfit(&["data", "info", store.to_str().unwrap()]);
    assert!(o.status.success());
    assert!(stdout(&o).contains("300 rows"), "{}", stdout(&o));

    let o = memfit(&[
        "bench",
        "data",
        "--store",
        store.to_str().unwrap(),
        "--random",
        "500",
        "--json",
    ]);
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
    let run = |input: &std::path::Path, extra: &[&str]| {
        let mut args = vec![
            "data",
            "prepare",
            "--input",
            input.to_str().unwrap(),
            "--tokenizer",
            tok.to_str().unwrap(),
            "--out",
            store.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        memfit(&args)
    };
    let o = run(&bad, &[]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("bad.jsonl") && err.contains("line 2, column `response`: null"),
        "{err}"
    );
    assert!(!err.contains("panicked"));
    assert!(!store.exists());

    let o = run(&bad, &["--on-invalid", "skip", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let meta: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        (meta["rows"].as_u64(), meta["counts"]["invalid"].as_u64()),
        (Some(1), Some(1))
    );

    let o = run(&input, &["--columns", "question,answer", "--force"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("no column `question`"),
        "{}",
        stderr(&o)
    );

    let garbage = tmp.path().join("garbage.parquet");
    std::fs::write(&garbage, b"PAR1 this is not parquet").unwrap();
    let o = run(&garbage, &["--force"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("garbage.parquet"), "{}", stderr(&o));

    let o = memfit(&[
        "bench",
        "data",
        "--store",
        tmp.path().to_str().unwrap(),
        "--random",
        "5",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not a token store"), "{}", stderr(&o));
}

#[test]
fn chatlm_fixture_prepares_with_its_tokenizer() {
    let shared = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared"));
    if !shared.exists() {
        eprintln!("skipped: ../shared (the ChatLM fixtures) is not present");
        return;
    }
    let fx = shared.join("fixtures/chatlm");
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("valid.store");
    let o = memfit(&[
        "data",
        "prepare",
        "--input",
        fx.join("my_valid_dataset_1k.parquet").to_str().unwrap(),
        "--tokenizer",
        fx.join("tokenizer").to_str().unwrap(),
        "--max-len",
        "256",
        "--out",
        store.to_str().unwrap(),
        "--json",
    ]);
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
    let o = memfit(&[
        "tokenizer",
        "encode",
        "--tokenizer",
        fx.join("tokenizer").to_str().unwrap(),
        "--json",
        "我要不要去当2021成都大运会志愿者？",
    ]);
    let ids: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(ids["ids"].as_array().unwrap().len(), 21);
    assert!(
        meta["counts"]["truncated"].as_u64().unwrap() > 0,
        "responses above 256 tokens are cut"
    );
}
