//! One owner per run directory, and a run resumable from its first moment, end to end with the demo:
//! a second trainer, a resume or a report that writes into the run is refused with the holder's PID
//! (exit 2) and changes nothing; racing starts leave one intact run; a run killed before its first
//! checkpoint resumes from step 0 with the same losses as an uninterrupted run; SIGTERM at any moment
//! of the start leaves a resumable run or nothing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

fn memfit() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memfit"))
}

const QUICK: [&str; 4] = ["--threads", "1", "--eval-rows", "0"];

/// A demo run of 4 steps, or `--max-steps` given in `extra`.
fn train(out: &Path, extra: &[&str]) -> Command {
    let mut c = memfit();
    c.arg("train").arg("--out").arg(out).args(QUICK).args(extra);
    if !extra.contains(&"--max-steps") {
        c.args(["--max-steps", "4"]);
    }
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    c
}

fn resume(run: &Path) -> Command {
    let mut c = memfit();
    c.arg("train")
        .arg("--resume")
        .arg(run)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// (step, loss) of every metrics line.
fn losses(run: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
        .collect()
}

fn wait_for(path: &Path, child: &mut Child) {
    let until = Instant::now() + Duration::from_secs(120);
    while !path.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "ended before {}",
            path.display()
        );
        assert!(Instant::now() < until, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn term(child: &Child) {
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
}

#[test]
fn a_second_owner_is_refused_with_the_holders_pid() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut holder = train(&run, &["--max-steps", "100000"]).spawn().unwrap();
    wait_for(&run.join("metrics.jsonl"), &mut holder);
    let pid = format!("in use by process {}", holder.id());
    let config = std::fs::read(run.join("config.toml")).unwrap();
    for (what, mut cmd) in [
        ("train", train(&run, &[])),
        ("resume", resume(&run)),
        ("report", {
            let mut c = memfit();
            c.arg("report").arg(&run);
            c
        }),
    ] {
        let o = cmd.output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{what}: {}", stderr(&o));
        assert!(stderr(&o).contains(&pid), "{what}: {}", stderr(&o));
    }
    assert!(
        holder.try_wait().unwrap().is_none(),
        "the holder was disturbed"
    );
    assert_eq!(std::fs::read(run.join("config.toml")).unwrap(), config);
    assert!(!run.join("report.svg").exists());
    // The refusal names the way out, and it works while the run goes on: a report written outside.
    let live = dir.path().join("live.svg");
    let o = memfit().arg("report").arg(&run).output().unwrap();
    assert!(stderr(&o).contains("--out FILE.svg"), "{}", stderr(&o));
    let o = memfit()
        .arg("report")
        .arg(&run)
        .arg("--out")
        .arg(&live)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(live.is_file() && dir.path().join("live.png").is_file());
    assert!(
        holder.try_wait().unwrap().is_none(),
        "the report disturbed the run"
    );
    term(&holder);
    assert_eq!(holder.wait().unwrap().code(), Some(75));
    // Free again: the resume runs (and is stopped the same way).
    let again = resume(&run).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    term(&again);
    let o = again.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
}

/// Rounds of two starts and a resume racing for one directory.
const ROUNDS: usize = 50;

#[test]
fn racing_starts_and_resumes_leave_one_intact_run() {
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("reference");
    assert!(train(&reference, &[]).status().unwrap().success());
    let expected = losses(&reference);
    for round in 0..ROUNDS {
        let run = dir.path().join(format!("run-{round}"));
        let mut kids: Vec<(&str, Child)> = vec![
            ("start", train(&run, &[]).spawn().unwrap()),
            ("start", train(&run, &[]).spawn().unwrap()),
        ];
        if round % 2 == 1 {
            std::thread::sleep(Duration::from_millis(300));
        }
        kids.push(("resume", resume(&run).spawn().unwrap()));
        let outs: Vec<(&str, Output)> = kids
            .into_iter()
            .map(|(what, c)| (what, c.wait_with_output().unwrap()))
            .collect();
        let codes: Vec<_> = outs.iter().map(|(w, o)| (*w, o.status.code())).collect();
        let started = outs
            .iter()
            .filter(|(w, o)| *w == "start" && o.status.success())
            .count();
        assert_eq!(started, 1, "round {round}: {codes:?}");
        for (what, o) in &outs {
            assert!(
                matches!(o.status.code(), Some(0 | 2)),
                "round {round} {what}: {}",
                stderr(o)
            );
        }
        // Each step once, as an uninterrupted run logs it.
        assert_eq!(losses(&run), expected, "round {round}: {codes:?}");
    }
}

#[test]
fn a_run_killed_before_its_first_checkpoint_resumes_from_step_0() {
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("reference");
    assert!(train(&reference, &[]).status().unwrap().success());
    let run = dir.path().join("run");
    let mut child = train(&run, &["--save-steps", "1000"]).spawn().unwrap();
    wait_for(&run.join("config.toml"), &mut child);
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    assert!(!run.join("checkpoints/step-1").exists());
    let o = resume(&run).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        losses(&run),
        losses(&reference),
        "same config, same data order"
    );
}

#[test]
fn sigterm_at_any_moment_of_the_start_leaves_a_resumable_run_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for (i, delay_ms) in [0u64, 5, 15, 30, 60, 100, 150].into_iter().enumerate() {
        let run: PathBuf = dir.path().join(format!("run-{i}"));
        let child = train(&run, &[]).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        term(&child);
        let o = child.wait_with_output().unwrap();
        match o.status.code() {
            // before memfit's handlers exist: nothing was made yet
            None => assert!(
                !run.exists(),
                "{delay_ms} ms: a half-made {}",
                run.display()
            ),
            Some(75) => {
                let r = resume(&run).output().unwrap();
                assert_eq!(r.status.code(), Some(0), "{delay_ms} ms: {}", stderr(&r));
            }
            // ran to its end before the signal was handled
            Some(0) => assert!(run.join("config.toml").exists()),
            other => panic!("{delay_ms} ms: exit {other:?}: {}", stderr(&o)),
        }
    }
}
