//! 50 racing start/resume pairs, each side its own process (the lock is per process: threads of one
//! share it): a start claims a new run directory, writes config.toml and 20 metric lines; a resume
//! claims it and appends 20 more. Every directory must end with one config.toml and metric lines in
//! whole blocks of one writer (no interleaving), and a refused side must leave everything in place.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use memfit_train::run_lock::{Claim, ClaimError, LockError};

const ROLE: &str = "MEMFIT_LOCK_RACE_ROLE";
const DIR: &str = "MEMFIT_LOCK_RACE_DIR";
const LINES: usize = 20;

/// The child side: does nothing unless started by `racing_pairs_leave_every_run_intact`.
#[test]
fn race_side() {
    let (Ok(role), Ok(dir)) = (std::env::var(ROLE), std::env::var(DIR)) else {
        return;
    };
    let root = Path::new(&dir);
    let claim = match role.as_str() {
        "start" => Claim::new_run(root),
        _ => Claim::resume(root),
    };
    let mut claim = match claim {
        Ok(c) => c,
        Err(ClaimError::AlreadyARun { .. }) => std::process::exit(3),
        Err(ClaimError::Lock(e @ LockError::Held { .. })) => {
            assert!(e.to_string().contains("in use by process"), "{e}");
            std::process::exit(2)
        }
        // A resume before the start made the directory.
        Err(ClaimError::Lock(LockError::Io { .. })) => std::process::exit(4),
    };
    if role == "start" {
        std::fs::write(root.join("config.toml"), "model = \"x\"\n").unwrap();
    } else if !root.join("config.toml").exists() {
        std::process::exit(4); // a resume of what is not (yet) a run
    }
    claim.keep();
    let mut metrics = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("metrics.jsonl"))
        .unwrap();
    for i in 0..LINES {
        writeln!(metrics, "{role} {} {i}", std::process::id()).unwrap();
        std::thread::sleep(Duration::from_micros(200));
    }
    std::process::exit(0);
}

fn side(role: &str, dir: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "race_side", "--nocapture", "--test-threads", "1"])
        .env(ROLE, role)
        .env(DIR, dir)
        .spawn()
        .unwrap()
}

#[test]
fn racing_pairs_leave_every_run_intact() {
    let tmp = tempfile::tempdir().unwrap();
    let mut codes = std::collections::BTreeMap::new();
    for pair in 0..50 {
        let dir = tmp.path().join(format!("run-{pair}"));
        // Half the pairs start at once; the other half stagger the resume a little.
        let mut start = side("start", &dir);
        if pair % 2 == 1 {
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut resume = side("resume", &dir);
        let (a, b) = (start.wait().unwrap(), resume.wait().unwrap());
        *codes.entry((a.code(), b.code())).or_insert(0) += 1;
        if a.code() == Some(2) {
            // The resume took the lock between the start's mkdir and its lock, found no run and left.
            assert_eq!(b.code(), Some(4), "pair {pair}");
            assert!(!dir.join("config.toml").exists());
            continue;
        }
        assert_eq!(a.code(), Some(0), "pair {pair}: the start failed");
        assert!(
            matches!(b.code(), Some(0 | 2 | 4)),
            "pair {pair}: the resume ended {b:?}"
        );
        let config = std::fs::read_to_string(dir.join("config.toml")).unwrap();
        assert_eq!(config, "model = \"x\"\n", "pair {pair}");
        let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let expected = if b.code() == Some(0) {
            2 * LINES
        } else {
            LINES
        };
        assert_eq!(lines.len(), expected, "pair {pair}: {text}");
        for block in lines.chunks(LINES) {
            let writer = |l: &str| l.rsplit_once(' ').unwrap().0.to_owned();
            assert!(
                block.iter().all(|l| writer(l) == writer(block[0])),
                "pair {pair}: interleaved writers: {block:?}"
            );
        }
        assert!(lines[0].starts_with("start "), "pair {pair}: {text}");
    }
    // How the pairs went: (start, resume) exit codes → count. 2 = refused with the holder's PID,
    // 4 = a resume before the start wrote config.toml, 0 = resumed after the start ended.
    println!("{codes:?}");
}
