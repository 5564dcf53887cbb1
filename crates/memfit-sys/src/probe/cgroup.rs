//! The memory cgroup this process lives in, v1 or v2, and the tightest limit over its ancestors.
//!
//! Where the memory controller is: a `N:memory:/path` line of /proc/self/cgroup means cgroup v1 (it wins in
//! hybrid setups, where the v2 tree has no memory controller); otherwise the `0::/path` line (v2). The mount
//! point comes from /proc/self/mountinfo. Every path is joined to a `root` so fixtures can stand in for `/`.

use std::fs;
use std::path::{Path, PathBuf};

/// Limits at or above this are "no limit": cgroup v1 prints PAGE_COUNTER_MAX × page size
/// (9223372036854771712) for an unlimited group; 2^60 bytes (1 EiB) is far above any real machine.
const UNLIMITED_FLOOR: u64 = 1 << 60;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum CgroupVersion {
    #[serde(rename = "v1")]
    V1,
    #[serde(rename = "v2")]
    V2,
}

/// Counters of limit hits since the cgroup was created.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct CgroupEvents {
    /// v2 `high`: times reclaim was forced by memory.high.
    pub high: u64,
    /// v2 `max` / v1 `memory.failcnt`: times usage hit the hard limit.
    pub max: u64,
    /// v2 `oom` (v1 has no such counter: 0).
    pub oom: u64,
    /// v2 `oom_kill` / v1 `oom_kill` of memory.oom_control: processes the kernel OOM-killed in the group.
    pub oom_kill: u64,
}

/// The memory cgroup of a process.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CgroupMemory {
    pub version: CgroupVersion,
    /// The cgroup directory (under the mount point).
    pub dir: PathBuf,
    /// The tightest hard limit (v2 memory.max, v1 memory.limit_in_bytes) over the group and its ancestors.
    pub max_bytes: Option<u64>,
    /// The tightest v2 memory.high (throttling starts there) over the group and its ancestors.
    pub high_bytes: Option<u64>,
    /// The directory whose limit is the tightest, when one is set.
    pub limited_by: Option<PathBuf>,
    /// Usage of the group itself (v2 memory.current, v1 memory.usage_in_bytes; v1 counts page cache).
    pub current_bytes: Option<u64>,
    /// The least room left under any limit of the group and its ancestors (limit − that group's usage).
    pub headroom_bytes: Option<u64>,
    pub events: CgroupEvents,
}

impl CgroupMemory {
    /// The limit that matters for a job: the lower of memory.high and memory.max.
    pub fn limit_bytes(&self) -> Option<u64> {
        match (self.max_bytes, self.high_bytes) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Room left now under the tightest limit: limit − (usage − inactive file cache) of the group that
    /// sets it. Inactive page cache is reclaimable; `docker stats` and the kubelet's working set subtract
    /// it the same way.
    pub fn headroom_now(&self) -> Option<u64> {
        let limit = self.limit_bytes()?;
        let dir = self.limited_by.as_ref()?;
        let (usage_file, inactive_key) = match self.version {
            CgroupVersion::V2 => ("memory.current", "inactive_file"),
            CgroupVersion::V1 => ("memory.usage_in_bytes", "total_inactive_file"),
        };
        let usage = read_u64(&dir.join(usage_file))?;
        let stat = fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
        let inactive = keyed(&stat, inactive_key).unwrap_or(0);
        Some(limit.saturating_sub(usage.saturating_sub(inactive)))
    }

    /// Re-reads usage and events (cheap: two or three small files), for sampling during a run.
    pub fn refresh_usage(&mut self) {
        let (current, events) = match self.version {
            CgroupVersion::V2 => (
                read_u64(&self.dir.join("memory.current")),
                events_v2(&self.dir),
            ),
            CgroupVersion::V1 => (
                read_u64(&self.dir.join("memory.usage_in_bytes")),
                events_v1(&self.dir),
            ),
        };
        self.current_bytes = current;
        self.events = events;
    }
}

/// This process's memory cgroup on the live system.
pub fn own_cgroup() -> Option<CgroupMemory> {
    let cgroup = fs::read_to_string("/proc/self/cgroup").ok()?;
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    cgroup_memory(&cgroup, &mountinfo, Path::new("/"))
}

/// The memory cgroup described by the text of /proc/self/cgroup and /proc/self/mountinfo, with every
/// mount point resolved under `root`.
pub fn cgroup_memory(proc_cgroup: &str, mountinfo: &str, root: &Path) -> Option<CgroupMemory> {
    let v1_path = proc_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.to_owned())
    });
    let (version, rel) = match v1_path {
        Some(p) => (CgroupVersion::V1, p),
        None => (
            CgroupVersion::V2,
            proc_cgroup
                .lines()
                .find_map(|l| l.strip_prefix("0::"))?
                .to_owned(),
        ),
    };
    let (mount_root, mount_point) = find_mount(mountinfo, version)?;
    // Inside a cgroup namespace or a bind mount, the mount's own root is a prefix of the path.
    let rel = rel.strip_prefix(&mount_root).unwrap_or(&rel);
    let base = root.join(mount_point.trim_start_matches('/'));
    let dir = base.join(rel.trim_start_matches('/'));
    Some(match version {
        CgroupVersion::V2 => read_v2(&base, dir),
        CgroupVersion::V1 => read_v1(&base, dir),
    })
}

