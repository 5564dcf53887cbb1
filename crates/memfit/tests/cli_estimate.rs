//! `memfit estimate` as a user runs it: the --json contract of docs/architecture.md §3 and exit codes.

mod cli_estimate_support;
use cli_estimate_support::{assert_exit, estimate_config, json, memfit};

#[test]
fn json_has_the_documented_schema() {
    let v = json(&[
        "estimate",
        "--model",
        "chatlm-mini",
        "--batch",
        "8",
        "--seq",
        "256",
        "--tgt-seq",
        "128",
        "--precision",
        "amp-bf16",
        "--method",
        "freeze",
        "--freeze",
        "embeddings,encoder",
        "--json",
    ]);
    let model = &v["model"];
    assert_eq!(model["name"], "chatlm-mini");
    assert_eq!(model["family"], "t5");
    assert_eq!(model["params_total"], 187_692_288u64);
    assert_eq!(model["params_trainable"], 94_396_032u64);
    let setup = &v["setup"];
    for key in [
        "task",
        "batch",
        "seq",
        "tgt_seq",
        "accum",
        "precision",
        "optimizer",
        "grad_ckpt",
        "method",
        "lora_r",
        "lora_alpha",
        "lora_targets",
        "quant",
        "freeze",
        "zero",
        "offload_optimizer",
        "offload_params",
        "gpus",
        "nodes",
        "attention",
        "device",
        "runtime",
        "workers",
        "pin_memory",
        "dataset_rows",
    ] {
        assert!(setup.get(key).is_some(), "setup.{key} missing");
    }
    assert_eq!(setup["precision"], "amp-bf16");
    assert_eq!(setup["task"], "seq2seq");
    let gpu = &v["gpu"];
    let alloc = gpu["peak_allocated_bytes"].as_u64().unwrap();
    let reserved = gpu["peak_reserved_bytes"].as_u64().unwrap();
    let nvml = gpu["nvml_used_bytes"].as_u64().unwrap();
    assert!(alloc > 0 && reserved >= alloc && nvml > reserved);
    let comps = gpu["components"].as_array().unwrap();
    assert!(comps.iter().any(|c| c["name"] == "weights"));
    for c in comps {
        assert!(c["name"].is_string() && c["bytes"].is_u64() && c["note"].is_string());
    }
    assert!(v["host"]["peak_rss_bytes"].as_u64().unwrap() > 0);
    assert!(
        v["host"]["components"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "runtime")
    );
}

#[test]
fn bigger_batch_needs_more_memory() {
    let peak = |b: &str| {
        json(&[
            "estimate",
            "--model",
            "bert-base-chinese",
            "--batch",
            b,
            "--seq",
            "256",
            "--json",
        ])["gpu"]["peak_allocated_bytes"]
            .as_u64()
            .unwrap()
    };
    assert!(peak("16") > peak("4"));
}

