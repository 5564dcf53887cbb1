//! Accumulation bookkeeping: one `accumulate` per micro-batch with the loss scaled by its share of the
//! step's target tokens (here every row has as many, so 1/accum, and 1/k for an epoch's short last step),
//! seeds derived from (seed, step, micro), the scheduled rate per step.

mod loop_support;

use loop_support::*;
use memfit_train::signals::StopFlag;
use memfit_train::task::RowSource;
use memfit_train::task::seq2seq::Pair;
use memfit_train::train_loop::{Finish, Silent, micro_batch_seed};

#[test]
fn one_accumulate_per_micro_batch_scaled_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut engine = LinearEngine::new();
    let summary = train(
        &dir.path().join("run"),
        &config,
        &mut engine,
        None,
        StopFlag::new(),
        plenty,
    )
    .unwrap();
    assert_eq!(summary.finish, Finish::Completed);
    // 20 rows / batch 3 = 7 micro-batches per epoch; accum 2 → steps of 2,2,2,1 micro-batches.
    assert_eq!(summary.total_steps, 12);
    assert_eq!(engine.calls.len(), 3 * 7);
    assert_eq!(engine.steps_done, 12);
    let scales: Vec<f32> = engine.calls[..7].iter().map(|c| c.loss_scale).collect();
    assert_eq!(scales, vec![0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 1.0]);
    // Rows: six full batches of 3, then the remaining 2.
    let rows: Vec<usize> = engine.calls[..7].iter().map(|c| c.rows).collect();
    assert_eq!(rows, vec![3, 3, 3, 3, 3, 3, 2]);
    // Seeds: (run seed, step, micro index within the step).
    assert_eq!(engine.calls[0].seed, micro_batch_seed(config.seed, 0, 0));
    assert_eq!(engine.calls[1].seed, micro_batch_seed(config.seed, 0, 1));
    assert_eq!(engine.calls[2].seed, micro_batch_seed(config.seed, 1, 0));
    let mut seeds: Vec<u64> = engine.calls.iter().map(|c| c.seed).collect();
    seeds.sort();
    seeds.dedup();
    assert_eq!(
        seeds.len(),
        engine.calls.len(),
        "every micro-batch draws its own seed"
    );
    // The rate of each step is the schedule's at the number of completed steps.
    let schedule = config.schedule(12);
    for (k, lr) in engine.lrs.iter().enumerate() {
        assert_eq!(*lr, schedule.lr_at(k as u64));
    }
}

#[test]
fn metrics_have_one_line_per_step_with_every_field() {
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
    let lines = read_jsonl(&root.join("metrics.jsonl"));
    assert_eq!(lines.len(), 12);
    for (i, m) in lines.iter().enumerate() {
        assert_eq!(m["step"], i as u64 + 1);
        for key in [
            "epoch",
            "micro_batch",
            "accum",
            "loss",
            "lr",
            "grad_norm",
            "tokens",
            "tokens_per_s",
            "step_s",
            "rss_bytes",
            "peak_rss_bytes",
        ] {
            assert!(m.get(key).is_some(), "metrics line lacks {key}");
        }
    }
    assert_eq!(lines[3]["accum"], 1);
    assert_eq!(lines[3]["micro_batch"], 3, "rows per micro-batch");
    assert_eq!(lines[4]["epoch"], 1);
    // Tokens: 5 source + 5 target per row, no padding in this data; step 1 reads 6 rows.
    assert_eq!(lines[0]["tokens"], 60);
    // The loss falls on this learnable task.
    let first = lines[0]["loss"].as_f64().unwrap();
    let last = lines[11]["loss"].as_f64().unwrap();
    assert!(last < first, "loss {first} → {last}");
}

