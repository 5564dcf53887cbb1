//! `memfit check`: works on any Linux machine, says what is missing instead of failing.

use std::process::Command;

fn check(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_memfit"))
        .arg("check")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn json_reports_every_source_or_says_why_not() {
    let o = check(&["--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mem = &v["memory"];
    let total = mem["total_bytes"].as_u64().unwrap();
    assert!(total > 0 && mem["available_bytes"].as_u64().unwrap() <= total);
    assert!(v["cpu"]["logical_cores"].as_u64().unwrap() >= 1);
    assert!(v["effective_limit_bytes"].as_u64().unwrap() <= total);
    let missing: Vec<&str> = v["missing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    // Each optional source is either present or named in `missing`.
    assert!(v["pressure"].is_object() || missing.iter().any(|m| m.starts_with("PSI")));
    assert!(
        !v["gpus"].as_array().unwrap().is_empty() || missing.iter().any(|m| m.starts_with("GPU"))
    );
    assert!(v["cgroup"].is_object() || missing.iter().any(|m| m.starts_with("cgroup")));
    // No swap must be warned about.
    if mem["swap_total_bytes"] == 0 {
        assert!(
            v["warnings"]
                .as_array()
                .unwrap()
                .iter()
                .any(|w| w.as_str().unwrap().contains("no swap"))
        );
    }
}

#[test]
fn table_names_each_row() {
    let dir = tempfile::tempdir().unwrap();
    let o = check(&["--dir", dir.path().to_str().unwrap()]);
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    for row in [
        "CPU",
        "RAM",
        "Swap",
        "cgroup",
        "Effective limit",
        "Disk",
        "GPUs",
        "OOM daemons",
    ] {
        assert!(out.contains(row), "no {row} row in\n{out}");
    }
}

#[test]
fn model_gets_the_planners_setup_commands_and_files() {
    let dir = tempfile::tempdir().unwrap();
    let o = check(&[
        "--json",
        "--model",
        "t5-small",
        "--dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rec = &v["recommendation"];
    assert!(v["memory"].is_object(), "the machine report is still there");
    let memfit = &rec["memfit"];
    assert_eq!(memfit["fits"], true, "{rec}");
    assert!(memfit["setup"]["batch"].as_u64().unwrap() >= 1);
    let train = memfit["files"]["memfit_train"].as_str().unwrap();
    // no --data given: the command names what is missing (tests/cli_handoff.rs runs the commands)
    assert_eq!(
        memfit["commands"]["train"],
        format!("memfit train --config {train} --data TRAIN_FILE --tokenizer TOKENIZER")
    );
    assert!(std::path::Path::new(train).exists());
    // where the README says: OUT/memfit/, OUT defaulting to DIR/memfit-plan
    assert_eq!(
        std::path::Path::new(train),
        dir.path().join("memfit-plan/memfit/memfit-train.toml")
    );
    // The planner's profiles file is one `memfit run --profiles` accepts.
    let profiles = memfit["files"]["profiles"].as_str().unwrap();
    let parsed = memfit_sys::profiles::load(std::path::Path::new(profiles)).unwrap();
    assert!(!parsed.is_empty());
    let pytorch = &rec["pytorch"];
    assert_eq!(pytorch["fits"], true, "{rec}");
    for file in ["accelerate", "deepspeed"] {
        assert!(std::path::Path::new(pytorch["files"][file].as_str().unwrap()).exists());
    }
    assert!(
        pytorch["commands"]["accelerate"]
            .as_str()
            .unwrap()
            .starts_with("accelerate launch --config_file")
    );
}

#[test]
fn unknown_model_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let o = check(&[
        "--model",
        "no-such-model",
        "--dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no-such-model"));
}
