//! The layout against transformers' own parameter counts of real configs (TinyLlama, Mistral 7B,
//! Qwen2.5-0.5B, Qwen3: `crates/memfit-plan/tests/fixtures/param_reference.json`, counted by
//! transformers on the meta device): every tensor and shape, tied heads counted once. Its
//! mixture-of-experts rows are refused, naming the field.

use memfit_nn::decoder::{DecoderConfig, DecoderLayout};
use serde_json::Value;

fn reference_rows() -> Vec<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../memfit-plan/tests/fixtures/param_reference.json"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["rows"].as_array().unwrap().clone()
}

#[test]
fn layouts_count_what_transformers_counts() {
    let mut checked = Vec::new();
    for row in reference_rows() {
        let config = &row["config"];
        let model_type = config["model_type"].as_str().unwrap_or("");
        let dense = ["llama", "qwen2", "mistral", "qwen3"].contains(&model_type);
        let moe = model_type.ends_with("_moe") || model_type == "mixtral";
        if !dense && !moe {
            continue;
        }
        let name = row["name"].as_str().unwrap();
        match DecoderConfig::from_json(config) {
            Ok(cfg) => {
                let total = DecoderLayout::new(&cfg).param_counts(&[]).0;
                assert_eq!(total, row["params_total"].as_u64().unwrap(), "{name}");
                checked.push(name.to_string());
            }
            Err(e) => assert!(moe, "{name}: {e}"),
        }
    }
    assert!(checked.len() >= 4, "{checked:?}");
}
