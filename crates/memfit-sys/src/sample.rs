//! Memory of a process tree and of the system, read from /proc without scanning all of /proc.
//!
//! Children come from `/proc/PID/task/TID/children` (CONFIG_PROC_CHILDREN, on in distribution kernels): a
//! walk costs one small read per thread of the job, not one per process on the machine. Kernels without
//! it fall back to a full /proc scan for parent PIDs. Memory per process comes from /proc/PID/status
//! (RssAnon/RssFile/RssShmem/VmSwap/VmHWM: constant cost, unlike smaps_rollup which walks every mapping).

use std::collections::HashMap;
use std::fs;

use crate::probe::meminfo_kib;

/// One process's memory, from /proc/PID/status.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ProcMem {
    pub pid: i32,
    pub name: String,
    pub rss_anon: u64,
    pub rss_file: u64,
    pub rss_shmem: u64,
    pub swap: u64,
    /// VmHWM: the kernel's high-water mark of the process's RSS (anonymous + file + shared pages) since
    /// it started or last exec'd; it sees a peak that fell between two reads.
    pub hwm: u64,
}

impl ProcMem {
    /// What the process costs the machine if it grows: anonymous and shared-memory pages plus what is
    /// swapped out. File pages (code, mmapped data) are left out: the kernel can drop and re-read them.
    pub fn charged(&self) -> u64 {
        self.rss_anon + self.rss_shmem + self.swap
    }
}

/// Parses the text of /proc/PID/status; `None` for kernel threads and zombies (no Rss lines).
pub fn parse_status(pid: i32, text: &str) -> Option<ProcMem> {
    let name = text
        .lines()
        .find_map(|l| l.strip_prefix("Name:"))
        .map(|n| n.trim().to_owned())
        .unwrap_or_default();
    let kib = |field| meminfo_kib(text, field).map(|k| k * 1024);
    Some(ProcMem {
        pid,
        name,
        rss_anon: kib("RssAnon")?,
        rss_file: kib("RssFile").unwrap_or(0),
        rss_shmem: kib("RssShmem").unwrap_or(0),
        swap: kib("VmSwap").unwrap_or(0),
        hwm: kib("VmHWM").unwrap_or(0),
    })
}

/// The PIDs listed in a `children` file (space separated).
pub fn parse_children(text: &str) -> impl Iterator<Item = i32> + '_ {
    text.split_whitespace().filter_map(|t| t.parse().ok())
}

/// The processes of a tree, found from its root each time it is walked.
pub struct TreeWalker {
    root: i32,
    children_files: bool,
}

impl TreeWalker {
    pub fn new(root: i32) -> Self {
        let probe = format!(
            "/proc/{}/task/{}/children",
            std::process::id(),
            std::process::id()
        );
        Self {
            root,
            children_files: fs::metadata(probe).is_ok(),
        }
    }

    /// Whether the cheap children files are in use (false: full /proc scan per walk).
    pub fn uses_children_files(&self) -> bool {
        self.children_files
    }

    /// PIDs of the root and all its descendants that are alive now (root first).
    pub fn pids(&self) -> Vec<i32> {
        self.descendants(&[self.root])
    }

    /// `roots` and all their descendants alive now (roots first).
    pub fn descendants(&self, roots: &[i32]) -> Vec<i32> {
        if self.children_files {
            let mut out = roots.to_vec();
            let mut next = 0;
            while next < out.len() {
                let kids = children_from_files(out[next]);
                out.extend(kids);
                next += 1;
            }
            out
        } else {
            let children = scan_children();
            let mut out = roots.to_vec();
            let mut next = 0;
            while next < out.len() {
                if let Some(kids) = children.get(&out[next]) {
                    out.extend(kids);
                }
                next += 1;
            }
            out
        }
    }

    /// The direct children of `pid` alive now.
    pub fn children(&self, pid: i32) -> Vec<i32> {
        if self.children_files {
            children_from_files(pid)
        } else {
            scan_children().remove(&pid).unwrap_or_default()
        }
    }

    /// Memory of every live process of the tree.
    pub fn sample(&self) -> Vec<ProcMem> {
        self.pids().into_iter().filter_map(proc_mem).collect()
    }
}