/// (root inside the filesystem, mount point) of the cgroup2 mount or the v1 mount carrying `memory`.
fn find_mount(mountinfo: &str, version: CgroupVersion) -> Option<(String, String)> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let left: Vec<&str> = left.split_whitespace().collect();
        let mut right = right.split_whitespace();
        let (fstype, _source, options) = (right.next()?, right.next()?, right.next().unwrap_or(""));
        let wanted = match version {
            CgroupVersion::V2 => fstype == "cgroup2",
            CgroupVersion::V1 => fstype == "cgroup" && options.split(',').any(|o| o == "memory"),
        };
        (wanted && left.len() >= 5).then(|| (unescape(left[3]), unescape(left[4])))
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape(field: &str) -> String {
    field
        .replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// A limit file's value; `max` and absurdly large values are "no limit".
fn read_limit(path: &Path) -> Option<u64> {
    read_u64(path).filter(|&v| v < UNLIMITED_FLOOR)
}

pub(crate) fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `dir` and its ancestors down to (and including) `base`, innermost first.
fn ancestors<'a>(base: &'a Path, dir: &'a Path) -> impl Iterator<Item = &'a Path> {
    dir.ancestors().take_while(move |p| p.starts_with(base))
}

/// Folds the limits found in `files` over the ancestors: tightest limit, and least headroom under any.
struct Tightest {
    limit: Option<u64>,
    limited_by: Option<PathBuf>,
    headroom: Option<u64>,
}

fn tightest(base: &Path, dir: &Path, file: &str, usage_file: &str) -> Tightest {
    let mut out = Tightest {
        limit: None,
        limited_by: None,
        headroom: None,
    };
    for level in ancestors(base, dir) {
        let Some(limit) = read_limit(&level.join(file)) else {
            continue;
        };
        let usage = read_u64(&level.join(usage_file)).unwrap_or(0);
        let room = limit.saturating_sub(usage);
        if out.limit.is_none_or(|l| limit < l) {
            out.limit = Some(limit);
            out.limited_by = Some(level.to_path_buf());
        }
        out.headroom = Some(out.headroom.map_or(room, |h| h.min(room)));
    }
    out
}

pub(crate) fn read_v2(base: &Path, dir: PathBuf) -> CgroupMemory {
    let max = tightest(base, &dir, "memory.max", "memory.current");
    let high = tightest(base, &dir, "memory.high", "memory.current");
    let limited_by = match (max.limit, high.limit) {
        (Some(m), Some(h)) if h < m => high.limited_by,
        (None, Some(_)) => high.limited_by,
        _ => max.limited_by,
    };
    let headroom = match (max.headroom, high.headroom) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    CgroupMemory {
        version: CgroupVersion::V2,
        current_bytes: read_u64(&dir.join("memory.current")),
        events: events_v2(&dir),
        max_bytes: max.limit,
        high_bytes: high.limit,
        limited_by,
        headroom_bytes: headroom,
        dir,
    }
}

fn read_v1(base: &Path, dir: PathBuf) -> CgroupMemory {
    let max = tightest(base, &dir, "memory.limit_in_bytes", "memory.usage_in_bytes");
    CgroupMemory {
        version: CgroupVersion::V1,
        current_bytes: read_u64(&dir.join("memory.usage_in_bytes")),
        events: events_v1(&dir),
        max_bytes: max.limit,
        high_bytes: None,
        limited_by: max.limited_by,
        headroom_bytes: max.headroom,
        dir,
    }
}

/// `key value` lines such as memory.events or memory.oom_control.
pub(crate) fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

pub(crate) fn events_v2(dir: &Path) -> CgroupEvents {
    let text = fs::read_to_string(dir.join("memory.events")).unwrap_or_default();
    CgroupEvents {
        high: keyed(&text, "high").unwrap_or(0),
        max: keyed(&text, "max").unwrap_or(0),
        oom: keyed(&text, "oom").unwrap_or(0),
        oom_kill: keyed(&text, "oom_kill").unwrap_or(0),
    }
}

pub(crate) fn events_v1(dir: &Path) -> CgroupEvents {
    let oom = fs::read_to_string(dir.join("memory.oom_control")).unwrap_or_default();
    CgroupEvents {
        high: 0,
        max: read_u64(&dir.join("memory.failcnt")).unwrap_or(0),
        oom: 0,
        oom_kill: keyed(&oom, "oom_kill").unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name)
    }

    fn load(dir: &Path) -> Option<CgroupMemory> {
        let cgroup = fs::read_to_string(dir.join("proc_self_cgroup")).unwrap();
        let mountinfo = fs::read_to_string(dir.join("mountinfo")).unwrap();
        cgroup_memory(&cgroup, &mountinfo, dir)
    }

    #[test]
    fn v1_captured_unlimited() {
        let root = fixture("cgroup-v1");
        let cg = load(&root).expect("memory controller found");
        assert_eq!(cg.version, CgroupVersion::V1);
        assert!(
            cg.dir
                .ends_with("memory/process_api/2a95b7ffe50293bc46a58722285ddc7e")
        );
        assert_eq!(cg.max_bytes, None, "9223372036854771712 means unlimited");
        assert_eq!(cg.limit_bytes(), None);
        assert_eq!(cg.current_bytes, Some(147_730_432));
        assert_eq!(cg.events, CgroupEvents::default());
    }

    #[test]
    fn v1_limit_on_an_ancestor_counts() {
        let tmp = tempfile::tempdir().unwrap();
        let src = fixture("cgroup-v1");
        copy_tree(&src, tmp.path());
        let parent = tmp.path().join("sys/fs/cgroup/memory/process_api");
        fs::write(parent.join("memory.limit_in_bytes"), "4294967296\n").unwrap();
        fs::write(parent.join("memory.usage_in_bytes"), "1073741824\n").unwrap();
        let cg = load(tmp.path()).unwrap();
        assert_eq!(cg.max_bytes, Some(4 << 30));
        assert_eq!(cg.limited_by.as_deref(), Some(parent.as_path()));
        assert_eq!(cg.headroom_bytes, Some(3 << 30));
    }

    #[test]
    fn v2_session_scope_limited_by_its_slice() {
        let root = fixture("cgroup-v2");
        let cg = load(&root).unwrap();
        assert_eq!(cg.version, CgroupVersion::V2);
        assert_eq!(cg.max_bytes, Some(8 << 30));
        assert_eq!(cg.high_bytes, Some(6 << 30));
        assert_eq!(cg.limit_bytes(), Some(6 << 30));
        assert!(
            cg.limited_by
                .unwrap()
                .ends_with("user.slice/user-1000.slice")
        );
        // memory.high 6 GiB − the slice's 2 GiB in use.
        assert_eq!(cg.headroom_bytes, Some(4 << 30));
        assert_eq!(cg.current_bytes, Some(1 << 30));
        assert_eq!(
            cg.events,
            CgroupEvents {
                high: 12,
                max: 3,
                oom: 1,
                oom_kill: 1
            }
        );
    }

    #[test]
    fn hybrid_prefers_v1_memory_line_and_v2_only_works() {
        let hybrid = "4:memory:/a\n0::/\n";
        let mounts = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                      41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        let cg = cgroup_memory(hybrid, mounts, Path::new("/nonexistent")).unwrap();
        assert_eq!(cg.version, CgroupVersion::V1);
        let cg = cgroup_memory("0::/b\n", mounts, Path::new("/nonexistent")).unwrap();
        assert_eq!(cg.version, CgroupVersion::V2);
        assert!(cg.dir.ends_with("unified/b"));
        assert_eq!(cg.max_bytes, None);
        assert!(cgroup_memory("", mounts, Path::new("/")).is_none());
    }

    fn copy_tree(src: &Path, dst: &Path) {
        for entry in fs::read_dir(src).unwrap() {
            let entry = entry.unwrap();
            let to = dst.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                fs::create_dir_all(&to).unwrap();
                copy_tree(&entry.path(), &to);
            } else {
                fs::copy(entry.path(), &to).unwrap();
            }
        }
    }
}
