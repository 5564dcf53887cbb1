//! Exact parameter counts: every row of validation/models/param_counts.csv, the chatlm-mini SFT
//! split, and published counts of the other supported families.

use memfit_plan::arch::{self, Group};
use std::path::PathBuf;

fn validation() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../validation"))
}

#[test]
fn every_row_of_param_counts_csv() {
    let dir = validation().join("models");
    let csv = std::fs::read_to_string(dir.join("param_counts.csv")).unwrap();
    let mut rows = 0;
    for line in csv.lines().skip(1) {
        let mut cells = line.splitn(3, ',');
        let file = cells.next().unwrap();
        let expected: u64 = cells.next().unwrap().parse().unwrap();
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        let a = arch::parse_config(file, &text, file).unwrap();
        assert_eq!(a.params_total(), expected, "{file}");
        rows += 1;
    }
    // Every model file a validation row may name has its row.
    let configs = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "json")
        })
        .count();
    assert_eq!(rows, configs);
    assert!(rows >= 22);
}

#[test]
fn chatlm_mini_sft_freezes_embeddings_and_encoder() {
    let a = arch::preset("chatlm-mini").unwrap();
    assert_eq!(a.params_total(), 187_692_288);
    let frozen = a.params_in(Group::Embeddings) + a.params_in(Group::Encoder);
    assert_eq!(a.params_total() - frozen, 94_396_032);
}

fn count(model_type_json: &str) -> u64 {
    arch::parse_config("test.json", model_type_json, "test")
        .unwrap()
        .params_total()
}

/// Published totals of models whose family no preset covers (model cards, `num_parameters()`).
#[test]
fn other_families_match_published_counts() {
    let mistral = r#"{"model_type":"mistral","hidden_size":4096,"intermediate_size":14336,
        "num_attention_heads":32,"num_key_value_heads":8,"num_hidden_layers":32,"vocab_size":32000,
        "tie_word_embeddings":false}"#;
    assert_eq!(count(mistral), 7_241_732_096);
    let gemma = r#"{"model_type":"gemma","hidden_size":2048,"intermediate_size":16384,
        "num_attention_heads":8,"num_key_value_heads":1,"head_dim":256,"num_hidden_layers":18,
        "vocab_size":256000}"#;
    assert_eq!(count(gemma), 2_506_172_416);
    let phi2 = r#"{"model_type":"phi","hidden_size":2560,"intermediate_size":10240,
        "num_attention_heads":32,"num_hidden_layers":32,"vocab_size":51200}"#;
    assert_eq!(count(phi2), 2_779_683_840);
    let stablelm = r#"{"model_type":"stablelm","hidden_size":2048,"intermediate_size":5632,
        "num_attention_heads":32,"num_key_value_heads":32,"num_hidden_layers":24,
        "vocab_size":100352,"use_qkv_bias":true,"tie_word_embeddings":false}"#;
    assert_eq!(count(stablelm), 1_644_515_328);
    let falcon = r#"{"model_type":"falcon","hidden_size":4544,"num_attention_heads":71,
        "num_hidden_layers":32,"vocab_size":65024,"multi_query":true,"parallel_attn":true,
        "bias":false}"#;
    assert_eq!(count(falcon), 6_921_720_704);
}

#[test]
fn errors_name_the_file_and_field() {
    let e = arch::parse_config("m/config.json", r#"{"model_type":"mamba"}"#, "x").unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("m/config.json") && msg.contains("model_type") && msg.contains("mamba"));
    let e = arch::parse_config("c.json", r#"{"model_type":"t5","d_model":512}"#, "x").unwrap_err();
    assert!(
        e.to_string().contains("c.json") && e.to_string().contains("d_kv"),
        "{e}"
    );
    let e = arch::parse_config(
        "c.json",
        r#"{"model_type":"bert","hidden_size":"big"}"#,
        "x",
    )
    .unwrap_err();
    assert!(e.to_string().contains("hidden_size"), "{e}");
    let e = arch::parse_config("c.json", "{not json", "x").unwrap_err();
    assert!(e.to_string().contains("c.json"), "{e}");
}

#[test]
fn preset_config_json_round_trips() {
    for name in arch::PRESET_NAMES {
        let v = arch::preset_config_json(name).unwrap();
        let text = serde_json::to_string(&v).unwrap();
        let a = arch::parse_config("x", &text, name).unwrap();
        assert_eq!(a, arch::preset(name).unwrap());
    }
    assert!(arch::preset_config_json("nope").is_none());
}