/// Memory of one live process; `None` once it is gone or a zombie.
pub fn proc_mem(pid: i32) -> Option<ProcMem> {
    parse_status(
        pid,
        &fs::read_to_string(format!("/proc/{pid}/status")).ok()?,
    )
}

/// Process group and start time of a live process (see `parse_stat_pgrp_start`).
pub fn pgrp_start(pid: i32) -> Option<(i32, u64)> {
    parse_stat_pgrp_start(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Whether `pid` is a zombie (state Z in /proc/PID/stat; false once it is gone).
pub fn is_zombie(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Children of every thread of `pid`, from /proc/PID/task/TID/children.
fn children_from_files(pid: i32) -> Vec<i32> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|text| parse_children(&text).collect::<Vec<_>>())
        .collect()
}

/// Every process's children, from one scan of /proc/*/stat (kernels without CONFIG_PROC_CHILDREN).
fn scan_children() -> HashMap<i32, Vec<i32>> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if let Some(ppid) = fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| parse_stat_ppid(&s))
            {
                children.entry(ppid).or_default().push(pid);
            }
        }
    }
    children
}

/// Parent PID from /proc/PID/stat (field 4, after the parenthesised command that may hold spaces).
pub fn parse_stat_ppid(stat: &str) -> Option<i32> {
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Process group and start time (clock ticks since boot) from /proc/PID/stat (fields 5 and 22): a PID
/// with the same start time is the same process, so a reused PID is never mistaken for a job member.
pub fn parse_stat_pgrp_start(stat: &str) -> Option<(i32, u64)> {
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After ")": state is field 3, so field N is at index N − 3.
    Some((fields.get(2)?.parse().ok()?, fields.get(19)?.parse().ok()?))
}

/// The machine's memory at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SystemMem {
    pub total_bytes: u64,
    pub available_bytes: u64,
    pub swap_total_bytes: u64,
    pub swap_free_bytes: u64,
}

pub fn parse_system(meminfo: &str) -> Option<SystemMem> {
    let b = |f| meminfo_kib(meminfo, f).map(|k| k * 1024);
    Some(SystemMem {
        total_bytes: b("MemTotal")?,
        available_bytes: b("MemAvailable")?,
        swap_total_bytes: b("SwapTotal").unwrap_or(0),
        swap_free_bytes: b("SwapFree").unwrap_or(0),
    })
}

pub fn system() -> Option<SystemMem> {
    parse_system(&fs::read_to_string("/proc/meminfo").ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captured_status() {
        let p = parse_status(7, include_str!("../tests/fixtures/proc/status")).unwrap();
        assert_eq!(p.name, "cat");
        assert_eq!(p.rss_anon, 116 * 1024);
        assert_eq!(p.rss_file, 1580 * 1024);
        assert_eq!(p.rss_shmem, 0);
        assert_eq!(p.charged(), 116 * 1024);
        assert_eq!(p.hwm, 1696 * 1024);
        assert!(parse_status(2, "Name:\tkthreadd\nState:\tS\n").is_none());
    }

    #[test]
    fn stat_fields_survive_odd_names() {
        let stat =
            "1234 (a) b (c) S 99 1234 1234 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 5555 1000 10";
        assert_eq!(parse_stat_ppid(stat), Some(99));
        assert_eq!(parse_stat_pgrp_start(stat), Some((1234, 5555)));
        assert_eq!(parse_stat_ppid("garbage"), None);
    }

    #[test]
    fn children_and_system() {
        assert_eq!(parse_children("12 13 \n").collect::<Vec<_>>(), [12, 13]);
        let s = parse_system(include_str!("../tests/fixtures/proc/meminfo")).unwrap();
        assert_eq!(s.total_bytes, 24_684_096 * 1024);
        assert_eq!(s.swap_total_bytes, 0);
    }

    #[test]
    fn live_tree_contains_a_child() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let walker = TreeWalker::new(std::process::id() as i32);
        let pids = walker.pids();
        let found = pids.contains(&(child.id() as i32));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(found, "{pids:?} lacks {}", child.id());
        assert!(
            walker
                .sample()
                .iter()
                .any(|p| p.pid == std::process::id() as i32)
        );
    }
}
