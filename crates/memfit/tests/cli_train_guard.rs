//! `memfit train`'s memory guard end to end on the demo task: a budget written into the run directory
//! while the run goes (`RUN/budget`, the documented override) either halves the micro-batch (soft
//! limit: the run completes, exit 0) or stops the run with a checkpoint (hard limit: exit 75), after
//! which `--resume` continues at the halved micro-batch.
//!
//! `memfit train` keeps freed memory in malloc's heap (`memfit_train::malloc_tuning`), so RSS holds
//! at its high-water mark between steps (the allocator behaviour the guard's ratchet is built for;
//! with glibc's defaults the demo's tiny RSS swings ±8 % inside every step, too much for a budget
//! set from one reading to land reliably between the soft and hard limits).

use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn memfit() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memfit"))
}

fn start(out: &Path, steps: u64) -> Child {
    memfit()
        .args([
            "train",
            "--out",
            &out.display().to_string(),
            "--max-steps",
            &steps.to_string(),
            "--threads",
            "1",
            "--eval-rows",
            "4",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// A demo run of `steps` steps in a temporary directory, once it has logged `after` steps.
fn started(steps: u64, after: usize) -> (tempfile::TempDir, std::path::PathBuf, Child) {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut child = start(&run, steps);
    wait_for_steps(&mut child, &run, after);
    (dir, run, child)
}

/// Waits until the run has logged `steps` optimizer steps (or ended).
fn wait_for_steps(child: &mut Child, run: &Path, steps: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while jsonl(&run.join("metrics.jsonl")).len() < steps && Instant::now() < deadline {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before step {steps}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The child's memory as the guard measures it (RssAnon + RssShmem + VmSwap).
fn charged(child: &Child) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    memfit_sys::sample::parse_status(child.id() as i32, &text)
        .unwrap()
        .charged()
}

/// Writes `RUN/budget` the way the docs say: a temporary file renamed over it.
fn write_budget(run: &Path, text: &str) {
    let tmp = run.join(".budget.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, run.join("budget")).unwrap();
}

fn trainer_state(run: &Path, step: usize) -> Value {
    let path = run.join(format!("checkpoints/step-{step}/trainer_state.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        let kept: Vec<_> = std::fs::read_dir(run.join("checkpoints"))
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        let events = std::fs::read_to_string(run.join("events.jsonl")).unwrap_or_default();
        panic!(
            "{}: {e}; checkpoints kept: {kept:?}; events:\n{events}",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap()
}

fn kind<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["kind"] == kind).collect()
}

#[test]
fn a_lowered_budget_halves_the_micro_batch_and_the_run_completes() {
    const STEPS: u64 = 120;
    let (_dir, run, child) = started(STEPS, 5);
    // A budget whose soft limit (85 %) lies under what the run holds now, and whose hard limit (95 %)
    // is ~5 % above it.
    let budget = (charged(&child) as f64 / 0.90) as u64;
    write_budget(&run, &format!("{budget}B\n"));
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&summary["finished"], &summary["steps"]),
        (&true.into(), &STEPS.into())
    );

    let events = jsonl(&run.join("events.jsonl"));
    let b = kind(&events, "budget");
    assert_eq!(b.len(), 1, "{events:?}");
    assert_eq!(b[0]["budget_bytes"], budget);
    let d = kind(&events, "downgrade");
    assert!(!d.is_empty(), "no downgrade: {events:?}");
    assert_eq!(
        (&d[0]["old_micro_batch"], &d[0]["new_micro_batch"]),
        (&32.into(), &16.into())
    );
    assert_eq!(
        (&d[0]["old_accum"], &d[0]["new_accum"]),
        (&1.into(), &2.into())
    );
    assert_eq!(d[0]["limits"]["budget_bytes"], budget);
    assert!(d[0]["rss_bytes"].as_u64().unwrap() >= d[0]["limits"]["soft_bytes"].as_u64().unwrap());
    assert!(kind(&events, "stop").is_empty());
    // The user sees it: the progress bar's message goes to stderr when the bar is hidden (--json).
    assert!(
        stderr.contains("memory guard:") && stderr.contains("micro-batch 32 × 1 → 16 × 2"),
        "{stderr}"
    );
    assert!(stderr.contains("memory budget now"), "{stderr}");

    // The metrics show the new shape from the step after the downgrade on.
    let at = d[0]["step"].as_u64().unwrap() as usize;
    let metrics = jsonl(&run.join("metrics.jsonl"));
    assert_eq!(metrics.len(), STEPS as usize);
    assert!(
        metrics[..at]
            .iter()
            .all(|m| m["micro_batch"] == 32 && m["accum"] == 1)
    );
    assert_eq!(
        (&metrics[at]["micro_batch"], &metrics[at]["accum"]),
        (&16.into(), &2.into())
    );
    // The last downgrade's checkpoint holds the shape it left. Under load the guard can halve a
    // second time (16 → 8) later in the run, and the first downgrade's checkpoint may then be
    // pruned by retention (the newest 3 are kept).
    let last = d[d.len() - 1];
    let state = trainer_state(&run, last["step"].as_u64().unwrap() as usize);
    let accum = 32 / last["new_micro_batch"].as_u64().unwrap();
    assert_eq!(
        (&state["micro_batch"], &state["accum"]),
        (&last["new_micro_batch"], &accum.into())
    );
}

#[test]
fn a_budget_below_the_hard_limit_stops_with_exit_75_and_resume_continues_smaller() {
    const STEPS: u64 = 40;
    let (_dir, run, child) = started(STEPS, 3);
    write_budget(&run, "1MiB\n");
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("over the hard limit") || stderr.contains("memory_hard_limit"),
        "{stderr}"
    );
    let events = jsonl(&run.join("events.jsonl"));
    let stop = kind(&events, "stop");
    assert_eq!(stop.len(), 1, "{events:?}");
    assert_eq!(stop[0]["reason"], "memory_hard_limit");
    assert_eq!(stop[0]["exit"], 75);
    assert_eq!(stop[0]["limits"]["budget_bytes"], 1 << 20);
    assert_eq!(stop[0]["resume_micro_batch"], 16);
    let stopped_at = stop[0]["step"].as_u64().unwrap();
    assert!(stopped_at < STEPS);
    let state = trainer_state(&run, stopped_at as usize);
    assert_eq!(state["micro_batch"], 16);

    // The user raises the budget again (removes the override) and resumes: same config, no
    // --allow-config-change, the halved micro-batch with twice the accumulation.
    std::fs::remove_file(run.join("budget")).unwrap();
    let out = memfit()
        .args(["train", "--resume", &run.display().to_string(), "--json"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metrics = jsonl(&run.join("metrics.jsonl"));
    assert_eq!(metrics.len(), STEPS as usize);
    for m in &metrics[stopped_at as usize..] {
        assert_eq!(
            (&m["micro_batch"], &m["accum"]),
            (&16.into(), &2.into()),
            "{m}"
        );
    }
}
