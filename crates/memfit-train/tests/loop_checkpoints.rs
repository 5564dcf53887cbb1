//! Checkpoint directories: what they hold, retention plus best, the free-disk check, and that an
//! interrupted write never replaces a good checkpoint.

mod loop_support;

use loop_support::*;
use memfit_train::checkpoint::{Checkpointer, TrainerState, checkpoint_steps};
use memfit_train::config::TrainConfig;
use memfit_train::signals::StopFlag;
use std::fs;

#[test]
fn save_steps_and_epoch_ends_with_retention_and_best() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("run");
    let config = TrainConfig {
        save_steps: Some(3),
        keep: 2,
        ..small_config()
    };
    let mut engine = LinearEngine::new();
    train(&root, &config, &mut engine, None, StopFlag::new(), plenty).unwrap();
    // Saved at 3, 4 (epoch end), 6, 8, 9, 12; the newest two are kept.
    let saved: Vec<u64> = read_jsonl(&root.join("events.jsonl"))
        .iter()
        .filter(|e| e["kind"] == "checkpoint")
        .map(|e| e["step"].as_u64().unwrap())
        .collect();
    assert_eq!(saved, vec![3, 4, 6, 8, 9, 12]);
    let kept: Vec<u64> = checkpoint_steps(&root.join("checkpoints"))
        .iter()
        .map(|(s, _)| *s)
        .collect();
    assert_eq!(kept, vec![9, 12]);
    let last = root.join("checkpoints/step-12");
    for f in [
        "config.json",
        "model.safetensors",
        "optimizer.safetensors",
        "trainer_state.json",
    ] {
        assert!(last.join(f).is_file(), "{f} missing");
    }
    let state: TrainerState =
        serde_json::from_str(&fs::read_to_string(last.join("trainer_state.json")).unwrap())
            .unwrap();
    // Format 2: the cursor counts optimizer steps (4 per epoch); the micro-batch is the configured one.
    assert_eq!((state.step, state.epoch, state.cursor.position), (12, 3, 4));
    assert_eq!((state.micro_batch, state.accum), (Some(3), Some(2)));
    assert_eq!(state.config_hash, config.hash());
    assert_eq!(state.scheduler.total_steps, 12);
    // best/ exists and holds the step its record names.
    let best: TrainerState =
        serde_json::from_str(&fs::read_to_string(root.join("best/trainer_state.json")).unwrap())
            .unwrap();
    let record = best.best.unwrap();
    assert_eq!(record.step, best.step);
    assert_eq!(record.metric, "bleu4");
    // No temporary directories are left.
    let hidden: Vec<_> = fs::read_dir(root.join("checkpoints"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(hidden.is_empty());
}

/// Collects the observer's messages.
struct Messages(Vec<String>);
impl memfit_train::train_loop::Observer for Messages {
    fn on_message(&mut self, message: &str) {
        self.0.push(message.to_string());
    }
}

#[test]
fn a_full_disk_skips_checkpoints_with_a_warning_and_no_partial_files() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("run");
    let mut engine = LinearEngine::new();
    let mut messages = Messages(Vec::new());
    let s = train_with(
        &root,
        &small_config(),
        &mut engine,
        None,
        StopFlag::new(),
        full_disk,
        None,
        &mut messages,
        &pairs(20),
    )
    .unwrap();
    assert_eq!(s.steps, 12);
    // Three step checkpoints and three tries at best/ skipped: the cause is printed once, then a
    // short line each.
    let warnings: Vec<&String> = messages
        .0
        .iter()
        .filter(|m| m.contains("skipped"))
        .collect();
    assert_eq!(warnings.len(), 6, "{warnings:?}");
    assert_eq!(
        warnings
            .iter()
            .filter(|m| m.contains("bytes needed"))
            .count(),
        1,
        "{warnings:?}"
    );
    assert!(s.last_checkpoint.is_none());
    // No model was saved: the summary says so (the binary exits 1) and names why.
    let unsaved = s.unsaved.expect("the run must not pass for saved");
    assert_eq!((unsaved.free, unsaved.newest.as_ref()), (10, None));
    assert_eq!(unsaved.path, root.join("checkpoints/step-12"));
    let message = unsaved.to_string();
    assert!(
        message.starts_with("no model was saved")
            && message.contains("bytes needed, 10 free")
            && message.contains("no checkpoint of this run exists"),
        "{message}"
    );
    let events = read_jsonl(&root.join("events.jsonl"));
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "checkpoint_skipped" && e["free_bytes"] == 10)
    );
    let last = events.last().unwrap();
    assert_eq!(
        (last["kind"].as_str(), last["reason"].as_str()),
        (Some("error"), Some("checkpoint_skipped"))
    );
    assert!(!events.iter().any(|e| e["kind"] == "finish"));
    assert!(
        fs::read_dir(root.join("checkpoints"))
            .unwrap()
            .next()
            .is_none()
    );
    assert!(!root.join("best").exists());
}

