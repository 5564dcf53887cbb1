//! `--cgroup`: the job in a memory cgroup of its own, created under memfit's, so every process it
//! starts is the job's whatever it does (setsid, double fork, cleared environment), and the kernel's
//! own figures are read: usage, the high-water mark, OOM kills.
//!
//! cgroup v1: a child of memfit's memory cgroup (mkdir needs write access to it: root, or a delegated
//! group). cgroup v2: a child of memfit's cgroup when the memory controller is delegated to its
//! children (`memory` in its `cgroup.subtree_control`); otherwise memfit says why and uses the process
//! tree alone.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::probe::cgroup::{self, CgroupVersion, events_v1, events_v2, keyed, read_u64};

pub(super) struct JobCgroup {
    pub(super) version: CgroupVersion,
    pub(super) dir: PathBuf,
}

impl JobCgroup {
    /// Creates `memfit-PID-SERIAL-ATTEMPT` under memfit's memory cgroup; the error says why it cannot.
    pub(super) fn create(attempt: u32) -> Result<Self, String> {
        let own = cgroup::own_cgroup().ok_or("no memory cgroup controller is mounted")?;
        if own.version == CgroupVersion::V2 {
            let control =
                fs::read_to_string(own.dir.join("cgroup.subtree_control")).unwrap_or_default();
            if !control.split_whitespace().any(|c| c == "memory") {
                return Err(format!(
                    "cgroup v2 without the memory controller delegated to {}'s children (its \
                     cgroup.subtree_control lacks \"memory\"); start memfit in a delegated group, e.g. \
                     systemd-run --user --scope -p Delegate=yes memfit run --cgroup …",
                    own.dir.display()
                ));
            }
        }
        // Unique within the process too: a library caller may run several jobs at once.
        static SERIAL: AtomicU32 = AtomicU32::new(0);
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
        let dir = own
            .dir
            .join(format!("memfit-{}-{serial}-{attempt}", std::process::id()));
        fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        Ok(Self {
            version: own.version,
            dir,
        })
    }

    /// Makes the command join the cgroup before it executes, so its first instruction is already
    /// counted: the fd is opened here, and the child only writes "0" (itself) to it.
    pub(super) fn enter_on_spawn(&self, cmd: &mut Command) -> std::io::Result<()> {
        let procs = fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.procs"))?;
        // SAFETY: the closure only calls write(2) on an fd opened before the fork (async-signal-safe).
        unsafe {
            cmd.pre_exec(move || {
                rustix::io::write(&procs, b"0")
                    .map(drop)
                    .map_err(std::io::Error::from)
            });
        }
        Ok(())
    }

    /// PIDs in the cgroup now.
    pub(super) fn pids(&self) -> Vec<i32> {
        fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|t| t.parse().ok())
            .collect()
    }

    /// Anonymous + shared memory (tmpfs files included) + swap, as the kernel charges the group: the
    /// quantity the process tree sums, without its blind spots.
    pub(super) fn charged_bytes(&self) -> Option<u64> {
        let stat = fs::read_to_string(self.dir.join("memory.stat")).ok()?;
        match self.version {
            CgroupVersion::V2 => {
                let swap = read_u64(&self.dir.join("memory.swap.current")).unwrap_or(0);
                Some(keyed(&stat, "anon")? + keyed(&stat, "shmem")? + swap)
            }
            CgroupVersion::V1 => Some(
                keyed(&stat, "total_rss")?
                    + keyed(&stat, "total_shmem").unwrap_or(0)
                    + keyed(&stat, "total_swap").unwrap_or(0),
            ),
        }
    }

    /// Usage as the kernel counts it (page cache included).
    pub(super) fn current_bytes(&self) -> Option<u64> {
        read_u64(&self.dir.join(match self.version {
            CgroupVersion::V2 => "memory.current",
            CgroupVersion::V1 => "memory.usage_in_bytes",
        }))
    }

    /// The kernel's high-water mark of `current_bytes` (v2 memory.peak, v1 memory.max_usage_in_bytes).
    pub(super) fn peak_bytes(&self) -> Option<u64> {
        read_u64(&self.dir.join(match self.version {
            CgroupVersion::V2 => "memory.peak",
            CgroupVersion::V1 => "memory.max_usage_in_bytes",
        }))
    }

    pub(super) fn oom_kills(&self) -> u64 {
        match self.version {
            CgroupVersion::V2 => events_v2(&self.dir).oom_kill,
            CgroupVersion::V1 => events_v1(&self.dir).oom_kill,
        }
    }
}

impl Drop for JobCgroup {
    /// Removes the group once its last process is gone (the kernel refuses while any remains; a
    /// just-reaped process can take a moment to leave it).
    fn drop(&mut self) {
        for _ in 0..50 {
            if fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::warn!("cannot remove the job's cgroup {}", self.dir.display());
    }
}
