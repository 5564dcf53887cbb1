//! The guard against a real process: `memfit-memhog` allocates memory in steps until the guard stops it.
//! These run the same `supervise::run` that `memfit run` calls.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use memfit_sys::guard::GuardConfig;
use memfit_sys::profiles::Profile;
use memfit_sys::supervise::{Outcome, RunConfig, RunSummary, run};
use memfit_sys::units::SizeOrPercent;

const HOG: &str = env!("CARGO_BIN_EXE_memfit-memhog");
const MIB: u64 = 1 << 20;
const BUDGET: u64 = 256 * MIB;

fn hog(args: &[&str]) -> Vec<String> {
    std::iter::once(HOG)
        .chain(args.iter().copied())
        .map(str::to_owned)
        .collect()
}

/// The hog growing 8 MiB every 10 ms (at most 800 MiB/s; page faults hold it near 400 MiB/s here, still
/// faster than a trainer's host memory grows), plus `extra` arguments.
fn growing(extra: &[&str]) -> Vec<String> {
    let mut args = vec!["--step-mib", "8", "--interval-ms", "10"];
    args.extend_from_slice(extra);
    hog(&args)
}

fn config(command: Vec<String>, grace: Duration) -> RunConfig {
    let mut cfg = RunConfig::new(command);
    cfg.budget = SizeOrPercent::Bytes(BUDGET);
    cfg.guard = GuardConfig {
        grace,
        cooldown: Duration::from_secs(1),
        ..GuardConfig::default()
    };
    cfg
}

fn json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn actions(s: &RunSummary, attempt: usize) -> Vec<String> {
    s.attempts[attempt]
        .actions
        .iter()
        .map(|a| match &a.reason {
            Some(r) => format!("{}:{r}", a.action),
            None => a.action.clone(),
        })
        .collect()
}

/// One trial: the growing hog must be stopped gracefully below the budget.
/// Returns the hog's peak RSS, the seconds from the graceful signal to the job's exit, and the sampling
/// period in force when the soft level was crossed (how long a crossing can go unseen).
fn trial(dir: &Path, write_series: bool) -> (u64, f64, f64) {
    let ck = dir.join("ck.json");
    let mut cfg = config(
        growing(&["--max-mib", "2048", "--checkpoint", ck.to_str().unwrap()]),
        Duration::from_secs(5),
    );
    cfg.jsonl = Some(dir.join("series.jsonl"));
    if write_series {
        cfg.csv = Some(dir.join("series.csv"));
    }
    let s = run(&cfg).unwrap();
    assert_eq!(s.outcome, Outcome::StoppedByGuard, "{s:#?}");
    assert_eq!(s.exit_code, 75);
    let acts = actions(&s, 0);
    assert!(acts.contains(&"graceful_stop".to_owned()), "{acts:?}");
    assert!(
        !acts.iter().any(|a| a.starts_with("kill")),
        "the hog obeys SIGTERM: {acts:?}"
    );
    let checkpoint = json(&ck);
    let peak = checkpoint["peak_rss_bytes"].as_u64().unwrap();
    assert!(peak < BUDGET, "RSS {} MiB passed the budget", peak / MIB);
    let stop_t = s.attempts[0]
        .actions
        .iter()
        .find(|a| a.action == "graceful_stop")
        .unwrap()
        .t_s;
    let series = std::fs::read_to_string(dir.join("series.jsonl")).unwrap();
    let period_before_stop = series
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .rfind(|r| r["type"] == "sample" && r["stage"] != "stopping")
        .map_or(0.0, |r| r["next_ms"].as_f64().unwrap() / 1e3);
    (peak, s.attempts[0].ended_s - stop_t, period_before_stop)
}

