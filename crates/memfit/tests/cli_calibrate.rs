//! `memfit calibrate` end to end on memfit-memhog, a job whose peak is exactly fixed + per-sample × batch:
//! the fit recovers both, the JSON keys, profiles for `memfit run`, the budget is never crossed, bad input.

mod cli_memhog_common;

use std::path::Path;
use std::process::Output;

use cli_memhog_common::{memfit, memhog};

const MIB: f64 = (1u64 << 20) as f64;

/// A memhog command holding `fixed + per_sample × {batch}` MiB for 300 ms (4 MiB steps, so exact).
fn hog_command(hog: &Path, fixed: u64, per_sample: u64) -> Vec<String> {
    let mut argv = vec![hog.display().to_string()];
    for a in [
        "--max-mib",
        &fixed.to_string(),
        "--per-sample-mib",
        &per_sample.to_string(),
        "--batch",
        "{batch}",
        "--step-mib",
        "4",
        "--interval-ms",
        "5",
        "--hold-ms",
        "300",
    ] {
        argv.push(a.to_owned());
    }
    argv
}

fn calibrate(args: &[&str], command: &[String]) -> Output {
    memfit()
        .arg("calibrate")
        .args(args)
        .arg("--")
        .args(command)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(o)))
}

fn keys(v: &serde_json::Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

#[test]
fn the_fit_recovers_fixed_and_per_sample_and_writes_profiles() {
    let Some(hog) = memhog() else { return };
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().to_str().unwrap();
    let o = calibrate(
        &["--budget-ram", "2GiB", "--at", "8", "--json", "--out", dir],
        &hog_command(&hog, 64, 24),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let j = json(&o);
    assert_eq!(keys(&j), ["at", "gpu", "host", "max_batch", "points"]);
    assert_eq!(keys(&j["host"]), ["fixed_bytes", "per_sample_bytes"]);
    assert_eq!(keys(&j["max_batch"]), ["gpu", "host"]);
    for p in j["points"].as_array().unwrap().iter().chain([&j["at"]]) {
        assert_eq!(keys(p), ["batch", "peak_gpu_bytes", "peak_rss_bytes"]);
    }
    let batches: Vec<u64> = j["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["batch"].as_u64().unwrap())
        .collect();
    assert_eq!(batches, [1, 2, 4]);
    // The process's own code and stack add well under 1 MiB to the fixed part.
    let fixed = j["host"]["fixed_bytes"].as_f64().unwrap() / MIB;
    let per_sample = j["host"]["per_sample_bytes"].as_f64().unwrap() / MIB;
    assert!((fixed - 64.0).abs() / 64.0 < 0.03, "fixed {fixed:.2} MiB");
    assert!(
        (per_sample - 24.0).abs() / 24.0 < 0.02,
        "per sample {per_sample:.2} MiB"
    );
    let at = j["at"]["peak_rss_bytes"].as_f64().unwrap() / MIB;
    assert!((at - 256.0).abs() / 256.0 < 0.02, "at 8: {at:.1} MiB");
    // 2 GiB less 10% = 1843.2 MiB: (1843.2 − 64) / 24 = 74.1.
    assert_eq!(j["max_batch"]["host"], 74);
    assert!(j["gpu"].is_null() || j["points"][0]["peak_gpu_bytes"].is_u64());
    let text = std::fs::read_to_string(out.path().join("profiles.toml")).unwrap();
    let profiles = memfit_sys::profiles::parse(&text).unwrap();
    let args: Vec<&Vec<String>> = profiles.iter().map(|p| &p.args).collect();
    assert_eq!(args[0], &["--batch", "74"]);
    assert_eq!(args[1], &["--batch", "37"]);
    // the run the profiles drive allocates as the trials did: glibc's mmap threshold pinned
    for p in &profiles {
        assert_eq!(p.env["MALLOC_MMAP_THRESHOLD_"], "131072", "{text}");
    }
}

/// A trainer-like job: 48 MiB held, and each step's activations (6 MiB per sample) allocated, filled and
/// freed at once, so its peak lasts a fraction of a sample period. It prints the peak it read itself at
/// the top of its largest step (RssAnon + RssShmem + VmSwap).
const BURSTING_JOB: &str = concat!(
    include_str!("../../memfit-sys/tests/common/charged.py"),
    r#"
batch = int(sys.argv[1])
held = b'\x02' * (48 << 20)
top = 0
for _ in range(4):
    time.sleep(0.3)
    act = b'\x01' * ((6 * batch) << 20)
    top = max(top, charged())
    del act
print(top)
"#
);

/// Issue 29: calibrate's prediction at batch 16 from batches 1, 2, 4 within 10% of the peak the job
/// reads itself when run at 16 (with the malloc pin its profiles set).
#[test]
fn a_bursting_job_is_predicted_at_16_from_1_2_4() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().to_str().unwrap();
    let command = ["python3", "-c", BURSTING_JOB, "{batch}"].map(String::from);
    let o = calibrate(
        &["--budget-ram", "2GiB", "--at", "16", "--json", "--out", dir],
        &command,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let predicted = json(&o)["at"]["peak_rss_bytes"].as_f64().unwrap();
    let run16 = std::process::Command::new("python3")
        .args(["-c", BURSTING_JOB, "16"])
        .env("MALLOC_MMAP_THRESHOLD_", "131072")
        .output()
        .unwrap();
    assert!(run16.status.success(), "{run16:?}");
    let measured: f64 = String::from_utf8_lossy(&run16.stdout)
        .trim()
        .parse()
        .unwrap();
    let off = (predicted - measured) / measured;
    assert!(
        off.abs() <= 0.10,
        "predicted {:.1} MiB at 16, measured {:.1} MiB ({:+.1}%)\n{}",
        predicted / MIB,
        measured / MIB,
        off * 100.0,
        stderr(&o)
    );
}

/// Every trial runs with glibc's mmap threshold pinned, unless the user's environment tunes malloc.
#[test]
fn trials_run_with_malloc_pinned() {
    let Some(hog) = memhog() else { return };
    let out = tempfile::tempdir().unwrap();
    let seen = out.path().join("seen-{batch}");
    let script = format!(
        "echo \"$MALLOC_MMAP_THRESHOLD_\" > {} && exec {}",
        seen.display(),
        hog_command(&hog, 32, 8).join(" ")
    );
    let command = ["sh".to_owned(), "-c".to_owned(), script];
    let dir = out.path().to_str().unwrap();
    let o = calibrate(&["--budget-ram", "1GiB", "--out", dir], &command);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let read = |b: u32| std::fs::read_to_string(out.path().join(format!("seen-{b}"))).unwrap();
    assert_eq!(read(1).trim(), "131072");
    assert!(
        stderr(&o).contains("MALLOC_MMAP_THRESHOLD_=131072"),
        "{}",
        stderr(&o)
    );
    // a user's own setting wins
    let o = memfit()
        .env("MALLOC_MMAP_THRESHOLD_", "65536")
        .args(["calibrate", "--budget-ram", "1GiB", "--out", dir, "--"])
        .args(&command)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(read(2).trim(), "65536");
}

#[test]
fn a_batch_predicted_over_the_budget_never_runs() {
    let Some(hog) = memhog() else { return };
    let out = tempfile::tempdir().unwrap();
    let mut command = hog_command(&hog, 48, 16);
    let done = out.path().join("done-{batch}.json");
    command.extend(["--done".to_owned(), done.display().to_string()]);
    let dir = out.path().to_str().unwrap();
    // 100 MiB less 10%: batch 1 (64 MiB) and 2 (80 MiB) fit, batch 4 is predicted at 112 MiB.
    let o = calibrate(&["--budget-ram", "100MiB", "--out", dir], &command);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let ran = |b: u32| out.path().join(format!("done-{b}.json")).exists();
    assert!(ran(1) && ran(2) && !ran(4), "{}", stderr(&o));
    assert!(stderr(&o).contains("batch 4 not run"), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("largest micro-batch 2"), "{stdout}");
    assert!(stdout.contains("linearity not checked"), "{stdout}");
}

#[test]
fn a_budget_below_the_fixed_part_exits_3_with_the_shortfall() {
    let Some(hog) = memhog() else { return };
    // Fixed 80 MiB, usable 150 MiB less 50% = 75 MiB: short by about 5 MiB before any sample.
    let o = calibrate(
        &["--budget-ram", "150MiB", "--headroom", "50%", "--json"],
        &hog_command(&hog, 80, 4),
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("fixed part") && err.contains("75.0 MiB") && err.contains("by"),
        "{err}"
    );
    assert_eq!(json(&o)["max_batch"]["host"], 0);
    // A budget the guard reaches at the smallest batch: stopped, not crossed, exit 3.
    let o = calibrate(&["--budget-ram", "60MiB"], &hog_command(&hog, 48, 16));
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("the guard stopped"), "{}", stderr(&o));
}

#[test]
fn bad_input_and_a_failing_command() {
    let sh = |script: &str| vec!["sh".to_owned(), "-c".to_owned(), script.to_owned()];
    for (args, command, needle) in [
        (vec![], sh("true"), "has no {batch}"),
        (vec!["--budget-ram", "10"], sh("echo {batch}"), "no unit"),
        (vec!["--budget-gpu", "10"], sh("echo {batch}"), "no unit"),
        (vec!["--batches", "4"], sh("echo {batch}"), "two different"),
        (vec!["--steps", "3"], sh("echo {batch}"), "{steps}"),
    ] {
        let o = calibrate(&args, &command);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
    let o = calibrate(
        &[],
        &sh("echo {batch} >/dev/null; sleep 0.3; echo boom-marker >&2; exit 7"),
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("batch 1 (exit code 7)") && err.contains("boom-marker"),
        "{err}"
    );
    // A profiles.toml that calibrate did not write is left alone.
    let out = tempfile::tempdir().unwrap();
    std::fs::write(
        out.path().join("profiles.toml"),
        "[[profile]]\nname = \"mine\"\n",
    )
    .unwrap();
    let o = calibrate(
        &["--out", out.path().to_str().unwrap()],
        &[
            "true".to_owned(),
            "--batch".to_owned(),
            "{batch}".to_owned(),
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("did not write it"), "{}", stderr(&o));
}
