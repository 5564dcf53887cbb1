//! Classification stores: sentence pairs as BERT and RoBERTa tokenizers encode them, longest-first
//! truncation, labels (names by id, num_labels, names given up front) and tokenizers without
//! classification specials.

mod common;

use common::special_tokenizers::{
    CLS, Processor, ROBERTA_CLS, ROBERTA_SEP, SEP, classification_tokenizer, cls_words,
};
use common::words;
use memfit_data::{
    ClassificationRow, InvalidPolicy, PrepareOptions, RowBuf, Task, TokenStore, prepare,
};
use serde_json::json;
use std::path::{Path, PathBuf};

fn pair_rows(dir: &Path) -> PathBuf {
    common::write_jsonl(
        &dir.join("pairs.jsonl"),
        &[
            json!({"text": words(&[1, 2]), "text_pair": words(&[3]), "label": "entail"}),
            json!({"text": words(&[4]), "text_pair": words(&[5, 6, 7]), "label": "contradict"}),
            json!({"text": words(&[8, 9, 10, 11, 12]), "text_pair": words(&[13, 14]), "label": "entail"}),
        ],
    )
}

fn prepare_pairs(dir: &Path, processor: Processor, max_len: Option<usize>) -> TokenStore {
    let tok = classification_tokenizer(&dir.join("tok"), 50, processor);
    let out = dir.join(format!("store-{max_len:?}"));
    let mut o = PrepareOptions::new(vec![pair_rows(dir)], tok, Task::Classification, out);
    o.max_len = max_len;
    let report = prepare(&o, &mut |_| {}).unwrap();
    assert_eq!(
        report.meta.options.columns,
        ["text", "text_pair", "label"],
        "default pair columns"
    );
    TokenStore::open(&report.store).unwrap()
}

fn cls_row(store: &TokenStore, i: usize) -> ClassificationRow {
    store.classification_row(i, &mut RowBuf::default()).unwrap()
}

#[test]
fn bert_pairs_have_token_types_zero_then_one() {
    let tmp = tempfile::tempdir().unwrap();
    let store = prepare_pairs(tmp.path(), Processor::Bert, None);
    assert_eq!(store.meta().segments, ["text", "text_pair"]);
    let r = cls_row(&store, 1);
    let expected = [
        vec![CLS],
        cls_words(&[4]),
        vec![SEP],
        cls_words(&[5, 6, 7]),
        vec![SEP],
    ];
    assert_eq!(r.ids, expected.concat());
    assert_eq!(r.token_types, Some(vec![0, 0, 0, 1, 1, 1, 1]));
    assert_eq!(r.label, 1);
    assert_eq!(store.label_names().unwrap(), ["entail", "contradict"]);
    assert_eq!(store.num_labels().unwrap(), 2);

    let rows = store
        .classification_rows(&[1, 0], &mut RowBuf::default())
        .unwrap();
    assert_eq!(rows[0], r);
    let batch = store.classification_batch(&[0, 1]).unwrap();
    assert_eq!(batch.len, 7);
    assert_eq!(
        batch.token_types.unwrap(),
        [vec![0, 0, 0, 0, 1, 1, 0], vec![0, 0, 0, 1, 1, 1, 1]].concat(),
        "types 1 on the second part, 0 on padding"
    );
    assert!(
        store.causal_row(0, &mut RowBuf::default()).is_err(),
        "not a causal-lm store"
    );
}

#[test]
fn roberta_pairs_are_all_type_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let store = prepare_pairs(tmp.path(), Processor::Roberta, None);
    let r = cls_row(&store, 0);
    let (s, e) = (ROBERTA_CLS, ROBERTA_SEP);
    let expected = [
        vec![s],
        cls_words(&[1, 2]),
        vec![e, e],
        cls_words(&[3]),
        vec![e],
    ];
    assert_eq!(r.ids, expected.concat(), "<s> a </s></s> b </s>");
    assert_eq!(r.token_types, None);
}

#[test]
fn long_pairs_are_cut_longest_first_keeping_the_specials() {
    let tmp = tempfile::tempdir().unwrap();
    let store = prepare_pairs(tmp.path(), Processor::Bert, Some(7));
    // Row 2: 5 + 2 words, 3 specials; 4 words fit: the longer text gives up 3 → (2, 2), as
    // transformers' truncation=True (longest_first) does.
    let r = cls_row(&store, 2);
    let expected = [
        vec![CLS],
        cls_words(&[8, 9]),
        vec![SEP],
        cls_words(&[13, 14]),
        vec![SEP],
    ];
    assert_eq!(r.ids, expected.concat());
    assert_eq!(r.token_types, Some(vec![0, 0, 0, 0, 1, 1, 1]));
    assert_eq!(store.meta().counts.truncated, 1);
    assert_eq!(
        cls_row(&store, 1).ids.len(),
        7,
        "a row that fits is not cut"
    );
}