#[test]
fn twenty_trials_stop_below_budget_and_spare_outsiders() {
    let mut sentinel = Command::new("sleep").arg("120").spawn().unwrap();
    let started = Instant::now();
    let results: Vec<(u64, f64, f64)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..2)
            .map(|w| {
                scope.spawn(move || {
                    (0..10)
                        .map(|i| {
                            let dir = tempfile::tempdir().unwrap();
                            trial(dir.path(), w == 0 && i == 0)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    assert_eq!(results.len(), 20);
    let alive = sentinel.try_wait().unwrap().is_none();
    sentinel.kill().unwrap();
    sentinel.wait().unwrap();
    assert!(alive, "a process outside the job was signalled");
    let max_peak = results.iter().map(|r| r.0).max().unwrap();
    let sorted = |f: fn(&(u64, f64, f64)) -> f64| {
        let mut v: Vec<f64> = results.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        (v[10] * 1e3, v[19] * 1e3)
    };
    let (exit_med, exit_max) = sorted(|r| r.1);
    let (seen_med, seen_max) = sorted(|r| r.2);
    println!(
        "20 trials in {:.1} s: peak RSS max {} MiB of a {} MiB budget; sampling period at the crossing \
         median {seen_med:.0} ms, max {seen_max:.0} ms; graceful signal → exit median {exit_med:.0} ms, \
         max {exit_max:.0} ms",
        started.elapsed().as_secs_f64(),
        max_peak / MIB,
        BUDGET / MIB,
    );
}

#[test]
fn series_is_self_describing() {
    let dir = tempfile::tempdir().unwrap();
    trial(dir.path(), true);
    let text = std::fs::read_to_string(dir.path().join("series.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = records
        .iter()
        .map(|r| r["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds[0], "header");
    assert_eq!(records[0]["schema"], "memfit-run/1");
    assert_eq!(records[0]["budget_bytes"], BUDGET);
    assert_eq!(kinds[1], "launch");
    assert!(kinds.contains(&"sample") && kinds.contains(&"action"));
    assert_eq!(kinds[kinds.len() - 2], "exit");
    assert_eq!(*kinds.last().unwrap(), "summary");
    let samples: Vec<&serde_json::Value> =
        records.iter().filter(|r| r["type"] == "sample").collect();
    assert!(
        samples
            .iter()
            .any(|s| s["job_bytes"].as_u64().unwrap() > 100 * MIB)
    );
    assert!(
        samples
            .iter()
            .all(|s| s["limit_bytes"].as_u64().unwrap() <= BUDGET)
    );
    let csv = std::fs::read_to_string(dir.path().join("series.csv")).unwrap();
    assert!(csv.starts_with("t_s,attempt,job_bytes,limit_bytes"));
    assert_eq!(csv.lines().count(), samples.len() + 1);
}

#[test]
fn relaunch_with_smaller_profile_completes() {
    let dir = tempfile::tempdir().unwrap();
    let (ck, done) = (dir.path().join("ck.json"), dir.path().join("done.json"));
    let (ck_s, done_s) = (ck.to_str().unwrap(), done.to_str().unwrap());
    let mut cfg = config(
        growing(&["--max-mib", "2048", "--checkpoint", ck_s, "--done", done_s]),
        Duration::from_secs(5),
    );
    cfg.profiles = vec![Profile {
        name: "small".into(),
        args: vec!["--max-mib".into(), "64".into()],
        env: [("MEMHOG_TAG".to_owned(), "small".to_owned())].into(),
        resume_args: vec!["--resume".into(), ck_s.into()],
    }];
    cfg.max_restarts = 3;
    let s = run(&cfg).unwrap();
    assert_eq!(s.attempts.len(), 2, "{s:#?}");
    assert!(s.attempts[0].stopped_by_guard);
    assert!(
        s.attempts[1]
            .argv
            .windows(2)
            .any(|w| w == ["--max-mib", "64"])
    );
    assert!(
        s.attempts[1]
            .argv
            .ends_with(&["--resume".to_owned(), ck_s.to_owned()])
    );
    assert_eq!((s.outcome, s.exit_code), (Outcome::Completed, 0));
    let done = json(&done);
    assert_eq!(
        done["tag"], "small",
        "the profile's environment reached the relaunch"
    );
    assert_eq!(done["allocated_bytes"].as_u64(), Some(64 * MIB));
}

#[test]
fn sigterm_ignored_means_kill_after_grace() {
    // Stops growing at 240 MiB: above the soft level (230 MiB), below the hard limit (256 MiB).
    let grace = Duration::from_millis(600);
    let cfg = config(
        growing(&["--ignore-term", "--max-mib", "240", "--hold-ms", "20000"]),
        grace,
    );
    let started = Instant::now();
    let s = run(&cfg).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "it was not killed"
    );
    assert_eq!(
        actions(&s, 0).last().unwrap(),
        "kill:grace_expired",
        "{:?}",
        actions(&s, 0)
    );
    let a = &s.attempts[0].actions;
    let stop = a.iter().find(|a| a.action == "graceful_stop").unwrap().t_s;
    let kill = a.iter().find(|a| a.action == "kill").unwrap().t_s;
    assert!(
        kill - stop >= grace.as_secs_f64(),
        "killed {:.3} s after the graceful signal",
        kill - stop
    );
    assert_eq!(s.attempts[0].signal, Some(9));
    assert_eq!((s.outcome, s.exit_code), (Outcome::StoppedByGuard, 75));
}

#[test]
fn still_rising_past_the_hard_limit_is_killed_before_the_grace_ends() {
    let cfg = config(
        growing(&["--ignore-term", "--max-mib", "4096"]),
        Duration::from_secs(60),
    );
    let started = Instant::now();
    let s = run(&cfg).unwrap();
    assert!(started.elapsed() < Duration::from_secs(20));
    let acts = actions(&s, 0);
    // Usually graceful signal then kill; if the machine starves the guard between the soft level and
    // the hard limit (26 MiB, about 65 ms at this rate), the kill comes alone, which the rules allow.
    assert_eq!(
        acts.last().map(String::as_str),
        Some("kill:hard_limit"),
        "{acts:?}"
    );
    let stops = acts.iter().filter(|a| *a == "graceful_stop").count();
    assert!(
        stops <= 1 && acts.iter().filter(|a| a.starts_with("kill")).count() == 1,
        "{acts:?}"
    );
}

#[test]
fn a_tree_is_sampled_and_stopped_as_one_job() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck.json");
    // Three processes growing 2 MiB every 10 ms each.
    let cfg = config(
        hog(&[
            "--children",
            "2",
            "--step-mib",
            "2",
            "--interval-ms",
            "10",
            "--max-mib",
            "2048",
            "--checkpoint",
            ck.to_str().unwrap(),
        ]),
        Duration::from_secs(5),
    );
    let s = run(&cfg).unwrap();
    assert_eq!(s.outcome, Outcome::StoppedByGuard);
    assert!(ck.exists());
    let hogs: Vec<_> = s
        .peak_by_process
        .iter()
        .filter(|p| p.name.starts_with("memfit-memhog"))
        .collect();
    assert_eq!(hogs.len(), 3, "{:?}", s.peak_by_process);
    let sum: u64 = hogs.iter().map(|p| p.peak_bytes).sum();
    assert!(
        sum > BUDGET / 2 && s.peak_job_bytes < BUDGET,
        "sum {sum}, job peak {}",
        s.peak_job_bytes
    );
}

#[test]
fn usr1_request_to_shed_memory_keeps_a_job_that_complies() {
    let dir = tempfile::tempdir().unwrap();
    let done = dir.path().join("done.json");
    let mut cfg = config(
        growing(&[
            "--shed-on-usr1",
            "--max-mib",
            "2048",
            "--hold-ms",
            "1500",
            "--done",
            done.to_str().unwrap(),
        ]),
        Duration::from_millis(300),
    );
    cfg.signal = memfit_sys::supervise::StopSignal::Usr1;
    let s = run(&cfg).unwrap();
    let acts = actions(&s, 0);
    assert!(
        acts.contains(&"graceful_stop".to_owned()) && acts.contains(&"recover".to_owned()),
        "{acts:?}"
    );
    assert!(!acts.iter().any(|a| a.starts_with("kill")), "{acts:?}");
    assert_eq!((s.outcome, s.exit_code), (Outcome::Completed, 0));
    assert!(done.exists(), "the job ran to its end");
}
