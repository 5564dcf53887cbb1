//! The ChatLM fixture tokenizer encodes fixed strings to exactly the ids Python `tokenizers` gives
//! (golden file made by scripts/gen_tokenizer_golden.py; this test needs no Python).

mod common;

use memfit_data::Tokenizer;

#[derive(serde::Deserialize)]
struct Golden {
    tokenizer_sha256: String,
    cases: Vec<Case>,
}

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
}

#[test]
fn chatlm_tokenizer_matches_python_tokenizers() {
    let Some(shared) =
        common::shared::shared_dir_or_skip("chatlm_tokenizer_matches_python_tokenizers")
    else {
        return;
    };
    let dir = shared.join("fixtures/chatlm/tokenizer");
    let golden: Golden =
        serde_json::from_str(include_str!("golden/chatlm_tokenizer.json")).unwrap();
    let tok = Tokenizer::load(&dir).unwrap();
    assert_eq!(
        tok.sha256(),
        golden.tokenizer_sha256,
        "the fixture tokenizer changed"
    );
    assert_eq!(tok.vocab_size(), 29298);
    assert_eq!(tok.eos().map(|t| t.id), Some(1));
    assert_eq!(tok.pad().map(|t| t.id), Some(0));
    assert!(golden.cases.len() >= 20);
    for case in &golden.cases {
        assert_eq!(
            tok.encode(&case.text).unwrap(),
            case.ids,
            "text {:?}",
            case.text
        );
    }
}

/// Without `../shared` a fixture test is skipped visibly (`None`), and under CI it fails.
#[test]
fn missing_shared_skips_visibly_and_fails_under_ci() {
    let missing = std::path::PathBuf::from("/nonexistent/memfit-shared");
    assert_eq!(
        common::shared::resolve(
            missing.clone(),
            false,
            "self-test of the skip, not a real skip"
        ),
        None
    );
    let under_ci = std::panic::catch_unwind(|| {
        common::shared::resolve(missing, true, "self-test of the skip under CI")
    });
    assert!(under_ci.is_err());
}
