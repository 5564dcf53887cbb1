//! Starting a run or continuing one: the run directory, the config-hash check, the checkpoint a resume
//! starts from. The binary builds the engine and the data, then hands everything to the loop.

use crate::checkpoint::{
    CheckpointError, Checkpointer, FreeSpace, TrainerState, latest_checkpoint, read_state,
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
    #[error(
        "{dir}: no complete checkpoint to resume from (checkpoints/step-N/ with trainer_state.json)"
    )]
    NoCheckpoint { dir: String },
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
    pub resume_from: Option<(PathBuf, TrainerState)>,
    /// Trajectory settings changed by `--allow-config-change`: (name, old, new).
    pub changes: Vec<(String, String, String)>,
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
    })
}

/// Continues the run in `dir` from its newest complete checkpoint. `overrides` (the command-line flags)
/// apply on top of the run's own config; a change to the trajectory is refused unless `allow_change`.
pub fn resume(
    dir: &Path,
    overrides: &ConfigLayer,
    allow_change: bool,
    spec: CheckpointSpec,
) -> Result<Session, SessionError> {
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
    let (step, ckpt) = latest_checkpoint(&dir.join(RunDir::CHECKPOINTS)).ok_or_else(|| {
        SessionError::NoCheckpoint {
            dir: dir.display().to_string(),
        }
    })?;
    let state = read_state(&ckpt)?;
    if state.model != config.model {
        return Err(SessionError::OtherModel {
            dir: ckpt.display().to_string(),
            found: state.model,
            expected: config.model,
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
    let mut run = RunDir::open(dir)?;
    run.cut_logs_after(step)?;
    if !changes.is_empty() {
        run.write_config(&config.to_toml())?;
    }
    run.event(
        step,
        "resume",
        json!({"from": ckpt, "config_hash": config.hash(), "changes": describe(&changes)}),
    )?;
    let checkpointer = checkpointer(&run, &config, spec)?;
    Ok(Session {
        config,
        run,
        checkpointer,
        resume_from: Some((ckpt, state)),
        changes,
    })
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
