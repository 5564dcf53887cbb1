//! `memfit run -- torchrun …` guards every local rank: a fake torchrun (Python) starts 3 ranks with
//! LOCAL_RANK/RANK/WORLD_SIZE set as torchrun sets them — one in a session of its own, one with a
//! DataLoader-like worker child — and rank 2 grows past the budget. The guard must stop every rank
//! and the launcher together (exit 75, nothing left), and report each rank's figures: in the summary
//! (`peak_by_rank`), in the stop action (`ranks`) and in the time series (`ranks` records).

use std::time::Duration;

use memfit_sys::guard::GuardConfig;
use memfit_sys::supervise::{Outcome, RunConfig, run};
use memfit_sys::units::SizeOrPercent;

const MIB: u64 = 1 << 20;
const BUDGET: u64 = 192 * MIB;

/// The launcher: ranks 0 and 1 hold 24 MiB, rank 1's worker 16 MiB, rank 2 grows 4 MiB per 50 ms;
/// each rank writes its PID to DIR/rank<N>.pid. `marker` rides in every command line.
fn launcher(dir: &str, marker: &str) -> String {
    format!(
        r#"
import os, subprocess, sys, time
HOLD = "import os,time\nx = bytearray(24 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1\ntime.sleep(60)"
WORKER = "import os,time\nx = bytearray(16 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1\ntime.sleep(60)"
GROW = "import time\nheld = []\nwhile True:\n    held.append(b'\\x01' * (4 << 20)); time.sleep(0.05)"
def rank(n, code, **kw):
    env = dict(os.environ, LOCAL_RANK=str(n), RANK=str(n), WORLD_SIZE="3", LOCAL_WORLD_SIZE="3")
    pre = f"import os\nopen('{dir}/rank{{n}}.pid', 'w').write(str(os.getpid()))\n"
    return subprocess.Popen([sys.executable, "-c", pre + code + "\n# {marker}"], env=env, **kw)
ranks = [rank(0, HOLD),
         rank(1, "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', " + repr(WORKER + "\n# {marker}") + "])\n" + HOLD),
         rank(2, GROW, start_new_session=True)]
sys.exit(max(p.wait() for p in ranks))
# {marker}
"#
    )
}

fn alive_with(marker: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .collect()
}

#[test]
fn every_rank_is_stopped_together_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.jsonl");
    let marker = format!("memfit-fake-torchrun-{}", std::process::id());
    let mut cfg = RunConfig::new(vec![
        "python3".into(),
        "-c".into(),
        launcher(dir.path().to_str().unwrap(), &marker),
    ]);
    cfg.budget = SizeOrPercent::Bytes(BUDGET);
    cfg.jsonl = Some(log.clone());
    cfg.guard = GuardConfig {
        grace: Duration::from_secs(1),
        ..GuardConfig::default()
    };
    let s = run(&cfg).unwrap();
    assert_eq!(
        (s.outcome, s.exit_code),
        (Outcome::StoppedByGuard, 75),
        "{s:#?}"
    );
    assert!(alive_with(&marker).is_empty(), "ranks left running");
    for n in 0..3 {
        let pid = std::fs::read_to_string(dir.path().join(format!("rank{n}.pid"))).unwrap();
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| !c.contains(&marker)),
            "rank {n} (PID {pid}) outlived the stop"
        );
    }

    // the summary: each rank's peak, rank 2 the largest, rank 1 counting its worker
    let ranks: Vec<u32> = s.peak_by_rank.iter().map(|p| p.local_rank).collect();
    assert_eq!(ranks, [0, 1, 2], "{:#?}", s.peak_by_rank);
    let peak = |n: usize| s.peak_by_rank[n].peak_bytes;
    assert!(peak(0) >= 20 * MIB && peak(0) < 64 * MIB, "{}", peak(0));
    assert!(
        peak(1) >= peak(0) + 12 * MIB,
        "the worker counts: {} vs {}",
        peak(1),
        peak(0)
    );
    assert!(peak(2) > peak(1), "{:#?}", s.peak_by_rank);
    assert_eq!(s.peak_by_rank[2].rank, Some(2));
    // the guard's total held: the launcher has no rank and counts only in the total
    assert!(s.peak_job_bytes >= peak(0) + peak(1) + peak(2));

    // the stop names every rank at that moment
    let stop = s.attempts[0]
        .actions
        .iter()
        .find(|a| a.action == "graceful_stop" || a.action == "kill")
        .expect("a stop action");
    assert_eq!(stop.ranks.len(), 3, "{stop:#?}");
    let at_stop: u64 = stop.ranks.iter().map(|r| r.bytes).sum();
    assert!(at_stop <= stop.job_bytes, "{stop:#?}");
    assert!(stop.ranks[2].bytes > stop.ranks[0].bytes, "{stop:#?}");

    // the time series carries `ranks` records
    let text = std::fs::read_to_string(&log).unwrap();
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["type"] == "ranks")
        .collect();
    assert!(!records.is_empty(), "no ranks records in {text}");
    assert!(
        records
            .iter()
            .any(|r| r["ranks"].as_array().unwrap().len() == 3)
    );
}
