//! The run directory's promises at the loop's level: a run is resumable from its first moment (no
//! checkpoint yet → step 0, same data order), a damaged newest checkpoint falls back to the previous
//! whole one, and a stop whose checkpoint finds the disk full says where `--resume` continues.

mod loop_support;

use std::cell::Cell;
use std::path::Path;

use loop_support::*;
use memfit_train::config::{ConfigLayer, TrainConfig};
use memfit_train::session;
use memfit_train::signals::StopFlag;
use memfit_train::train_loop::{Finish, Observer, Summary};

fn config() -> TrainConfig {
    TrainConfig {
        save_steps: Some(2),
        keep: 3,
        ..small_config()
    }
}

/// Requests a stop once `at` steps are done; with `fill_disk`, the disk is full from then on.
struct StopAt {
    at: u64,
    fill_disk: bool,
    stop: StopFlag,
    messages: Vec<String>,
}

thread_local! {
    // Per test thread: the loop runs on the test's own thread.
    static DISK_FULL: Cell<bool> = const { Cell::new(false) };
}

fn filling_disk(_: &Path) -> std::io::Result<u64> {
    Ok(if DISK_FULL.get() { 10 } else { u64::MAX / 2 })
}

impl Observer for StopAt {
    fn on_step(&mut self, m: &memfit_train::metrics::StepMetrics) {
        if m.step == self.at {
            self.stop.request();
            DISK_FULL.set(self.fill_disk);
        }
    }
    fn on_message(&mut self, message: &str) {
        self.messages.push(message.to_string());
    }
}

/// A new run in `root` stopped after `at` steps: its summary and the messages it showed.
fn stopped_at(root: &Path, at: u64, fill_disk: bool) -> (Summary, Vec<String>) {
    let stop = StopFlag::new();
    let mut observer = StopAt {
        at,
        fill_disk,
        stop: stop.clone(),
        messages: Vec::new(),
    };
    let mut engine = LinearEngine::new();
    let s = train_with(
        root,
        &config(),
        &mut engine,
        None,
        stop,
        filling_disk,
        None,
        &mut observer,
        &pairs(20),
    )
    .unwrap();
    DISK_FULL.set(false);
    assert_eq!(s.finish, Finish::Stopped);
    (s, observer.messages)
}

fn uninterrupted_bits() -> Vec<u32> {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = LinearEngine::new();
    let s = train(
        &dir.path().join("run"),
        &config(),
        &mut engine,
        None,
        StopFlag::new(),
        plenty,
    )
    .unwrap();
    assert_eq!(s.finish, Finish::Completed);
    engine.weight_bits()
}

fn resume(root: &Path, engine: &mut LinearEngine) -> memfit_train::train_loop::Summary {
    train(
        root,
        &config(),
        engine,
        Some((&ConfigLayer::default(), false)),
        StopFlag::new(),
        plenty,
    )
    .unwrap()
}

#[test]
fn a_run_with_no_checkpoint_yet_resumes_from_step_0_in_the_same_order() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("run");
    // Killed after the run directory was made, before the loop wrote anything.
    drop(session::start(config(), &root, spec(plenty)).unwrap());
    let mut engine = LinearEngine::new();
    let s = resume(&root, &mut engine);
    assert_eq!((s.finish, s.steps), (Finish::Completed, 12));
    assert_eq!(
        engine.weight_bits(),
        uninterrupted_bits(),
        "same config, same data order"
    );
    let events = read_jsonl(&root.join("events.jsonl"));
    let resumed = events.iter().find(|e| e["kind"] == "resume").unwrap();
    assert_eq!(
        (resumed["step"].as_u64(), resumed["from"].is_null()),
        (Some(0), true)
    );
}

