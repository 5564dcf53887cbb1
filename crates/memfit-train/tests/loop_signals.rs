//! SIGTERM at any moment of a run — a micro-batch, an optimizer step, a validation batch, a
//! generation, a checkpoint write — stops it within that unit of work with a checkpoint of the last
//! completed step, and `--resume` finishes it exactly as the uninterrupted run, evaluations included.
//! (Its own test binary, one test: signal handlers are process-wide.)

mod loop_support;

use loop_support::*;
use memfit_train::batches::derive_seed;
use memfit_train::checkpoint::{TrainerState, latest_checkpoint, read_state};
use memfit_train::config::{ConfigLayer, TrainConfig};
use memfit_train::signals::StopFlag;
use memfit_train::train_loop::Finish;
use std::path::Path;

/// 12 steps (4 an epoch), evaluations at 0 (asked for), every 2 steps and at epoch ends, checkpoints
/// every 5 steps and at epoch ends.
fn config() -> TrainConfig {
    TrainConfig {
        eval_steps: Some(2),
        eval_at_start: true,
        save_steps: Some(5),
        ..small_config()
    }
}

/// The engine calls a signal may land in; four seeded moments in each.
const KINDS: [&str; 5] = ["accumulate", "step", "eval_loss", "generate", "save"];

/// 20 call numbers (1-based): for each kind, four calls of that kind picked by seed.
fn moments(calls: &[&str]) -> Vec<usize> {
    let mut out = Vec::new();
    for (k, kind) in KINDS.iter().enumerate() {
        let of_kind: Vec<usize> = (1..=calls.len())
            .filter(|&n| calls[n - 1] == *kind)
            .collect();
        assert!(!of_kind.is_empty(), "the run makes no {kind} call");
        for j in 0..4u64 {
            let pick = derive_seed(20_261_124, &[k as u64, j]) as usize % of_kind.len();
            out.push(of_kind[pick]);
        }
    }
    out
}

fn eval_steps(root: &Path) -> Vec<u64> {
    event_steps(root, "eval")
}

fn metric_steps(root: &Path) -> Vec<u64> {
    read_jsonl(&root.join("metrics.jsonl"))
        .iter()
        .map(|m| m["step"].as_u64().unwrap())
        .collect()
}

#[test]
fn sigterm_at_20_seeded_moments_always_leaves_a_resumable_run() {
    let dir = tempfile::tempdir().unwrap();
    let stop = StopFlag::from_signals().unwrap();
    let mut reference = LinearEngine::new();
    let r = train(
        &dir.path().join("reference"),
        &config(),
        &mut reference,
        None,
        StopFlag::new(),
        plenty,
    )
    .unwrap();
    assert_eq!((r.finish, r.steps), (Finish::Completed, 12));
    let calls = reference.log.borrow().clone();
    let evals = eval_steps(&dir.path().join("reference"));
    assert_eq!(evals, vec![0, 2, 4, 6, 8, 10, 12]);

    let mut stopped_in = Vec::new();
    for (i, at) in moments(&calls).into_iter().enumerate() {
        let root = dir.path().join(format!("run-{i}"));
        let what = format!("SIGTERM in call {at} ({})", calls[at - 1]);
        stop.clear();
        let mut engine = LinearEngine::new();
        *engine.on_call.borrow_mut() = Some((
            at,
            Box::new(|| signal_hook::low_level::raise(signal_hook::consts::SIGTERM).unwrap()),
        ));
        let s = train(&root, &config(), &mut engine, None, stop.clone(), plenty).unwrap();
        assert!(stop.is_requested(), "{what}: the signal was not seen");

        // Within that unit of work: no micro-batch, validation batch or generation after the
        // signal; at most the step whose micro-batches were all done, and one checkpoint.
        let after: Vec<&str> = engine.log.borrow()[at..].to_vec();
        assert!(
            after.iter().all(|c| *c == "step" || *c == "save")
                && after.iter().filter(|c| **c == "step").count() <= 1
                && after.iter().filter(|c| **c == "save").count() <= 1,
            "{what}: the run went on with {after:?}"
        );
        let (ckpt_step, ckpt) = latest_checkpoint(&root.join("checkpoints")).unwrap();
        assert_eq!(
            ckpt_step, engine.steps_done,
            "{what}: not the last completed step"
        );
        let events = read_jsonl(&root.join("events.jsonl"));
        let last = events.last().unwrap();
        if s.finish == Finish::Stopped {
            assert_eq!(s.steps, engine.steps_done, "{what}");
            assert_eq!(
                (last["kind"].as_str(), last["exit"].as_u64()),
                (Some("stop"), Some(75)),
                "{what}"
            );
            stopped_in.push(calls[at - 1]);
        } else {
            // Only a signal once nothing but checkpoint writes is left lets it complete: the last
            // one, or best/ at the last step (a tie goes to the later evaluation) before it.
            assert!(
                calls[at..].iter().all(|c| *c == "save"),
                "{what}: completed"
            );
            assert_eq!(last["kind"], "finish", "{what}");
        }
        let state: TrainerState = read_state(&ckpt).unwrap();
        assert_eq!(state.step, ckpt_step);

        // A later --resume continues and finishes exactly as the uninterrupted run did.
        let mut resumed = LinearEngine::new();
        let layer = ConfigLayer::default();
        let r = train(
            &root,
            &config(),
            &mut resumed,
            Some((&layer, false)),
            StopFlag::new(),
            plenty,
        )
        .unwrap_or_else(|e| panic!("{what}: resume failed: {e}"));
        assert_eq!((r.finish, r.steps), (Finish::Completed, 12), "{what}");
        assert_eq!(
            resumed.weight_bits(),
            reference.weight_bits(),
            "{what}: resumed weights differ"
        );
        assert_eq!(
            eval_steps(&root),
            evals,
            "{what}: evaluations lost or doubled"
        );
        assert_eq!(metric_steps(&root), (1..=12).collect::<Vec<_>>(), "{what}");
        assert!(
            !read_state(&root.join("checkpoints/step-12"))
                .unwrap()
                .eval_pending
        );
    }
    // Every kind of moment stopped a run at least once.
    for kind in KINDS {
        assert!(
            stopped_in.contains(&kind),
            "no stop in {kind}: {stopped_in:?}"
        );
    }
}
