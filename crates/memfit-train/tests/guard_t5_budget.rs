//! Issue #6's integration test: a real T5 run whose budget is lowered mid-run (through the `RUN/budget`
//! file, the mechanism a user or `memfit run` uses) below what its micro-batch needs: the guard, reading
//! this process's real memory, halves the micro-batch; the run completes, and its per-step losses match
//! a run started at the smaller micro-batch within floating-point noise.
//!
//! Its own test binary with one test: the guard reads the whole process's memory, which other tests
//! running in parallel threads would disturb.
//!
//! Why the match is not trivial: with token-weighted accumulation a step's gradient does not depend on
//! how its rows are cut, so the run that never downgrades matches too. The test therefore also checks
//! that the downgrade really happened (events, metrics: the later steps ran at the smaller micro-batch)
//! and that the tolerance tells runs apart (a run on another data order is far outside it).

mod loop_support;

use loop_support::*;
use memfit_nn::families;
use memfit_train::config::TrainConfig;
use memfit_train::engine::ModelEngine;
use memfit_train::memory_guard::{
    GuardSettings, MemoryGuard, OVERRIDE_FILE, ProcessMemory, own_charged_bytes,
};
use memfit_train::metrics::StepMetrics;
use memfit_train::signals::StopFlag;
use memfit_train::train_loop::{Finish, Observer};
use memfit_train::{demo, engine_setup};
use std::path::Path;

/// Loss agreement across micro-batch cuts: f32 sums in another order (measured ~1e-7 here).
const TOL: f64 = 1e-4;

/// Reverse-copy rows with sources of 3..=10 tokens (unequal target counts per micro-batch).
fn rows() -> InMemoryPairs {
    in_memory(
        (0..48u32)
            .map(|i| {
                let n = 3 + (i * 5 % 8);
                let src: Vec<u32> = (0..n).map(|j| 6 + (i * 7 + j * 3) % 26).collect();
                let mut tgt: Vec<u32> = src.iter().rev().copied().collect();
                (src.into_iter().chain([1]).collect(), {
                    tgt.push(1);
                    tgt
                })
            })
            .collect(),
    )
}

fn config(batch: usize, accum: usize, seed: u64) -> TrainConfig {
    TrainConfig {
        model: "demo".into(),
        batch,
        accum,
        epochs: 3,
        lr: 3e-3,
        seed,
        eval_rows: 2,
        gen_max_tokens: 4,
        threads: 1,
        memory_budget_bytes: Some(4 << 30),
        ..TrainConfig::default()
    }
}

fn model_json() -> serde_json::Value {
    let mut m = demo::seq2seq::model_config(VOCAB);
    // Dropout draws per (step, micro-batch) and so depends on the cut; the comparison needs none.
    m["dropout_rate"] = 0.0.into();
    m
}

struct WriteBudgetAt {
    step: u64,
    file: std::path::PathBuf,
    written: Option<u64>,
}

impl Observer for WriteBudgetAt {
    fn on_step(&mut self, m: &StepMetrics) {
        if m.step == self.step {
            // A budget whose soft limit (85 %) sits just under what the process uses now and whose hard
            // limit (95 %) is ~9 % above it.
            let budget = (own_charged_bytes() as f64 / 0.87) as u64;
            let tmp = self.file.with_extension("tmp");
            std::fs::write(&tmp, format!("{budget}B\n")).unwrap();
            std::fs::rename(&tmp, &self.file).unwrap();
            self.written = Some(budget);
        }
    }
}

fn run(root: &Path, config: &TrainConfig, guarded: bool) -> (Vec<serde_json::Value>, Option<u64>) {
    let (model, _) = families::seq2seq(&model_json(), "demo", None, config.seed).unwrap();
    let mut engine = ModelEngine::new(
        model,
        engine_setup::engine_options(config, &memfit_train::device::ChosenDevice::cpu("test")),
    )
    .unwrap();
    let guard = guarded.then(|| {
        MemoryGuard::start(GuardSettings::for_run(config, root), ProcessMemory::new()).unwrap()
    });
    let mut observer = WriteBudgetAt {
        step: if guarded { 2 } else { 0 },
        file: root.join(OVERRIDE_FILE),
        written: None,
    };
    let s = train_with(
        root,
        config,
        &mut engine,
        None,
        StopFlag::new(),
        plenty,
        guard.as_ref(),
        &mut observer,
        &rows(),
    )
    .unwrap();
    assert_eq!(s.finish, Finish::Completed, "{}", root.display());
    (read_jsonl(&root.join("metrics.jsonl")), observer.written)
}

#[test]
fn a_lowered_budget_downgrades_a_t5_run_that_then_matches_the_smaller_micro_batch() {
    memfit_train::engine::set_threads(1).unwrap();
    // Ballast, so that the tiny model's transient buffers (a checkpoint's serialized tensors, ~1 MB)
    // are a few percent of the process rather than a sixth of it, as they would be in a real run.
    let ballast = vec![1u8; 64 << 20];
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("guarded");
    std::fs::create_dir_all(&root).unwrap();
    let (guarded, written) = run(&root, &config(8, 2, 5), true);
    let budget = written.expect("the budget was written at step 2");

    let events = read_jsonl(&root.join("events.jsonl"));
    let budget_event = events
        .iter()
        .find(|e| e["kind"] == "budget")
        .expect("a budget event");
    assert_eq!(budget_event["budget_bytes"], budget);
    let downgrades: Vec<_> = events.iter().filter(|e| e["kind"] == "downgrade").collect();
    assert!(!downgrades.is_empty(), "no downgrade: {events:?}");
    let first = downgrades[0];
    assert_eq!(
        (&first["old_micro_batch"], &first["new_micro_batch"]),
        (&8.into(), &4.into())
    );
    assert_eq!(
        (&first["old_accum"], &first["new_accum"]),
        (&2.into(), &4.into())
    );
    let at = first["step"].as_u64().unwrap();
    assert!((2..=3).contains(&at), "downgrade at step {at}");
    // Every later step ran at the smaller micro-batch (or smaller still if memory kept growing).
    for m in &guarded[at as usize..] {
        assert!(m["micro_batch"].as_u64().unwrap() <= 4, "{m}");
    }
    println!(
        "budget {budget} B; downgrades at steps {:?}; rss at the first {}",
        downgrades.iter().map(|d| &d["step"]).collect::<Vec<_>>(),
        first["rss_bytes"]
    );

    let (small, _) = run(&dir.path().join("small"), &config(4, 4, 5), false);
    let d = max_rel_diff(&losses(&guarded), &losses(&small));
    println!("max relative loss difference to the 4 × 4 run: {d:e}");
    assert!(d < TOL, "{d}");
    // The losses move (the run trains), and another data order and init is far outside the tolerance.
    let l = losses(&small);
    assert!(l[l.len() - 1] < l[0]);
    let (other, _) = run(&dir.path().join("other"), &config(4, 4, 6), false);
    assert!(max_rel_diff(&losses(&guarded), &losses(&other)) > 100.0 * TOL);
    assert_eq!(ballast.iter().map(|b| *b as usize).sum::<usize>(), 64 << 20);
}
