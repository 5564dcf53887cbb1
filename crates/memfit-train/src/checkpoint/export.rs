//! `memfit export`: a checkpoint as the Hugging Face directory its family is loaded from, without
//! the trainer's own files (optimizer state, trainer_state.json, SHA256SUMS, checked first); with
//! `merge`, a LoRA checkpoint's adapter merged into its base model. Written into a hidden sibling directory and renamed into
//! place: an interrupted export leaves no directory that looks complete.

use super::TrainerState;
use std::fs;
use std::path::{Path, PathBuf};

/// Files a checkpoint holds for the trainer, not for the model's users.
const TRAINER_FILES: [&str; 3] = [
    "optimizer.safetensors",
    TrainerState::FILE,
    super::checksums::FILE,
];

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{0}: not a checkpoint (no config.json or adapter_config.json in it)")]
    NotACheckpoint(String),
    #[error(
        "--merge: {0} holds a full model, not a LoRA adapter (no adapter_config.json): export it without --merge"
    )]
    NothingToMerge(String),
    #[error("{0}")]
    Damaged(String),
    #[error("--out {0}: already exists and is not empty")]
    OutExists(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Model(#[from] memfit_nn::ModelError),
}

impl ExportError {
    /// Bad input (exit 2) rather than a failure at run time.
    pub fn is_bad_input(&self) -> bool {
        !matches!(self, ExportError::Io { .. })
    }
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> ExportError + '_ {
    move |source| ExportError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Exports `checkpoint` into `out`; returns the files written.
pub fn export(checkpoint: &Path, out: &Path, merge: bool) -> Result<Vec<String>, ExportError> {
    let is_checkpoint = ["config.json", "adapter_config.json"]
        .iter()
        .any(|f| checkpoint.join(f).is_file());
    if !is_checkpoint {
        return Err(ExportError::NotACheckpoint(
            checkpoint.display().to_string(),
        ));
    }
    super::checksums::verify(checkpoint).map_err(ExportError::Damaged)?;
    if out.exists() && fs::read_dir(out).map_err(io(out))?.next().is_some() {
        return Err(ExportError::OutExists(out.display().to_string()));
    }
    let tmp = sibling(out);
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    let written = fill(checkpoint, &tmp, merge);
    if written.is_err() {
        let _ = fs::remove_dir_all(&tmp);
        return written;
    }
    if out.exists() {
        fs::remove_dir(out).map_err(io(out))?;
    }
    fs::rename(&tmp, out).map_err(io(out))?;
    written
}

/// `.NAME.export-PID` beside `out`.
fn sibling(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map_or("export".into(), |n| n.to_string_lossy().into_owned());
    out.with_file_name(format!(".{name}.export-{}", std::process::id()))
}

/// The model's files into `tmp`: merged weights and the tokenizer files, or every file but the
/// trainer's.
fn fill(checkpoint: &Path, tmp: &Path, merge: bool) -> Result<Vec<String>, ExportError> {
    if merge && !memfit_nn::families::merge_adapter(checkpoint, tmp)? {
        return Err(ExportError::NothingToMerge(
            checkpoint.display().to_string(),
        ));
    }
    let mut names = Vec::new();
    for entry in fs::read_dir(checkpoint).map_err(io(checkpoint))? {
        let path = entry.map_err(io(checkpoint))?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let adapter_file = name.starts_with("adapter_");
        if !path.is_file() || TRAINER_FILES.contains(&name.as_str()) || (merge && adapter_file) {
            continue;
        }
        let dest = tmp.join(&name);
        if !dest.exists() {
            fs::copy(&path, &dest).map_err(io(&dest))?;
        }
    }
    for entry in fs::read_dir(tmp).map_err(io(tmp))? {
        let path = entry.map_err(io(tmp))?.path();
        fs::File::open(&path)
            .and_then(|f| f.sync_all())
            .map_err(io(&path))?;
        names.push(
            path.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
    }
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trainer_files_stay_behind_and_a_full_model_refuses_merge() {
        let dir = tempfile::tempdir().unwrap();
        let ckpt = dir.path().join("step-3");
        fs::create_dir_all(&ckpt).unwrap();
        for f in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "optimizer.safetensors",
            "trainer_state.json",
        ] {
            fs::write(ckpt.join(f), f).unwrap();
        }
        let out = dir.path().join("hf");
        let files = export(&ckpt, &out, false).unwrap();
        assert_eq!(
            files,
            ["config.json", "model.safetensors", "tokenizer.json"]
        );
        assert_eq!(fs::read(out.join("config.json")).unwrap(), b"config.json");
        // a second export into the same directory is refused: nothing is overwritten
        let err = export(&ckpt, &out, false).unwrap_err();
        assert!(matches!(err, ExportError::OutExists(_)), "{err}");
        let err = export(&ckpt, &dir.path().join("merged"), true).unwrap_err();
        assert!(err.to_string().contains("not a LoRA adapter"), "{err}");
        assert!(!dir.path().join("merged").exists());
        let leftovers: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "a failed export left {leftovers:?}");
    }

    #[test]
    fn a_directory_without_a_model_is_not_a_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let err = export(dir.path(), &dir.path().join("out"), false).unwrap_err();
        assert!(err.to_string().contains("not a checkpoint"), "{err}");
        assert!(err.is_bad_input());
    }
}
