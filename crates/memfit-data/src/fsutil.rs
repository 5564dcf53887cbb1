//! Atomic writes: a file is written beside its target under a temporary name, synced, then renamed,
//! so a reader sees the old file or the new one, never half of one.

use crate::error::{DataError, Result};
use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` through a temporary sibling and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(DataError::write(path, e));
    }
    Ok(())
}
