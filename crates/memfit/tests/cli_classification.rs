//! `memfit train --task classification` end to end on the classification demo (a tiny BERT,
//! seconds): it learns; its checkpoint is the transformers classifier directory; `memfit predict`
//! gives the evaluation's predictions; `memfit export` strips the trainer's files; `--init` from it
//! keeps its head; a stop and `--resume` end bit-identical to an uninterrupted run; bad input exits 2
//! naming what is wrong and leaves no run behind.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn memfit() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memfit"))
}

fn ok(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

/// Exit 2 with every one of `words` in the message.
fn bad(out: &Output, words: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for w in words {
        assert!(err.contains(w), "{w:?} not in: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

fn jsonl(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The demo, `epochs` epochs, one thread, JSON summary.
fn demo(out: &Path, epochs: u32) -> Command {
    let mut cmd = memfit();
    cmd.args([
        "train",
        "--demo",
        "classification",
        "--threads",
        "1",
        "--json",
    ])
    .args(["--epochs", &epochs.to_string(), "--out"])
    .arg(out);
    cmd
}

#[test]
fn the_demo_learns_predicts_exports_and_starts_another_run() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let summary = ok(&demo(&run, 5).output().unwrap());
    assert_eq!(summary["task"], "classification");
    let (before, after) = (
        summary["before"].as_f64().unwrap(),
        summary["after"].as_f64().unwrap(),
    );
    assert!(before < 0.5 && after > 0.6, "accuracy {before} → {after}");
    assert_eq!(summary["classes"].as_array().unwrap().len(), 3);

    // The checkpoint is what BertForSequenceClassification.from_pretrained reads.
    let best = run.join("best");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(best.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "BertForSequenceClassification");
    let mut labels: Vec<String> = config["id2label"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    labels.sort();
    assert_eq!(labels, ["negative", "neutral", "positive"]);
    let weights = std::fs::read(best.join("model.safetensors")).unwrap();
    let names: Vec<String> = safetensors::SafeTensors::deserialize(&weights)
        .unwrap()
        .names()
        .into_iter()
        .map(str::to_string)
        .collect();
    assert!(names.iter().any(|n| n == "classifier.weight"), "{names:?}");
    assert!(
        names
            .iter()
            .any(|n| n == "bert.encoder.layer.1.output.dense.weight")
    );

    // predict on the last checkpoint gives the last evaluation's accuracy, row for row.
    let last = summary["last_checkpoint"].as_str().unwrap();
    let valid = run.join("demo/valid.jsonl");
    let preds = dir.path().join("preds.jsonl");
    ok(&memfit()
        .args(["predict", "--model", last, "--out"])
        .arg(&preds)
        .arg("--input")
        .arg(&valid)
        .output()
        .unwrap());
    let (rows, predicted) = (jsonl(&valid), jsonl(&preds));
    assert_eq!(rows.len(), predicted.len());
    let right = rows
        .iter()
        .zip(&predicted)
        .filter(|(r, p)| r["label"] == p["label"])
        .count();
    assert!((right as f64 / rows.len() as f64 - after).abs() < 1e-9);
    for p in &predicted {
        let scores: Vec<f64> = p["scores"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_f64().unwrap())
            .collect();
        assert_eq!(scores.len(), 3);
        assert!((scores.iter().sum::<f64>() - 1.0).abs() < 1e-6);
    }

    // export: the model's files only
    let hf = dir.path().join("hf");
    ok(&memfit()
        .arg("export")
        .arg(&best)
        .arg("--out")
        .arg(&hf)
        .output()
        .unwrap());
    assert!(hf.join("model.safetensors").is_file() && hf.join("tokenizer.json").is_file());
    assert!(!hf.join("optimizer.safetensors").exists() && !hf.join("trainer_state.json").exists());

    // a new run from the exported classifier keeps its head (nothing newly initialised)
    let demo = run.join("demo");
    let tuned = dir.path().join("tuned");
    let out = memfit()
        .args([
            "train",
            "--max-steps",
            "2",
            "--threads",
            "1",
            "--json",
            "--init",
        ])
        .arg(&hf)
        .arg("--data")
        .arg(demo.join("train.jsonl"))
        .arg("--tokenizer")
        .arg(demo.join("tokenizer"))
        .arg("--out")
        .arg(&tuned)
        .output()
        .unwrap();
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("init: weights from"), "{err}");
    assert!(!err.contains("newly initialised"), "{err}");
}

/// A run stopped by SIGTERM after its first step and resumed ends with the weights of a run never
/// stopped.
#[test]
fn a_stopped_and_resumed_run_ends_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, cut) = (dir.path().join("whole"), dir.path().join("cut"));
    ok(&demo(&whole, 2).output().unwrap());
    let mut child = demo(&cut, 2)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    for line in lines.by_ref() {
        if line.unwrap().starts_with("step 1/") {
            break;
        }
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let code = child.wait().unwrap().code();
    // The run may have finished before the signal landed: both outcomes are legal.
    assert!(matches!(code, Some(0 | 75)), "{code:?}: {rest:?}");
    if code == Some(75) {
        ok(&memfit()
            .args(["train", "--json", "--resume"])
            .arg(&cut)
            .output()
            .unwrap());
    }
    let last = |run: &Path| {
        let summary = jsonl(&run.join("events.jsonl"));
        let ckpt = summary
            .iter()
            .rev()
            .find(|e| e["kind"] == "checkpoint")
            .unwrap()["path"]
            .as_str()
            .unwrap()
            .to_string();
        std::fs::read(Path::new(&ckpt).join("model.safetensors")).unwrap()
    };
    assert!(
        last(&whole) == last(&cut),
        "the resumed run's weights differ"
    );
}

#[test]
fn bad_input_is_named_and_leaves_no_run() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    ok(&demo(&run, 1).output().unwrap());
    let demo_dir = run.join("demo");
    let tokenizer = demo_dir.join("tokenizer");

    // A label column that is missing.
    let no_label = dir.path().join("no_label.jsonl");
    std::fs::write(&no_label, "{\"text\": \"the food was good\"}\n").unwrap();
    let attempt = dir.path().join("attempt");
    // `memfit train FLAGS… MODEL --data DATA --tokenizer … --out attempt`
    let try_train = |flags: &[&str], model: &Path, data: &Path| {
        memfit()
            .arg("train")
            .args(flags)
            .arg(model)
            .arg("--data")
            .arg(data)
            .arg("--tokenizer")
            .arg(&tokenizer)
            .arg("--out")
            .arg(&attempt)
            .output()
            .unwrap()
    };
    let out = try_train(
        &["--task", "classification", "--init"],
        &run.join("best"),
        &no_label,
    );
    bad(&out, &["label", "no_label.jsonl"]);
    assert!(
        !attempt.exists(),
        "a failed start left {}",
        attempt.display()
    );

    // Labels the init checkpoint does not have.
    let other = dir.path().join("other.jsonl");
    std::fs::write(
        &other,
        "{\"text\": \"the food was good\", \"label\": \"joy\"}\n",
    )
    .unwrap();
    let out = try_train(&["--init"], &run.join("best"), &other);
    bad(&out, &["\"joy\"", "positive"]);
    assert!(!attempt.exists());

    // One stray integer label: it made a million-class run that the kernel's OOM killer ended
    // (8 B × labels² of evaluation counts); 2^31 aborted in the label names. Now a bad row, named.
    for stray in ["1000000", "2147483648", "4000000000"] {
        let labels = dir.path().join("labels.jsonl");
        let mut text = String::new();
        for (i, l) in ["0", "1", "2", stray].iter().enumerate() {
            text += &format!("{{\"text\": \"the food was good {i}\", \"label\": {l}}}\n");
        }
        std::fs::write(&labels, text).unwrap();
        let out = try_train(
            &["--task", "classification", "--model"],
            &demo_dir.join("config.json"),
            &labels,
        );
        bad(
            &out,
            &["labels.jsonl", "line 4", &format!("label {stray}"), "65535"],
        );
        assert!(
            !attempt.exists(),
            "label {stray}: a failed start left the run"
        );
        let store = dir.path().join("labels.store");
        let out = memfit()
            .args(["data", "prepare", "--task", "classification", "--input"])
            .arg(&labels)
            .arg("--tokenizer")
            .arg(&tokenizer)
            .arg("--out")
            .arg(&store)
            .output()
            .unwrap();
        bad(&out, &["labels.jsonl", "line 4", &format!("label {stray}")]);
        assert!(!store.exists());
    }

    // An --init checkpoint with one bit flipped: its SHA256SUMS names the file.
    let flipped = dir.path().join("flipped");
    std::fs::create_dir(&flipped).unwrap();
    for entry in std::fs::read_dir(run.join("best")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, flipped.join(path.file_name().unwrap())).unwrap();
    }
    let weights = flipped.join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&weights, bytes).unwrap();
    let out = try_train(&["--init"], &flipped, &demo_dir.join("train.jsonl"));
    bad(&out, &["--init", "model.safetensors", "SHA-256"]);
    assert!(!attempt.exists());
    let out = memfit()
        .args(["export"])
        .arg(&flipped)
        .arg("--out")
        .arg(dir.path().join("exported"))
        .output()
        .unwrap();
    bad(&out, &["model.safetensors", "SHA-256"]);

    // A resume across tasks.
    let out = memfit()
        .args(["train", "--task", "seq2seq", "--resume"])
        .arg(&run)
        .output()
        .unwrap();
    bad(&out, &["classification", "--task seq2seq"]);

    // predict on a directory that is not a checkpoint.
    let out = memfit()
        .args(["predict", "--input"])
        .arg(demo_dir.join("valid.jsonl"))
        .arg("--model")
        .arg(&demo_dir)
        .output()
        .unwrap();
    bad(&out, &["not a checkpoint", "demo"]);

    // --init of another architecture than --model.
    let out = try_train(
        &["--model", "t5-small", "--init"],
        &run.join("best"),
        &demo_dir.join("train.jsonl"),
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!attempt.exists());
}
