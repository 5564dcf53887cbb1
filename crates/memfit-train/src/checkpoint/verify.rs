//! A cheap integrity check of a checkpoint directory before a resume trusts it: `trainer_state.json`
//! parses and every `.safetensors` file is whole — its header parses and the file is exactly as long as
//! the header says (8-byte length + JSON header + the largest tensor end offset). A file cut short by a
//! crash, a full disk or a copy fails it, and a bit flip anywhere fails `SHA256SUMS` (`checksums`).

use super::state::TrainerState;
use super::store::{OPTIMIZER_FILE, read_state};
use std::fs::{self, File};
use std::io::Read;
use std::path::Path;

/// Why `dir` cannot be resumed from, if it cannot: its state unreadable, a file cut short or
/// differing from `SHA256SUMS`, or no optimizer state (retention keeps it only in the newest).
pub fn verify_checkpoint(dir: &Path) -> Result<TrainerState, String> {
    let state = read_state(dir).map_err(|e| e.to_string())?;
    if !dir.join(OPTIMIZER_FILE).is_file() {
        return Err(format!(
            "{}: no {OPTIMIZER_FILE} (a resume needs the optimizer's state)",
            dir.display()
        ));
    }
    let entries = fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|x| x == "safetensors") {
            check_safetensors(&path).map_err(|why| format!("{}: {why}", path.display()))?;
        }
    }
    // After the cheap checks, whose words say more of a file cut short.
    super::checksums::verify(dir)?;
    Ok(state)
}

/// The safetensors layout: u64 little-endian header length N, N bytes of JSON mapping each tensor to
/// its `data_offsets` [begin, end) in the data that follows (and an optional `__metadata__`).
fn check_safetensors(path: &Path) -> Result<(), String> {
    let mut file = File::open(path).map_err(|e| e.to_string())?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    let mut n = [0u8; 8];
    file.read_exact(&mut n)
        .map_err(|_| "shorter than a safetensors header".to_string())?;
    let header_len = u64::from_le_bytes(n);
    if header_len > len.saturating_sub(8) {
        return Err(format!("header of {header_len} bytes in a file of {len}"));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header).map_err(|e| e.to_string())?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| format!("header: {e}"))?;
    let data_end = header
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| {
            v["data_offsets"][1]
                .as_u64()
                .ok_or_else(|| format!("tensor {k} has no data_offsets"))
        })
        .try_fold(0u64, |m, end| end.map(|e| m.max(e)))?;
    let expected = 8 + header_len + data_end;
    if len != expected {
        return Err(format!("{len} bytes where the header describes {expected}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn safetensors(data: &[u8]) -> Vec<u8> {
        let header = format!(
            r#"{{"__metadata__":{{"a":"b"}},"t":{{"dtype":"U8","shape":[{}],"data_offsets":[0,{}]}}}}"#,
            data.len(),
            data.len()
        );
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn whole_files_pass_and_cut_or_garbled_ones_fail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let whole = safetensors(&[7; 100]);
        fs::write(&path, &whole).unwrap();
        check_safetensors(&path).unwrap();
        fs::write(&path, &whole[..whole.len() - 1]).unwrap();
        let e = check_safetensors(&path).unwrap_err();
        assert!(e.contains("bytes where the header describes"), "{e}");
        let mut garbled = whole.clone();
        garbled[8] = b'#'; // the header's opening brace
        fs::write(&path, &garbled).unwrap();
        assert!(check_safetensors(&path).unwrap_err().contains("header"));
        fs::write(&path, [1u8, 2]).unwrap();
        assert!(check_safetensors(&path).is_err());
    }
}
