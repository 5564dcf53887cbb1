//! One owner per run directory: an advisory lock (`flock` on `RUN/.lock`) held for the run's life, by a
//! new run from before its directory holds anything, by `--resume`, and by `memfit report` while it
//! writes there. A second owner is refused with the holder's PID (written into the lock file). The
//! kernel drops the lock when its holder exits, however it exits, so a lock is never stale.
//!
//! Within one process the lock is shared: the CLI takes it before preparing the data and the run
//! directory takes it again for the loop; it is released when the last handle drops.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

/// The lock file in a run directory (removed only by the failed start that made it, under its lock).
pub const LOCK_FILE: &str = ".lock";

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "{path} is in use by {holder}: another memfit train, --resume or report holds its lock \
         ({LOCK_FILE}); wait for it to end or choose another directory"
    )]
    Held { path: String, holder: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LockError + '_ {
    move |source| LockError::Io {
        path: path.display().to_string(),
        source,
    }
}

#[derive(Debug)]
struct Held {
    dir: PathBuf,
    /// Closing it releases the lock.
    _file: File,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = registry().lock().unwrap_or_else(|e| e.into_inner());
        if held.get(&self.dir).is_some_and(|w| w.strong_count() == 0) {
            held.remove(&self.dir);
        }
    }
}

fn registry() -> &'static Mutex<HashMap<PathBuf, Weak<Held>>> {
    static HELD: std::sync::OnceLock<Mutex<HashMap<PathBuf, Weak<Held>>>> =
        std::sync::OnceLock::new();
    HELD.get_or_init(Default::default)
}

/// A held lock on a run directory; clones share it.
#[derive(Debug, Clone)]
pub struct RunLock {
    _held: Arc<Held>,
}

impl RunLock {
    /// Takes the lock of the existing directory `dir` without waiting, or shares this process's.
    pub fn acquire(dir: &Path) -> Result<Self, LockError> {
        let key = fs::canonicalize(dir).map_err(io_err(dir))?;
        let mut held = registry().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = held.get(&key).and_then(Weak::upgrade) {
            return Ok(Self { _held: h });
        }
        let path = key.join(LOCK_FILE);
        let mut file = locked_file(&path, dir)?;
        // Who holds it is for messages only: a full disk must not fail a lock that is held.
        if file.set_len(0).is_ok() {
            let _ = writeln!(file, "{}", std::process::id());
        }
        let h = Arc::new(Held {
            dir: key.clone(),
            _file: file,
        });
        held.insert(key, Arc::downgrade(&h));
        Ok(Self { _held: h })
    }
}

/// Opens `path` (creating it) and takes its lock without waiting. A failed start may remove the
/// lock file it made (under the lock), so a lock taken on a file no longer at `path` is let go
/// and taken again on the file now there: two owners never hold two inodes of one path.
fn locked_file(path: &Path, dir: &Path) -> Result<File, LockError> {
    loop {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io_err(path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(LockError::Held {
                    path: dir.display().to_string(),
                    holder: holder(&mut file),
                });
            }
            Err(TryLockError::Error(e)) => return Err(io_err(path)(e)),
        }
        if is_at(&file, path) {
            return Ok(file);
        }
    }
}

