//! `--device` on a machine without a GPU (CI's): `auto` trains on the CPU and says why; a CUDA
//! device that cannot run exits 2 naming what is missing, before anything is created; `memfit
//! check` says whether this binary can train on a GPU.

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
    for device in ["cuda", "cuda:7"] {
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
