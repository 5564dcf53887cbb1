//! The job's recorded peak, from four sources, so that a burst between two of the guard's samples is
//! not lost (issue 29: a PyTorch step's peak lasts well under the guard's 1 s period far from the limit).
//!
//! - `sampled`: the guarded quantity at the guard's full samples (what the guard acted on);
//! - `polled`: between full samples the processes found at the last one are re-read every
//!   [`PEAK_POLL`] (their /proc/PID/status only: no tree walk, no series record), plus the /dev/shm
//!   files counted at the last sample;
//! - `high_water`: each process's VmHWM, the kernel's high-water mark of its RSS, which sees a peak
//!   between any two reads. It counts file pages too, so the largest RssFile seen in the process is
//!   taken off: that is the least the peak's anonymous + shared part can have been, as long as the
//!   process's file pages never stood higher at its peak than at any read (they grow as code and data
//!   are mapped in, and seldom shrink). Only a rise of VmHWM between two reads of one process counts
//!   (a forked child inherits its parent's mark); the other processes count at the lower of their two
//!   reads around it, and one process's rise at a time (their rises need not coincide);
//! - `cgroup` (with `--cgroup`): the group's own high-water mark (v2 `memory.peak`, v1
//!   `memory.max_usage_in_bytes`) less the most it was seen holding besides the guarded quantity (page
//!   cache, kernel memory), by the same reasoning.
//!
//! Each is a figure the job reached (or, for the last two, a lower bound of it); the recorded peak is
//! the largest.

use std::collections::HashMap;
use std::time::Duration;

use crate::sample::{ProcMem, proc_mem};

/// The period of the light re-reads between full samples: the period an outside poll of the
/// baselines used (issue 29), and ~20 µs per process per read here.
pub const PEAK_POLL: Duration = Duration::from_millis(20);

/// A process is (PID, start time): a reused PID is another process.
pub(super) type ProcKey = (i32, u64);

/// What was last read of one process.
#[derive(Clone, Copy)]
struct Seen {
    charged: u64,
    hwm: u64,
    max_file: u64,
}

/// The peak of each source, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PeakSources {
    pub sampled_bytes: u64,
    pub polled_bytes: u64,
    pub high_water_bytes: u64,
    /// `None` without `--cgroup`.
    pub cgroup_bytes: Option<u64>,
}

impl PeakSources {
    /// The recorded peak: the largest source.
    pub fn peak(&self) -> u64 {
        self.sampled_bytes
            .max(self.polled_bytes)
            .max(self.high_water_bytes)
            .max(self.cgroup_bytes.unwrap_or(0))
    }
}

#[derive(Default)]
pub(super) struct PeakTracker {
    seen: HashMap<ProcKey, Seen>,
    /// PIDs of the last full sample, re-read by `poll`.
    pids: Vec<i32>,
    /// /dev/shm files counted at the last full sample.
    shm_files: u64,
    /// The most the job's cgroup held besides the guarded quantity at one sample.
    cgroup_other: Option<u64>,
    pub(super) sources: PeakSources,
}

impl PeakTracker {
    /// A full sample: `job` is the guarded quantity; `procs` the job's processes, `shm_files` its
    /// /dev/shm files. Returns the high-water estimate of the peak since the previous sample.
    pub(super) fn sample<'a>(
        &mut self,
        job: u64,
        procs: impl IntoIterator<Item = (ProcKey, &'a ProcMem)>,
        shm_files: u64,
    ) -> u64 {
        let mut seen = HashMap::new();
        let (mut floor, mut rise) = (self.shm_files.min(shm_files), 0);
        for (key, p) in procs {
            let now = p.charged();
            let before = self.seen.get(&key);
            let max_file = before.map_or(p.rss_file, |b| b.max_file.max(p.rss_file));
            let low = before.map_or(0, |b| b.charged.min(now));
            floor += low;
            if let Some(b) = before
                && p.hwm > b.hwm
            {
                rise = rise.max(p.hwm.saturating_sub(max_file).saturating_sub(low));
            }
            seen.insert(
                key,
                Seen {
                    charged: now,
                    hwm: p.hwm,
                    max_file,
                },
            );
        }
        self.pids = seen.keys().map(|k| k.0).collect();
        self.seen = seen;
        self.shm_files = shm_files;
        let high_water = floor + rise;
        let s = &mut self.sources;
        s.sampled_bytes = s.sampled_bytes.max(job);
        s.high_water_bytes = s.high_water_bytes.max(high_water);
        high_water
    }

