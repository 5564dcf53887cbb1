//! Exact parameter counts against transformers' own: every row of
//! tests/fixtures/param_reference.json (written by scripts/param_reference.py, which builds each
//! published config with its transformers class on the meta device and counts
//! `model.parameters()`) must come out of memfit's config reader with the same total, and, for a
//! full fine-tune, the same trainable count.

use memfit_plan::arch::{self, Arch};
use memfit_plan::memory::{Setup, states};
use serde_json::Value;

fn table() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/param_reference.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn rows() -> Vec<Value> {
    table()["rows"]
        .as_array()
        .expect("`rows` is a list")
        .clone()
}

fn parse(row: &Value) -> Arch {
    let name = row["name"].as_str().unwrap();
    let text = serde_json::to_string(&row["config"]).unwrap();
    arch::parse_config("param_reference.json", &text, name)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn every_row_has_transformers_total() {
    let mut wrong = Vec::new();
    for row in rows() {
        let a = parse(&row);
        let expected = row["params_total"].as_u64().unwrap();
        if a.params_total() != expected {
            let diff = a.params_total() as i128 - expected as i128;
            wrong.push(format!(
                "{}: memfit {} ({diff:+})",
                a.name,
                a.params_total()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "counts differ from transformers: {wrong:#?}"
    );
}

#[test]
fn full_fine_tuning_trains_what_transformers_trains() {
    for row in rows() {
        let a = parse(&row);
        let trainable = states::trainable(&a, &Setup::new(&a)).total();
        assert_eq!(
            trainable,
            row["params_trainable"].as_u64().unwrap(),
            "{}",
            a.name
        );
    }
}

/// The table covers every model_type memfit reads, and each of issue 17's in a published config;
/// mt5 is checked against its published count in `arch_params.rs` (scripts/param_reference.py
/// says why transformers 5 cannot be the reference for it).
#[test]
fn table_covers_every_model_type() {
    let types: Vec<String> = rows()
        .iter()
        .map(|r| r["config"]["model_type"].as_str().unwrap().to_string())
        .collect();
    for t in [
        "t5",
        "bert",
        "roberta",
        "gpt2",
        "llama",
        "mistral",
        "qwen2",
        "gemma",
        "phi",
        "stablelm",
        "falcon",
        "bloom",
        "gpt_neox",
        "gptj",
        "opt",
        "phi3",
        "gemma2",
        "qwen3",
        "starcoder2",
        "mixtral",
        "qwen2_moe",
        "qwen3_moe",
    ] {
        assert!(types.iter().any(|x| x == t), "no row of model_type {t}");
    }
    assert!(table()["transformers"].as_str().is_some());
}

/// The mixtures carry their routing: every expert's weights are parameters, top-k of them run.
#[test]
fn mixtures_of_experts_are_read() {
    let rows = rows();
    let by_name = |n: &str| parse(rows.iter().find(|r| r["name"] == n).unwrap());
    let mixtral = by_name("mixtral-8x7b");
    let m = mixtral.moe.expect("mixtral has a mixture");
    assert_eq!((m.experts, m.top_k, m.sparse_layers), (8, 2, 32));
    let qwen = by_name("qwen1.5-moe-a2.7b").moe.unwrap();
    assert_eq!((qwen.experts, qwen.top_k, qwen.shared_ffn), (60, 4, 5632));
    // decoder_sparse_step 2 makes blocks 1, 3, 5, 7 sparse; mlp_only_layers [3] takes one back
    let mixed = by_name("qwen2-moe-mixed-layers").moe.unwrap();
    assert_eq!(mixed.sparse_layers, 3);
    assert!(by_name("mistral-7b-v0.1").moe.is_none());
}

#[test]
fn bad_moe_fields_name_the_field() {
    let cfg = r#"{"model_type":"mixtral","hidden_size":64,"intermediate_size":128,
        "num_attention_heads":4,"num_hidden_layers":2,"vocab_size":100,
        "num_local_experts":2,"num_experts_per_tok":3}"#;
    let e = arch::parse_config("moe.json", cfg, "x")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("moe.json") && e.contains("num_experts_per_tok"),
        "{e}"
    );
    let cfg = r#"{"model_type":"qwen2_moe","hidden_size":64,"intermediate_size":128,
        "num_attention_heads":4,"num_hidden_layers":2,"vocab_size":100,
        "mlp_only_layers":["one"]}"#;
    let e = arch::parse_config("moe.json", cfg, "x")
        .unwrap_err()
        .to_string();
    assert!(e.contains("mlp_only_layers") && e.contains("one"), "{e}");
}
