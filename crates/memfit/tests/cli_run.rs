//! `memfit run` end to end: exit codes, bad input, a guard stop, a relaunch, signal forwarding, guard RSS.

mod cli_memhog_common;

use std::process::{Command, Output};
use std::time::Duration;

use cli_memhog_common::{memfit, memhog};

const MIB: u64 = 1 << 20;
/// memfit-memhog arguments for a job that grows 4 MiB every 10 ms per process.
const GROWING: [&str; 4] = ["--step-mib", "4", "--interval-ms", "10"];

fn run(args: &[&str]) -> Output {
    memfit().arg("run").args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn summary(o: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(stdout.lines().last().expect("a summary line")).unwrap()
}

#[test]
fn the_commands_own_exit_code_passes_through() {
    assert_eq!(run(&["--", "sh", "-c", "exit 7"]).status.code(), Some(7));
    assert_eq!(run(&["--", "true"]).status.code(), Some(0));
}

#[test]
fn a_bare_number_or_a_budget_too_small_to_start_is_refused_before_launch() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("started");
    let touch = format!("touch {}", marker.display());
    for (budget, needle) in [
        // 10 bytes was taken as a budget and the job SIGKILLed at once
        ("10", "has no unit"),
        ("10", "10GiB"),
        ("10B", "below 16.0 MiB"),
        ("1MiB", "below 16.0 MiB"),
        ("0.0001%", "below 16.0 MiB"),
    ] {
        let o = run(&["--budget", budget, "--", "sh", "-c", &touch]);
        assert_eq!(o.status.code(), Some(2), "{budget}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{budget}: {}", stderr(&o));
        assert!(!marker.exists(), "--budget {budget}: the job was started");
    }
    // at the floor a small job runs to its end
    let o = run(&["--budget", "16MiB", "--", "sh", "-c", &touch]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(marker.exists());
}

#[test]
fn bad_input_exits_2_and_names_the_value() {
    for (args, needle) in [
        (vec!["--budget", "lots", "--", "true"], "--budget"),
        (vec!["--signal", "HUP", "--", "true"], "--signal"),
        (vec!["--warn", "95%", "--", "true"], "--warn"),
        (vec!["--grace", "soon", "--", "true"], "--grace"),
        (vec!["--", "/nonexistent/program"], "/nonexistent/program"),
        (
            vec!["--log", "/nonexistent/dir/run.jsonl", "--", "true"],
            "/nonexistent/dir",
        ),
    ] {
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("profiles.toml");
    std::fs::write(&bad, "[[profile]]\nname = \"a\"\nbatch = 4\n").unwrap();
    let o = run(&["--profiles", bad.to_str().unwrap(), "--", "true"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("profiles.toml") && stderr(&o).contains("batch"),
        "{}",
        stderr(&o)
    );
    assert_eq!(run(&[]).status.code(), Some(2), "a command is required");
}

#[test]
fn guard_stops_the_job_below_budget_with_exit_75_and_stays_small() {
    let Some(hog) = memhog() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (ck, log) = (dir.path().join("ck.json"), dir.path().join("run.jsonl"));
    let o = memfit()
        .args([
            "run", "--json", "--budget", "256MiB", "--grace", "2s", "--log",
        ])
        .arg(&log)
        .arg("--")
        .arg(&hog)
        .args(["--children", "2"])
        .args(GROWING)
        .arg("--checkpoint")
        .arg(&ck)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    assert!(ck.exists(), "the job wrote its checkpoint on SIGTERM");
    let s = summary(&o);
    assert_eq!(s["outcome"], "stopped_by_guard");
    assert!(s["peak_job_bytes"].as_u64().unwrap() < 256 * MIB);
    let guard_rss = s["guard_peak_rss_bytes"].as_u64().unwrap();
    println!(
        "memfit run's own peak RSS: {:.1} MiB",
        guard_rss as f64 / MIB as f64
    );
    assert!(
        guard_rss < 20 * MIB,
        "the guard used {} MiB",
        guard_rss / MIB
    );
    let first = std::fs::read_to_string(&log).unwrap();
    assert!(
        first
            .lines()
            .next()
            .unwrap()
            .contains("\"schema\":\"memfit-run/1\"")
    );
}

#[test]
fn profiles_file_relaunches_smaller_and_completes() {
    let Some(hog) = memhog() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (ck, done, profiles) = (
        dir.path().join("ck.json"),
        dir.path().join("done.json"),
        dir.path().join("profiles.toml"),
    );
    std::fs::write(
        &profiles,
        format!(
            "[[profile]]\nname = \"small\"\nargs = [\"--max-mib\", \"48\"]\nenv = {{ MEMHOG_TAG = \"small\" }}\n\
             resume_args = [\"--resume\", {:?}]\n",
            ck.to_str().unwrap()
        ),
    )
    .unwrap();
    let o = memfit()
        .args(["run", "--json", "--budget", "256MiB", "--profiles"])
        .arg(&profiles)
        .arg("--")
        .arg(&hog)
        .args(GROWING)
        .args(["--max-mib", "4096", "--checkpoint"])
        .arg(&ck)
        .arg("--done")
        .arg(&done)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let s = summary(&o);
    assert_eq!(s["attempts"].as_array().unwrap().len(), 2);
    assert_eq!(s["attempts"][1]["profile"], "small");
    let done: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&done).unwrap()).unwrap();
    assert_eq!(done["tag"], "small");
}

#[test]
fn a_signal_to_memfit_reaches_the_job() {
    let Some(hog) = memhog() else { return };
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck.json");
    let child = memfit()
        .args(["run", "--json", "--"])
        .arg(&hog)
        .args(["--max-mib", "16", "--hold-ms", "30000", "--checkpoint"])
        .arg(&ck)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // memfit installs its handlers before it starts the job: wait for the job, then for the job's own
    // handlers (it installs them first thing).
    let children = format!("/proc/{0}/task/{0}/children", child.id());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(&children)
        .unwrap_or_default()
        .trim()
        .is_empty()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "memfit never started the job"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(300));
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let o = child.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "the job's own code after it checkpointed"
    );
    assert!(ck.exists());
    assert_eq!(summary(&o)["outcome"], "interrupted");
}

