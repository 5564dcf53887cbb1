//! Exact resume: a run stopped at any step and continued ends with the same weights (bit for bit),
//! the same metrics and the same data order as an uninterrupted run; bad resumes are refused.

mod loop_support;

use loop_support::*;
use memfit_train::config::ConfigLayer;
use memfit_train::signals::StopFlag;
use memfit_train::train_loop::Finish;

fn uninterrupted() -> (LinearEngine, Vec<serde_json::Value>) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("run");
    let mut engine = LinearEngine::new();
    train(
        &root,
        &small_config(),
        &mut engine,
        None,
        StopFlag::new(),
        plenty,
    )
    .unwrap();
    (engine, read_jsonl(&root.join("metrics.jsonl")))
}

/// Continues the run in `root` with the same config in a fresh engine (a new process's view).
fn resume(
    root: &std::path::Path,
) -> Result<(memfit_train::train_loop::Summary, LinearEngine), String> {
    resume_with(root, &ConfigLayer::default(), false)
}

/// Resumes the run in `root` with `layer` over its config (`allow`: --allow-config-change).
fn resume_with(
    root: &std::path::Path,
    layer: &ConfigLayer,
    allow: bool,
) -> Result<(memfit_train::train_loop::Summary, LinearEngine), String> {
    let mut engine = LinearEngine::new();
    let s = train(
        root,
        &small_config(),
        &mut engine,
        Some((layer, allow)),
        StopFlag::new(),
        plenty,
    )?;
    Ok((s, engine))
}

fn stop_at(step: u64, root: &std::path::Path) -> Vec<Call> {
    let stop = StopFlag::new();
    let mut engine = LinearEngine::new();
    let flag = stop.clone();
    engine.after_step = Some((step, Box::new(move || flag.request())));
    let s = train(root, &small_config(), &mut engine, None, stop, plenty).unwrap();
    assert_eq!(s.finish, Finish::Stopped);
    assert_eq!(s.steps, step);
    assert!(
        root.join(format!("checkpoints/step-{step}/trainer_state.json"))
            .is_file()
    );
    engine.calls
}

#[test]
fn resume_from_every_step_is_bit_identical() {
    let (reference, reference_metrics) = uninterrupted();
    for stop in 1..12 {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("run");
        let mut calls = stop_at(stop, &root);
        // A fresh process: a new engine, its state from the checkpoint only.
        let (s, engine) = resume(&root).unwrap();
        assert_eq!(s.finish, Finish::Completed);
        assert_eq!(s.start_step, stop);
        assert_eq!(
            engine.weight_bits(),
            reference.weight_bits(),
            "stopped at step {stop}"
        );
        // The same micro-batches, in the same order, with the same seeds and scales.
        calls.extend(engine.calls);
        let key = |c: &Call| (c.seed, c.rows, c.first_label, c.loss_scale.to_bits());
        assert_eq!(
            calls.iter().map(key).collect::<Vec<_>>(),
            reference.calls.iter().map(key).collect::<Vec<_>>()
        );
        let metrics = read_jsonl(&root.join("metrics.jsonl"));
        assert_eq!(metrics.len(), reference_metrics.len());
        for (a, b) in metrics.iter().zip(&reference_metrics) {
            assert_eq!(
                (a["step"].clone(), a["loss"].clone(), a["lr"].clone()),
                (b["step"].clone(), b["loss"].clone(), b["lr"].clone())
            );
        }
    }
}