    /// Re-reads the processes of the last full sample; returns their sum (with the /dev/shm files).
    pub(super) fn poll(&mut self) -> u64 {
        let sum = self.shm_files
            + self
                .pids
                .iter()
                .filter_map(|&pid| proc_mem(pid))
                .map(|p| p.charged())
                .sum::<u64>();
        self.sources.polled_bytes = self.sources.polled_bytes.max(sum);
        sum
    }

    /// With `--cgroup`, at each sample: the group's usage and the part of it that is the guarded
    /// quantity.
    pub(super) fn cgroup_sample(&mut self, current: u64, charged: u64) {
        let other = current.saturating_sub(charged);
        self.cgroup_other = Some(self.cgroup_other.map_or(other, |o| o.max(other)));
    }

    /// With `--cgroup`, when the attempt ends: the group's high-water mark.
    pub(super) fn cgroup_peak(&mut self, peak: u64) {
        self.sources.cgroup_bytes = Some(peak.saturating_sub(self.cgroup_other.unwrap_or(0)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn mem(pid: i32, anon: u64, file: u64, hwm: u64) -> ProcMem {
        ProcMem {
            pid,
            name: "p".into(),
            rss_anon: anon * MIB,
            rss_file: file * MIB,
            rss_shmem: 0,
            swap: 0,
            hwm: hwm * MIB,
        }
    }

    #[test]
    fn a_burst_between_samples_shows_through_the_high_water_mark() {
        let mut t = PeakTracker::default();
        let a = mem(10, 100, 20, 120);
        let b = mem(11, 50, 5, 55);
        t.sample(150 * MIB, [((10, 1), &a), ((11, 1), &b)], 0);
        // Process 10 rose to 400 MiB anonymous (+20 file) and fell back between the samples; 11 shrank.
        let a2 = mem(10, 110, 20, 420);
        let b2 = mem(11, 40, 5, 55);
        let hw = t.sample(150 * MIB, [((10, 1), &a2), ((11, 1), &b2)], 0);
        // 11 at the lower of its two reads (40) + 10's mark less its file pages (400).
        assert_eq!(hw, 440 * MIB);
        assert_eq!(t.sources.peak(), 440 * MIB);
        assert_eq!(t.sources.sampled_bytes, 150 * MIB);
    }

    #[test]
    fn inherited_or_unmoved_marks_add_nothing() {
        let mut t = PeakTracker::default();
        // A new process (a fork inherits its parent's mark) counts at its current figure only, from
        // its second read on.
        let child = mem(20, 10, 1, 900);
        assert_eq!(t.sample(10 * MIB, [((20, 5), &child)], 0), 0);
        assert_eq!(t.sample(10 * MIB, [((20, 5), &child)], 0), 10 * MIB);
        // A reused PID with another start time is a new process.
        let other = mem(20, 30, 1, 2000);
        assert_eq!(t.sample(30 * MIB, [((20, 6), &other)], 0), 0);
        assert_eq!(t.sources.peak(), 30 * MIB);
    }

    #[test]
    fn cgroup_peak_less_what_is_not_the_job() {
        let mut t = PeakTracker::default();
        t.cgroup_sample(300 * MIB, 200 * MIB);
        t.cgroup_sample(260 * MIB, 200 * MIB);
        t.cgroup_peak(700 * MIB);
        assert_eq!(t.sources.cgroup_bytes, Some(600 * MIB));
        assert_eq!(t.sources.peak(), 600 * MIB);
    }

    #[test]
    fn polls_reread_the_last_samples_processes() {
        let mut t = PeakTracker::default();
        let me = crate::sample::proc_mem(std::process::id() as i32).unwrap();
        t.sample(me.charged(), [((me.pid, 1), &me)], 3 * MIB);
        let polled = t.poll();
        assert!(polled >= 3 * MIB + me.rss_anon / 2, "{polled}");
        assert_eq!(t.sources.polled_bytes, polled);
    }
}
