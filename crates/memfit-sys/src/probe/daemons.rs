//! Userspace OOM killers that may kill a job before the guard acts.

/// Process names (/proc/PID/comm, at most 15 characters) of known OOM daemons.
const OOM_DAEMONS: &[&str] = &[
    "earlyoom",
    "systemd-oomd",
    "nohang",
    "oomd",
    "low-memory-moni",
];

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Daemon {
    pub pid: i32,
    pub name: String,
}

/// Whether a process called `comm` is an OOM daemon.
pub fn is_oom_daemon(comm: &str) -> bool {
    OOM_DAEMONS.contains(&comm.trim())
}

/// Scans /proc once (`memfit check` only; the guard never scans /proc wholesale).
pub fn oom_daemons() -> Vec<Daemon> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found: Vec<Daemon> = entries
        .filter_map(|e| {
            let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            is_oom_daemon(&comm).then(|| Daemon {
                pid,
                name: comm.trim().to_owned(),
            })
        })
        .collect();
    found.sort_by_key(|d| d.pid);
    found
}

#[cfg(test)]
mod tests {
    #[test]
    fn names() {
        assert!(super::is_oom_daemon("earlyoom\n"));
        assert!(super::is_oom_daemon("systemd-oomd"));
        assert!(!super::is_oom_daemon("bash"));
    }
}
