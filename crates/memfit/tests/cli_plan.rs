//! `memfit plan` as a user runs it: choice, exit 3, emitted files, tiers, auto budgets.

mod cli_estimate_support;
use cli_estimate_support::{assert_exit, json, memfit};

#[test]
fn chooses_a_setup_within_budget_holding_the_target_batch() {
    let v = json(&[
        "plan",
        "--model",
        "chatlm-mini",
        "--gpus",
        "2",
        "--gpu-mem",
        "12GiB",
        "--host-mem",
        "32GiB",
        "--seq",
        "256",
        "--target-batch",
        "64",
        "--json",
    ]);
    let c = &v["chosen"];
    let s = &c["setup"];
    let (b, a, g) = (
        s["batch"].as_u64().unwrap(),
        s["accum"].as_u64().unwrap(),
        s["gpus"].as_u64().unwrap(),
    );
    assert_eq!(b * a * g, 64);
    assert!(c["gpu"]["nvml_used_bytes"].as_u64().unwrap() <= (12u64 << 30) * 9 / 10);
    assert!(c["host"]["peak_rss_bytes"].as_u64().unwrap() <= (32u64 << 30) * 9 / 10);
    assert!(c["tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(v["alternatives"].as_array().unwrap().len() <= 3);
    for r in v["rejected"].as_array().unwrap() {
        assert!(r["reason"].as_str().unwrap().contains("GiB"));
    }
}

#[test]
fn nothing_fits_exits_3_with_the_reason() {
    let out = memfit(&[
        "plan",
        "--model",
        "llama-2-7b",
        "--gpu-mem",
        "4GiB",
        "--host-mem",
        "8GiB",
    ]);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nothing fits") && err.contains("GiB"), "{err}");
}

/// `memfit plan --json` of t5-small on two 8 GiB GPUs, writing the `emit` configs into `out`.
fn t5_small_on_two_gpus(emit: &str, out: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "plan",
        "--model",
        "t5-small",
        "--gpus",
        "2",
        "--gpu-mem",
        "8GiB",
        "--host-mem",
        "16GiB",
        "--emit",
        emit,
        "--out",
        out.to_str().unwrap(),
        "--json",
    ];
    args.extend(extra);
    memfit(&args)
}

/// `--zero-bucket-size`: planned for (ZeRO-1/2 hold two 16-bit buckets of it through the backward)
/// and written into the emitted DeepSpeed config; without it, hidden² as before.
#[test]
fn the_zero_bucket_size_is_planned_and_written() {
    let dir = tempfile::tempdir().unwrap();
    let plan = |bucket: &[&str], name: &str| {
        let out_dir = dir.path().join(name);
        let out = t5_small_on_two_gpus("deepspeed", &out_dir, bucket);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ds: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out_dir.join("deepspeed.json")).unwrap())
                .unwrap();
        let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (
            plan,
            ds["zero_optimization"]["reduce_bucket_size"]
                .as_u64()
                .unwrap(),
        )
    };
    let (_, auto) = plan(&[], "auto");
    assert_eq!(auto, 512 * 512, "t5-small's hidden²");
    let (p, big) = plan(&["--zero-bucket-size", "200000000"], "big");
    assert_eq!(big, 200_000_000);
    assert_eq!(
        p["chosen"]["setup"]["zero_bucket_size"], 200_000_000,
        "{}",
        p["chosen"]["setup"]
    );
}

#[test]
fn emits_every_config_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("cfg");
    let out = t5_small_on_two_gpus("deepspeed,accelerate,hf,memfit,profiles", &out_dir, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &plan["chosen"]["setup"];
    let ds: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("deepspeed.json")).unwrap())
            .unwrap();
    assert_eq!(ds["train_micro_batch_size_per_gpu"], s["batch"]);
    assert_eq!(ds["gradient_accumulation_steps"], s["accum"]);
    assert_eq!(ds["train_batch_size"].as_u64().unwrap(), 32);
    let hf: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("training_args.json")).unwrap())
            .unwrap();
    assert_eq!(hf["per_device_train_batch_size"], s["batch"]);
    let yaml = std::fs::read_to_string(out_dir.join("accelerate.yaml")).unwrap();
    assert!(yaml.contains("num_processes: 2"));
    let train: toml::Table =
        toml::from_str(&std::fs::read_to_string(out_dir.join("memfit-train.toml")).unwrap())
            .unwrap();
    assert_eq!(train["model"].as_str(), Some("t5-small"));
    assert_eq!(
        train["batch"].as_integer().map(|b| b as u64),
        s["batch"].as_u64()
    );
    let profiles: toml::Table =
        toml::from_str(&std::fs::read_to_string(out_dir.join("profiles.toml")).unwrap()).unwrap();
    assert!(!profiles["profile"].as_array().unwrap().is_empty());
    // no temporary files left behind
    let leftovers: Vec<_> = std::fs::read_dir(&out_dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty());
}

