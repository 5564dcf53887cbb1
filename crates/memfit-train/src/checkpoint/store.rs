//! Writing, finding and pruning checkpoint directories.

use super::disk::FreeSpace;
use super::state::TrainerState;
use crate::engine::Engine;
use crate::text::CheckpointFile;
use std::fs;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("checkpoint {path}: the engine failed to save: {message}")]
    Engine { path: String, message: String },
    #[error("checkpoint {path}: {message}")]
    State { path: String, message: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// What happened to a requested checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SaveOutcome {
    Saved {
        path: PathBuf,
        bytes: u64,
    },
    /// Not written: the disk lacks room (nothing partial is left).
    Skipped {
        path: PathBuf,
        needed: u64,
        free: u64,
    },
}

/// Writes checkpoints of one run.
#[derive(Debug)]
pub struct Checkpointer {
    checkpoints_dir: PathBuf,
    best_dir: PathBuf,
    keep: usize,
    tokenizer_files: Vec<CheckpointFile>,
    free_space: FreeSpace,
    /// Size of the last checkpoint written, or the caller's estimate before the first.
    expected_bytes: u64,
}

/// Room asked for beyond the expected size: 10% for file-system metadata and growth (own margin).
const DISK_MARGIN: f64 = 1.10;

impl Checkpointer {
    /// `expected_bytes`: the size of one checkpoint before any exists (e.g. weights + optimizer state).
    /// Leftovers of an interrupted write are cleaned up here.
    pub fn new(
        checkpoints_dir: PathBuf,
        best_dir: PathBuf,
        keep: usize,
        tokenizer_files: Vec<CheckpointFile>,
        free_space: FreeSpace,
        expected_bytes: u64,
    ) -> Result<Self, CheckpointError> {
        fs::create_dir_all(&checkpoints_dir).map_err(io(&checkpoints_dir))?;
        recover(&checkpoints_dir)?;
        if let Some(parent) = best_dir.parent() {
            recover(parent)?;
        }
        let expected_bytes = latest_checkpoint(&checkpoints_dir)
            .map(|(_, p)| dir_size(&p))
            .filter(|s| *s > 0)
            .unwrap_or(expected_bytes);
        Ok(Self {
            checkpoints_dir,
            best_dir,
            keep: keep.max(1),
            tokenizer_files,
            free_space,
            expected_bytes,
        })
    }

    pub fn step_dir(&self, step: u64) -> PathBuf {
        self.checkpoints_dir.join(format!("step-{step}"))
    }

    /// `checkpoints/step-N/`, then retention.
    pub fn save_step<E: Engine>(
        &mut self,
        engine: &mut E,
        state: &TrainerState,
    ) -> Result<SaveOutcome, CheckpointError> {
        let outcome = self.write_dir(&self.step_dir(state.step), engine, state, true)?;
        if matches!(outcome, SaveOutcome::Saved { .. }) {
            self.apply_retention()?;
        }
        Ok(outcome)
    }

    /// `best/`, replacing the previous best only once the new one is complete.
    pub fn save_best<E: Engine>(
        &mut self,
        engine: &mut E,
        state: &TrainerState,
    ) -> Result<SaveOutcome, CheckpointError> {
        let best = self.best_dir.clone();
        // a resume continues from the newest step checkpoint, never from best/: no optimizer state
        self.write_dir(&best, engine, state, false)
    }

