//! The hand-offs between commands: every command `memfit check` prints runs as printed, and the
//! config `memfit plan --emit memfit` writes is one `memfit train` takes — or refuses, naming the file,
//! when it names no data (it no longer trains the demo's data in silence).

use std::path::Path;
use std::process::{Command, Output};

fn memfit() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memfit"))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `memfit check --json --model … ARGS` in `dir`: its `recommendation`.
fn check(dir: &Path, model: &str, extra: &[&str]) -> serde_json::Value {
    let o = memfit()
        .args(["check", "--json", "--model", model, "--dir"])
        .arg(dir)
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["recommendation"].clone()
}

/// Runs a printed command as printed, in `cwd`: each `memfit` word is this build's binary.
fn run_printed(command: &str, cwd: &Path) -> Output {
    let words: Vec<String> = command
        .split_whitespace()
        .map(|w| {
            if w == "memfit" {
                env!("CARGO_BIN_EXE_memfit").to_string()
            } else {
                w.to_string()
            }
        })
        .collect();
    Command::new(&words[0])
        .args(&words[1..])
        .current_dir(cwd)
        .output()
        .unwrap()
}

#[test]
fn every_command_check_prints_runs_as_printed() {
    let dir = tempfile::tempdir().unwrap();
    // the demo's tiny T5 and its data: the commands train it for one epoch in seconds
    let demo = memfit_train::demo::seq2seq::write(&dir.path().join("demo"), 7).unwrap();
    let (train, valid, tok) = (
        demo.train.to_str().unwrap(),
        demo.valid.to_str().unwrap(),
        demo.tokenizer_dir.to_str().unwrap(),
    );
    let model = demo.model_config.to_str().unwrap();
    let seq = ["--seq", "16", "--target-batch", "256"];
    let mut args = vec!["--data", train, "--valid", valid, "--tokenizer", tok];
    args.extend(seq);
    let rec = check(dir.path(), model, &args);
    let memfit_rec = &rec["memfit"];
    assert_eq!(memfit_rec["fits"], true, "{rec}");
    assert!(memfit_rec.get("note").is_none(), "{memfit_rec}");
    let commands = memfit_rec["commands"].as_object().unwrap();
    assert_eq!(commands.len(), 2, "train and guarded: {commands:?}");
    for (name, command) in commands {
        let command = command.as_str().unwrap();
        assert!(!command.contains("TRAIN_FILE"), "{command}");
        // each in its own directory: runs/<second> of two runs must not collide
        let cwd = tempfile::tempdir().unwrap();
        let o = run_printed(command, cwd.path());
        assert!(o.status.success(), "{name}: {command}\n{}", stderr(&o));
        let runs: Vec<_> = std::fs::read_dir(cwd.path().join("runs"))
            .unwrap()
            .collect();
        assert_eq!(runs.len(), 1, "{name}: one run directory");
        let run = runs[0].as_ref().unwrap().path();
        let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
        // trained on the data the check was given, not on a demo of its own
        assert!(config.contains(train), "{name}: {config}");
        assert!(!run.join("demo").exists(), "{name}");
        assert!(run.join("best").is_dir() || run.join("checkpoints").is_dir());
    }
    // the PyTorch stack's command names files that exist (train.py is the user's script)
    let accelerate = rec["pytorch"]["commands"]["accelerate"].as_str().unwrap();
    for word in accelerate
        .split_whitespace()
        .filter(|w| w.ends_with(".yaml"))
    {
        let yaml = std::fs::read_to_string(word).unwrap();
        assert!(yaml.contains("distributed_type: '"), "{yaml}");
    }
}