/// A run stopped at step 9 whose step-9 model `damage` changes, resumed: it falls back to step 8
/// and ends as an uninterrupted run; why step 9 was skipped.
fn resumed_past_a_damaged_step_9(damage: impl Fn(&Path)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("run");
    stopped_at(&root, 9, false);
    damage(&root.join("checkpoints/step-9/model.safetensors"));
    let mut engine = LinearEngine::new();
    let s = resume(&root, &mut engine);
    assert_eq!((s.finish, s.steps), (Finish::Completed, 12));
    assert_eq!(engine.weight_bits(), uninterrupted_bits());
    let events = read_jsonl(&root.join("events.jsonl"));
    let resumed = events.iter().rfind(|e| e["kind"] == "resume").unwrap();
    assert_eq!(resumed["step"].as_u64(), Some(8));
    let skipped = resumed["skipped"][0].as_str().unwrap();
    assert!(skipped.contains("step-9"), "{skipped}");
    skipped.to_string()
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_to_the_previous_whole_one() {
    // The stop's checkpoint, cut short as a crash or a full disk leaves a file.
    let skipped = resumed_past_a_damaged_step_9(|model| {
        let bytes = std::fs::read(model).unwrap();
        std::fs::write(model, &bytes[..bytes.len() - 3]).unwrap();
    });
    assert!(
        skipped.contains("bytes where the header describes"),
        "{skipped}"
    );
}

/// Flips one bit near the end of `path`, its length unchanged.
fn flip_a_bit(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let near_end = bytes.len() - 2;
    bytes[near_end] ^= 0x04;
    std::fs::write(path, &bytes).unwrap();
}

#[test]
fn a_bit_flip_in_the_newest_checkpoint_falls_back_to_the_previous_one() {
    let skipped = resumed_past_a_damaged_step_9(flip_a_bit);
    assert!(
        skipped.contains("model.safetensors: its SHA-256 differs"),
        "{skipped}"
    );
}

#[test]
fn damaged_optimizer_states_in_both_resumable_checkpoints_are_named_not_skipped_past() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("run");
    stopped_at(&root, 9, false);
    // Retention keeps the optimizer's state in the two newest (step-8, step-9) only: the older
    // step-6 cannot be resumed from exactly, so nothing can.
    for step in ["step-8", "step-9"] {
        flip_a_bit(
            &root
                .join("checkpoints")
                .join(step)
                .join("optimizer.safetensors"),
        );
    }
    let e = session::resume(&root, &ConfigLayer::default(), false, spec(plenty))
        .err()
        .unwrap();
    let text = e.to_string();
    for named in [
        "no checkpoint is whole",
        "step-9",
        "step-8",
        "step-6",
        "optimizer",
    ] {
        assert!(text.contains(named), "{named:?} not in {text}");
    }
    assert!(e.is_bad_input());
}

#[test]
fn a_run_whose_checkpoints_are_all_damaged_is_not_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("run");
    stopped_at(&root, 3, false);
    for step in ["step-2", "step-3"] {
        std::fs::write(
            root.join("checkpoints")
                .join(step)
                .join("trainer_state.json"),
            "{",
        )
        .unwrap();
    }
    let e = session::resume(&root, &ConfigLayer::default(), false, spec(plenty))
        .err()
        .unwrap();
    let text = e.to_string();
    assert!(
        text.contains("no checkpoint is whole") && text.contains("step-2"),
        "{text}"
    );
    assert!(e.is_bad_input());
}

#[test]
fn a_stop_without_room_for_its_checkpoint_says_where_resume_continues() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("run");
    // Steps 2 and 4 are saved; the disk fills at step 5, where the stop comes.
    let (_, messages) = stopped_at(&root, 5, true);
    let events = read_jsonl(&root.join("events.jsonl"));
    let stop_event = events.iter().find(|e| e["kind"] == "stop").unwrap();
    assert_eq!(stop_event["exit"], 75);
    assert!(stop_event["checkpoint"].is_null());
    assert_eq!(stop_event["resumes_from_step"], 4);
    let said = messages.join("\n");
    assert!(
        said.contains("no room to checkpoint step 5") && said.contains("continues from step 4"),
        "{said}"
    );
    assert!(!said.contains("checkpointed step"), "{said}");
    let mut engine = LinearEngine::new();
    let s = resume(&root, &mut engine);
    assert_eq!((s.finish, s.steps), (Finish::Completed, 12));
    assert_eq!(engine.weight_bits(), uninterrupted_bits());
}