    /// Writes `target` whole or not at all; `resumable`: with the optimizer's state.
    fn write_dir<E: Engine>(
        &mut self,
        target: &Path,
        engine: &mut E,
        state: &TrainerState,
        resumable: bool,
    ) -> Result<SaveOutcome, CheckpointError> {
        let parent = target.parent().unwrap_or(Path::new("."));
        let name = target
            .file_name()
            .map_or("checkpoint".into(), |n| n.to_string_lossy().into_owned());
        // Room for the new checkpoint; when it replaces one of the same name, both coexist for a moment.
        let needed = (self.expected_bytes as f64 * DISK_MARGIN) as u64;
        let free = (self.free_space)(parent).map_err(io(parent))?;
        if free < needed {
            return Ok(SaveOutcome::Skipped {
                path: target.to_path_buf(),
                needed,
                free,
            });
        }
        let tmp = parent.join(format!(".tmp-{name}-{}", std::process::id()));
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
        }
        let written = self
            .fill(&tmp, engine, state)
            .and_then(|()| match resumable {
                true => Ok(()),
                false => remove_optimizer(&tmp),
            });
        if let Err(e) = written {
            let _ = fs::remove_dir_all(&tmp);
            if let CheckpointError::Io { source, .. } = &e
                && source.kind() == std::io::ErrorKind::StorageFull
            {
                return Ok(SaveOutcome::Skipped {
                    path: target.to_path_buf(),
                    needed,
                    free: (self.free_space)(parent).unwrap_or(0),
                });
            }
            return Err(e);
        }
        if target.exists() {
            let old = parent.join(format!(".old-{name}-{}", std::process::id()));
            fs::rename(target, &old).map_err(io(target))?;
            fs::rename(&tmp, target).map_err(io(target))?;
            fs::remove_dir_all(&old).map_err(io(&old))?;
        } else {
            fs::rename(&tmp, target).map_err(io(target))?;
        }
        sync_dir(parent);
        let bytes = dir_size(target);
        if resumable {
            // the next checkpoint's size: a step checkpoint's, optimizer state included
            self.expected_bytes = bytes;
        }
        Ok(SaveOutcome::Saved {
            path: target.to_path_buf(),
            bytes,
        })
    }

    fn fill<E: Engine>(
        &self,
        tmp: &Path,
        engine: &mut E,
        state: &TrainerState,
    ) -> Result<(), CheckpointError> {
        fs::create_dir_all(tmp).map_err(io(tmp))?;
        engine.save(tmp).map_err(|e| CheckpointError::Engine {
            path: tmp.display().to_string(),
            message: e.to_string(),
        })?;
        for file in &self.tokenizer_files {
            let dest = tmp.join(file.name);
            fs::write(&dest, &file.bytes).map_err(io(&dest))?;
        }
        let json = serde_json::to_string_pretty(state).unwrap_or_default();
        let state_path = tmp.join(TrainerState::FILE);
        fs::write(&state_path, json).map_err(io(&state_path))?;
        super::checksums::write(tmp).map_err(io(tmp))?;
        for entry in fs::read_dir(tmp).map_err(io(tmp))? {
            let path = entry.map_err(io(tmp))?.path();
            if path.is_file() {
                fs::File::open(&path)
                    .and_then(|f| f.sync_all())
                    .map_err(io(&path))?;
            }
        }
        sync_dir(tmp);
        Ok(())
    }

    /// Keeps the newest `keep` step checkpoints (`best/` lives apart and is never pruned), and the
    /// optimizer state only in the [`RESUMABLE`] newest, those a resume can continue from (an AdamW
    /// state is twice the weights: kept in every checkpoint, it was most of a run's disk).
    pub fn apply_retention(&self) -> Result<Vec<PathBuf>, CheckpointError> {
        let steps = checkpoint_steps(&self.checkpoints_dir);
        let excess = steps.len().saturating_sub(self.keep);
        let mut removed = Vec::new();
        let older = steps.len().saturating_sub(RESUMABLE);
        for (i, (_, path)) in steps.into_iter().enumerate() {
            if i < excess {
                fs::remove_dir_all(&path).map_err(io(&path))?;
                removed.push(path);
            } else if i < older {
                remove_optimizer(&path)?;
            }
        }
        Ok(removed)
    }
}

/// Removes a checkpoint's optimizer state, if it has one.
/// Then its line leaves `SHA256SUMS` (a crash between the two leaves a listed, missing optimizer
/// state: the checkpoint is then not resumable, which it no longer was meant to be).
fn remove_optimizer(dir: &Path) -> Result<(), CheckpointError> {
    let path = dir.join(OPTIMIZER_FILE);
    match fs::remove_file(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(&path)(e)),
        Ok(()) => {}
    }
    super::checksums::forget(dir, OPTIMIZER_FILE).map_err(io(dir))
}

/// Step checkpoints that keep their optimizer state: a resume continues from the newest, or from the
/// one before when the newest is damaged (`session::resume` falls back past it).
pub const RESUMABLE: usize = 2;

/// The optimizer's state in a checkpoint (what `Engine::save` writes beside the model).
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";

/// Removes `.tmp-*` leftovers of interrupted writes and puts back a `.old-*` directory whose
/// replacement never arrived.
fn recover(dir: &Path) -> Result<(), CheckpointError> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.starts_with(".tmp-") && path.is_dir() {
            fs::remove_dir_all(&path).map_err(io(&path))?;
        } else if let Some(rest) = name.strip_prefix(".old-") {
            // `.old-<name>-<pid>`: the name is everything before the last '-'.
            let original = rest.rsplit_once('-').map_or(rest, |(n, _)| n);
            let target = dir.join(original);
            if target.exists() {
                fs::remove_dir_all(&path).map_err(io(&path))?;
            } else {
                fs::rename(&path, &target).map_err(io(&path))?;
            }
        }
    }
    Ok(())
}

fn sync_dir(dir: &Path) {
    // Persisting the rename; a failure here (e.g. a file system without directory fsync) is harmless.
    if let Ok(f) = fs::File::open(dir) {
        let _ = f.sync_all();
    }
}

/// Complete step checkpoints (`step-N/` with a `trainer_state.json`), oldest first.
pub fn checkpoint_steps(checkpoints_dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut steps: Vec<(u64, PathBuf)> = fs::read_dir(checkpoints_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix("step-")?.parse::<u64>().ok()?;
            let path = e.path();
            path.join(TrainerState::FILE)
                .is_file()
                .then_some((step, path))
        })
        .collect();
    steps.sort();
    steps
}

/// The newest complete step checkpoint.
pub fn latest_checkpoint(checkpoints_dir: &Path) -> Option<(u64, PathBuf)> {
    checkpoint_steps(checkpoints_dir).pop()
}

/// Reads `trainer_state.json` of a checkpoint directory.
pub fn read_state(dir: &Path) -> Result<TrainerState, CheckpointError> {
    let path = dir.join(TrainerState::FILE);
    let text = fs::read_to_string(&path).map_err(io(&path))?;
    serde_json::from_str(&text).map_err(|e| CheckpointError::State {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// Total size of the files directly in `dir`.
pub fn dir_size(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}
