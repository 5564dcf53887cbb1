//! The recorded peak against the truth (issue 29: "peaks are caught"). The jobs are Python processes
//! that allocate in a fast burst and free it at once, between the guard's samples (1 s apart far
//! from the default budget); each reads its own RssAnon + RssShmem + VmSwap at the top of its burst
//! (the exact peak, measured independently of memfit) and prints it. The recorded peak must be within
//! 3% of it: not missed, and not overstated by adding processes' high-water marks that did not
//! coincide.

use memfit_sys::supervise::{Outcome, RunConfig, RunSummary, run};

const MIB: f64 = (1u64 << 20) as f64;
/// The largest relative difference allowed (the issue's 3%).
const TOLERANCE: f64 = 0.03;

/// `burst(mib)` allocates and fills `mib` MiB, reads the process's own charged memory, frees it and
/// returns the reading; `report(tag, **fields)` prints one JSON line (in one write: CI once saw two
/// processes' `print`s interleave into one line).
const PRELUDE: &str = concat!(
    include_str!("common/charged.py"),
    r#"
def burst(mib):
    b = b'\x01' * (mib << 20)
    top = charged()
    del b
    return top
def report(tag, **fields):
    # one write call for the whole line: two processes report at about the same moment
    import os
    os.write(1, (json.dumps(dict(tag=tag, **fields)) + "\n").encode())
"#
);

/// Runs `sh -c script` under the default budget; returns the summary and the JSON lines printed.
fn run_job(script: &str) -> (RunSummary, Vec<serde_json::Value>) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.jsonl");
    let mut cfg = RunConfig::new(vec!["sh".into(), "-c".into(), script.into()]);
    cfg.stdout = Some(out.clone());
    let s = run(&cfg).unwrap();
    assert_eq!((s.outcome, s.exit_code), (Outcome::Completed, 0), "{s:#?}");
    let lines = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (s, lines)
}

/// A `python3 -c` command line for `sh -c`, running `body` after the prelude.
fn python(body: &str) -> String {
    format!(
        "python3 -c '{}'",
        format!("{PRELUDE}\n{body}").replace('\'', "'\\''")
    )
}

fn field(lines: &[serde_json::Value], tag: &str, key: &str) -> f64 {
    let line = lines
        .iter()
        .find(|l| l["tag"] == tag)
        .unwrap_or_else(|| panic!("no {tag} line in {lines:?}"));
    line[key].as_f64().unwrap()
}

fn assert_close(what: &str, got: f64, truth: f64, s: &RunSummary) {
    let off = (got - truth) / truth;
    assert!(
        off.abs() <= TOLERANCE,
        "{what}: {:.1} MiB recorded, {:.1} MiB true ({:+.1}%)\n{:#?}",
        got / MIB,
        truth / MIB,
        off * 100.0,
        s.attempts[0].peak_sources
    );
}

#[test]
fn a_burst_between_samples_is_in_the_recorded_peak() {
    // 1.5 s idle lets the sampling period settle at 1 s; three 160 MiB bursts of ~0.2 s each follow.
    let (s, lines) = run_job(&python(
        "time.sleep(1.5)\ntop = 0\nfor _ in range(3):\n    top = max(top, burst(160))\n    time.sleep(1.2)\nreport('job', top=top)",
    ));
    let truth = field(&lines, "job", "top");
    let a = &s.attempts[0];
    assert_close("peak_job_bytes", a.peak_job_bytes as f64, truth, &s);
    assert_close("run peak", s.peak_job_bytes as f64, truth, &s);
    // The kernel's high-water mark alone catches it too.
    assert_close(
        "high-water estimate",
        a.peak_sources.high_water_bytes as f64,
        truth,
        &s,
    );
}

#[test]
fn bursts_of_two_processes_at_different_times_are_not_added() {
    // Each process bursts once, two seconds apart; the job's true peak is one burst plus the other
    // process at rest. The sum of the two high-water marks would be about twice that.
    let worker = |tag: &str, wait: f64| {
        python(&format!(
            "time.sleep({wait})\nrest = charged()\ntop = burst(160)\ntime.sleep({})\nreport({tag:?}, rest=rest, top=top)",
            5.0 - wait
        ))
    };
    let (s, lines) = run_job(&format!(
        "{} & {}; wait",
        worker("a", 1.5),
        worker("b", 3.5)
    ));
    let at = |first: &str, other: &str| field(&lines, first, "top") + field(&lines, other, "rest");
    let truth = at("a", "b").max(at("b", "a"));
    assert_close("peak_job_bytes", s.peak_job_bytes as f64, truth, &s);
}
