//! Named policies end to end: `memfit plan --policy qwen-*` estimates a fixed DeepSpeed preset and
//! writes its files; `memfit train --policy bert-ultra-low` applies its settings to the
//! classification demo; a policy on a run it is not made for exits 2 naming both.

use std::path::Path;
use std::process::{Command, Output};

fn memfit() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memfit"))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Exit 2, one `error: ` message holding every one of `words`, no panic.
fn refused(o: &Output, words: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.starts_with("error: "), "{err}");
    for w in words {
        assert!(err.contains(w), "{w:?} not in: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

/// `memfit plan --policy NAME` for Qwen2.5-0.5B LoRA with fixed budgets (the machine's own would
/// make the verdict depend on where the test runs), the three PyTorch files into `out`.
fn qwen_plan(policy: &str, gpu: &str, out: &Path) -> Output {
    memfit()
        .args([
            "plan",
            "--policy",
            policy,
            "--model",
            "qwen2.5-0.5b",
            "--method",
            "lora",
        ])
        .args(["--gpu-mem", gpu, "--host-mem", "64GiB", "--json"])
        .args(["--emit", "deepspeed,accelerate,hf", "--out"])
        .arg(out)
        .output()
        .unwrap()
}

#[test]
fn qwen_presets_write_their_deepspeed_setup() {
    // (policy, micro-batch, accumulation, seq, stage, optimizer offloaded, parameters offloaded)
    let presets = [
        ("qwen-minimal", 1, 16, 1024, 3, true, true),
        ("qwen-stage3", 2, 8, 2048, 3, false, false),
        ("qwen-stage2-offload", 2, 8, 2048, 2, true, false),
        ("qwen-deepspeed", 4, 4, 2048, 2, false, false),
    ];
    for (policy, micro, accum, seq, stage, off_opt, off_par) in presets {
        let dir = tempfile::tempdir().unwrap();
        // Qwen's 151,936-token vocabulary: 4 × 2048 rows of fp32 logits alone are 5 GB
        let o = qwen_plan(policy, "80GiB", dir.path());
        assert!(o.status.success(), "{policy}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["policy"], policy);
        assert!(v["policy_source"].as_str().unwrap().contains("issue 15"));
        assert_eq!(v["fits"], true, "{policy}: {v}");
        assert_eq!(v["checked"], "GPU and host");
        let setup = &v["chosen"]["setup"];
        assert_eq!(setup["seq"], seq, "{policy}");
        assert_eq!(setup["precision"], "amp-bf16");
        assert_eq!(setup["grad_ckpt"], true);
        assert!(v["chosen"]["gpu"]["peak_allocated_bytes"].as_u64().unwrap() > 0);

        let ds = read_json(&dir.path().join("deepspeed.json"));
        assert_eq!(ds["train_micro_batch_size_per_gpu"], micro, "{policy}");
        assert_eq!(ds["gradient_accumulation_steps"], accum, "{policy}");
        assert_eq!(ds["train_batch_size"], micro * accum, "{policy}");
        assert_eq!(ds["bf16"]["enabled"], true);
        let zero = &ds["zero_optimization"];
        assert_eq!(zero["stage"], stage, "{policy}");
        let device = |key: &str| zero[key]["device"].as_str().map(str::to_owned);
        let cpu = Some("cpu".to_owned());
        assert_eq!(
            device("offload_optimizer"),
            off_opt.then(|| cpu.clone().unwrap())
        );
        assert_eq!(
            device("offload_param"),
            off_par.then(|| cpu.clone().unwrap())
        );

        let hf = read_json(&dir.path().join("training_args.json"));
        assert_eq!(hf["per_device_train_batch_size"], micro);
        assert_eq!(hf["gradient_accumulation_steps"], accum);
        assert_eq!(hf["gradient_checkpointing"], true);
        // named by their absolute path: accelerate and transformers resolve a relative one against
        // the directory the user launches from
        let deepspeed = std::path::absolute(dir.path().join("deepspeed.json")).unwrap();
        assert_eq!(hf["deepspeed"], deepspeed.to_str().unwrap());
        let yaml = std::fs::read_to_string(dir.path().join("accelerate.yaml")).unwrap();
        assert!(yaml.contains("distributed_type: 'DEEPSPEED'"), "{yaml}");
        let named = format!("deepspeed_config_file: '{}'", deepspeed.display());
        assert!(yaml.contains(&named), "{yaml}");
        assert!(
            yaml.contains(&format!("zero3_init_flag: {}", stage == 3)),
            "{yaml}"
        );
    }
}

#[test]
fn a_preset_says_what_it_sets_and_what_was_checked() {
    let dir = tempfile::tempdir().unwrap();
    let o = memfit()
        .args([
            "plan",
            "--policy",
            "qwen-minimal",
            "--model",
            "qwen2.5-0.5b",
            "--method",
        ])
        .args(["lora", "--gpu-mem", "none", "--host-mem", "64GiB"])
        .args(["--emit", "deepspeed", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(
            "policy qwen-minimal (a fixed preset, not searched) → micro-batch 1, max length 1024, \
             accumulation 16, bf16 mixed precision, gradient checkpointing, ZeRO-3, parameters \
             and optimizer offloaded to CPU"
        ),
        "{text}"
    );
    // no GPU budget: the DeepSpeed preset stays on the GPU and only the host side is checked
    assert!(text.contains("checked: host only: no GPU budget"), "{text}");
    assert!(text.contains("GPU: peak allocated"), "{text}");
    assert!(dir.path().join("deepspeed.json").is_file());
}

#[test]
fn presets_refuse_what_they_are_not_made_for() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("files");
    let plan = |args: &[&str]| {
        memfit()
            .args(["plan", "--gpu-mem", "24GiB", "--host-mem", "64GiB"])
            .args(args)
            .args(["--emit", "deepspeed", "--out"])
            .arg(&out)
            .output()
            .unwrap()
    };
    // a LoRA preset without LoRA
    let o = plan(&["--policy", "qwen-minimal", "--model", "qwen2.5-0.5b"]);
    refused(&o, &["qwen-minimal", "--method lora", "full"]);
    // a PyTorch preset for memfit's own trainer
    let args = [
        "--policy",
        "qwen-stage3",
        "--model",
        "qwen2.5-0.5b",
        "--method",
        "lora",
    ];
    let o = plan(&[&args[..], &["--runtime", "memfit"]].concat());
    refused(&o, &["qwen-stage3", "memfit's own trainer"]);
    // a decoder preset on an encoder, a classification preset on a decoder
    let o = plan(&[
        "--policy",
        "qwen-stage3",
        "--model",
        "bert-base-chinese",
        "--method",
        "lora",
    ]);
    refused(&o, &["qwen-stage3", "causal-lm", "classification"]);
    let o = plan(&["--policy", "bert-safe", "--model", "qwen2.5-0.5b"]);
    refused(&o, &["bert-safe", "classification", "causal-lm"]);
    // the seed's tables read the machine: memfit train's, not a preset to estimate
    let o = plan(&[
        "--policy",
        "chatlm-v8",
        "--model",
        "chatlm-mini",
        "--runtime",
        "memfit",
    ]);
    refused(&o, &["chatlm-v8", "memfit train --policy chatlm-v8"]);
    let o = plan(&["--policy", "qwen-9", "--model", "qwen2.5-0.5b"]);
    refused(&o, &["qwen-9", "qwen-minimal"]);
    assert!(!out.exists(), "a refused plan writes nothing");

    // a preset that does not fit: exit 3 with the shortfall, and no files
    let o = qwen_plan("qwen-deepspeed", "16GiB", &out);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--policy qwen-deepspeed does not fit"),
        "{}",
        stderr(&o)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["fits"], false);
    assert!(v["reason"].as_str().unwrap().contains("per GPU"), "{v}");
    assert!(!out.exists(), "a preset that does not fit writes nothing");
}

#[test]
fn bert_ultra_low_sets_the_classification_demo_up() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let o = memfit()
        .args([
            "train",
            "--demo",
            "classification",
            "--policy",
            "bert-ultra-low",
        ])
        .args(["--max-steps", "2", "--threads", "1", "--json", "--out"])
        .arg(&run)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let sets = "bert-ultra-low (a fixed preset) → micro-batch 1, max length 128, accumulation 16, \
                bf16 mixed precision, gradient checkpointing, 0 loader workers";
    let err = stderr(&o);
    assert!(err.contains(sets), "{err}");
    // the demo's BERT has 64 positions: the 128 tokens are cut there, and said
    assert!(err.contains("cut to the model's 64 positions"), "{err}");
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(log.contains(sets), "{log}");
    let config: toml::Table = std::fs::read_to_string(run.join("config.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let int = |k: &str| config[k].as_integer().unwrap();
    assert_eq!((int("batch"), int("accum"), int("seq")), (1, 16, 64));
    assert_eq!(config["precision"].as_str(), Some("bf16"));
    assert_eq!(config["grad_ckpt"].as_bool(), Some(true));
    let planning = &read_json(&run.join("plan.json"))["planning"];
    assert_eq!(planning["policy"], "bert-ultra-low");
    assert!(
        planning["policy_source"]
            .as_str()
            .unwrap()
            .contains("4 GB GPU")
    );
    assert_eq!(planning["chosen"]["settings"]["effective_batch"], 16);
    // the run trained under them: 2 steps of 16 one-row micro-batches
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
    assert_eq!(
        (last["step"].as_u64(), last["micro_batch"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(last["accum"], 16);
}

#[test]
fn a_bert_policy_on_another_task_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // the default demo is seq2seq (a T5)
    let o = memfit()
        .args([
            "train",
            "--policy",
            "bert-safe",
            "--max-steps",
            "1",
            "--out",
        ])
        .arg(&run)
        .output()
        .unwrap();
    refused(&o, &["bert-safe", "classification", "seq2seq"]);
    assert!(!run.exists(), "a refused start leaves nothing behind");
    // a PyTorch preset is not one of memfit train's
    let o = memfit()
        .args([
            "train",
            "--demo",
            "classification",
            "--policy",
            "qwen-minimal",
            "--out",
        ])
        .arg(&run)
        .output()
        .unwrap();
    refused(&o, &["qwen-minimal", "memfit plan --policy qwen-minimal"]);
    assert!(!run.exists());
}

/// `--out` given relative, from another directory: the files name the DeepSpeed JSON where it was
/// written, so `accelerate launch --config_file DIR/accelerate.yaml` works from anywhere.
#[test]
fn a_relative_out_is_named_absolutely_in_the_files() {
    let cwd = tempfile::tempdir().unwrap();
    let o = memfit()
        .current_dir(cwd.path())
        .args([
            "plan",
            "--policy",
            "qwen-stage2-offload",
            "--model",
            "qwen2.5-0.5b",
        ])
        .args([
            "--method",
            "lora",
            "--gpu-mem",
            "80GiB",
            "--host-mem",
            "64GiB",
        ])
        .args(["--emit", "deepspeed,accelerate,hf", "--out", "configs/ds"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let written = std::fs::canonicalize(cwd.path().join("configs/ds/deepspeed.json")).unwrap();
    let yaml = std::fs::read_to_string(cwd.path().join("configs/ds/accelerate.yaml")).unwrap();
    let named = yaml
        .lines()
        .find_map(|l| l.trim().strip_prefix("deepspeed_config_file: "))
        .expect("the YAML names its DeepSpeed file");
    let named = std::path::Path::new(named.trim_matches('\''));
    assert!(named.is_absolute(), "{yaml}");
    assert_eq!(std::fs::canonicalize(named).unwrap(), written);
    let hf = read_json(&cwd.path().join("configs/ds/training_args.json"));
    let named = std::path::Path::new(hf["deepspeed"].as_str().unwrap());
    assert_eq!(std::fs::canonicalize(named).unwrap(), written);
}