/// Whether `file` is the file at `path` now (same device and inode).
fn is_at(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Who holds the lock: the PID its holder writes just after taking it (asked again for up to 100 ms
/// if the holder has not written it yet).
fn holder(file: &mut File) -> String {
    for _ in 0..20 {
        let mut text = String::new();
        if file.seek(SeekFrom::Start(0)).is_ok()
            && file.read_to_string(&mut text).is_ok()
            && let Ok(pid) = text.trim().parse::<u32>()
        {
            return format!("process {pid}");
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    "another process".to_string()
}

/// A run directory a start has claimed: locked, and cleaned up if the start fails before `keep`: a
/// directory it made is removed whole, and the parents it made for it where they are still empty;
/// in one that existed, only the entries it added (the lock file too when it made it: removed under
/// the lock, which [`locked_file`] makes safe).
#[derive(Debug)]
pub struct Claim {
    root: PathBuf,
    lock: Option<RunLock>,
    made_root: bool,
    /// The parents of `root` this start created, the deepest first.
    made_parents: Vec<PathBuf>,
    /// The lock file was not there before this start.
    made_lock: bool,
    /// Entries of a directory that existed before; `None` once kept.
    before: Option<HashSet<OsString>>,
}

impl Claim {
    /// Claims `root` for a new run: creates it if missing (its parents too), takes its lock, and
    /// refuses a directory that already holds a run.
    pub fn new_run(root: &Path) -> Result<Self, ClaimError> {
        let mut made_parents = Vec::new();
        if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
            let missing = parent
                .ancestors()
                .take_while(|p| !p.as_os_str().is_empty() && !p.exists());
            made_parents = missing.map(Path::to_path_buf).collect();
            fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        let made_root = match fs::create_dir(root) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && root.is_dir() => false,
            Err(e) => return Err(io_err(root)(e).into()),
        };
        let made_lock = !root.join(LOCK_FILE).exists();
        let lock = RunLock::acquire(root)?;
        let before = entries(root).map_err(io_err(root))?;
        let claim = Self {
            root: root.to_path_buf(),
            lock: Some(lock),
            made_root,
            made_parents,
            made_lock,
            before: Some(before),
        };
        if root.join(crate::run_dir::RunDir::CONFIG).exists() {
            let mut claim = claim;
            claim.keep(); // not ours to clean up
            return Err(ClaimError::AlreadyARun {
                path: root.display().to_string(),
            });
        }
        Ok(claim)
    }

    /// Claims the existing run `root` for a resume (nothing is cleaned up if it fails).
    pub fn resume(root: &Path) -> Result<Self, ClaimError> {
        let lock = RunLock::acquire(root)?;
        Ok(Self {
            root: root.to_path_buf(),
            lock: Some(lock),
            made_root: false,
            made_parents: Vec::new(),
            made_lock: false,
            before: None,
        })
    }

    /// The run got going: whatever happens now is the run's, kept for `--resume`.
    pub fn keep(&mut self) {
        self.before = None;
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl Drop for Claim {
    /// Cleans up while the lock is still held, then releases it.
    fn drop(&mut self) {
        if let Some(before) = self.before.take() {
            if self.made_root {
                let _ = fs::remove_dir_all(&self.root);
                // only while empty: another start may have put its run beside this one meanwhile
                for parent in &self.made_parents {
                    let _ = fs::remove_dir(parent);
                }
            } else if let Ok(now) = entries(&self.root) {
                for name in now.difference(&before) {
                    let path = self.root.join(name);
                    let _ = fs::remove_dir_all(&path).or_else(|_| fs::remove_file(&path));
                }
                if self.made_lock {
                    let _ = fs::remove_file(self.root.join(LOCK_FILE));
                }
            }
        }
        self.lock.take();
    }
}

fn entries(dir: &Path) -> std::io::Result<HashSet<OsString>> {
    fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(
        "{path} already holds a run (config.toml); continue it with --resume {path} or choose another --out"
    )]
    AlreadyARun { path: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_shares_its_lock_and_releases_it_with_the_last_handle() {
        let dir = tempfile::tempdir().unwrap();
        let a = RunLock::acquire(dir.path()).unwrap();
        let b = RunLock::acquire(dir.path()).unwrap();
        let pid = fs::read_to_string(dir.path().join(LOCK_FILE)).unwrap();
        assert_eq!(pid.trim(), std::process::id().to_string());
        // Another open file description is refused while a handle lives (as another process would be).
        let other = File::open(dir.path().join(LOCK_FILE)).unwrap();
        assert!(matches!(other.try_lock(), Err(TryLockError::WouldBlock)));
        drop(a);
        assert!(matches!(other.try_lock(), Err(TryLockError::WouldBlock)));
        drop(b);
        other.try_lock().unwrap();
    }

    #[test]
    fn a_failed_start_removes_only_what_it_added() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("existing");
        fs::create_dir(&root).unwrap();
        fs::write(root.join("notes.txt"), "mine").unwrap();
        let claim = Claim::new_run(&root).unwrap();
        fs::write(root.join("config.toml"), "x").unwrap();
        fs::create_dir(root.join("checkpoints")).unwrap();
        drop(claim);
        let mut left: Vec<_> = entries(&root).unwrap().into_iter().collect();
        left.sort();
        assert_eq!(
            left,
            [OsString::from("notes.txt")],
            "the lock it made goes too"
        );

        // A lock file that was there before stays (another start may have it open).
        fs::write(root.join(LOCK_FILE), "").unwrap();
        drop(Claim::new_run(&root).unwrap());
        assert!(root.join(LOCK_FILE).exists());

        // The parents it made go with the run directory; the ones that were there stay.
        let made = dir.path().join("new").join("runs").join("run");
        let claim = Claim::new_run(&made).unwrap();
        fs::write(made.join("config.toml"), "x").unwrap();
        drop(claim);
        assert!(
            !dir.path().join("new").exists(),
            "the parents it made are gone"
        );
        assert!(dir.path().exists());
        // A parent that another run took meanwhile is not empty and stays.
        let claim = Claim::new_run(&made).unwrap();
        fs::create_dir(dir.path().join("new").join("other")).unwrap();
        drop(claim);
        assert!(!made.exists() && !made.parent().unwrap().exists());
        assert!(dir.path().join("new").join("other").exists());
    }

    #[test]
    fn a_lock_on_a_removed_lock_file_is_taken_again_on_the_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOCK_FILE);
        let old = File::create(&path).unwrap();
        assert!(is_at(&old, &path));
        // What a failed start does: its lock file removed under its lock; a racer had it open.
        fs::remove_file(&path).unwrap();
        assert!(
            !is_at(&old, &path),
            "an unlinked file is not the one at the path"
        );
        old.try_lock().unwrap();
        let lock = RunLock::acquire(dir.path()).unwrap();
        assert!(path.exists(), "the new owner locks a file at the path");
        let other = File::open(&path).unwrap();
        assert!(matches!(other.try_lock(), Err(TryLockError::WouldBlock)));
        drop(lock);
    }

    #[test]
    fn a_kept_claim_and_a_run_are_never_removed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("run");
        let mut claim = Claim::new_run(&root).unwrap();
        fs::write(root.join("config.toml"), "x").unwrap();
        claim.keep();
        drop(claim);
        assert!(root.join("config.toml").exists());
        let e = Claim::new_run(&root).unwrap_err();
        assert!(matches!(e, ClaimError::AlreadyARun { .. }), "{e}");
        assert!(root.join("config.toml").exists());
    }
}
