//! Free space on a filesystem (statvfs), and the size of /dev/shm.

use std::path::Path;

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Disk {
    pub path: String,
    pub total_bytes: u64,
    /// Space an unprivileged user can write (f_bavail).
    pub free_bytes: u64,
}

/// Free space where `path` lives; if `path` does not exist yet, its nearest existing ancestor.
pub fn disk(path: &Path) -> Option<Disk> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let st = nix::sys::statvfs::statvfs(existing).ok()?;
    let unit = st.fragment_size();
    Some(Disk {
        path: std::fs::canonicalize(path)
            .unwrap_or_else(|_| path.to_path_buf())
            .display()
            .to_string(),
        total_bytes: st.blocks() * unit,
        free_bytes: st.blocks_available() * unit,
    })
}