#[test]
fn device_cpu_has_no_gpu_object_and_counts_activations_on_the_host() {
    let v = json(&[
        "estimate", "--model", "t5-small", "--batch", "4", "--seq", "128", "--device", "cpu",
        "--json",
    ]);
    assert!(v["gpu"].is_null());
    let comps = v["host"]["components"].as_array().unwrap();
    assert!(
        comps
            .iter()
            .any(|c| c["name"] == "activations" && c["bytes"].as_u64().unwrap() > 0)
    );
    // the human output names the CPU, not "1 GPU(s)"
    let out = memfit(&[
        "estimate", "--model", "t5-small", "--batch", "4", "--seq", "128", "--device", "cpu",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains(", CPU\n"), "{text}");
    assert!(!text.contains("GPU(s)"), "{text}");
}

#[test]
fn human_output_is_a_table_with_scaling() {
    let out = memfit(&[
        "estimate", "--model", "gpt2", "--batch", "2", "--seq", "512",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("weights") && text.contains("batch × sequence") && text.contains("GiB"));
}

#[test]
fn bad_config_exits_2_naming_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let stderr_for = |config: &str| {
        let out = estimate_config(dir.path(), config, &["--batch", "1", "--seq", "8"]);
        assert_eq!(out.status.code(), Some(2), "{config}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = stderr_for(r#"{"model_type": "mamba", "hidden_size": 768}"#);
    assert!(
        err.contains("config.json") && err.contains("model_type") && err.contains("mamba"),
        "{err}"
    );
    let err = stderr_for(r#"{"model_type": "llama", "hidden_size": 768}"#);
    assert!(
        err.contains("config.json") && err.contains("num_attention_heads"),
        "{err}"
    );
    // A byte order mark before the JSON (Windows editors write one) is read past.
    let out = estimate_config(
        dir.path(),
        "\u{feff}{\"model_type\": \"bert\", \"hidden_size\": 64, \"num_attention_heads\": 4, \
         \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"vocab_size\": 100}",
        &["--batch", "1", "--seq", "8"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A negative value names its flag (it was clap's "unexpected argument '-1'").
    let out = memfit(&[
        "estimate", "--model", "t5-small", "--batch", "-1", "--seq", "8",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("'-1'") && err.contains("--batch"), "{err}");
    let err = stderr_for("{ not json");
    assert!(err.contains("config.json"), "{err}");
    assert_exit(
        2,
        &[
            "estimate --model no-such-model --batch 1 --seq 8",
            "estimate --model t5-small --batch 1 --seq 8 --precision fp8",
            "estimate --model t5-small --batch 0 --seq 8",
            "estimate --model t5-small --batch 1 --seq 8 --method qlora",
            "estimate --model t5-small --batch 1 --seq 8 --offload-params cpu",
        ],
    );
}

/// Sizes past what memfit estimates are refused naming the flag or the field, never answered with
/// a wrapped figure (`--seq` u64::MAX printed 17 billion GiB and "peak allocated 1.13 GiB").
#[test]
fn sizes_that_would_overflow_exit_2_naming_the_flag_or_field() {
    let run = |args: &str| {
        let out = memfit(&args.split(' ').collect::<Vec<_>>());
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{args}: {err}");
        assert!(out.stdout.is_empty(), "{args}: a figure was printed");
        err
    };
    let err = run("estimate --model qwen2.5-0.5b --batch 1 --seq 18446744073709551615");
    assert!(err.contains("--seq 18446744073709551615"), "{err}");
    let err = run("estimate --model qwen2.5-0.5b --batch 1 --seq 1000000000");
    assert!(
        err.contains("--seq 1000000000") && err.contains("attention"),
        "{err}"
    );
    let err = run("estimate --model t5-small --batch 1 --seq 8 --accum 18446744073709551615");
    assert!(err.contains("--accum"), "{err}");
    let err = run("plan --model t5-small --seq 128 --target-batch 18446744073709551615 --json");
    assert!(err.contains("--target-batch"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let layers = r#"{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
        "intermediate_size": 128, "vocab_size": 100, "num_hidden_layers": 1000000000000}"#;
    let out = estimate_config(dir.path(), layers, &["--batch", "1", "--seq", "8"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("config.json") && err.contains("num_hidden_layers"),
        "{err}"
    );
    let wide = layers
        .replace("1000000000000", "4000")
        .replace("\"hidden_size\": 64", "\"hidden_size\": 262144");
    let out = estimate_config(dir.path(), &wide, &["--batch", "1", "--seq", "8"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("parameters") && err.contains("config.json"),
        "{err}"
    );
}

/// A remote-code model (Qwen v1, its first generation's config) is read as is; a decoder of a
/// `model_type` memfit does not read is estimated generically, with the assumption on stderr and
/// in the JSON's `model.assumption`.
#[test]
fn remote_code_and_generic_decoders_are_estimated() {
    let dir = tempfile::tempdir().unwrap();
    let run = |config: &str| {
        let args = [
            "--batch",
            "1",
            "--seq",
            "2048",
            "--method",
            "lora",
            "--lora-targets",
            "qkv",
            "--precision",
            "bf16",
            "--grad-ckpt",
            "--json",
        ];
        let out = estimate_config(dir.path(), config, &args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (v, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (v, err) = run(
        r#"{"model_type":"qwen","hidden_size":4096,"intermediate_size":22016,
        "kv_channels":128,"no_bias":true,"num_attention_heads":32,"num_hidden_layers":32,
        "vocab_size":151936}"#,
    );
    assert_eq!(v["model"]["params_total"], 7_721_324_544u64);
    assert!(v["model"]["assumption"].is_null());
    assert!(!err.contains("warning"), "{err}");
    let (v, err) = run(
        r#"{"model_type":"aquila","hidden_size":4096,"intermediate_size":11008,
        "num_attention_heads":32,"num_hidden_layers":32,"vocab_size":100008}"#,
    );
    assert!(
        err.contains("warning") && err.contains("aquila") && err.contains("generic"),
        "{err}"
    );
    assert!(
        v["model"]["assumption"]
            .as_str()
            .unwrap()
            .contains("generic")
    );
    assert!(v["gpu"]["peak_allocated_bytes"].as_u64().unwrap() > 14 << 30);
}

/// `--stack`: the stack is in the setup, and what it keeps differently shows in the components
/// (Llama 2 7B LoRA under FSDP on 2 GPUs with 64 accumulated micro-batches, the setup of
/// LitGPT's resource table).
#[test]
fn stack_changes_what_is_kept() {
    let config = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../validation/models/llama-2-7b.json"
    );
    let component = |stack: &str, name: &str| {
        let v = json(&[
            "estimate",
            "--model",
            config,
            "--task",
            "causal-lm",
            "--batch",
            "1",
            "--seq",
            "1304",
            "--accum",
            "64",
            "--precision",
            "bf16",
            "--method",
            "lora",
            "--lora-targets",
            "q,v",
            "--zero",
            "fsdp-full",
            "--gpus",
            "2",
            "--grad-ckpt",
            "--attention",
            "sdpa",
            "--stack",
            stack,
            "--json",
        ]);
        assert_eq!(v["setup"]["stack"], stack);
        v["gpu"]["components"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .map_or(0, |c| c["bytes"].as_u64().unwrap())
    };
    let gib = 1u64 << 30;
    // LitGPT: Fabric's no_backward_sync keeps every block's whole unsharded gradient
    // (use_orig_params=True units hold frozen and LoRA tensors together) on each rank.
    assert!(component("litgpt", "gradients") > 12 * gib);
    // the Trainer's no_sync keeps only the adapters' gradients (PEFT wraps them as units)
    assert!(component("hf-trainer", "gradients") < gib / 8);
    // Lightning's Trainer shards whole blocks every micro-batch: half of LitGPT's on 2 GPUs
    let lightning = component("lightning", "gradients");
    assert!(lightning > 5 * gib && lightning < 7 * gib);
    // LitGPT's 128-token bf16 chunks, no fp32 upcast, beside transformers' whole fp32 loss
    assert!(component("litgpt", "logits + loss") * 2 < component("hf-trainer", "logits + loss"));
}

#[test]
fn unknown_stack_exits_2() {
    let out = memfit(&[
        "estimate", "--model", "gpt2", "--batch", "1", "--seq", "8", "--stack", "keras",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("litgpt"));
}

/// Varying lengths without expandable segments print what the estimate does not hold for on
/// stderr (stdout stays the JSON object); with `--expandable-segments`, or fixed lengths, nothing.
#[test]
fn varying_lengths_warn_unless_segments_expand() {
    let stderr = |extra: &[&str]| {
        let mut args = vec!["estimate", "--model", "qwen2.5-0.5b", "--method", "lora"];
        args.extend(["--batch", "1", "--seq", "2048", "--json"]);
        args.extend(extra);
        let out = memfit(&args);
        assert!(out.status.success());
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("stdout is JSON");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let warned = stderr(&["--length-spread", "0.1"]);
    assert!(
        warned.contains("warning: lengths vary (--length-spread 0.1)")
            && warned.contains("expandable_segments:True"),
        "{warned}"
    );
    assert_eq!(
        stderr(&["--length-spread", "0.1", "--expandable-segments"]),
        ""
    );
    assert_eq!(stderr(&[]), "");
    let plan = memfit(&[
        "plan",
        "--model",
        "qwen2.5-0.5b",
        "--method",
        "lora",
        "--seq",
        "2048",
        "--gpu-mem",
        "24GiB",
        "--length-spread",
        "0.1",
    ]);
    assert!(String::from_utf8_lossy(&plan.stderr).contains("warning: lengths vary"));
}