#[test]
fn a_config_without_data_says_so_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let rec = check(dir.path(), "chatlm-mini", &[]);
    let memfit_rec = &rec["memfit"];
    assert_eq!(memfit_rec["fits"], true, "{rec}");
    let config = memfit_rec["files"]["memfit_train"].as_str().unwrap();
    let printed = memfit_rec["commands"]["train"].as_str().unwrap();
    // the printed command shows what is missing; the note says how to fill it in
    assert_eq!(
        printed,
        format!("memfit train --config {config} --data TRAIN_FILE --tokenizer TOKENIZER")
    );
    assert!(memfit_rec["note"].as_str().unwrap().contains(config));
    // the file alone is refused before anything is created: exit 2, the file named
    let out = dir.path().join("run");
    let o = memfit()
        .args(["train", "--config", config, "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.starts_with("error: "), "{err}");
    assert!(
        err.contains(config) && err.contains("names no training data"),
        "{err}"
    );
    assert!(!out.exists(), "a refused start leaves nothing behind");
    // the emitted max_steps = 0 means "run the epochs": --plan-only takes the file as written
    let o = memfit()
        .args(["train", "--plan-only", "--config", config])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_setup_the_memfit_stack_cannot_plan_gets_no_command() {
    let dir = tempfile::tempdir().unwrap();
    // QLoRA: memfit's trainer has no 4-bit base, so its stack plans nothing, and says so
    let rec = check(dir.path(), "qwen2.5-0.5b", &["--method", "qlora"]);
    let memfit_rec = &rec["memfit"];
    assert_eq!(memfit_rec["fits"], false, "{rec}");
    assert!(memfit_rec.get("commands").is_none(), "{memfit_rec}");
    assert!(!memfit_rec["reason"].as_str().unwrap().is_empty());
}

#[test]
fn a_decoder_lora_plan_gets_a_config_that_memfit_train_takes() {
    let dir = tempfile::tempdir().unwrap();
    // memfit's host model has decoder/LoRA terms: the plan comes with its memfit train config
    let rec = check(dir.path(), "qwen2.5-0.5b", &["--method", "lora"]);
    let memfit_rec = &rec["memfit"];
    assert_eq!(memfit_rec["fits"], true, "{rec}");
    assert!(memfit_rec["commands"]["train"].is_string(), "{memfit_rec}");
    let config = memfit_rec["files"]["memfit_train"].as_str().unwrap();
    let o = memfit()
        .args(["train", "--plan-only", "--config", config])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_bad_value_in_a_config_names_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("run.toml");
    std::fs::write(&config, "model = \"t5-small\"\nprecision = \"amp-fp16\"\n").unwrap();
    let o = memfit()
        .args(["train", "--plan-only", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(
        err.contains(config.to_str().unwrap()) && err.contains("line 2"),
        "{err}"
    );
    assert!(err.contains("`fp32` or `bf16`"), "{err}");
}

#[test]
fn check_tells_the_setup_for_bert_classification() {
    let dir = tempfile::tempdir().unwrap();
    let rec = check(
        dir.path(),
        "bert-base-chinese",
        &["--task", "classification", "--seq", "128"],
    );
    let memfit_rec = &rec["memfit"];
    assert_eq!(memfit_rec["fits"], true, "{rec}");
    assert_eq!(memfit_rec["setup"]["task"], "classification");
    assert_eq!(memfit_rec["setup"]["seq"], 128);
    let config = memfit_rec["files"]["memfit_train"].as_str().unwrap();
    let toml = std::fs::read_to_string(config).unwrap();
    assert!(toml.contains("model = \"bert-base-chinese\""), "{toml}");
    assert!(toml.contains("task = \"classification\""), "{toml}");
    // memfit train takes the file as written (the data placeholders aside)
    let o = memfit()
        .args(["train", "--plan-only", "--json", "--config", config])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    // the PyTorch stack answers for the same task, with its files
    let pytorch = &rec["pytorch"];
    if pytorch["fits"] == true {
        assert_eq!(pytorch["setup"]["task"], "classification");
        let ds = pytorch["files"]["deepspeed"].as_str().unwrap();
        assert!(Path::new(ds).is_file(), "{ds}");
    } else {
        assert!(!pytorch["reason"].as_str().unwrap().is_empty(), "{pytorch}");
    }

    // A BERT classifier small enough to train here, with the classification demo's data: every
    // command check prints runs as printed and trains a classifier on that data.
    let demo = memfit_train::demo::classification::write(&dir.path().join("demo"), 7).unwrap();
    let (train, valid, tok) = (
        demo.train.to_str().unwrap(),
        demo.valid.to_str().unwrap(),
        demo.tokenizer_dir.to_str().unwrap(),
    );
    let model = demo.model_config.to_str().unwrap();
    let out = dir.path().join("configs");
    let args = [
        "--task",
        "classification",
        "--seq",
        "32",
        "--target-batch",
        "256",
        "--data",
        train,
        "--valid",
        valid,
        "--tokenizer",
        tok,
        "--out",
        out.to_str().unwrap(),
    ];
    let rec = check(dir.path(), model, &args);
    let memfit_rec = &rec["memfit"];
    assert_eq!(memfit_rec["fits"], true, "{rec}");
    let commands = memfit_rec["commands"].as_object().unwrap();
    assert_eq!(commands.len(), 2, "train and guarded: {commands:?}");
    for (name, command) in commands {
        let command = command.as_str().unwrap();
        let cwd = tempfile::tempdir().unwrap();
        let o = run_printed(command, cwd.path());
        assert!(o.status.success(), "{name}: {command}\n{}", stderr(&o));
        let runs: Vec<_> = std::fs::read_dir(cwd.path().join("runs"))
            .unwrap()
            .collect();
        assert_eq!(runs.len(), 1, "{name}: one run directory");
        let run = runs[0].as_ref().unwrap().path();
        let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
        assert!(
            config.contains("task = \"classification\""),
            "{name}: {config}"
        );
        assert!(config.contains(train), "{name}: {config}");
        let best: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run.join("best/config.json")).unwrap())
                .unwrap();
        assert_eq!(best["architectures"][0], "BertForSequenceClassification");
    }
}