#[test]
fn cgroup_option_guards_a_background_worker_or_says_why_it_cannot() {
    // `(hog &)`: the worker is orphaned at once; it is the job's either way.
    let Some(hog) = memhog() else { return };
    let script = format!(
        "({} {} --max-mib 1024 &); sleep 60",
        hog.display(),
        GROWING.join(" ")
    );
    let o = run(&[
        "--cgroup", "--json", "--budget", "128MiB", "--grace", "1s", "--", "sh", "-c", &script,
    ]);
    assert_eq!(o.status.code(), Some(75), "{}", stderr(&o));
    let s = summary(&o);
    assert!(s["peak_job_bytes"].as_u64().unwrap() >= 64 * MIB, "{s}");
    match s["cgroup_unavailable"].as_str() {
        Some(reason) => {
            println!("SKIPPED the cgroup checks: {reason}");
            assert!(stderr(&o).contains("--cgroup not used"), "{}", stderr(&o));
        }
        None => {
            let attempt = &s["attempts"][0];
            let dir = attempt["cgroup"].as_str().expect("the job's cgroup");
            assert!(!std::path::Path::new(dir).exists(), "{dir} was left behind");
            assert!(attempt["cgroup_peak_bytes"].as_u64().unwrap() >= 64 * MIB);
            assert!(
                stderr(&o).contains("job cgroup: kernel peak"),
                "{}",
                stderr(&o)
            );
        }
    }
}

/// docs/guard.md's campaign script keeps running against the binary: one trial of its numbered
/// cases and of its racing starts (its whole run, `--n 10`, is by hand: docs/guard.md).
#[test]
fn the_guard_campaign_script_runs_its_numbered_cases_and_a_race() {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/guard_campaign.py"
    );
    let out = Command::new("python3")
        .args([script, "--bin", env!("CARGO_BIN_EXE_memfit"), "--n", "1"])
        .args(["--only", "numbered,racing"])
        .output()
        .expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert!(
        text.contains("numbered") && text.contains("11/11"),
        "{text}"
    );
    assert!(text.contains("racing starts (4 at once)"), "{text}");
}
