//! Starting a run or continuing one: the run directory, the config-hash check, the checkpoint a resume
//! starts from. The binary builds the engine and the data, then hands everything to the loop.

use crate::checkpoint::{
    CheckpointError, Checkpointer, FreeSpace, TrainerState, verify_checkpoint,
};
use crate::config::{ConfigError, ConfigLayer, TrainConfig};
use crate::engine::Engine;
use crate::run_dir::{RunDir, RunDirError};
use serde_json::json;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("{dir}: no checkpoint is whole, so none can be resumed from: {why}")]
    NoCheckpoint { dir: String, why: String },
    #[error(
        "{dir}: the config differs from the run's (hash {old} → {new}): {changes}; pass --allow-config-change to continue anyway"
    )]
    ConfigChanged {
        dir: String,
        old: String,
        new: String,
        changes: String,
    },
    #[error("{dir}: checkpoint of model {found:?}, but this run trains {expected:?}")]
    OtherModel {
        dir: String,
        found: String,
        expected: String,
    },
    #[error("{dir}: checkpoint vocabulary {found}, but the tokenizer has {expected} tokens")]
    OtherVocab {
        dir: String,
        found: usize,
        expected: usize,
    },
    #[error("{dir}: loading the checkpoint failed: {message}")]
    Load { dir: String, message: String },
}

impl SessionError {
    /// Bad input (exit 2) rather than a failure at run time (exit 1).
    pub fn is_bad_input(&self) -> bool {
        !matches!(
            self,
            SessionError::Checkpoint(CheckpointError::Io { .. }) | SessionError::Load { .. }
        )
    }
}

/// Where a run stands before its loop starts.
pub struct Session {
    pub config: TrainConfig,
    pub run: RunDir,
    pub checkpointer: Checkpointer,
    /// The checkpoint to load into the engine (with its optimizer) and its state.
    pub resume_from: ResumeFrom,
    /// Trajectory settings changed by `--allow-config-change`: (name, old, new).
    pub changes: Vec<(String, String, String)>,
    /// Damaged checkpoints a resume passed over, newest first: `path: why`.
    pub skipped: Vec<String>,
}

/// How checkpoints are written for this run.
pub struct CheckpointSpec {
    /// The tokenizer files written into every checkpoint ([`crate::text::checkpoint_tokenizer_files`]).
    pub tokenizer_files: Vec<crate::text::CheckpointFile>,
    pub free_space: FreeSpace,
    /// Expected size of one checkpoint before any exists.
    pub expected_bytes: u64,
}

fn checkpointer(
    run: &RunDir,
    config: &TrainConfig,
    spec: CheckpointSpec,
) -> Result<Checkpointer, SessionError> {
    Ok(Checkpointer::new(
        run.checkpoints(),
        run.best(),
        config.keep,
        spec.tokenizer_files,
        spec.free_space,
        spec.expected_bytes,
    )?)
}

/// A new run in `out` with a validated config.
pub fn start(
    config: TrainConfig,
    out: &Path,
    spec: CheckpointSpec,
) -> Result<Session, SessionError> {
    config.validate()?;
    let mut run = RunDir::create(out, &config.to_toml())?;
    run.event(
        0,
        "start",
        json!({"config_hash": config.hash(), "model": config.model}),
    )?;
    let checkpointer = checkpointer(&run, &config, spec)?;
    Ok(Session {
        config,
        run,
        checkpointer,
        resume_from: None,
        changes: Vec::new(),
        skipped: Vec::new(),
    })
}

