//! `--device` on a machine without a GPU (CI's): `auto` trains on the CPU and says why; a CUDA
//! device that cannot run exits 2 naming what is missing, before anything is created; `memfit
//! check` says whether this binary can train on a GPU; data-parallel ranks on the CPU (`cpu:N`, the
//! multi-GPU code path) train as one device with the accumulation times the ranks, and a resume
//! on another rank count continues the same run.

use std::path::Path;
use std::process::{Command, Output};

fn memfit() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memfit"))
}

/// Whether this machine shows a CUDA GPU (then the no-GPU expectations below do not apply).
fn has_gpu() -> bool {
    let out = memfit().args(["check", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["memfit_train_gpu"]["devices"]
        .as_array()
        .is_some_and(|d| !d.is_empty())
}

fn demo(out: &Path, device: &str) -> Output {
    memfit()
        .args(["train", "--demo", "classification", "--threads", "1"])
        .args(["--max-steps", "3", "--device", device, "--out"])
        .arg(out)
        .output()
        .unwrap()
}

#[test]
fn auto_and_cpu_train_on_the_cpu_and_say_why() {
    if has_gpu() {
        eprintln!("skipped: this machine has a CUDA GPU (auto would take it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (device, why) in [
        ("auto", "device cpu (auto: "),
        ("cpu", "device cpu (asked)"),
    ] {
        let run = dir.path().join(device);
        let out = demo(&run, device);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(err.contains(why), "{why:?} not in: {err}");
        assert!(err.contains("training state on the host"), "{err}");
        let log = std::fs::read_to_string(run.join("train.log")).unwrap();
        assert!(
            log.contains(why),
            "the run's log keeps the device line: {log}"
        );
    }
}

#[test]
fn a_cuda_device_that_cannot_run_is_named_and_nothing_is_created() {
    if has_gpu() {
        eprintln!("skipped: this machine has a CUDA GPU");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for device in ["cuda", "cuda:7", "cuda:0,1", "cuda:all"] {
        let run = dir.path().join("run");
        let out = demo(&run, device);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        let index = if device == "cuda" { "cuda:0" } else { device };
        assert!(err.contains(&format!("--device {index}: ")), "{err}");
        // this binary has no CUDA, or (built with it) the machine has no driver
        assert!(
            err.contains("built without CUDA") || err.contains("libcuda.so.1"),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
        assert!(!run.exists(), "a refused start left {}", run.display());
    }
    // not a device at all: clap's usage error, exit 2
    let out = demo(&dir.path().join("x"), "gpu");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cuda:N"), "{err}");
}

#[test]
fn check_says_whether_this_binary_can_train_on_a_gpu() {
    let out = memfit().args(["check", "--json"]).output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let gpu = &v["memfit_train_gpu"];
    assert!(gpu["ready"].is_boolean(), "{gpu}");
    assert!(gpu["devices"].is_array(), "{gpu}");
    let detail = gpu["detail"].as_str().unwrap();
    if gpu["ready"] == false {
        assert!(!detail.is_empty(), "a reason is given");
    }
    let table = memfit().arg("check").output().unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("memfit train on GPU"), "{text}");
    let start: String = detail.chars().take(20).collect();
    assert!(
        text.contains(&start),
        "the table gives the same reason: {text}"
    );
}

fn losses(run: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    (text.lines())
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"]
                .as_f64()
                .unwrap()
        })
        .collect()
}

fn train(out: &Path, device: &str, accum: &str) -> Output {
    train_with(out, device, accum, &[])
}

fn train_with(out: &Path, device: &str, accum: &str, more: &[&str]) -> Output {
    memfit()
        .args([
            "train",
            "--demo",
            "classification",
            "--threads",
            "1",
            "--max-steps",
            "6",
        ])
        .args([
            "--save-steps",
            "3",
            "--accum",
            accum,
            "--device",
            device,
            "--out",
        ])
        .arg(out)
        .args(more)
        .output()
        .unwrap()
}

fn assert_same_losses(what: &str, got: &[f64], reference: &[f64]) {
    assert_eq!(got.len(), reference.len(), "{what}");
    for (step, (a, b)) in got.iter().zip(reference).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs().max(1.0),
            "{what}: step {}: {a} vs {b}",
            step + 1
        );
    }
}

#[test]
fn cpu_ranks_train_as_one_device_and_resume_on_another_rank_count() {
    let dir = tempfile::tempdir().unwrap();
    let one = dir.path().join("one");
    let out = train(&one, "cpu", "2");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let two = dir.path().join("two");
    let out = train(&two, "cpu:2", "1");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("data parallel: 2 ranks (cpu:2)"), "{err}");
    assert!(
        err.contains("2 micro-batches a step = accumulation 1 per rank"),
        "{err}"
    );
    assert_same_losses(
        "cpu:2 × accum 1 against cpu × accum 2",
        &losses(&two),
        &losses(&one),
    );
    let config = std::fs::read_to_string(two.join("config.toml")).unwrap();
    assert!(
        config.contains("accum = 2"),
        "config.toml keeps a step's micro-batches: {config}"
    );
    let sharded = dir.path().join("zero1");
    assert!(
        err.contains("all-reduced after each step's last backward"),
        "{err}"
    );
    // ZeRO-1 with per-block checkpointing: the reduce overlapped with the backward
    let out = train_with(
        &sharded,
        "cpu:2",
        "1",
        &["--shard-optimizer", "--grad-ckpt"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("optimizer state sharded between the ranks (ZeRO-1)"),
        "{err}"
    );
    assert!(err.contains("all-reduced block by block"), "{err}");
    assert_same_losses(
        "cpu:2 ZeRO-1 with --grad-ckpt against cpu × accum 2",
        &losses(&sharded),
        &losses(&one),
    );
    // back to the checkpoint of step 3, then on to step 6 on 3 ranks
    std::fs::remove_dir_all(two.join("checkpoints/step-6")).unwrap();
    let out = memfit()
        .args([
            "train",
            "--resume",
            two.to_str().unwrap(),
            "--device",
            "cpu:3",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("data parallel: 3 ranks (cpu:3)"), "{err}");
    assert!(
        err.contains("accumulation 1 per rank (the last group of a step leaves 1 rank(s) idle)"),
        "{err}"
    );
    assert_same_losses(
        "cpu:2, then cpu:3 from step 3",
        &losses(&two),
        &losses(&one),
    );
}
