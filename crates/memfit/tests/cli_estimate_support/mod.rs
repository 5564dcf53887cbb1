//! Running the built binary from the CLI tests (shared by cli_estimate.rs and cli_plan.rs).

use std::process::{Command, Output};

pub fn memfit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memfit"))
        .args(args)
        .output()
        .expect("run memfit")
}

/// Runs a command that must succeed and print one JSON object.
pub fn json(args: &[&str]) -> serde_json::Value {
    let out = memfit(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}

/// Each whitespace-separated command line must exit with `code`.
pub fn assert_exit(code: i32, command_lines: &[&str]) {
    for line in command_lines {
        let args: Vec<&str> = line.split_whitespace().collect();
        let out = memfit(&args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "memfit {line}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `memfit estimate --model <dir>/config.json ARGS…` with `config` written there first.
#[allow(dead_code)] // cli_plan.rs shares this module and has no config of its own
pub fn estimate_config(dir: &std::path::Path, config: &str, args: &[&str]) -> Output {
    let path = dir.join("config.json");
    std::fs::write(&path, config).unwrap();
    let mut all = vec!["estimate", "--model", path.to_str().unwrap()];
    all.extend_from_slice(args);
    memfit(&all)
}