#[test]
fn logs_written_after_the_last_checkpoint_are_cut_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("run");
    stop_at(5, &root);
    // Simulate a kill after step 7 was logged but before any checkpoint of it: extra lines.
    let mut extra = std::fs::read_to_string(root.join("metrics.jsonl")).unwrap();
    extra.push_str("{\"step\":6,\"loss\":99.0}\n{\"step\":7,\"loss\":99.0}\n");
    std::fs::write(root.join("metrics.jsonl"), extra).unwrap();
    resume(&root).unwrap();
    let steps: Vec<u64> = read_jsonl(&root.join("metrics.jsonl"))
        .iter()
        .map(|m| m["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, (1..=12).collect::<Vec<_>>());
}

#[test]
fn a_changed_config_is_refused_unless_allowed_and_the_change_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("run");
    stop_at(3, &root);
    let layer = ConfigLayer {
        lr: Some(0.5),
        ..Default::default()
    };
    let err = resume_with(&root, &layer, false).err().unwrap();
    assert!(
        err.contains("lr: 0.05 → 0.5") && err.contains("--allow-config-change"),
        "{err}"
    );
    // Bookkeeping settings may change freely.
    let keep = ConfigLayer {
        keep: Some(5),
        ..Default::default()
    };
    resume_with(&root, &keep, false).unwrap();
}

#[test]
fn allowed_config_change_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("run");
    stop_at(3, &root);
    let layer = ConfigLayer {
        lr: Some(0.01),
        ..Default::default()
    };
    resume_with(&root, &layer, true).unwrap();
    let config = std::fs::read_to_string(root.join("config.toml")).unwrap();
    assert!(config.contains("lr = 0.01"));
    let resume = read_jsonl(&root.join("events.jsonl"))
        .into_iter()
        .find(|e| e["kind"] == "resume")
        .unwrap();
    assert!(resume["changes"].as_str().unwrap().contains("lr"));
}

#[test]
fn a_checkpoint_of_another_model_or_vocabulary_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("run");
    stop_at(2, &root);
    let layer = ConfigLayer {
        model: Some("t5-small".into()),
        ..Default::default()
    };
    let err = resume_with(&root, &layer, true).err().unwrap();
    assert!(err.contains("checkpoint of model \"linear-test\""), "{err}");

    let (_, ckpt) = memfit_train::checkpoint::latest_checkpoint(&root.join("checkpoints")).unwrap();
    let state = memfit_train::checkpoint::read_state(&ckpt).unwrap();
    let err = memfit_train::session::load_checkpoint(
        &mut LinearEngine::new(),
        &ckpt,
        &state,
        Some(VOCAB + 1),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("vocabulary 32") && err.contains("33"), "{err}");
}

#[test]
fn resume_of_no_run_is_refused_and_of_a_run_without_a_checkpoint_starts_at_step_0() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = LinearEngine::new();
    let err = train(
        dir.path(),
        &small_config(),
        &mut engine,
        Some((&ConfigLayer::default(), false)),
        StopFlag::new(),
        plenty,
    )
    .unwrap_err();
    assert!(err.contains("not a run directory"), "{err}");
    // A run with no checkpoint yet (stopped before its first save) is resumable: from step 0
    // (loop_run_dir.rs checks it matches the uninterrupted run).
    std::fs::write(dir.path().join("config.toml"), small_config().to_toml()).unwrap();
    let s = train(
        dir.path(),
        &small_config(),
        &mut engine,
        Some((&ConfigLayer::default(), false)),
        StopFlag::new(),
        plenty,
    )
    .unwrap();
    assert_eq!((s.start_step, s.steps), (0, 12));
}

#[test]
fn a_format_1_checkpoint_resumes_with_its_cursor_converted_to_steps() {
    let (reference, _) = uninterrupted();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("run");
    // Stopped at step 5: epoch 1, one step (two micro-batches of 3 rows) into it.
    stop_at(5, &root);
    let path = root.join("checkpoints/step-5/trainer_state.json");
    let mut state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(state["cursor"]["position"], 1);
    // As memfit wrote it before the memory guard: micro-batch positions, no micro_batch/accum.
    state["format"] = 1.into();
    state["cursor"]["position"] = 2.into();
    let obj = state.as_object_mut().unwrap();
    obj.remove("micro_batch");
    obj.remove("accum");
    std::fs::write(&path, state.to_string()).unwrap();
    let (s, engine) = resume(&root).unwrap();
    assert_eq!((s.finish, s.steps), (Finish::Completed, 12));
    assert_eq!(engine.weight_bits(), reference.weight_bits());
}
