//! What this machine has. Every source is optional: a missing one is reported, never fatal.
//!
//! `host_memory()` and `gpus()` are what the planner asks for; `machine()` gathers everything
//! `memfit check` prints, with the warnings a user needs.

pub mod cgroup;
pub mod cpu;
pub mod cuda;
pub mod daemons;
pub mod disk;
pub mod gpu;
pub mod psi;

pub use gpu::Gpu;

use std::fs;
use std::path::Path;

/// Host memory as the kernel and the process's cgroups see it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HostMemory {
    pub total_bytes: u64,
    pub available_bytes: u64,
    pub swap_total_bytes: u64,
    pub swap_free_bytes: u64,
    /// The tightest limit over this process's memory cgroup and its ancestors (v2 memory.max and
    /// memory.high, v1 memory.limit_in_bytes), if any is set.
    pub cgroup_limit_bytes: Option<u64>,
    /// What a new job can use: MemAvailable, capped by the cgroup limit minus its current usage.
    pub effective_available_bytes: u64,
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

/// Reads /proc/meminfo and the memory cgroup of this process (v1 or v2, see [`cgroup`]).
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
    let cgroup = cgroup::own_cgroup();
    let cgroup_limit_bytes = cgroup.as_ref().and_then(|c| c.limit_bytes());
    // Room under the cgroup limit, not counting reclaimable page cache as used.
    let room = cgroup
        .as_ref()
        .and_then(|c| c.headroom_now().or(c.headroom_bytes));
    let effective_available_bytes = match room {
        Some(headroom) => available_bytes.min(headroom),
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

/// The tightest cgroup v2 limit over `dir` and its ancestors under `root`, and the headroom left under
/// it (limit − memory.current of the group that sets it). `None` when no ancestor sets a limit.
pub fn cgroup_headroom(root: &Path, dir: &str) -> Option<(u64, u64)> {
    let cg = cgroup::read_v2(root, root.join(dir.trim_start_matches('/')));
    Some((cg.limit_bytes()?, cg.headroom_bytes?))
}

/// GPUs through NVML. `Err` says why none can be listed (no driver, no NVML support built).
pub fn gpus() -> Result<Vec<Gpu>, String> {
    gpu::gpus_with_driver().map(|(gpus, _driver)| gpus)
}

/// Below this, /dev/shm is "small": PyTorch DataLoader workers pass batches through it, and Docker's
/// default of 64 MiB makes them fail with "bus error" (pytorch/pytorch issue 2244); 1 GiB is a common fix.
const SMALL_SHM_BYTES: u64 = 1 << 30;
/// A cgroup limit below this share of RAM is "far below" it: the job dies at the limit with RAM to spare.
const FAR_BELOW_RAM: f64 = 0.5;
/// `some avg10` memory pressure above this percent means tasks already stall on memory (systemd-oomd's
/// default ManagedOOMMemoryPressureLimit is 60% over 20 s; 10% is an early warning well before that).
const PRESSURE_WARN_PCT: f64 = 10.0;
/// Less free disk than this where runs are written cannot hold a few checkpoints of a mid-size model.
const LOW_DISK_BYTES: u64 = 10 << 30;

/// Everything `memfit check` reports. Each optional source that could not be read is named in `missing`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Machine {
    pub cpu: Option<cpu::Cpu>,
    pub memory: Option<HostMemory>,
    pub cgroup: Option<cgroup::CgroupMemory>,
    /// The least of RAM and the cgroup limit: what one job can ever use.
    pub effective_limit_bytes: Option<u64>,
    pub pressure: Option<psi::Psi>,
    pub disk: Option<disk::Disk>,
    pub shm: Option<disk::Disk>,
    pub gpus: Vec<Gpu>,
    pub gpu_driver: Option<String>,
    pub oom_daemons: Vec<daemons::Daemon>,
    pub missing: Vec<String>,
    pub warnings: Vec<String>,
}

/// Probes everything; `runs_dir` is where runs will be written (its free space is reported).
pub fn machine(runs_dir: &Path) -> Machine {
    let mut missing = Vec::new();
    let cpu = cpu::cpu();
    if cpu.is_none() {
        missing.push("CPU: /proc/cpuinfo unreadable".to_owned());
    }
    let memory = host_memory()
        .map_err(|e| missing.push(format!("memory: {e}")))
        .ok();
    let cgroup = cgroup::own_cgroup();
    if cgroup.is_none() {
        missing.push("cgroup: no memory controller found in /proc/self/cgroup".to_owned());
    }
    let pressure = psi::memory_pressure();
    if pressure.is_none() {
        missing.push(
            "PSI: /proc/pressure/memory absent (kernel without CONFIG_PSI or booted with psi=0)"
                .to_owned(),
        );
    }
    let disk = disk::disk(runs_dir);
    if disk.is_none() {
        missing.push(format!("disk: cannot statvfs {}", runs_dir.display()));
    }
    let shm = disk::disk(Path::new("/dev/shm"));
    let (gpus, gpu_driver) = match gpu::gpus_with_driver() {
        Ok((gpus, driver)) => (gpus, Some(driver)),
        Err(why) => {
            missing.push(format!("GPU: {why}"));
            (Vec::new(), None)
        }
    };
    let effective_limit_bytes = memory.as_ref().map(|m| match m.cgroup_limit_bytes {
        Some(limit) => limit.min(m.total_bytes),
        None => m.total_bytes,
    });
    let mut machine = Machine {
        cpu,
        memory,
        cgroup,
        effective_limit_bytes,
        pressure,
        disk,
        shm,
        gpus,
        gpu_driver,
        oom_daemons: daemons::oom_daemons(),
        missing,
        warnings: Vec::new(),
    };
    machine.warnings = warnings(&machine);
    machine
}

