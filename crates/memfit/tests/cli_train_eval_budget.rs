//! Issue 29's evaluation case: a tiny T5 (ChatLM's 29k vocabulary, seq 128 + 128) on the real
//! ChatLM sample under a 300 MiB budget the planner accepts: the run trains and evaluates to the
//! end within the budget — no stop by the guard, the evaluation's validation loss computed in
//! chunks of logits (it peaked at 0.57 GiB with the logits whole) — and plan.json plans the
//! evaluation as its own phase.

#[path = "../../memfit-data/tests/common/shared.rs"]
mod shared;

use std::process::Command;

#[test]
fn a_300_mib_budget_the_planner_accepts_holds_through_evaluation() {
    let Some(shared) = shared::shared_dir_or_skip("a_300_mib_budget_the_planner_accepts_holds")
    else {
        return;
    };
    let fx = shared.join("fixtures/chatlm");
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config.json");
    std::fs::write(
        &config,
        serde_json::json!({
            "model_type": "t5", "vocab_size": 29298, "d_model": 256, "d_kv": 32, "d_ff": 1024,
            "num_layers": 4, "num_decoder_layers": 4, "num_heads": 8,
            "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
            "dropout_rate": 0.1, "pad_token_id": 0, "eos_token_id": 1,
            "decoder_start_token_id": 0, "feed_forward_proj": "relu"
        })
        .to_string(),
    )
    .unwrap();
    let run = tmp.path().join("run");
    let out = Command::new(env!("CARGO_BIN_EXE_memfit"))
        .args(["train", "--model"])
        .arg(&config)
        .arg("--data")
        .arg(fx.join("my_train_dataset_3k.parquet"))
        .arg("--valid")
        .arg(fx.join("my_valid_dataset_1k.parquet"))
        .arg("--tokenizer")
        .arg(fx.join("tokenizer"))
        .args(["--budget-ram", "300MiB", "--seq", "128", "--tgt-seq", "128"])
        .args([
            "--max-steps",
            "2",
            "--eval-steps",
            "2",
            "--eval-loss-rows",
            "96",
        ])
        .args(["--eval-rows", "2", "--threads", "1", "--json"])
        .arg("--out")
        .arg(&run)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let events = std::fs::read_to_string(run.join("events.jsonl")).unwrap();
    let kinds: Vec<serde_json::Value> = events
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!kinds.iter().any(|e| e["kind"] == "stop"), "{events}");
    let eval = kinds
        .iter()
        .find(|e| e["kind"] == "eval")
        .expect("an evaluation ran");
    assert_eq!(eval["rows_loss"], 96, "{eval}");
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("plan.json")).unwrap()).unwrap();
    let phase = &plan["planning"]["evaluation"];
    let budget = 300u64 << 20;
    assert!(
        phase["predicted_peak_rss_bytes"].as_u64().unwrap() < budget,
        "{phase}"
    );
    // the process's high-water mark, evaluation included
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        summary["peak_rss_bytes"].as_u64().unwrap() < budget,
        "{summary}"
    );
}