#[test]
fn bad_input_exits_2() {
    let budget = "--gpu-mem 8GiB --host-mem 8GiB";
    assert_exit(
        2,
        &[
            &format!("plan --model t5-small --emit deepspeed {budget}"), // --emit without --out
            "plan --model t5-small --gpu-mem lots --host-mem 8GiB",
            // a bare number has no unit (it was read as bytes)
            "plan --model t5-small --gpu-mem 24 --host-mem 8GiB",
            "plan --model t5-small --gpu-mem 24GiB --host-mem 64",
            // --data for the memfit TOML must exist
            &format!(
                "plan --model t5-small --emit memfit --out x --data /nonexistent.jsonl {budget}"
            ),
            &format!("plan --model t5-small --headroom 200% {budget}"),
            &format!("plan --model t5-small --emit docker --out x {budget}"),
            // --out naming a file (the test runs in the crate's directory; it is refused unread)
            &format!("plan --model t5-small --emit memfit --out Cargo.toml {budget}"),
            &format!("plan --model no-such-model {budget}"),
        ],
    );
}

#[test]
fn auto_budgets_read_this_machine() {
    // No GPU here (or one): either way the plan must come back with a host budget from /proc.
    let out = memfit(&["plan", "--model", "t5-small", "--seq", "128", "--json"]);
    assert!(
        matches!(out.status.code(), Some(0) | Some(3)),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["budget"]["host_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn tiers_json_has_every_cell() {
    let v = json(&["plan", "--model", "bert-base-chinese", "--tiers", "--json"]);
    let cells = v["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 5);
    assert!(cells.iter().all(|r| r.as_array().unwrap().len() == 8));
    // 64 GiB host, 80 GiB GPU: something fits
    assert!(cells[4][7].is_string());
}

/// The README's tier tables are exactly what the commands beside them print.
#[test]
fn readme_tier_tables_are_current() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    for args in [
        &["chatlm-mini"][..],
        &["bert-base-chinese"],
        &["qwen2.5-0.5b", "--method", "lora"],
    ] {
        let mut full = vec!["plan", "--model"];
        full.extend_from_slice(args);
        full.push("--tiers");
        let out = memfit(&full);
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        let table: String = text
            .lines()
            .filter(|l| l.starts_with('|'))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(
            readme.contains(&format!("$ memfit {}\n", full.join(" "))),
            "README lacks the command {full:?}"
        );
        assert!(
            readme.contains(&table),
            "README tier table for {args:?} is stale; rerun the command beside it"
        );
    }
}

/// The commands of docs/gpu.md "From one node to many", as printed there (with `--json`).
fn plan_json(command: &str) -> serde_json::Value {
    let mut args: Vec<&str> = command.split_whitespace().skip(2).collect();
    args.insert(0, "plan");
    args.push("--json");
    json(&args)
}

#[test]
fn data_parallel_figures_for_both_trainers_as_docs_gpu_prints_them() {
    let docs = include_str!("../../../docs/gpu.md");
    let base = "memfit plan --model chatlm-mini --gpus 3 --gpu-mem 20GiB --host-mem 64GiB --target-batch 96";
    let memfit_cmd = format!("{base} --runtime memfit");
    assert!(docs.contains(&memfit_cmd) && docs.contains(&format!("{base}\n")));
    let memfit_dp = plan_json(&memfit_cmd)["chosen"]["data_parallel"].clone();
    let torch_dp = plan_json(base)["chosen"]["data_parallel"].clone();
    for dp in [&memfit_dp, &torch_dp] {
        assert_eq!(dp["ranks"], 3, "{dp}");
        let speedup = dp["speedup_vs_one_gpu"].as_f64().unwrap();
        assert!(speedup > 1.0 && speedup < 3.0, "{dp}");
        assert!(dp["allreduce_bytes_per_step"].as_f64().unwrap() > 0.0);
        assert!(dp["allreduce_s_per_step"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(
        memfit_dp["overlap"], 0.0,
        "this plan fits without checkpointing: memfit train's backward is one pass, reduced after"
    );
    assert!(torch_dp["overlap"].as_f64().unwrap() > 0.0, "{torch_dp}");
    // the text report says it too
    let args: Vec<&str> = base.split_whitespace().skip(1).collect();
    let o = memfit(&args);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("data parallel over 3 ranks") && text.contains("the speed of one GPU"),
        "{text}"
    );
}

#[test]
fn fsdp2_plan_of_docs_gpu_writes_version_2_configs() {
    let docs = include_str!("../../../docs/gpu.md").replace("\\\n       ", "");
    let cmd = "memfit plan --model t5-base --nodes 2 --gpus 4 --gpu-mem 6GiB --host-mem 64GiB --target-batch 128 --sharding fsdp2 --emit accelerate,hf,profiles --out run-config/";
    assert!(docs.contains(cmd), "docs/gpu.md no longer prints: {cmd}");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run-config");
    let cmd = cmd.replace("run-config/", out.to_str().unwrap());
    let v = plan_json(&cmd);
    let s = &v["chosen"]["setup"];
    assert!(
        s["zero"].as_str().unwrap().starts_with("fsdp") || s["zero"] == "0",
        "FSDP's options only: {s}"
    );
    assert_eq!(v["chosen"]["data_parallel"]["ranks"], 8);
    let yaml = std::fs::read_to_string(out.join("accelerate.yaml")).unwrap();
    assert!(
        yaml.contains("num_machines: 2") && yaml.contains("num_processes: 8"),
        "{yaml}"
    );
    if s["zero"] != "0" {
        assert!(yaml.contains("fsdp_version: 2"), "{yaml}");
        let hf: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("training_args.json")).unwrap())
                .unwrap();
        assert_eq!(hf["fsdp_config"]["version"], 2);
    }
}
