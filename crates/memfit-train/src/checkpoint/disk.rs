//! Free disk space where a checkpoint is about to be written.

use std::path::Path;

/// How the checkpointer learns the free space (replaceable in tests to simulate a full disk).
pub type FreeSpace = fn(&Path) -> std::io::Result<u64>;

/// Bytes available to this (unprivileged) process on the file system holding `path` (statvfs).
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    let st = nix::sys::statvfs::statvfs(path).map_err(std::io::Error::from)?;
    Ok(st.blocks_available().saturating_mul(st.fragment_size()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn temp_dir_has_some_free_space() {
        assert!(super::free_bytes(&std::env::temp_dir()).unwrap() > 0);
    }
}
