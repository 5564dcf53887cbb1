//! Checkpoint directories (docs/architecture.md §4): `checkpoints/step-N/` and `best/`, each holding what the
//! engine writes (`config.json`, `model.safetensors`, `optimizer.safetensors`), the tokenizer files and
//! `trainer_state.json`.
//!
//! Every checkpoint is assembled in a hidden temporary directory beside its final place, fsynced, and
//! renamed into place; a checkpoint that already exists under that name is swapped out only after the
//! new one is complete. Before writing, free disk space is checked against the size of the previous
//! checkpoint (or an estimate): when it does not fit, the checkpoint is skipped with a warning and
//! nothing partial is left behind.
//!
//! `checksums` — `SHA256SUMS`, the SHA-256 of each file, written last and checked before a resume
//! or an `--init` trusts the checkpoint.
//!
//! `verify_checkpoint` — whether a checkpoint is whole before a resume trusts it.
//!
//! `export` — `memfit export`: a checkpoint as the Hugging Face directory its family loads from.

pub mod checksums;
mod disk;
pub mod export;
mod state;
mod store;
mod verify;

pub use disk::{FreeSpace, free_bytes};
pub use state::{BestRecord, RngState, SchedulerState, TrainerState};
pub use store::{
    CheckpointError, Checkpointer, SaveOutcome, checkpoint_steps, dir_size, latest_checkpoint,
    read_state,
};
pub use verify::verify_checkpoint;
