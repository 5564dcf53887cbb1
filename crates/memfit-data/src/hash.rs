//! SHA-256 content hashes (hex) for the store's meta.json: sources and tokenizers are identified by
//! content, not by path or modification time, so a moved file is still recognised and a touched
//! one is not rebuilt for nothing. memfit-train's checkpoints hash their files with it too.

use crate::error::{DataError, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

/// Hash of a file, read in 1 MiB pieces (memory stays flat whatever the file size).
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path).map_err(|e| DataError::read(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| DataError::read(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

pub fn sha256_bytes(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
