//! An allocation failure loses at most the current step (issue #6): `memfit train` under a real
//! `RLIMIT_AS` that its next steps cannot fit gives its memory reserve back, finishes or abandons
//! the step, checkpoints and exits 75; `--resume` continues.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Resource, Rlimit, prlimit};

fn memfit() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memfit"))
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn vm_size_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmSize:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

fn wait_with_timeout(child: &mut Child, limit: Duration) -> i32 {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("memfit train did not stop within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_allocation_failure_checkpoints_the_last_step_and_exits_75() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // The demo at micro-batch 256, with glibc's mmap threshold pinned at 64 KiB: every tensor
    // gets its own mapping, returned when freed, so every step asks the kernel for tens of MiB of
    // fresh address space. (Left adaptive, glibc keeps freed memory for reuse and may not ask for
    // a long time.) An 8 GiB budget holds back a 410 MiB reserve.
    let mut child = memfit()
        .env("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536")
        .args(["train", "--out"])
        .arg(&run)
        .args(["--batch", "256", "--epochs", "1000", "--budget-ram", "8GiB"])
        .args(["--save-steps", "0", "--eval-steps", "0", "--json"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let metrics = run.join("metrics.jsonl");
    let start = Instant::now();
    while lines(&metrics).len() < 5 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "training did not start"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "memfit train ended early"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The address space over half a second of training: its low and high points; the limit goes
    // just under the low point, so the next fresh mapping fails once glibc's free heap space is
    // used up (glibc falls back to it when a mapping is refused).
    let pid = child.id();
    let (mut low, mut high) = (u64::MAX, 0);
    let sampling = Instant::now();
    while sampling.elapsed() < Duration::from_millis(500) {
        if let Some(v) = vm_size_bytes(pid) {
            low = low.min(v);
            high = high.max(v);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(high > low, "the address space did not move ({low} bytes)");
    let limit = low - (4 << 20);
    prlimit(
        Pid::from_raw(pid as i32),
        Resource::As,
        Rlimit {
            current: Some(limit),
            maximum: None,
        },
    )
    .unwrap();

    let code = wait_with_timeout(&mut child, Duration::from_secs(120));
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(code, 75, "{stderr}");
    assert!(stderr.contains("allocation_failure"), "{stderr}");

    let stop = lines(&run.join("events.jsonl"))
        .into_iter()
        .rfind(|e| e["kind"] == "stop")
        .expect("a stop event");
    assert_eq!(stop["reason"], "allocation_failure", "{stop}");
    assert_eq!(stop["exit"], 75);
    // At most the current step is lost: every completed step is in the checkpoint.
    let completed = lines(&metrics)
        .iter()
        .filter_map(|m| m["step"].as_u64())
        .max()
        .unwrap();
    let saved = stop["step"].as_u64().unwrap();
    assert_eq!(saved, completed, "{stop}");
    assert!(run.join(format!("checkpoints/step-{saved}")).is_dir());
    assert_eq!(stop["resume_micro_batch"], 128);

    // Without the limit the run goes on from there, at the halved micro-batch.
    let out = memfit()
        .args(["train", "--resume"])
        .arg(&run)
        .args([
            "--max-steps",
            &(saved + 3).to_string(),
            "--allow-config-change",
        ])
        .args(["--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let resumed: Vec<_> = lines(&metrics)
        .into_iter()
        .filter(|m| m["step"].as_u64().unwrap() > saved)
        .collect();
    assert_eq!(resumed.len(), 3);
    assert!(resumed.iter().all(|m| m["micro_batch"] == 128));
}
