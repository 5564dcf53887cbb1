//! The loop under the memory guard, with readings fed by the test: a soft-limit crossing halves the
//! micro-batch (effective batch and losses unchanged; at micro-batch 1 the run goes on), a hard one
//! checkpoints and stops (at a step boundary or in the middle of a step), and a resume continues at
//! the lowered micro-batch.

mod loop_support;

use loop_support::*;
use memfit_train::checkpoint::TrainerState;
use memfit_train::config::{ConfigLayer, TrainConfig};
use memfit_train::eval::EvalPhase;
use memfit_train::memory_guard::{
    GuardSettings, MemoryGuard, MemoryReading, MemorySampler, OVERRIDE_FILE,
};
use memfit_train::metrics::StepMetrics;
use memfit_train::signals::StopFlag;
use memfit_train::train_loop::{Finish, Observer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const MIB: u64 = 1 << 20;
/// Budget 1000 MiB: soft limit 850 MiB, hard 950 MiB (the default fractions).
const BUDGET: u64 = 1000 * MIB;
const CALM: u64 = 500 * MIB;
const OVER_SOFT: u64 = 900 * MIB;
const OVER_HARD: u64 = 960 * MIB;

/// Relative tolerance for "the same loss" across different micro-batch cuts (f32 sums in another order).
const TOL: f64 = 1e-5;

/// 24 rows whose targets have 2..=7 tokens, so micro-batches carry unequal token counts.
fn varied_rows() -> InMemoryPairs {
    in_memory(
        (0..24u32)
            .map(|i| {
                let n = 2 + (i * 7 % 6) as usize;
                let tgt: Vec<u32> = (0..n as u32 - 1)
                    .map(|j| 2 + (i + 3 * j) % 29)
                    .chain([1])
                    .collect();
                (vec![2 + i % 7, 3 + i % 5, 1], tgt)
            })
            .collect(),
    )
}

/// 4 × 2 = effective batch 8: three steps per epoch of 24 rows, two epochs.
fn config(batch: usize, accum: usize) -> TrainConfig {
    TrainConfig {
        batch,
        accum,
        epochs: 2,
        memory_budget_bytes: Some(BUDGET),
        ..small_config()
    }
}

fn fed(value: &Arc<AtomicU64>) -> impl MemorySampler + 'static {
    let v = Arc::clone(value);
    move || MemoryReading {
        host_bytes: v.load(Ordering::SeqCst),
        gpu_bytes: None,
    }
}

/// A guard whose thread samples once at start and then (period one hour) leaves the readings to the
/// loop's step-boundary checks, so the step a verdict lands on is deterministic.
fn guard(value: &Arc<AtomicU64>, override_file: Option<PathBuf>) -> MemoryGuard {
    let settings = GuardSettings {
        budget_bytes: Some(BUDGET),
        period: Duration::from_secs(3600),
        override_file,
        ..GuardSettings::for_run(&config(4, 2), Path::new("/nonexistent"))
    };
    MemoryGuard::start(settings, fed(value)).unwrap()
}

/// Runs a closure after the optimizer step with the given number and records the bar's messages.
struct OnStep<F: FnMut(u64)> {
    f: F,
    messages: Vec<String>,
}

impl<F: FnMut(u64)> Observer for OnStep<F> {
    fn on_step(&mut self, m: &StepMetrics) {
        (self.f)(m.step);
    }
    fn on_message(&mut self, message: &str) {
        self.messages.push(message.to_owned());
    }
}

fn quiet_engine() -> LinearEngine {
    let mut e = LinearEngine::new();
    e.noise = false;
    e
}

/// A run on the varied rows: a new one, or (`resume`) the continuation of the run in `root`.
fn go(
    root: &Path,
    config: &TrainConfig,
    engine: &mut LinearEngine,
    resume: bool,
    guard: Option<&MemoryGuard>,
    observer: &mut dyn Observer,
) -> memfit_train::train_loop::Summary {
    let layer = ConfigLayer::default();
    train_with(
        root,
        config,
        engine,
        resume.then_some((&layer, false)),
        StopFlag::new(),
        plenty,
        guard,
        observer,
        &varied_rows(),
    )
    .unwrap()
}

