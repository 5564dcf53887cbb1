//! Which processes are the job's: the leader's tree, and every process that left it.
//!
//! memfit is a child subreaper (`PR_SET_CHILD_SUBREAPER`), so a job process whose parent exits — a
//! double-forked daemon, a `(cmd &)` worker, the children of a leader that has ended — is re-parented to
//! memfit instead of init. Such a child of memfit is the job's when it was seen in the job before (same
//! PID and start time) or when its environment carries the job's token (`MEMFIT_JOB`, set at launch and
//! inherited by every descendant that does not clear its environment). Every member is signalled by PID
//! through a pidfd after checking its start time, so a reused PID is never hit.

use std::collections::{HashMap, HashSet};

use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgrp, getpid};

use super::job_cgroup::JobCgroup;
use crate::sample::{self, ProcMem, TreeWalker};

/// The environment variable that marks the job's processes.
pub const JOB_ENV: &str = "MEMFIT_JOB";

/// One live process of the job.
pub(super) struct Member {
    pub(super) mem: ProcMem,
    pub(super) pgrp: i32,
    pub(super) start: u64,
}

pub(super) struct Members {
    token: String,
    leader: i32,
    /// False once the leader is reaped: its group ID may then be reused, so it is never signalled.
    leader_unreaped: bool,
    walker: TreeWalker,
    /// Start time of every process of the job at the last sample, by PID.
    seen: HashMap<i32, u64>,
    /// Children of memfit adopted as the job's (to reap when they end).
    adopted: HashSet<i32>,
    /// Children of memfit found not to be the job's, by (PID, start time).
    foreign: HashSet<(i32, u64)>,
    /// With `--cgroup`: every process in it is the job's.
    pub(super) cgroup: Option<JobCgroup>,
    /// A child of memfit could not be classified at the last sample (see `carries_token`).
    undecided: bool,
}

impl Members {
    pub(super) fn new(leader: i32, token: String, cgroup: Option<JobCgroup>) -> Self {
        assert!(leader > 1, "job PID {leader} cannot be signalled safely");
        assert_ne!(
            Pid::from_raw(leader),
            getpgrp(),
            "the job must not share memfit's group"
        );
        assert_ne!(Pid::from_raw(leader), getpid());
        Self {
            token,
            leader,
            leader_unreaped: true,
            walker: TreeWalker::new(leader),
            seen: HashMap::new(),
            adopted: HashSet::new(),
            foreign: HashSet::new(),
            cgroup,
            undecided: false,
        }
    }

    /// Whether the last sample left a child of memfit unclassified: it may still be the job's.
    pub(super) fn undecided(&self) -> bool {
        self.undecided
    }

    pub(super) fn leader_reaped(&mut self) {
        self.leader_unreaped = false;
    }

    /// Every live process of the job now, with its memory.
    pub(super) fn sample(&mut self) -> Vec<Member> {
        self.reap_adopted();
        let mut roots: Vec<i32> = Vec::new();
        if self.leader_unreaped {
            roots.push(self.leader);
        }
        self.adopt_orphans();
        roots.extend(self.adopted.iter().copied());
        if let Some(cg) = &self.cgroup {
            roots.extend(cg.pids());
        }
        let mut members = Vec::new();
        // Only the live members matter for recognising an orphan later: the map stays as small as the job.
        let mut seen = HashMap::new();
        for pid in self.walker.descendants(&roots) {
            if seen.contains_key(&pid) {
                continue;
            }
            let Some((pgrp, start)) = sample::pgrp_start(pid) else {
                continue;
            };
            let Some(mem) = sample::proc_mem(pid) else {
                continue; // a zombie: it holds no memory
            };
            seen.insert(pid, start);
            members.push(Member { mem, pgrp, start });
        }
        self.seen = seen;
        members
    }

    /// Children of memfit that are the job's: seen in the job before, or carrying its token.
    fn adopt_orphans(&mut self) {
        let me = std::process::id() as i32;
        self.undecided = false;
        let children = self.walker.children(me);
        // Forget ended children (their PIDs may come back as new processes).
        self.foreign.retain(|(pid, _)| children.contains(pid));
        for pid in children {
            if pid == self.leader || self.adopted.contains(&pid) {
                continue;
            }
            let Some((_, start)) = sample::pgrp_start(pid) else {
                continue;
            };
            if self.foreign.contains(&(pid, start)) {
                continue;
            }
            let ours = if self.seen.get(&pid) == Some(&start) {
                Some(true)
            } else {
                carries_token(pid, &self.token)
            };
            match ours {
                Some(true) => {
                    self.adopted.insert(pid);
                }
                Some(false) => {
                    self.foreign.insert((pid, start));
                }
                // unreadable for now (an exec under way): asked again next time
                None => self.undecided = true,
            }
        }
    }

    /// Reaps adopted children that ended (they are memfit's children now, so memfit must).
    fn reap_adopted(&mut self) {
        self.adopted.retain(|&pid| {
            matches!(
                waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)),
                Ok(WaitStatus::StillAlive)
            )
        });
    }

    /// Sends `sig` to every member: the leader's group while the leader is unreaped (which also reaches
    /// a process forked since the sample), and each member outside that group by PID. Returns the PIDs
    /// signalled one by one.
    pub(super) fn signal(&self, sig: Signal, members: &[Member]) -> Vec<i32> {
        let group_reached = self.leader_unreaped && killpg(Pid::from_raw(self.leader), sig).is_ok();
        members
            .iter()
            .filter(|m| !(group_reached && m.pgrp == self.leader))
            .filter(|m| signal_pid(m.mem.pid, m.start, sig))
            .map(|m| m.mem.pid)
            .collect()
    }
}

/// Whether /proc/PID/environ holds `MEMFIT_JOB=token`; `None` while a live process's environment
/// cannot be read or comes back empty (as during an exec), so the question is asked again. A zombie
/// (no environment) is not counted: it holds no memory.
fn carries_token(pid: i32, token: &str) -> Option<bool> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    if environ.is_empty() {
        return sample::is_zombie(pid).then_some(false);
    }
    let wanted = format!("{JOB_ENV}={token}");
    Some(environ.split(|&b| b == 0).any(|v| v == wanted.as_bytes()))
}

/// Signals `pid` through a pidfd if it is still the process that started at `start`: the pidfd pins the
/// process between the check and the signal.
fn signal_pid(pid: i32, start: u64, sig: Signal) -> bool {
    let Some(rpid) = rustix::process::Pid::from_raw(pid) else {
        return false;
    };
    let Ok(fd) = rustix::process::pidfd_open(rpid, rustix::process::PidfdFlags::empty()) else {
        return false;
    };
    if sample::pgrp_start(pid).map(|(_, s)| s) != Some(start) {
        return false;
    }
    let Some(s) = rustix::process::Signal::from_named_raw(sig as i32) else {
        return false;
    };
    rustix::process::pidfd_send_signal(&fd, s).is_ok()
}

/// Makes this process a child subreaper, so the job's orphans stay under memfit. Idempotent.
pub(super) fn become_subreaper() {
    if let Err(e) = rustix::process::set_child_subreaper(rustix::process::Pid::from_raw(
        std::process::id() as i32,
    )) {
        tracing::warn!(
            "cannot become a child subreaper ({e}): processes that leave the job's tree are found only \
             while their parent lives"
        );
    }
}
