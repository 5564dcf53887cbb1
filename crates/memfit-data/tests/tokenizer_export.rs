//! The tokenizer a checkpoint carries (`Tokenizer::json_appending_eos`) encodes a text, with special
//! tokens as transformers' `AutoTokenizer` does by default, into exactly the ids the token store holds
//! for it: on generated data always, and on the ChatLM fixture against ids recorded from Python
//! transformers (golden file made by scripts/gen_tokenizer_golden.py; no Python needed here).

mod common;

use common::{EOS, ids, words};
use memfit_data::prepare::{PrepareOptions, prepare};
use memfit_data::{DataError, RowBuf, Task, TokenStore, Tokenizer};
use std::path::Path;

/// The saved tokenizer.json, loaded as transformers' fast tokenizers load it.
fn exported(tok: &Tokenizer, eos: u32) -> tokenizers::Tokenizer {
    tokenizers::Tokenizer::from_bytes(tok.json_appending_eos(eos).unwrap()).unwrap()
}

fn encode(t: &tokenizers::Tokenizer, text: &str) -> Vec<u32> {
    t.encode(text, true).unwrap().get_ids().to_vec()
}

fn store(dir: &Path, max_len: Option<usize>) -> TokenStore {
    let input = common::seq2seq_jsonl(&dir.join("d.jsonl"), 300);
    let mut opts = PrepareOptions::new(
        vec![input],
        dir.join("tok"),
        Task::Seq2seq,
        dir.join(format!("s{max_len:?}.store")),
    );
    (opts.max_len, opts.max_target_len) = (max_len, max_len);
    TokenStore::open(&prepare(&opts, &mut |_| {}).unwrap().store).unwrap()
}

#[test]
fn saved_tokenizer_encodes_prompts_and_responses_as_the_store_holds_them() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = Tokenizer::load(&common::tokenizer(tmp.path())).unwrap();
    let store = store(tmp.path(), None);
    let saved = exported(&tok, store.eos_id().unwrap());
    let mut buf = RowBuf::default();
    for i in 0..store.len() {
        let (s, t) = common::seq2seq_row(i);
        let row = store.read_row(i, &mut buf).unwrap();
        assert_eq!(
            encode(&saved, &words(&s)),
            row.source().to_vec(),
            "prompt of row {i}"
        );
        assert_eq!(
            encode(&saved, &words(&t)),
            row.target().unwrap().to_vec(),
            "response of row {i}"
        );
        assert_eq!(row.source().to_vec().last(), Some(&EOS));
    }
    // Without special tokens nothing is added: the rest of the tokenizer is unchanged.
    let plain = saved.encode(words(&[4, 5]), false).unwrap();
    assert_eq!(plain.get_ids(), ids(&[4, 5]));
}

#[test]
fn truncation_keeps_eos_last_as_the_store_does() {
    // AutoTokenizer(text, truncation=True, max_length=4) keeps the post-processor's EOS in the 4.
    let tmp = tempfile::tempdir().unwrap();
    let tok = Tokenizer::load(&common::tokenizer(tmp.path())).unwrap();
    let store = store(tmp.path(), Some(4));
    let mut saved = exported(&tok, EOS);
    saved
        .with_truncation(Some(tokenizers::TruncationParams {
            max_length: 4,
            ..Default::default()
        }))
        .unwrap();
    let mut buf = RowBuf::default();
    let mut cut = 0;
    for i in 0..store.len() {
        let (s, _) = common::seq2seq_row(i);
        cut += usize::from(s.len() > 3);
        let row = store.read_row(i, &mut buf).unwrap();
        assert_eq!(encode(&saved, &words(&s)), row.source().to_vec(), "row {i}");
    }
    assert!(cut > 100, "the test cut {cut} prompts");
}

#[test]
fn a_previous_post_processor_is_replaced_and_pairs_end_each_part_in_eos() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = common::tokenizer(tmp.path());
    // A BERT-style post-processor that memfit's store never used: [PAD] stands in for [CLS].
    let path = dir.join("tokenizer.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json["post_processor"] = serde_json::json!({"type": "BertProcessing",
        "sep": ["[EOS]", EOS], "cls": ["[PAD]", 0]});
    std::fs::write(&path, json.to_string()).unwrap();
    let tok = Tokenizer::load(&dir).unwrap();
    assert_eq!(
        tok.inner().encode("w1", true).unwrap().get_ids()[0],
        0,
        "the original adds its [CLS] stand-in"
    );
    let saved = exported(&tok, EOS);
    assert_eq!(
        encode(&saved, &words(&[1, 2])),
        [ids(&[1, 2]), vec![EOS]].concat()
    );
    let pair = saved.encode(("w1", "w2 w3"), true).unwrap();
    assert_eq!(
        pair.get_ids(),
        [ids(&[1]), vec![EOS], ids(&[2, 3]), vec![EOS]].concat()
    );
    assert_eq!(pair.get_type_ids(), [0, 0, 1, 1, 1]);
}

#[test]
fn an_eos_id_outside_the_vocabulary_names_the_tokenizer() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = Tokenizer::load(&common::tokenizer(tmp.path())).unwrap();
    let err = tok.json_appending_eos(100_000).unwrap_err();
    assert!(matches!(err, DataError::Tokenizer { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("tokenizer.json") && msg.contains("100000"),
        "{msg}"
    );
}

#[test]
fn a_config_for_a_bare_tokenizer_names_the_fast_class_and_its_specials() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = Tokenizer::load(&common::tokenizer(tmp.path())).unwrap();
    let config: serde_json::Value = serde_json::from_str(&tok.transformers_config()).unwrap();
    assert_eq!(
        config,
        serde_json::json!({"tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": "[EOS]", "pad_token": "[PAD]"})
    );
}

#[derive(serde::Deserialize)]
struct Golden {
    transformers_version: String,
    cases: Vec<Case>,
}

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    input_ids: Vec<u32>,
}

#[test]
fn chatlm_checkpoint_tokenizer_matches_python_autotokenizer() {
    let Some(shared) = common::shared::shared_dir_or_skip(
        "chatlm_checkpoint_tokenizer_matches_python_autotokenizer",
    ) else {
        return;
    };
    let golden: Golden =
        serde_json::from_str(include_str!("golden/chatlm_autotokenizer.json")).unwrap();
    let tok = Tokenizer::load(&shared.join("fixtures/chatlm/tokenizer")).unwrap();
    let eos = tok.eos().unwrap().id;
    let saved = exported(&tok, eos);
    assert!(golden.cases.len() >= 20, "{}", golden.transformers_version);
    for case in &golden.cases {
        // What memfit trains on: the ids without specials, then EOS by id.
        let trained = [tok.encode(&case.text).unwrap(), vec![eos]].concat();
        assert_eq!(
            case.input_ids, trained,
            "AutoTokenizer vs training: {:?}",
            case.text
        );
        assert_eq!(
            encode(&saved, &case.text),
            trained,
            "saved file: {:?}",
            case.text
        );
    }
}