/// An observer that makes the sampler return `reading` from the end of step `step` on.
fn reading_at(value: &Arc<AtomicU64>, step: u64, reading: u64) -> OnStep<impl FnMut(u64)> {
    let v = Arc::clone(value);
    OnStep {
        f: move |s| {
            if s == step {
                v.store(reading, Ordering::SeqCst);
            }
        },
        messages: vec![],
    }
}

/// An observer that does nothing on a step.
fn watch() -> OnStep<fn(u64)> {
    OnStep {
        f: |_| {},
        messages: vec![],
    }
}

/// A run under a guard whose sampler returns `value` (see [`go`]); the summary and the engine.
fn guarded(
    root: &Path,
    config: &TrainConfig,
    value: &Arc<AtomicU64>,
    resume: bool,
    observer: &mut dyn Observer,
) -> (memfit_train::train_loop::Summary, LinearEngine) {
    let g = guard(value, None);
    let mut engine = quiet_engine();
    let s = go(root, config, &mut engine, resume, Some(&g), observer);
    (s, engine)
}

/// A temporary run directory and the memory reading its guard's sampler returns.
struct Fixture {
    dir: tempfile::TempDir,
    root: PathBuf,
    value: Arc<AtomicU64>,
}

fn fixture(reading: u64) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("run");
    Fixture {
        dir,
        root,
        value: Arc::new(AtomicU64::new(reading)),
    }
}

/// A plain run (no guard) of `config`; its metrics lines.
fn reference(dir: &Path, config: &TrainConfig) -> Vec<serde_json::Value> {
    let root = dir.join(format!(
        "ref-{}x{}-{}",
        config.batch, config.accum, config.seed
    ));
    let mut engine = quiet_engine();
    let s = go(&root, config, &mut engine, false, None, &mut watch());
    assert_eq!(s.finish, Finish::Completed);
    read_jsonl(&root.join("metrics.jsonl"))
}

fn events(root: &Path, kind: &str) -> Vec<serde_json::Value> {
    read_jsonl(&root.join("events.jsonl"))
        .into_iter()
        .filter(|e| e["kind"] == kind)
        .collect()
}

