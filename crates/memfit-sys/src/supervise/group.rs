//! The job's processes: signalling its group and the members that left it, waiting for its leader.

use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::{Pid, getpgrp, getpid};

use crate::sample::{self, ProcMem};

/// The job's process group; refuses anything that could be memfit's own group or init.
pub(super) struct JobGroup {
    pgid: i32,
}

impl JobGroup {
    pub(super) fn new(pid: i32) -> Self {
        assert!(
            pid > 1,
            "job PID {pid} cannot lead a group memfit may signal"
        );
        assert_ne!(
            Pid::from_raw(pid),
            getpgrp(),
            "the job must not share memfit's group"
        );
        assert_ne!(Pid::from_raw(pid), getpid());
        Self { pgid: pid }
    }

    /// Sends `sig` to the group; false when the group is empty.
    pub(super) fn signal(&self, sig: Option<Signal>) -> bool {
        killpg(Pid::from_raw(self.pgid), sig).is_ok()
    }

    /// Sends `sig` to the group and to live descendants of `leader` that left the group.
    pub(super) fn signal_all(&self, sig: Signal, procs: &[ProcMem]) -> Vec<i32> {
        self.signal(Some(sig));
        procs
            .iter()
            .filter(|p| p.pid != self.pgid)
            .filter_map(|p| signal_outside_member(p.pid, self.pgid, sig).then_some(p.pid))
            .collect()
    }
}

/// Signals `pid` through a pidfd when it is outside `pgid` and still a descendant of `leader` (= pgid):
/// the pidfd pins the process between the check and the signal, so a reused PID is never hit.
fn signal_outside_member(pid: i32, leader: i32, sig: Signal) -> bool {
    let Some(rpid) = rustix::process::Pid::from_raw(pid) else {
        return false;
    };
    let Ok(fd) = rustix::process::pidfd_open(rpid, rustix::process::PidfdFlags::empty()) else {
        return false;
    };
    let stat = |p: i32| std::fs::read_to_string(format!("/proc/{p}/stat")).ok();
    let Some((pgrp, _)) = stat(pid).as_deref().and_then(sample::parse_stat_pgrp_start) else {
        return false;
    };
    if pgrp == leader {
        return false; // the group signal reached it
    }
    let mut cur = pid;
    // A tree deeper than this is not a real job; give up rather than loop.
    for _ in 0..4096 {
        match stat(cur).as_deref().and_then(sample::parse_stat_ppid) {
            Some(ppid) if ppid == leader => {
                let Some(s) = rustix::process::Signal::from_named_raw(sig as i32) else {
                    return false;
                };
                return rustix::process::pidfd_send_signal(&fd, s).is_ok();
            }
            Some(ppid) if ppid > 1 => cur = ppid,
            _ => return false,
        }
    }
    false
}

/// Waits up to `timeout` for the leader to exit (pidfd becomes readable) or a signal to arrive.
pub(super) fn wait_exit(pidfd: Option<&std::os::fd::OwnedFd>, timeout: Duration) {
    match pidfd {
        Some(fd) => {
            let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
            let ts = rustix::event::Timespec {
                tv_sec: timeout.as_secs() as i64,
                tv_nsec: timeout.subsec_nanos() as i64,
            };
            // EINTR (a forwarded signal) simply ends the wait early.
            let _ = rustix::event::poll(&mut fds, Some(&ts));
        }
        None => std::thread::sleep(timeout),
    }
}
