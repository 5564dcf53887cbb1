//! Training BPE and Unigram tokenizers from generated JSONL and parquet text.

mod common;

use memfit_data::tokenizer::train::{TokenizerModel, TrainOptions, train};
use memfit_data::{DataError, Tokenizer};
use std::sync::Arc;

fn corpus(dir: &std::path::Path) -> std::path::PathBuf {
    let sentences = [
        "the quick brown fox jumps over the lazy dog",
        "memory budgets keep training runs alive",
        "我要不要去当成都大运会志愿者？",
        "问自己，真喜欢吗？开心吗？值得吗？",
        "tokens 2021 and 3.11 are numbers",
    ];
    let rows: Vec<serde_json::Value> = (0..300)
        .map(|i| {
            serde_json::json!({
                "prompt": sentences[i % sentences.len()],
                "response": format!("{} {}", sentences[(i + 2) % sentences.len()], i),
            })
        })
        .collect();
    common::write_jsonl(&dir.join("corpus.jsonl"), &rows)
}

fn check_trained(model: TokenizerModel, vocab: usize) {
    let tmp = tempfile::tempdir().unwrap();
    let input = corpus(tmp.path());
    let out = tmp.path().join("tok");
    let mut opts = TrainOptions::new(vec![input], vocab, out.clone());
    opts.model = model;
    let report = train(&opts).unwrap();
    assert_eq!(report.rows, 300);
    assert_eq!(report.texts, 600);
    assert!(
        report.vocab_size <= vocab && report.vocab_size > 7,
        "{}",
        report.vocab_size
    );
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    let tok = Tokenizer::load(&out).unwrap();
    for (id, s) in [
        "[PAD]", "[EOS]", "[SEP]", "[BOS]", "[CLS]", "[MASK]", "[UNK]",
    ]
    .iter()
    .enumerate()
    {
        assert_eq!(tok.inner().token_to_id(s), Some(id as u32), "{s}");
    }
    assert_eq!(tok.eos().unwrap().id, 1);
    assert_eq!(tok.pad().unwrap().id, 0);
    let ids = tok.encode("the quick brown fox").unwrap();
    assert!(
        !ids.is_empty() && !ids.contains(&6),
        "no [UNK] for seen text: {ids:?}"
    );
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("tokenizer_config.json")).unwrap())
            .unwrap();
    assert_eq!(config["eos_token"], "[EOS]");
    assert_eq!(config["added_tokens_decoder"]["6"]["content"], "[UNK]");
}

#[test]
fn trains_bpe_with_the_seed_specials() {
    check_trained(TokenizerModel::Bpe, 300);
}

#[test]
fn trains_unigram_with_the_seed_specials() {
    check_trained(TokenizerModel::Unigram, 200);
}

#[test]
fn trains_from_parquet_with_a_column_missing_in_one_file() {
    let tmp = tempfile::tempdir().unwrap();
    let texts: Vec<Option<&str>> = (0..50).map(|_| Some("hello parquet world")).collect();
    let pq = common::write_parquet(
        &tmp.path().join("a.parquet"),
        vec![("prompt", common::string_array(texts))],
        16,
    );
    let opts = TrainOptions::new(vec![pq], 60, tmp.path().join("tok"));
    let report = train(&opts).unwrap();
    assert_eq!(report.texts, 50);
}

#[test]
fn bad_training_inputs_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let input = corpus(tmp.path());
    let mut opts = TrainOptions::new(vec![input.clone()], 5, tmp.path().join("tok"));
    assert!(matches!(train(&opts), Err(DataError::Options(m)) if m.contains("vocab-size")));
    opts.vocab_size = 100;
    opts.columns = vec!["nope".into()];
    let err = train(&opts).unwrap_err();
    assert!(
        matches!(err, DataError::MissingColumn { ref column, .. } if column == "nope"),
        "{err}"
    );
    assert!(err.is_bad_input());
    let labels = common::write_parquet(
        &tmp.path().join("ints.parquet"),
        vec![(
            "prompt",
            common::int_array(vec![Some(1)]) as Arc<dyn arrow_array::Array>,
        )],
        16,
    );
    let opts = TrainOptions::new(vec![labels], 100, tmp.path().join("tok2"));
    assert!(matches!(train(&opts), Err(DataError::ColumnType { .. })));
}
