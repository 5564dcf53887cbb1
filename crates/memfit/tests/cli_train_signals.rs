//! `memfit train` on the demo task with its stderr in a pipe (not a terminal): SIGTERM early in a run
//! with an evaluation every 3 steps stops it with exit 75 and a checkpoint of the last completed step;
//! `--resume` runs the evaluation that was cut short, if any, and finishes; progress comes as plain
//! lines. (The demo's steps and evaluations take milliseconds, so where the signal lands is up to the
//! scheduler;
//! `memfit-train/tests/loop_signals.rs` places it exactly, in every kind of work.)

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn memfit() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memfit"))
}

fn jsonl(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// 100 steps, an evaluation every 3 and at the end over the whole validation set (200 rows, 200
/// generations).
const ARGS: [&str; 12] = [
    "--max-steps",
    "100",
    "--eval-steps",
    "3",
    "--eval-loss-rows",
    "200",
    "--eval-rows",
    "200",
    "--threads",
    "1",
    "--keep",
    "1",
];

#[test]
fn sigterm_early_in_a_run_with_evaluations_stops_with_75_and_resume_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut child = memfit()
        .arg("train")
        .arg("--out")
        .arg(&run)
        .args(ARGS)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    // The first step's plain progress line, then the signal.
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push(line.clone());
        if line.starts_with("step 1/100 (1%) epoch 0 loss ") {
            break;
        }
    }
    assert!(
        seen.last()
            .is_some_and(|l| l.contains(" tok/s rss ") && l.contains(" eta ")),
        "no plain progress line: {seen:?}"
    );
    let signalled = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    seen.extend(lines.map_while(Result::ok));
    let status = child.wait().unwrap();
    // Seconds, not the rest of the run (the bound only catches a stop that waits for work to end).
    assert!(signalled.elapsed() < Duration::from_secs(60));
    assert_eq!(status.code(), Some(75), "{seen:?}");

    let events = jsonl(&run.join("events.jsonl"));
    let stop = events.last().unwrap();
    assert_eq!(
        (stop["kind"].as_str(), stop["reason"].as_str()),
        (Some("stop"), Some("signal"))
    );
    let steps_done = jsonl(&run.join("metrics.jsonl")).len() as u64;
    assert_eq!(stop["step"].as_u64(), Some(steps_done));
    assert!(
        run.join(format!("checkpoints/step-{steps_done}/trainer_state.json"))
            .is_file()
    );
    assert!(
        seen.iter()
            .any(|l| l.contains("stop requested: checkpointed step")),
        "{seen:?}"
    );

    let out = memfit()
        .arg("train")
        .arg("--resume")
        .arg(&run)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let evals: Vec<u64> = jsonl(&run.join("events.jsonl"))
        .iter()
        .filter(|e| e["kind"] == "eval")
        .map(|e| e["step"].as_u64().unwrap())
        .collect();
    let every_3: Vec<u64> = (1..=33).map(|i| 3 * i).chain([100]).collect();
    assert_eq!(evals, every_3, "an evaluation lost or run twice");
    assert!(stderr.contains("step 100/100 (100%)"), "{stderr}");
    assert!(
        stderr.contains("eval at step 100: 200 rows, 200 generations, "),
        "{stderr}"
    );
}