/// Continues the run in `dir` from its newest checkpoint that is whole (a damaged newer one is skipped,
/// and named in `skipped`), or from step 0 with the run's own config when it has none yet (a run
/// stopped before its first checkpoint). `overrides` (the command-line flags) apply on top of the run's
/// own config; a change to the trajectory is refused unless `allow_change`. The run directory is
/// locked first, so nothing below races another owner.
pub fn resume(
    dir: &Path,
    overrides: &ConfigLayer,
    allow_change: bool,
    spec: CheckpointSpec,
) -> Result<Session, SessionError> {
    let mut run = RunDir::open(dir)?;
    let config_path = dir.join(RunDir::CONFIG);
    let text =
        std::fs::read_to_string(&config_path).map_err(|e| RunDirError::not_a_run(dir, &e))?;
    let old = TrainConfig::from_toml(&text, &config_path)?;
    let mut config = old.clone();
    overrides.apply(&mut config);
    config.validate()?;
    let changes = config.changes_from(&old);
    if !changes.is_empty() && !allow_change {
        return Err(SessionError::ConfigChanged {
            dir: dir.display().to_string(),
            old: old.hash(),
            new: config.hash(),
            changes: describe(&changes),
        });
    }
    let (from, skipped) = resume_point(dir)?;
    if let Some((ckpt, state)) = &from {
        check_state(ckpt, state, &config, &old, allow_change)?;
    }
    let step = from.as_ref().map_or(0, |(_, state)| state.step);
    run.cut_logs_after(step)?;
    if from.is_none() {
        run.forget_evaluations_at_start()?;
    }
    if !changes.is_empty() {
        run.write_config(&config.to_toml())?;
    }
    run.event(
        step,
        "resume",
        json!({"from": from.as_ref().map(|(c, _)| c), "config_hash": config.hash(),
               "changes": describe(&changes), "skipped": skipped}),
    )?;
    let checkpointer = checkpointer(&run, &config, spec)?;
    Ok(Session {
        config,
        run,
        checkpointer,
        resume_from: from,
        changes,
        skipped,
    })
}

/// A checkpoint to resume from, with its state.
type ResumeFrom = Option<(PathBuf, TrainerState)>;

/// The newest whole checkpoint and the damaged newer ones skipped (`path: why`); no checkpoint at all
/// means step 0, while checkpoints that are all damaged are an error (starting over would lose them).
fn resume_point(dir: &Path) -> Result<(ResumeFrom, Vec<String>), SessionError> {
    let mut skipped = Vec::new();
    let steps = step_dirs(&dir.join(RunDir::CHECKPOINTS));
    for ckpt in steps.iter().rev() {
        match verify_checkpoint(ckpt) {
            Ok(state) => return Ok((Some((ckpt.clone(), state)), skipped)),
            Err(why) => {
                tracing::warn!("skipping a damaged checkpoint: {why}");
                skipped.push(why);
            }
        }
    }
    if steps.is_empty() {
        return Ok((None, skipped));
    }
    Err(SessionError::NoCheckpoint {
        dir: dir.display().to_string(),
        why: skipped.join("; "),
    })
}

/// Every `checkpoints/step-N/` directory, complete or not, oldest first.
fn step_dirs(checkpoints: &Path) -> Vec<PathBuf> {
    let mut steps: Vec<(u64, PathBuf)> = std::fs::read_dir(checkpoints)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            Some((name.strip_prefix("step-")?.parse().ok()?, e.path()))
        })
        .collect();
    steps.sort();
    steps.into_iter().map(|(_, p)| p).collect()
}

/// The checkpoint belongs to this run: its model, and the config it was written under.
fn check_state(
    ckpt: &Path,
    state: &TrainerState,
    config: &TrainConfig,
    old: &TrainConfig,
    allow_change: bool,
) -> Result<(), SessionError> {
    if state.model != config.model {
        return Err(SessionError::OtherModel {
            dir: ckpt.display().to_string(),
            found: state.model.clone(),
            expected: config.model.clone(),
        });
    }
    if state.config_hash != old.hash() && !allow_change {
        return Err(SessionError::ConfigChanged {
            dir: ckpt.display().to_string(),
            old: state.config_hash.clone(),
            new: old.hash(),
            changes: "the checkpoint was written under another config.toml".into(),
        });
    }
    Ok(())
}

/// `name: old → new; …`
pub fn describe(changes: &[(String, String, String)]) -> String {
    changes
        .iter()
        .map(|(k, a, b)| format!("{k}: {a} → {b}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Loads the resume checkpoint into `engine` (weights and optimizer state), checking its vocabulary.
pub fn load_checkpoint<E: Engine>(
    engine: &mut E,
    dir: &Path,
    state: &TrainerState,
    vocab_size: Option<usize>,
) -> Result<(), SessionError> {
    if let (Some(found), Some(expected)) = (state.vocab_size, vocab_size)
        && found != expected
    {
        return Err(SessionError::OtherVocab {
            dir: dir.display().to_string(),
            found,
            expected,
        });
    }
    engine.load(dir, true).map_err(|e| SessionError::Load {
        dir: dir.display().to_string(),
        message: e.to_string(),
    })
}