fn state(root: &Path, step: u64) -> TrainerState {
    let path = root.join(format!("checkpoints/step-{step}/trainer_state.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn over_the_soft_limit_the_micro_batch_halves_and_the_losses_do_not_change() {
    let Fixture { dir, root, value } = fixture(CALM);
    let mut observer = reading_at(&value, 2, OVER_SOFT);
    let (s, engine) = guarded(&root, &config(4, 2), &value, false, &mut observer);
    assert_eq!((s.finish, s.steps), (Finish::Completed, 6));

    let downgrades = events(&root, "downgrade");
    assert_eq!(downgrades.len(), 1, "the ratchet holds at a steady RSS");
    let d = &downgrades[0];
    assert_eq!(d["step"], 2);
    assert_eq!(
        (
            &d["old_micro_batch"],
            &d["new_micro_batch"],
            &d["old_accum"],
            &d["new_accum"]
        ),
        (&4.into(), &2.into(), &2.into(), &4.into())
    );
    assert_eq!(d["rss_bytes"], OVER_SOFT);
    assert_eq!(d["limits"]["soft_bytes"], 850 * MIB);
    assert_eq!(d["limits"]["hard_bytes"], 950 * MIB);
    assert!(
        observer
            .messages
            .iter()
            .any(|m| m.contains("micro-batch 4 × 2 → 2 × 4")),
        "{:?}",
        observer.messages
    );
    // The downgrade's checkpoint records the new micro-batch for a resume.
    let st = state(&root, 2);
    assert_eq!((st.micro_batch, st.accum), (Some(2), Some(4)));

    let lines = read_jsonl(&root.join("metrics.jsonl"));
    let shape: Vec<(u64, u64)> = lines
        .iter()
        .map(|m| {
            (
                m["micro_batch"].as_u64().unwrap(),
                m["accum"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(shape, vec![(4, 2), (4, 2), (2, 4), (2, 4), (2, 4), (2, 4)]);
    // Calls: 2 steps × 2 micro-batches of 4 rows, then 4 steps × 4 micro-batches of 2 rows.
    let rows: Vec<usize> = engine.calls.iter().map(|c| c.rows).collect();
    assert_eq!(rows, [vec![4; 4], vec![2; 16]].concat());

    // The same rows per step as a run started at 2 × 4, weighted by tokens: the same losses.
    let small = reference(dir.path(), &config(2, 4));
    let big = reference(dir.path(), &config(4, 2));
    let got = losses(&lines);
    assert!(max_rel_diff(&got, &losses(&small)) < TOL);
    assert!(max_rel_diff(&got, &losses(&big)) < TOL);
    // The tolerance tells runs apart: another data order (seed) is far outside it.
    let other = reference(
        dir.path(),
        &TrainConfig {
            seed: 7,
            ..config(2, 4)
        },
    );
    assert!(max_rel_diff(&got, &losses(&other)) > 100.0 * TOL);
}

#[test]
fn over_the_hard_limit_at_a_step_end_it_checkpoints_stops_and_resumes_smaller() {
    let Fixture { dir, root, value } = fixture(CALM);
    let mut observer = reading_at(&value, 2, OVER_HARD);
    let (s, engine) = guarded(&root, &config(4, 2), &value, false, &mut observer);
    assert_eq!(
        (s.finish, s.steps, engine.steps_done),
        (Finish::Stopped, 2, 2)
    );
    let stop = events(&root, "stop");
    assert_eq!(stop.len(), 1);
    assert_eq!(stop[0]["reason"], "memory_hard_limit");
    assert_eq!(stop[0]["exit"], 75);
    assert_eq!(stop[0]["rss_bytes"], OVER_HARD);
    assert_eq!(stop[0]["resume_micro_batch"], 2);
    assert!(stop[0]["abandoned_step"].is_null());
    assert_eq!(state(&root, 2).micro_batch, Some(2));

    // Resume (memory fine again): same config, no config-change complaint, at micro-batch 2.
    let calm = Arc::new(AtomicU64::new(CALM));
    let (s, engine) = guarded(&root, &config(4, 2), &calm, true, &mut watch());
    assert_eq!((s.finish, s.start_step, s.steps), (Finish::Completed, 2, 6));
    assert!(engine.calls.iter().all(|c| c.rows == 2));
    let lines = read_jsonl(&root.join("metrics.jsonl"));
    assert_eq!(lines.len(), 6);
    assert!(lines[2..].iter().all(|m| m["micro_batch"] == 2));
    let small = reference(dir.path(), &config(2, 4));
    assert!(max_rel_diff(&losses(&lines), &losses(&small)) < TOL);
}

#[test]
fn over_the_hard_limit_mid_step_the_step_is_abandoned_and_redone_on_resume() {
    let Fixture { dir, root, value } = fixture(CALM);
    let g = Arc::new(guard(&value, None));
    let mut engine = quiet_engine();
    // The 5th micro-batch is the first of step 3: memory jumps while it runs, the thread's reading
    // (taken here, synchronously) latches the hard verdict before the 6th.
    let (v, gg) = (Arc::clone(&value), Arc::clone(&g));
    engine.after_accumulate = Some((
        5,
        Box::new(move || {
            v.store(OVER_HARD, Ordering::SeqCst);
            gg.sample_now();
        }),
    ));
    let s = go(
        &root,
        &config(4, 2),
        &mut engine,
        false,
        Some(&g),
        &mut watch(),
    );
    assert_eq!(
        (s.finish, s.steps, engine.steps_done),
        (Finish::Stopped, 2, 2)
    );
    assert_eq!(
        engine.calls.len(),
        5,
        "the step's second micro-batch never ran"
    );
    let stop = &events(&root, "stop")[0];
    assert_eq!(stop["reason"], "memory_hard_limit");
    assert_eq!(stop["abandoned_step"]["step"], 3);
    assert_eq!(stop["abandoned_step"]["micro_batches_done"], 1);
    assert_eq!(stop["abandoned_step"]["of"], 2);
    // Nothing of the abandoned step was applied or logged.
    assert_eq!(read_jsonl(&root.join("metrics.jsonl")).len(), 2);
    let st = state(&root, 2);
    assert_eq!(
        (st.step, st.cursor.position, st.micro_batch),
        (2, 2, Some(2))
    );

    let mut engine = quiet_engine();
    let s = go(&root, &config(4, 2), &mut engine, true, None, &mut watch());
    assert_eq!((s.finish, s.steps), (Finish::Completed, 6));
    let small = reference(dir.path(), &config(2, 4));
    let lines = read_jsonl(&root.join("metrics.jsonl"));
    assert!(max_rel_diff(&losses(&lines), &losses(&small)) < TOL);
}

#[test]
fn a_budget_written_into_the_run_directory_takes_effect_at_the_next_step() {
    let Fixture {
        dir: _dir,
        root,
        value,
    } = fixture(500 * MIB);
    // Configured budget 2000 MiB: 500 MiB is far below it; the override brings the budget to 560 MiB.
    let g = MemoryGuard::start(
        GuardSettings {
            budget_bytes: Some(2000 * MIB),
            period: Duration::from_secs(3600),
            ..GuardSettings::for_run(&config(4, 2), &root)
        },
        fed(&value),
    )
    .unwrap();
    let file = root.join(OVERRIDE_FILE);
    let mut observer = OnStep {
        f: |step| {
            if step == 3 {
                let tmp = file.with_extension("tmp");
                std::fs::write(&tmp, "560MiB\n").unwrap();
                std::fs::rename(&tmp, &file).unwrap();
            }
        },
        messages: vec![],
    };
    let mut engine = quiet_engine();
    let config = TrainConfig {
        memory_budget_bytes: Some(2000 * MIB),
        ..config(4, 2)
    };
    let s = go(&root, &config, &mut engine, false, Some(&g), &mut observer);
    assert_eq!(s.finish, Finish::Completed);
    let budget = events(&root, "budget");
    assert_eq!(budget.len(), 1);
    assert_eq!(
        (&budget[0]["step"], &budget[0]["budget_bytes"]),
        (&3.into(), &(560 * MIB).into())
    );
    let d = events(&root, "downgrade");
    assert_eq!(d.len(), 1);
    assert_eq!(
        (&d[0]["step"], &d[0]["new_micro_batch"]),
        (&3.into(), &2.into())
    );
    assert!(
        observer
            .messages
            .iter()
            .any(|m| m.contains("memory budget now"))
    );
}

/// At micro-batch 1 the soft limit has nothing to halve: the run goes on (one `pressure` event, the
/// trigger moved up as after a downgrade), and the hard limit stops it once memory keeps growing.
#[test]
fn soft_at_a_micro_batch_of_one_goes_on_until_the_hard_limit() {
    let Fixture {
        dir: _dir,
        root,
        value,
    } = fixture(OVER_SOFT);
    let (s, _) = guarded(&root, &config(1, 8), &value, false, &mut watch());
    assert_eq!((s.finish, s.steps), (Finish::Completed, 6));
    let pressure = events(&root, "pressure");
    assert_eq!(pressure.len(), 1, "{pressure:?}");
    assert_eq!(pressure[0]["rss_bytes"], OVER_SOFT);
    assert!(events(&root, "downgrade").is_empty() && events(&root, "stop").is_empty());

    let Fixture {
        dir: _dir,
        root,
        value,
    } = fixture(CALM);
    let mut observer = OnStep {
        f: {
            let v = Arc::clone(&value);
            move |step| match step {
                2 => v.store(OVER_SOFT, Ordering::SeqCst),
                4 => v.store(OVER_HARD, Ordering::SeqCst),
                _ => {}
            }
        },
        messages: vec![],
    };
    let (s, _) = guarded(&root, &config(1, 8), &value, false, &mut observer);
    assert_eq!((s.finish, s.steps), (Finish::Stopped, 4));
    assert_eq!(events(&root, "pressure")[0]["step"], 2);
    let stop = &events(&root, "stop")[0];
    assert_eq!(stop["reason"], "memory_hard_limit");
    assert_eq!(stop["resume_micro_batch"], 1);
    assert!(
        observer
            .messages
            .iter()
            .any(|m| m.contains("nothing left to halve"))
    );
}

/// The run's metrics, each step's loss within [`TOL`] of `want`'s.
fn same_losses(root: &Path, want: &[serde_json::Value]) -> Vec<serde_json::Value> {
    let got = read_jsonl(&root.join("metrics.jsonl"));
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        let (a, b) = (g["loss"].as_f64().unwrap(), w["loss"].as_f64().unwrap());
        assert!(
            (a - b).abs() <= TOL * b.abs(),
            "step {}: {a} vs {b}",
            g["step"]
        );
    }
    got
}

/// A device out of memory (injected: the engine refuses micro-batches of more than 1 row) halves
/// the micro-batch and redoes the step, with the last completed step checkpointed first; the
/// effective batch and every step's loss stay those of a run that started at micro-batch 1.
#[test]
fn a_device_out_of_memory_halves_the_micro_batch_and_redoes_the_step() {
    let f = fixture(CALM);
    let cfg = config(4, 2);
    let want = reference(f.dir.path(), &config(1, 8));
    let mut engine = quiet_engine();
    engine.device_rows = Some(1);
    let mut obs = watch();
    let s = go(&f.root, &cfg, &mut engine, false, None, &mut obs);
    assert_eq!(s.finish, Finish::Completed);
    let got = same_losses(&f.root, &want);
    for g in &got {
        assert_eq!(g["micro_batch"], 1);
    }
    let downgrades = events(&f.root, "downgrade");
    assert_eq!(downgrades.len(), 2, "4 → 2 → 1: {downgrades:?}");
    for (d, (old, new)) in downgrades.iter().zip([(4, 2), (2, 1)]) {
        assert_eq!(d["reason"], "device_out_of_memory");
        assert_eq!(
            (d["old_micro_batch"].as_u64(), d["new_micro_batch"].as_u64()),
            (Some(old), Some(new))
        );
        assert_eq!(d["effective_batch"], 8);
        // the last completed step (here the start) was checkpointed before the step was redone
        let ckpt = d["checkpoint"].as_str().expect("a checkpoint");
        assert!(Path::new(ckpt).ends_with("step-0"), "{ckpt}");
    }
    assert!(
        obs.messages.iter().any(|m| m.contains("ran out of memory")),
        "{:?}",
        obs.messages
    );
}

/// Out of device memory at micro-batch 1: checkpointed, stopped resumable (exit 75's event), and a
/// resume on a device with room continues exactly.
#[test]
fn out_of_device_memory_at_micro_batch_1_stops_resumable() {
    stopped_then_resumed(
        config(1, 8),
        |e| e.device_rows = Some(0),
        |f, stop| {
            assert_eq!(stop["step"], 0);
            assert!(
                f.root.join("checkpoints/step-0").is_dir(),
                "the start was checkpointed"
            );
        },
    );
}

/// A run of `cfg` whose engine `limit` leaves no room: it stops for the device's memory (exit 75's
/// event, which `stopped` checks further), then a resume on a device with room finishes with the
/// uninterrupted run's losses. The fixture and the stop event.
fn stopped_then_resumed(
    cfg: TrainConfig,
    limit: impl FnOnce(&mut LinearEngine),
    stopped: impl FnOnce(&Fixture, &serde_json::Value),
) -> (Fixture, serde_json::Value) {
    let f = fixture(CALM);
    let want = reference(f.dir.path(), &cfg);
    let mut first = quiet_engine();
    limit(&mut first);
    let s = go(&f.root, &cfg, &mut first, false, None, &mut watch());
    assert_eq!(s.finish, Finish::Stopped);
    let stop = events(&f.root, "stop");
    assert_eq!(stop.len(), 1);
    assert_eq!(
        (stop[0]["reason"].as_str(), stop[0]["exit"].as_u64()),
        (Some("device_out_of_memory"), Some(75))
    );
    stopped(&f, &stop[0]);
    let s = go(&f.root, &cfg, &mut quiet_engine(), true, None, &mut watch());
    assert_eq!(s.finish, Finish::Completed);
    same_losses(&f.root, &want);
    let stop = stop[0].clone();
    (f, stop)
}

/// The device out of memory while evaluating (injected: more than 1 row an evaluation batch): the
/// evaluation batch halves (4 → 2 → 1) and the evaluation is redone; training keeps its micro-batch
/// and its losses, and the validation losses are those of an evaluation that fit at once (to f32
/// sums in another order).
#[test]
fn a_device_out_of_memory_in_evaluation_halves_the_evaluation_batch() {
    let f = fixture(CALM);
    let cfg = config(4, 2);
    let want = reference(f.dir.path(), &cfg);
    let mut engine = quiet_engine();
    engine.eval_device_rows = Some(1);
    let mut obs = watch();
    let s = go(&f.root, &cfg, &mut engine, false, None, &mut obs);
    assert_eq!(s.finish, Finish::Completed);
    for g in same_losses(&f.root, &want) {
        assert_eq!(g["micro_batch"], 4, "training kept its micro-batch");
    }
    let downgrades = events(&f.root, "downgrade");
    assert_eq!(downgrades.len(), 2, "4 → 2 → 1 once: {downgrades:?}");
    for (d, (old, new)) in downgrades.iter().zip([(4, 2), (2, 1)]) {
        assert_eq!(
            (d["reason"].as_str(), d["phase"].as_str()),
            (Some("device_out_of_memory"), Some("evaluation"))
        );
        assert_eq!(
            (d["old_eval_batch"].as_u64(), d["new_eval_batch"].as_u64()),
            (Some(old), Some(new))
        );
    }
    let reference_root = f.dir.path().join(format!("ref-4x2-{}", cfg.seed));
    let reference_evals = events(&reference_root, "eval");
    let evals = events(&f.root, "eval");
    assert_eq!(evals.len(), reference_evals.len());
    for (a, b) in evals.iter().zip(&reference_evals) {
        let (a, b) = (
            a["valid_loss"].as_f64().unwrap(),
            b["valid_loss"].as_f64().unwrap(),
        );
        assert!((a - b).abs() <= TOL * b.abs(), "valid loss {a} vs {b}");
    }
    assert!(
        obs.messages
            .iter()
            .any(|m| m.contains("evaluation batch 4 → 2")),
        "{:?}",
        obs.messages
    );
}

/// Out of device memory evaluating one row at a time: the step is checkpointed with its
/// evaluation pending, the run stops resumable (exit 75's event), and a resume on a device with
/// room runs that evaluation and finishes as the uninterrupted run.
#[test]
fn out_of_device_memory_evaluating_one_row_stops_resumable() {
    let (f, stop) = stopped_then_resumed(
        config(4, 2),
        |e| e.eval_device_rows = Some(0),
        |f, stop| {
            let step = stop["step"].as_u64().unwrap();
            assert!(
                state(&f.root, step).eval_pending,
                "checkpointed with its evaluation pending"
            );
        },
    );
    let step = stop["step"].as_u64().unwrap();
    let evals = events(&f.root, "eval");
    assert!(
        evals.iter().any(|e| e["step"].as_u64() == Some(step)),
        "the pending evaluation ran"
    );
}

/// Makes the sampler return `reading` once the evaluation at `step` has done its first batch.
struct RisingInEvaluation {
    value: Arc<AtomicU64>,
    step: u64,
    reading: u64,
}

impl Observer for RisingInEvaluation {
    fn on_eval_progress(&mut self, step: u64, _phase: EvalPhase, done: usize, _total: usize) {
        if step == self.step && done > 0 {
            self.value.store(self.reading, Ordering::SeqCst);
        }
    }
}

/// Over the hard limit in the middle of an evaluation (the reading rises after its first batch):
/// the guard's reading between evaluation batches abandons it, the step is checkpointed with the
/// evaluation pending at half the micro-batch, and the run stops resumable (exit 75's event); a
/// resume runs that evaluation once and finishes with the uninterrupted run's losses.
#[test]
fn over_the_hard_limit_while_evaluating_it_stops_and_the_resume_evaluates() {
    let Fixture { dir, root, value } = fixture(CALM);
    let cfg = config(4, 2);
    let want = reference(dir.path(), &cfg);
    let mut observer = RisingInEvaluation {
        value: Arc::clone(&value),
        step: 3,
        reading: OVER_HARD,
    };
    let (s, _) = guarded(&root, &cfg, &value, false, &mut observer);
    assert_eq!((s.finish, s.steps), (Finish::Stopped, 3));
    let stop = events(&root, "stop");
    assert_eq!(stop.len(), 1);
    assert_eq!(
        (stop[0]["reason"].as_str(), stop[0]["exit"].as_u64()),
        (Some("memory_hard_limit"), Some(75))
    );
    assert_eq!(stop[0]["rss_bytes"], OVER_HARD);
    assert_eq!(stop[0]["resume_micro_batch"], 2);
    assert!(
        state(&root, 3).eval_pending,
        "checkpointed with its evaluation pending"
    );
    assert!(events(&root, "eval").iter().all(|e| e["step"] != 3));

    let calm = Arc::new(AtomicU64::new(CALM));
    let (s, _) = guarded(&root, &cfg, &calm, true, &mut watch());
    assert_eq!((s.finish, s.start_step, s.steps), (Finish::Completed, 3, 6));
    let at_3 = events(&root, "eval")
        .into_iter()
        .filter(|e| e["step"] == 3)
        .count();
    assert_eq!(at_3, 1, "the pending evaluation ran once");
    same_losses(&root, &want);
}
