//! Files the job leaves in /dev/shm: tmpfs pages that stay in RAM after the writer closes or unmaps
//! them, so no process's RSS shows them.
//!
//! A file is the job's when it appeared after the run started and a process of the job was seen
//! holding it open: other programs of the same user (a browser keeps hundreds of MiB there) are not
//! charged to the job. The open files of the job are looked at only while an unattributed new file
//! exists, at most every `FD_SCAN_PERIOD`.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Where POSIX shared memory (`shm_open`) and most shared-memory files live.
const SHM_DIR: &str = "/dev/shm";
/// How often the job's open files are listed while a new file is not attributed yet.
const FD_SCAN_PERIOD: Duration = Duration::from_millis(50);

/// The /dev/shm files that existed when the run started, and those found to be the job's since.
pub(super) struct ShmFiles {
    dir: PathBuf,
    before: HashSet<(u64, u64)>,
    ours: HashSet<(u64, u64)>,
    uid: u32,
    last_scan: Option<Instant>,
}

impl ShmFiles {
    pub(super) fn snapshot() -> Self {
        Self::snapshot_of(PathBuf::from(SHM_DIR))
    }

    fn snapshot_of(dir: PathBuf) -> Self {
        let mut files = Self {
            dir,
            before: HashSet::new(),
            ours: HashSet::new(),
            last_scan: None,
            uid: rustix::process::geteuid().as_raw(),
        };
        files.before = files.list().map(|(id, _)| id).collect();
        files
    }

    /// (device, inode) and allocated bytes of each regular file of memfit's user in the directory.
    fn list(&self) -> impl Iterator<Item = ((u64, u64), u64)> + '_ {
        std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.metadata().ok())
            .filter(|m| m.is_file() && m.uid() == self.uid)
            .map(|m| ((m.dev(), m.ino()), m.blocks() * 512))
    }

    /// Bytes held by the job's files (allocated blocks: a sparse file costs what it wrote, not its
    /// length); `pids` are the job's live processes.
    pub(super) fn job_bytes(&mut self, pids: &[i32]) -> u64 {
        let new: Vec<((u64, u64), u64)> = self
            .list()
            .filter(|(id, _)| !self.before.contains(id))
            .collect();
        let scan_due = self.last_scan.is_none_or(|t| t.elapsed() >= FD_SCAN_PERIOD);
        if scan_due && new.iter().any(|(id, _)| !self.ours.contains(id)) {
            self.last_scan = Some(Instant::now());
            self.ours
                .extend(pids.iter().flat_map(|&pid| open_files_in(pid, &self.dir)));
        }
        new.iter()
            .filter(|(id, _)| self.ours.contains(id))
            .map(|(_, bytes)| bytes)
            .sum()
    }
}

/// (device, inode) of the files under `dir` that `pid` holds open.
fn open_files_in(pid: i32, dir: &std::path::Path) -> Vec<(u64, u64)> {
    let fd_dir = format!("/proc/{pid}/fd");
    std::fs::read_dir(fd_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|target| target.starts_with(dir)))
        .filter_map(|e| std::fs::metadata(e.path()).ok())
        .map(|m| (m.dev(), m.ino()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_new_files_the_job_held_open() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("old"), vec![1u8; 64 << 10]).unwrap();
        let mut files = ShmFiles::snapshot_of(dir.path().to_owned());
        let me = [std::process::id() as i32];
        assert_eq!(files.job_bytes(&me), 0);
        // Another program's new file: not held by the job, not counted.
        std::fs::write(dir.path().join("theirs"), vec![1u8; 256 << 10]).unwrap();
        assert_eq!(files.job_bytes(&[]), 0);
        // The job's: written while open, then closed; a sparse GiB costs (almost) nothing.
        let mut f = std::fs::File::create(dir.path().join("new")).unwrap();
        std::io::Write::write_all(&mut f, &vec![1u8; 128 << 10]).unwrap();
        let sparse = std::fs::File::create(dir.path().join("sparse")).unwrap();
        sparse.set_len(1 << 30).unwrap();
        files.last_scan = None;
        let bytes = files.job_bytes(&me);
        drop((f, sparse));
        assert_eq!(files.job_bytes(&me), bytes, "still the job's once closed");
        // File systems round to their blocks.
        assert!((128 << 10..256 << 10).contains(&bytes), "{bytes}");
    }
}
