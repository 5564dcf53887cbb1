//! SIGTERM during training: the loop finishes the step it is in, checkpoints it and reports a stop.
//! (Its own test binary: signal handlers are process-wide.)

mod loop_support;

use loop_support::*;
use memfit_train::signals::StopFlag;
use memfit_train::train_loop::Finish;

#[test]
fn sigterm_finishes_the_step_checkpoints_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("run");
    let stop = StopFlag::from_signals().unwrap();
    let mut engine = LinearEngine::new();
    engine.after_step = Some((
        5,
        Box::new(|| signal_hook::low_level::raise(signal_hook::consts::SIGTERM).unwrap()),
    ));
    let s = train(&root, &small_config(), &mut engine, None, stop, plenty).unwrap();
    assert_eq!(s.finish, Finish::Stopped);
    assert_eq!((s.steps, engine.steps_done), (5, 5));
    assert!(root.join("checkpoints/step-5/trainer_state.json").is_file());
    let events = read_jsonl(&root.join("events.jsonl"));
    let last = events.last().unwrap();
    assert_eq!(
        (last["kind"].as_str(), last["exit"].as_u64()),
        (Some("stop"), Some(75))
    );
}
