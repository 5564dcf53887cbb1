//! What this machine has. Every source is optional: a missing one is reported, never fatal.

use std::fs;
use std::path::Path;

/// Host memory as the kernel and the process's cgroups see it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HostMemory {
    pub total_bytes: u64,
    pub available_bytes: u64,
    pub swap_total_bytes: u64,
    pub swap_free_bytes: u64,
    /// The tightest `memory.max`/`memory.high` over this process's cgroup v2 ancestors, if any is set.
    pub cgroup_limit_bytes: Option<u64>,
    /// What a new job can use: MemAvailable, capped by the cgroup limit minus its current usage.
    pub effective_available_bytes: u64,
}

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Gpu {
    pub name: String,
    pub total_bytes: u64,
    pub free_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: field {field} missing or not a number")]
    Field { path: String, field: &'static str },
}

/// Reads /proc/meminfo and the cgroup v2 hierarchy under /sys/fs/cgroup.
pub fn host_memory() -> Result<HostMemory, ProbeError> {
    let meminfo_path = "/proc/meminfo";
    let meminfo = fs::read_to_string(meminfo_path).map_err(|source| ProbeError::Read {
        path: meminfo_path.into(),
        source,
    })?;
    let field = |name: &'static str| {
        meminfo_kib(&meminfo, name)
            .map(|kib| kib * 1024)
            .ok_or(ProbeError::Field {
                path: meminfo_path.into(),
                field: name,
            })
    };
    let total_bytes = field("MemTotal")?;
    let available_bytes = field("MemAvailable")?;
    let swap_total_bytes = field("SwapTotal")?;
    let swap_free_bytes = field("SwapFree")?;
    let cgroup =
        own_cgroup_dir().and_then(|dir| cgroup_headroom(Path::new("/sys/fs/cgroup"), &dir));
    let cgroup_limit_bytes = cgroup.map(|(limit, _)| limit);
    let effective_available_bytes = match cgroup {
        Some((_, headroom)) => available_bytes.min(headroom),
        None => available_bytes,
    };
    Ok(HostMemory {
        total_bytes,
        available_bytes,
        swap_total_bytes,
        swap_free_bytes,
        cgroup_limit_bytes,
        effective_available_bytes,
    })
}

/// The value in KiB of a `/proc/meminfo` line such as `MemAvailable:   123 kB`.
pub fn meminfo_kib(meminfo: &str, name: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// This process's cgroup v2 path (the `0::/path` line of /proc/self/cgroup).
fn own_cgroup_dir() -> Option<String> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
}

/// The tightest limit over `dir` and its ancestors under `root`, and the headroom left under it
/// (limit − memory.current of the cgroup that sets it). `None` when no ancestor sets a limit.
pub fn cgroup_headroom(root: &Path, dir: &str) -> Option<(u64, u64)> {
    let mut best: Option<(u64, u64)> = None;
    let mut path = root.join(dir.trim_start_matches('/'));
    loop {
        for file in ["memory.max", "memory.high"] {
            let limit = fs::read_to_string(path.join(file))
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok());
            if let Some(limit) = limit {
                let current = fs::read_to_string(path.join("memory.current"))
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                let headroom = limit.saturating_sub(current);
                if best.is_none_or(|(_, h)| headroom < h) {
                    best = Some((limit, headroom));
                }
            }
        }
        if path == root || !path.pop() || !path.starts_with(root) {
            break;
        }
    }
    best
}

/// GPUs through NVML. `Err` says why none can be listed (no driver, no NVML support built).
pub fn gpus() -> Result<Vec<Gpu>, String> {
    Err("NVML support is not built into this binary".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_parse() {
        let text = "MemTotal:       24576000 kB\nMemAvailable:    1000 kB\nSwapTotal: 0 kB\n";
        assert_eq!(meminfo_kib(text, "MemTotal"), Some(24_576_000));
        assert_eq!(meminfo_kib(text, "MemAvailable"), Some(1000));
        assert_eq!(meminfo_kib(text, "Mem"), None);
    }

    #[test]
    fn cgroup_tightest_ancestor_wins() {
        let root = std::env::temp_dir().join(format!("memfit-cg-{}", std::process::id()));
        let job = root.join("a/b");
        fs::create_dir_all(&job).unwrap();
        fs::write(root.join("a/memory.max"), "1000\n").unwrap();
        fs::write(root.join("a/memory.current"), "400\n").unwrap();
        fs::write(job.join("memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_headroom(&root, "/a/b"), Some((1000, 600)));
        fs::remove_dir_all(&root).unwrap();
    }
}