#[test]
fn integer_labels_give_num_labels_and_default_names() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = classification_tokenizer(&tmp.path().join("tok"), 50, Processor::Bert);
    let rows: Vec<_> = [0, 3, 1]
        .iter()
        .map(|l| json!({"text": words(&[1]), "label": l}))
        .collect();
    let input = common::write_jsonl(&tmp.path().join("ints.jsonl"), &rows);
    let out = tmp.path().join("ints.store");
    let o = PrepareOptions::new(vec![input.clone()], tok.clone(), Task::Classification, out);
    let meta = prepare(&o, &mut |_| {}).unwrap().meta;
    assert_eq!(
        (meta.num_labels, meta.label_names.is_empty()),
        (Some(4), true)
    );
    let store = TokenStore::open(&o.out).unwrap();
    assert_eq!(
        store.label_names().unwrap(),
        ["LABEL_0", "LABEL_1", "LABEL_2", "LABEL_3"]
    );

    // A store written before `num_labels` existed: read from labels.bin.
    let meta_path = o.out.join("meta.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&meta_path).unwrap()).unwrap();
    json.as_object_mut().unwrap().remove("num_labels");
    std::fs::write(&meta_path, json.to_string()).unwrap();
    assert_eq!(TokenStore::open(&o.out).unwrap().num_labels().unwrap(), 4);

    // Names given up front name the integer ids; a label past them is refused.
    let mut named = o.clone();
    named.out = tmp.path().join("named.store");
    named.label_names = Some(["a", "b", "c", "d"].map(String::from).to_vec());
    let store = TokenStore::open(&prepare(&named, &mut |_| {}).unwrap().store).unwrap();
    assert_eq!(store.label_names().unwrap(), ["a", "b", "c", "d"]);
    named.label_names = Some(vec!["a".into(), "b".into()]);
    named.force = true;
    let e = prepare(&named, &mut |_| {}).unwrap_err();
    assert!(
        e.is_bad_input()
            && e.to_string().contains(
                "ints.jsonl: line 2, column `label`: label 3 is outside the 2 given label names"
            ),
        "{e}"
    );
}

#[test]
fn given_label_names_fix_the_ids_of_string_labels() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = classification_tokenizer(&tmp.path().join("tok"), 50, Processor::Bert);
    let mut o = PrepareOptions::new(
        vec![pair_rows(tmp.path())],
        tok,
        Task::Classification,
        tmp.path().join("s"),
    );
    o.label_names = Some(vec!["contradict".into(), "neutral".into(), "entail".into()]);
    let store = TokenStore::open(&prepare(&o, &mut |_| {}).unwrap().store).unwrap();
    assert_eq!(cls_row(&store, 0).label, 2);
    assert_eq!(cls_row(&store, 1).label, 0);
    assert_eq!(store.num_labels().unwrap(), 3);
    o.label_names = Some(vec!["contradict".into()]);
    o.on_invalid = InvalidPolicy::Skip;
    let meta = prepare(&o, &mut |_| {}).unwrap().meta;
    assert_eq!(
        (meta.rows, meta.counts.invalid),
        (1, 2),
        "unknown labels skipped"
    );
}

#[test]
fn a_tokenizer_without_classification_specials_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = classification_tokenizer(&tmp.path().join("plain"), 50, Processor::None);
    let o = PrepareOptions::new(
        vec![pair_rows(tmp.path())],
        tok,
        Task::Classification,
        tmp.path().join("s"),
    );
    let e = prepare(&o, &mut |_| {}).unwrap_err();
    let msg = e.to_string();
    assert!(e.is_bad_input(), "{msg}");
    assert!(
        msg.contains("plain/tokenizer.json")
            && msg.contains("does not add the classification specials")
            && msg.contains("[CLS] … [SEP]"),
        "{msg}"
    );
    assert!(!o.out.exists());

    // The word-level test tokenizer has no [CLS] at all: the missing token is named.
    let o = PrepareOptions::new(
        vec![pair_rows(tmp.path())],
        common::tokenizer(tmp.path()),
        Task::Classification,
        tmp.path().join("s"),
    );
    let msg = prepare(&o, &mut |_| {}).unwrap_err().to_string();
    assert!(msg.contains("has no CLS token (tried [CLS], <s>)"), "{msg}");
}