/// The warnings a user needs before starting a long job on this machine.
pub fn warnings(m: &Machine) -> Vec<String> {
    use crate::units::human_bytes as h;
    let mut out = Vec::new();
    if let Some(mem) = &m.memory {
        if mem.swap_total_bytes == 0 {
            out.push(
                "no swap: memory pressure gives little warning before the kernel OOM killer strikes; \
                 run long jobs under `memfit run` so they are stopped with a checkpoint first"
                    .to_owned(),
            );
        }
        if let Some(limit) = mem.cgroup_limit_bytes
            && (limit as f64) < mem.total_bytes as f64 * FAR_BELOW_RAM
        {
            out.push(format!(
                "the cgroup limit {} is far below RAM {}: jobs are killed at the limit, not when RAM runs out",
                h(limit),
                h(mem.total_bytes)
            ));
        }
    }
    if let Some(shm) = &m.shm
        && shm.total_bytes < SMALL_SHM_BYTES
    {
        out.push(format!(
            "/dev/shm is small ({}): PyTorch DataLoader workers fail with \"bus error\"; \
             use --workers 0 or enlarge it (docker run --shm-size=1g)",
            h(shm.total_bytes)
        ));
    }
    if let Some(p) = &m.pressure
        && p.some.avg10 > PRESSURE_WARN_PCT
    {
        out.push(format!(
            "memory pressure now: tasks stalled on memory {:.1}% of the last 10 s",
            p.some.avg10
        ));
    }
    for d in &m.oom_daemons {
        out.push(format!(
            "{} (pid {}) is running and may kill a job before memfit run's guard stops it gracefully",
            d.name, d.pid
        ));
    }
    if let Some(d) = &m.disk
        && d.free_bytes < LOW_DISK_BYTES
    {
        out.push(format!(
            "only {} free on the disk holding {}: checkpoints may not fit",
            h(d.free_bytes),
            d.path
        ));
    }
    out
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

    fn machine_with(mem: HostMemory, shm_total: u64) -> Machine {
        Machine {
            cpu: None,
            memory: Some(mem),
            cgroup: None,
            effective_limit_bytes: None,
            pressure: None,
            disk: None,
            shm: Some(disk::Disk {
                path: "/dev/shm".into(),
                total_bytes: shm_total,
                free_bytes: shm_total,
            }),
            gpus: Vec::new(),
            gpu_driver: None,
            oom_daemons: vec![daemons::Daemon {
                pid: 42,
                name: "earlyoom".into(),
            }],
            missing: Vec::new(),
            warnings: Vec::new(),
        }
    }

    #[test]
    fn warnings_name_each_risk() {
        let mem = HostMemory {
            total_bytes: 24 << 30,
            available_bytes: 20 << 30,
            swap_total_bytes: 0,
            swap_free_bytes: 0,
            cgroup_limit_bytes: Some(4 << 30),
            effective_available_bytes: 4 << 30,
        };
        let w = warnings(&machine_with(mem.clone(), 64 << 20)).join("\n");
        assert!(w.contains("no swap"), "{w}");
        assert!(w.contains("far below RAM"), "{w}");
        assert!(w.contains("/dev/shm is small (64.0 MiB)"), "{w}");
        assert!(w.contains("earlyoom (pid 42)"), "{w}");
        let mut m = machine_with(
            HostMemory {
                swap_total_bytes: 8 << 30,
                cgroup_limit_bytes: Some(20 << 30),
                ..mem
            },
            8 << 30,
        );
        m.oom_daemons.clear();
        assert!(warnings(&m).is_empty(), "{:?}", warnings(&m));
    }

    #[test]
    fn meminfo_captured() {
        let text = include_str!("../../tests/fixtures/proc/meminfo");
        assert_eq!(meminfo_kib(text, "MemTotal"), Some(24_684_096));
        assert_eq!(meminfo_kib(text, "SwapTotal"), Some(0));
        assert!(meminfo_kib(text, "MemAvailable").is_some());
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