#[test]
fn a_failed_write_leaves_the_previous_checkpoint_intact() {
    let dir = tempfile::tempdir().unwrap();
    let ckpts = dir.path().join("checkpoints");
    let mut cp = Checkpointer::new(
        ckpts.clone(),
        dir.path().join("best"),
        3,
        Vec::new(),
        plenty,
        1,
    )
    .unwrap();
    let mut engine = LinearEngine::new();
    let mut state = state_at(4);
    cp.save_step(&mut engine, &state).unwrap();
    let good = fs::read(ckpts.join("step-4/model.safetensors")).unwrap();
    // The same step written again (a resumed run re-saving it) fails half-way.
    engine.w[0] += 1.0;
    engine.fail_save = true;
    assert!(cp.save_step(&mut engine, &state).is_err());
    assert_eq!(
        fs::read(ckpts.join("step-4/model.safetensors")).unwrap(),
        good
    );
    assert_eq!(
        fs::read_dir(&ckpts).unwrap().count(),
        1,
        "no temporary directory left"
    );
    // A later step fails too: the older one stays the newest complete checkpoint.
    state.step = 5;
    assert!(cp.save_step(&mut engine, &state).is_err());
    assert_eq!(checkpoint_steps(&ckpts).last().unwrap().0, 4);
}

#[test]
fn leftovers_of_a_killed_write_are_cleaned_and_a_swapped_out_checkpoint_restored() {
    let dir = tempfile::tempdir().unwrap();
    let ckpts = dir.path().join("checkpoints");
    fs::create_dir_all(ckpts.join(".tmp-step-9-123")).unwrap();
    fs::write(ckpts.join(".tmp-step-9-123/model.safetensors"), b"partial").unwrap();
    // Killed between "move the old best aside" and "move the new one in".
    fs::create_dir_all(dir.path().join(".old-best-77")).unwrap();
    fs::write(dir.path().join(".old-best-77/trainer_state.json"), b"{}").unwrap();
    Checkpointer::new(
        ckpts.clone(),
        dir.path().join("best"),
        3,
        Vec::new(),
        plenty,
        1,
    )
    .unwrap();
    assert!(!ckpts.join(".tmp-step-9-123").exists());
    assert!(dir.path().join("best/trainer_state.json").is_file());
    assert!(!dir.path().join(".old-best-77").exists());
}

#[test]
fn tokenizer_files_are_written_into_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let tok = memfit_train::text::CheckpointFile {
        name: "tokenizer.json",
        bytes: b"{\"fake\": true}".to_vec(),
    };
    let mut cp = Checkpointer::new(
        dir.path().join("c"),
        dir.path().join("best"),
        1,
        vec![tok],
        plenty,
        1,
    )
    .unwrap();
    cp.save_step(&mut LinearEngine::new(), &state_at(1))
        .unwrap();
    assert_eq!(
        fs::read(dir.path().join("c/step-1/tokenizer.json")).unwrap(),
        b"{\"fake\": true}"
    );
}

fn state_at(step: u64) -> TrainerState {
    TrainerState {
        format: TrainerState::FORMAT,
        epoch: 0,
        step,
        cursor: memfit_data::Cursor {
            epoch: 0,
            position: step,
            seed: 1,
        },
        rng: memfit_train::checkpoint::RngState {
            seed: 1,
            scheme: "test".into(),
        },
        scheduler: memfit_train::checkpoint::SchedulerState {
            kind: "onecycle".into(),
            total_steps: 10,
            step,
            next_lr: 0.1,
        },
        best: None,
        config_hash: "0".into(),
        model: "linear-test".into(),
        vocab_size: Some(VOCAB),
        first_loss: None,
        last_loss: None,
        score_before: None,
        micro_batch: None,
        accum: None,
        eval_pending: false,
    }
}
