//! `SHA256SUMS` in every checkpoint: the SHA-256 of each file, in `sha256sum`'s format (so
//! `sha256sum -c SHA256SUMS` checks a checkpoint by hand), written last into the temporary
//! directory before it is renamed into place, and checked before a resume or an `--init` trusts the
//! checkpoint. It catches what the structural checks cannot: bit flips inside tensor data.

use std::fs::{self, File};
use std::path::Path;

/// The checksum file of a checkpoint directory.
pub const FILE: &str = "SHA256SUMS";

/// SHA-256 of a file (memfit-data's: read in 1 MiB pieces, memory flat whatever the size).
fn sha256_file(path: &Path) -> std::io::Result<String> {
    memfit_data::hash::sha256_file(path).map_err(std::io::Error::other)
}

/// Writes `dir/SHA256SUMS` over every regular file of `dir` (names sorted), replacing it atomically.
pub fn write(dir: &Path) -> std::io::Result<()> {
    let mut names: Vec<String> = fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != FILE && !n.starts_with('.'))
        .collect();
    names.sort();
    let mut text = String::new();
    for name in &names {
        text += &format!("{}  {name}\n", sha256_file(&dir.join(name))?);
    }
    write_atomic(dir, &text)
}

/// Drops `name`'s line from `dir/SHA256SUMS` (a file removed on purpose), atomically; nothing to
/// do without one.
pub fn forget(dir: &Path, name: &str) -> std::io::Result<()> {
    let path = dir.join(FILE);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let kept: String = text
        .lines()
        .filter(|l| l.split_once("  ").is_none_or(|(_, n)| n != name))
        .map(|l| format!("{l}\n"))
        .collect();
    write_atomic(dir, &kept)
}

fn write_atomic(dir: &Path, text: &str) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{FILE}.tmp"));
    fs::write(&tmp, text)?;
    File::open(&tmp)?.sync_all()?;
    fs::rename(&tmp, dir.join(FILE))
}

/// Whether the files `SHA256SUMS` lists are there with their sums: `Ok(false)` for a checkpoint
/// written before checksums (nothing to check against), `Err` naming each file that differs or
/// is missing. Files it does not list are not checked.
pub fn verify(dir: &Path) -> Result<bool, String> {
    let path = dir.join(FILE);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut bad = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Some((sum, name)) = line.split_once("  ") else {
            return Err(format!(
                "{}: not a sha256sum line: {line:?}",
                path.display()
            ));
        };
        let file = dir.join(name);
        if name == super::store::OPTIMIZER_FILE && !file.exists() {
            continue; // removed by retention; a resume asks for it apart
        }
        match sha256_file(&file) {
            Ok(found) if found == sum => {}
            Ok(_) => bad.push(format!(
                "{name}: its SHA-256 differs from {FILE}'s (damaged)"
            )),
            Err(e) => bad.push(format!("{name}: {e}")),
        }
    }
    if bad.is_empty() {
        Ok(true)
    } else {
        Err(format!("{}: {}", dir.display(), bad.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flipped_bit_a_missing_file_and_an_old_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::write(d.join("model.safetensors"), vec![7u8; 3 << 20]).unwrap();
        fs::write(d.join("trainer_state.json"), "{}").unwrap();
        assert_eq!(verify(d), Ok(false), "no SHA256SUMS: nothing to check");
        write(d).unwrap();
        let sums = fs::read_to_string(d.join(FILE)).unwrap();
        assert_eq!(sums.lines().count(), 2, "{sums}");
        assert!(
            sums.lines().all(|l| l.len() > 66 && &l[64..66] == "  "),
            "{sums}"
        );
        assert_eq!(verify(d), Ok(true));

        // One bit inside the data, length unchanged.
        let mut bytes = fs::read(d.join("model.safetensors")).unwrap();
        bytes[2 << 20] ^= 0x10;
        fs::write(d.join("model.safetensors"), &bytes).unwrap();
        let err = verify(d).unwrap_err();
        assert!(
            err.contains("model.safetensors") && err.contains("damaged"),
            "{err}"
        );

        forget(d, "trainer_state.json").unwrap();
        assert_eq!(fs::read_to_string(d.join(FILE)).unwrap().lines().count(), 1);

        fs::remove_file(d.join("model.safetensors")).unwrap();
        let err = verify(d).unwrap_err();
        assert!(err.contains("model.safetensors"), "{err}");
        assert!(!err.contains("trainer_state.json"), "{err}");
    }
}