#[test]
fn max_steps_caps_the_run_across_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let config = memfit_train::config::TrainConfig {
        max_steps: Some(6),
        epochs: 1,
        ..small_config()
    };
    let mut engine = LinearEngine::new();
    let s = train(
        &dir.path().join("run"),
        &config,
        &mut engine,
        None,
        StopFlag::new(),
        plenty,
    )
    .unwrap();
    assert_eq!((s.steps, s.total_steps), (6, 6));
    // Six steps: one epoch (4 steps, 7 micro-batches) + 2 steps (4 micro-batches).
    assert_eq!(engine.calls.len(), 11);
}

#[test]
fn evaluations_run_each_epoch_every_n_steps_and_at_the_start_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let eval_steps = |root: &std::path::Path| event_steps(root, "eval");
    let config = memfit_train::config::TrainConfig {
        eval_steps: Some(3),
        ..small_config()
    };
    let root = dir.path().join("default");
    let s = train(
        &root,
        &config,
        &mut LinearEngine::new(),
        None,
        StopFlag::new(),
        plenty,
    )
    .unwrap();
    assert_eq!(eval_steps(&root), vec![3, 4, 6, 8, 9, 12]);
    assert_eq!(s.score_before, None);

    let config = memfit_train::config::TrainConfig {
        eval_at_start: true,
        ..config
    };
    let root = dir.path().join("at-start");
    let s = train(
        &root,
        &config,
        &mut LinearEngine::new(),
        None,
        StopFlag::new(),
        plenty,
    )
    .unwrap();
    assert_eq!(eval_steps(&root), vec![0, 3, 4, 6, 8, 9, 12]);
    let before = s.score_before.unwrap();
    // The mock echoes the source; sources and targets share 3 of 4 leading tokens.
    assert!(before > 0.0 && before < 1.0);
    let last = s.last_eval.unwrap();
    assert!(last.valid_loss.is_finite());
    // All 6 validation rows (fewer than the automatic minimum) and the 4 configured generations.
    assert_eq!((last.rows_loss, last.rows_generated), (6, 4));
}

/// Training rows that note which thread read them.
struct Watched {
    rows: InMemoryPairs,
    readers: std::sync::Mutex<Vec<std::thread::ThreadId>>,
}

impl RowSource<Pair> for Watched {
    fn len(&self) -> usize {
        self.rows.len()
    }
    fn row(&self, index: usize) -> Result<Pair, memfit_data::DataError> {
        self.readers
            .lock()
            .unwrap()
            .push(std::thread::current().id());
        self.rows.row(index)
    }
    fn lengths(&self) -> Result<Vec<u32>, memfit_data::DataError> {
        self.rows.lengths()
    }
}

/// The first step's rows are read on the loop's thread; every later step's on a helper thread
/// while the step before computes (the data order unchanged: the same rows as a plain read of the
/// sampler, checked by the resume and accumulation tests); each step reports its input wait.
#[test]
fn later_steps_rows_are_read_ahead_on_a_helper_thread() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("run");
    let config = small_config();
    let watched = Watched {
        rows: pairs(20),
        readers: std::sync::Mutex::new(Vec::new()),
    };
    let mut engine = LinearEngine::new();
    let summary = train_with(
        &root,
        &config,
        &mut engine,
        None,
        StopFlag::new(),
        plenty,
        None,
        &mut Silent,
        &watched,
    )
    .unwrap();
    assert_eq!(summary.finish, Finish::Completed);
    let readers = watched.readers.lock().unwrap();
    let me = std::thread::current().id();
    // step 1: 2 micro-batches of 3 rows, read here
    assert!(readers[..6].iter().all(|t| *t == me), "{readers:?}");
    assert_eq!(readers.len(), 20 * 3, "every row of three epochs read once");
    assert!(readers[6..].iter().all(|t| *t != me), "{readers:?}");
    for m in read_jsonl(&root.join("metrics.jsonl")) {
        let wait = m["input_wait_s"].as_f64().expect("input_wait_s");
        assert!(
            wait >= 0.0 && wait <= m["step_s"].as_f64().unwrap() + 1e-3,
            "{m}"
        );
    }
}
