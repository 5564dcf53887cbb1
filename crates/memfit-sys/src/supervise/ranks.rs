//! Per-rank figures of a distributed job (`memfit run -- torchrun …`, `accelerate launch`): the
//! launcher gives each rank `LOCAL_RANK` (and `RANK`) in its environment, which the rank's own
//! children (DataLoader workers, compile workers) inherit, so a process's rank is read from
//! /proc/PID/environ and a rank's memory is the sum over its processes. The launcher itself has no
//! rank. The guard still holds the job's total to the budget — a rank over the budget puts the total
//! over it — and stops every rank together; these figures say which rank grew.

use std::collections::HashMap;

use super::members::Member;

/// A rank's memory in one sample.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RankUsage {
    pub local_rank: u32,
    /// The global rank (`RANK`), when the launcher set it.
    pub rank: Option<u32>,
    /// Processes of the rank (the rank and its children).
    pub processes: u32,
    /// Σ RssAnon + RssShmem + VmSwap of its processes, as the job's total counts them.
    pub bytes: u64,
    /// Σ of its processes' GPU memory (NVML per-PID figures); `None` without NVML.
    pub gpu_bytes: Option<u64>,
}

/// A rank's largest figures over an attempt.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RankPeak {
    pub attempt: u32,
    pub local_rank: u32,
    pub rank: Option<u32>,
    pub peak_bytes: u64,
    pub peak_gpu_bytes: Option<u64>,
}

/// (LOCAL_RANK, RANK) of a process.
type RankId = (u32, Option<u32>);

/// Each process's rank, read once per process (PID and start time) once it has one. A process
/// without a rank is asked again at each sample: between its fork and its exec a rank still has
/// the launcher's environment.
#[derive(Default)]
pub(super) struct Ranks {
    known: HashMap<(i32, u64), RankId>,
}

impl Ranks {
    /// The ranks' usage now, by local rank; empty when no process has a rank.
    pub(super) fn usage(
        &mut self,
        live: &[Member],
        gpu_by_pid: Option<&HashMap<u32, u64>>,
    ) -> Vec<RankUsage> {
        self.known
            .retain(|(pid, start), _| live.iter().any(|m| m.mem.pid == *pid && m.start == *start));
        let mut by_rank: HashMap<u32, RankUsage> = HashMap::new();
        for m in live {
            let Some((local_rank, rank)) = self.rank_of(m.mem.pid, m.start) else {
                continue;
            };
            let u = by_rank.entry(local_rank).or_insert(RankUsage {
                local_rank,
                rank,
                processes: 0,
                bytes: 0,
                gpu_bytes: gpu_by_pid.map(|_| 0),
            });
            u.processes += 1;
            u.bytes += m.mem.charged();
            if let (Some(total), Some(gpu)) = (u.gpu_bytes.as_mut(), gpu_by_pid) {
                *total += gpu.get(&(m.mem.pid as u32)).copied().unwrap_or(0);
            }
        }
        let mut out: Vec<RankUsage> = by_rank.into_values().collect();
        out.sort_by_key(|u| u.local_rank);
        out
    }

    fn rank_of(&mut self, pid: i32, start: u64) -> Option<RankId> {
        if let Some(known) = self.known.get(&(pid, start)) {
            return Some(*known);
        }
        // empty during an exec and for a zombie: asked again at the next sample
        let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let id = rank_from_environ(&environ)?;
        self.known.insert((pid, start), id);
        Some(id)
    }
}

/// LOCAL_RANK and RANK from a NUL-separated environment block; `None` without LOCAL_RANK.
pub(super) fn rank_from_environ(environ: &[u8]) -> Option<RankId> {
    let var = |name: &str| {
        let prefix = format!("{name}=");
        environ
            .split(|&b| b == 0)
            .find_map(|v| v.strip_prefix(prefix.as_bytes()))
            .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u32>().ok())
    };
    Some((var("LOCAL_RANK")?, var("RANK")))
}

/// Keeps each rank's largest figures of the attempt.
pub(super) fn update_peaks(
    peaks: &mut HashMap<(u32, u32), RankPeak>,
    attempt: u32,
    usage: &[RankUsage],
) {
    for u in usage {
        let p = peaks
            .entry((attempt, u.local_rank))
            .or_insert_with(|| RankPeak {
                attempt,
                local_rank: u.local_rank,
                rank: u.rank,
                peak_bytes: 0,
                peak_gpu_bytes: None,
            });
        p.peak_bytes = p.peak_bytes.max(u.bytes);
        p.peak_gpu_bytes = u.gpu_bytes.map(|g| p.peak_gpu_bytes.unwrap_or(0).max(g));
    }
}

/// "local rank 2: 190.0 MiB (largest), local rank 0: 24.0 MiB, …" for the guard's log line.
pub(super) fn describe(usage: &[RankUsage]) -> String {
    let largest = usage.iter().map(|u| u.bytes).max().unwrap_or(0);
    usage
        .iter()
        .map(|u| {
            let mut s = format!(
                "local rank {}: {}",
                u.local_rank,
                crate::units::human_bytes(u.bytes)
            );
            if let Some(g) = u.gpu_bytes {
                s += &format!(" (GPU {})", crate::units::human_bytes(g));
            }
            if u.bytes == largest && usage.len() > 1 {
                s += " (largest)";
            }
            s
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_are_read_from_the_environment_block() {
        let env = b"PATH=/bin\0LOCAL_RANK=2\0RANK=6\0WORLD_SIZE=8\0";
        assert_eq!(rank_from_environ(env), Some((2, Some(6))));
        assert_eq!(rank_from_environ(b"LOCAL_RANK=0\0"), Some((0, None)));
        // the launcher, and a variable that only starts with the name
        assert_eq!(rank_from_environ(b"RANK=1\0MY_LOCAL_RANK=3\0"), None);
        assert_eq!(rank_from_environ(b"LOCAL_RANK=x\0"), None);
    }

    #[test]
    fn peaks_keep_the_largest_of_each_rank() {
        let mut peaks = HashMap::new();
        let u = |local_rank, bytes| RankUsage {
            local_rank,
            rank: Some(local_rank),
            processes: 1,
            bytes,
            gpu_bytes: None,
        };
        update_peaks(&mut peaks, 0, &[u(0, 10), u(1, 50)]);
        update_peaks(&mut peaks, 0, &[u(0, 30), u(1, 20)]);
        assert_eq!(peaks[&(0, 0)].peak_bytes, 30);
        assert_eq!(peaks[&(0, 1)].peak_bytes, 50);
        assert!(describe(&[u(0, 10), u(1, 50)]).contains("local rank 1: 50 B (largest)"));
    }
}
