//! Data parallelism on CPU devices (burn's CPU backends have no collective ops; the host
//! collective stands in for NCCL): the loop over 2 and 3 ranks held to the one-device run with the
//! accumulation multiplied by the rank count — the same losses and checkpoints — on flex with the
//! state on the host and on ndarray (the GPU's code path) with the state on the device; a resume on
//! another rank count; a failing rank or collective stopping every rank at the last completed step.

mod loop_support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use burn::prelude::Tensor;
use loop_support::*;
use memfit_nn::layers::host::to_f32_vec;
use memfit_nn::t5::{T5Config, T5Model};
use memfit_train::checkpoint::FreeSpace;
use memfit_train::config::{ConfigLayer, TrainConfig};
use memfit_train::data_parallel::{Collective, CollectiveError, DataParallel, HostCollective};
use memfit_train::engine::{
    Backend, Engine, EngineOptions, Generate, GenerateConfig, GradBucket, ModelEngine, ParamCounts,
    Placement, Replica, SendBucket, Seq2SeqBatch, StepStats, TokenRows,
};
use memfit_train::optim::Optimizer;
use memfit_train::signals::StopFlag;
use memfit_train::train_loop::{Finish, Observer, RANK_FAILED, Silent};
use serde_json::json;

type T5Engine = ModelEngine<T5Model>;

fn t5_config() -> T5Config {
    T5Config::from_json(&json!({
        "vocab_size": VOCAB, "d_model": 16, "d_kv": 4, "d_ff": 32, "num_layers": 2,
        "num_decoder_layers": 2, "num_heads": 4, "relative_attention_num_buckets": 8,
        "relative_attention_max_distance": 16, "dropout_rate": 0.1,
        "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0
    }))
    .unwrap()
}

/// With per-block gradient checkpointing: the backward the overlapped reduction follows.
fn engine((backend, placement): (Backend, Placement)) -> T5Engine {
    let options = EngineOptions {
        backend,
        placement,
        grad_ckpt: true,
        ..Default::default()
    };
    ModelEngine::new(T5Model::init(t5_config(), 3), options).unwrap()
}

fn group(ranks: usize, at: (Backend, Placement)) -> DataParallel<T5Engine> {
    let collective = Arc::new(HostCollective::new(ranks, Duration::from_secs(60)));
    DataParallel::new((0..ranks).map(|_| engine(at)).collect(), collective)
}

/// The buckets of the tiny T5's overlapped reduction, in backward order: the head (final norm),
/// decoder blocks 1 and 0, the decoder's relative bias, the encoder's final norm, encoder blocks
/// 1 and 0, the encoder's relative bias, and last the shared embedding (tied to the head, used by
/// both stacks).
const T5_BUCKETS: usize = 9;

/// The host collective, counting rank 0's all-reduces; with `fail_at`, that one (1-based) fails
/// as a timed-out all-reduce does (the other rank, waiting in the same all-reduce, sees it
/// abandoned).
struct Counting {
    inner: HostCollective,
    calls: std::sync::atomic::AtomicUsize,
    fail_at: Option<usize>,
}

impl Counting {
    fn new(ranks: usize, fail_at: Option<usize>) -> Self {
        Self {
            inner: HostCollective::new(ranks, Duration::from_secs(60)),
            calls: Default::default(),
            fail_at,
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Collective for Counting {
    fn ranks(&self) -> usize {
        self.inner.ranks()
    }
    fn all_reduce_sum(
        &self,
        rank: usize,
        bucket: GradBucket,
    ) -> Result<GradBucket, CollectiveError> {
        if rank == 0 {
            let call = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            if self.fail_at == Some(call) {
                let timeout = Duration::from_millis(1);
                self.inner.abort(0, "timed out");
                return Err(CollectiveError::Timeout {
                    rank: 0,
                    missing: vec![1],
                    waited: timeout,
                    timeout,
                });
            }
        }
        self.inner.all_reduce_sum(rank, bucket)
    }
    fn abort(&self, rank: usize, reason: &str) {
        self.inner.abort(rank, reason)
    }
    fn reset(&self) {
        self.inner.reset()
    }
}

/// Micro-batch 2 × 4 micro-batches a step (on one device: accumulation 4; on 2 ranks: 2 each; on
/// 3 ranks: 2, 1 and 1), 20 steps.
fn config() -> TrainConfig {
    TrainConfig {
        batch: 2,
        accum: 4,
        epochs: 10,
        max_steps: Some(20),
        lr: 3e-3,
        eval_steps: Some(10),
        ..small_config()
    }
}

fn run(
    dir: &Path,
    engine: &mut impl Generate<Batch = Seq2SeqBatch>,
    resume: Option<&ConfigLayer>,
    stop: StopFlag,
    observer: &mut dyn Observer,
) -> Result<Finish, String> {
    let plenty: FreeSpace = plenty;
    let resume = resume.map(|l| (l, false));
    let rows = pairs(24);
    train_with(
        dir,
        &config(),
        engine,
        resume,
        stop,
        plenty,
        None,
        observer,
        &rows,
    )
    .map(|s| s.finish)
}

fn step_losses(dir: &Path) -> Vec<f64> {
    losses(&read_jsonl(&dir.join("metrics.jsonl")))
}

/// The `valid_loss` of every evaluation in `events.jsonl`.
fn valid_losses(dir: &Path) -> Vec<f64> {
    (read_jsonl(&dir.join("events.jsonl")).iter())
        .filter(|e| e["kind"] == "eval")
        .map(|e| e["valid_loss"].as_f64().unwrap())
        .collect()
}

/// The model weights of checkpoint `step-N`.
fn checkpoint_weights(dir: &Path, step: u64) -> Vec<(String, Vec<f32>)> {
    let path = dir.join(format!("checkpoints/step-{step}/model.safetensors"));
    let (tensors, _) = memfit_nn::weights::read_f32(&path).unwrap();
    let mut named: Vec<_> = tensors.into_iter().map(|(n, t)| (n, t.values)).collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

fn assert_same_weights(what: &str, a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) {
    assert_eq!(a.len(), b.len(), "{what}");
    for ((na, va), (nb, vb)) in a.iter().zip(b) {
        assert_eq!(na, nb, "{what}");
        let worst = (va.iter().zip(vb))
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(worst <= 1e-5, "{what}: {na} differs by {worst}");
    }
}

/// Built with `--features wgpu`, burn's wgpu backend too (cubecl's kernels, dropout masks drawn by
/// them, every rank on the one adapter).
fn engines() -> Vec<(Backend, Placement)> {
    let all = vec![
        (Backend::Flex, Placement::Host),
        (Backend::Ndarray, Placement::Device),
    ];
    #[cfg(feature = "wgpu")]
    let all = [all, vec![(Backend::Wgpu, Placement::Device)]].concat();
    all
}

/// Every replica computes with the same weights, bit for bit.
fn assert_lockstep(replicas: &[&T5Engine]) {
    let bits = |e: &T5Engine| -> Vec<u32> {
        (e.weights_on_device().into_iter())
            .flat_map(|t: Tensor<2>| to_f32_vec(t).unwrap())
            .map(f32::to_bits)
            .collect()
    };
    let first = bits(replicas[0]);
    for (r, replica) in replicas.iter().enumerate().skip(1) {
        assert!(bits(replica) == first, "rank {r} drifted from rank 0");
    }
}

#[test]
fn ranks_train_as_one_device_with_the_accumulation_times_the_ranks() {
    for at in engines() {
        let tmp = tempfile::tempdir().unwrap();
        let one = one_device_run(tmp.path(), at);
        let reference = step_losses(&one);
        assert_eq!(reference.len(), 20);
        let first = &read_jsonl(&one.join("metrics.jsonl"))[0];
        assert!(
            first.get("rank_input_wait_s").is_none(),
            "one device: no per-rank waits: {first}"
        );
        assert!(
            reference[19] < reference[0],
            "{at:?} did not learn: {reference:?}"
        );
        for ranks in [2, 3] {
            let what = format!("{at:?} on {ranks} ranks");
            let dir = tmp.path().join(format!("ranks-{ranks}"));
            let counting = Arc::new(Counting::new(ranks, None));
            let replicas = (0..ranks).map(|_| engine(at)).collect();
            let mut dp = DataParallel::new(replicas, counting.clone());
            let finish = run(&dir, &mut dp, None, StopFlag::new(), &mut Silent).unwrap();
            assert_eq!(finish, Finish::Completed, "{what}");
            // 2 ranks: every rank's last micro-batch in the step's last group, the reduction in
            // buckets during its backward; 3 ranks (2, 1 and 1 micro-batches): one reduction
            // after the last group
            let per_step = counting.calls() as f64 / 20.0;
            let expected = if ranks == 2 { T5_BUCKETS } else { 1 };
            assert_eq!(per_step, expected as f64, "{what}: all-reduces a step");
            let metrics = read_jsonl(&dir.join("metrics.jsonl"));
            for m in &metrics {
                let waits = m["rank_input_wait_s"].as_array().unwrap();
                assert_eq!(waits.len(), ranks, "{what}: a wait per rank: {m}");
                assert!(waits.iter().all(|w| w.as_f64().unwrap() >= 0.0), "{m}");
            }
            // the evaluations' loss, its batches shared out between the ranks
            let (a, b) = (valid_losses(&dir), valid_losses(&one));
            assert!(
                a.len() >= 2,
                "{what}: evaluations at epoch ends and every 10 steps"
            );
            let diff = max_rel_diff(&a, &b);
            assert!(
                diff <= 1e-5,
                "{what}: valid losses differ by {diff}: {a:?} {b:?}"
            );
            let got = step_losses(&dir);
            let diff = max_rel_diff(&got, &reference);
            assert!(
                diff <= 1e-5,
                "{what}: losses differ by {diff}\n{got:?}\n{reference:?}"
            );
            let what = format!("{what}: checkpoint step-20");
            assert_same_weights(
                &what,
                &checkpoint_weights(&dir, 20),
                &checkpoint_weights(&one, 20),
            );
            assert_lockstep(&dp.replicas().iter().collect::<Vec<_>>());
        }
    }
}

/// The optimizer state of checkpoint `step-N`, by tensor name.
fn checkpoint_optimizer(dir: &Path, step: u64) -> Vec<(String, Vec<f32>)> {
    let path = dir.join(format!("checkpoints/step-{step}/optimizer.safetensors"));
    let (tensors, _) = memfit_nn::weights::read_f32(&path).unwrap();
    let mut named: Vec<_> = tensors.into_iter().map(|(n, t)| (n, t.values)).collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

#[test]
fn zero1_shards_the_optimizer_state_and_trains_as_one_device() {
    for at in engines() {
        let tmp = tempfile::tempdir().unwrap();
        let one = one_device_run(tmp.path(), at);
        let total = engine(at).optimizer_state().unwrap().state_values();
        for ranks in [2, 3] {
            let what = format!("{at:?}, ZeRO-1 on {ranks} ranks");
            let dir = tmp.path().join(format!("zero1-{ranks}"));
            let mut dp = group(ranks, at).with_sharded_optimizer().unwrap();
            let held = dp.optimizer_state_values().unwrap();
            assert_eq!(
                held.iter().sum::<usize>(),
                total,
                "{what}: every state once: {held:?}"
            );
            let largest = engine(at)
                .trained_sizes()
                .into_iter()
                .flatten()
                .max()
                .unwrap();
            for h in &held {
                assert!(
                    *h <= total / ranks + 2 * largest,
                    "{what}: {held:?} of {total}"
                );
            }
            run(&dir, &mut dp, None, StopFlag::new(), &mut Silent).unwrap();
            let diff = max_rel_diff(&step_losses(&dir), &step_losses(&one));
            assert!(diff <= 1e-5, "{what}: losses differ by {diff}");
            let (w, o) = (checkpoint_weights(&dir, 20), checkpoint_weights(&one, 20));
            assert_same_weights(&what, &w, &o);
            let (w, o) = (
                checkpoint_optimizer(&dir, 20),
                checkpoint_optimizer(&one, 20),
            );
            assert_same_weights(&format!("{what}: optimizer.safetensors"), &w, &o);
            assert_lockstep(&dp.replicas().iter().collect::<Vec<_>>());
        }
    }
}

#[test]
fn a_zero1_run_resumes_on_another_rank_count() {
    let at = (Backend::Flex, Placement::Host);
    let tmp = tempfile::tempdir().unwrap();
    let one = one_device_run(tmp.path(), at);
    let dir = tmp.path().join("zero1-two-then-three");
    let stop = StopFlag::new();
    let mut two = group(2, at).with_sharded_optimizer().unwrap();
    run(&dir, &mut two, None, stop.clone(), &mut StopAt(7, stop)).unwrap();
    let layer = ConfigLayer::default();
    let mut three = group(3, at).with_sharded_optimizer().unwrap();
    let finish = run(&dir, &mut three, Some(&layer), StopFlag::new(), &mut Silent).unwrap();
    assert_eq!(finish, Finish::Completed);
    let diff = max_rel_diff(&step_losses(&dir), &step_losses(&one));
    assert!(
        diff <= 1e-5,
        "ZeRO-1 on 2 ranks, then 3: losses differ by {diff}"
    );
}

/// The reference: the run on one device of `at`, in `root/one`.
fn one_device_run(root: &Path, at: (Backend, Placement)) -> std::path::PathBuf {
    let one = root.join("one");
    run(&one, &mut engine(at), None, StopFlag::new(), &mut Silent).unwrap();
    one
}

/// Requests a stop once step `at` is done.
struct StopAt(u64, StopFlag);
impl Observer for StopAt {
    fn on_step(&mut self, m: &memfit_train::metrics::StepMetrics) {
        if m.step == self.0 {
            self.1.request();
        }
    }
}

#[test]
fn a_resume_on_another_rank_count_continues_the_same_run() {
    let at = (Backend::Flex, Placement::Host);
    let tmp = tempfile::tempdir().unwrap();
    let one = one_device_run(tmp.path(), at);
    let dir = tmp.path().join("two-then-three");
    let stop = StopFlag::new();
    let finish = run(
        &dir,
        &mut group(2, at),
        None,
        stop.clone(),
        &mut StopAt(7, stop),
    )
    .unwrap();
    assert_eq!(finish, Finish::Stopped);
    assert_eq!(step_losses(&dir).len(), 7);
    let layer = ConfigLayer::default();
    let finish = run(
        &dir,
        &mut group(3, at),
        Some(&layer),
        StopFlag::new(),
        &mut Silent,
    )
    .unwrap();
    assert_eq!(finish, Finish::Completed);
    let diff = max_rel_diff(&step_losses(&dir), &step_losses(&one));
    assert!(
        diff <= 1e-5,
        "2 ranks then 3: losses differ from one device by {diff}"
    );
    assert_same_weights(
        "2 then 3 ranks",
        &checkpoint_weights(&dir, 20),
        &checkpoint_weights(&one, 20),
    );
}

/// A replica whose `accumulate` call number `fail_at` (1-based, this rank's own count) fails.
struct Failing {
    inner: T5Engine,
    fail_at: Option<usize>,
    calls: usize,
    injected: Injected,
}

/// What [`Failing`] does at its failing call.
#[derive(Clone, Copy)]
enum Injected {
    /// An error: the rank's device was lost.
    Lost,
    /// The device's out-of-memory error.
    OutOfMemory,
    /// The rank's thread panics.
    Panic,
}

impl Failing {
    /// Counts a call; the injected failure at call `fail_at`.
    fn call(&mut self) -> Result<(), memfit_nn::ModelError> {
        self.calls += 1;
        if self.fail_at != Some(self.calls) {
            return Ok(());
        }
        match self.injected {
            Injected::Lost => Err(memfit_nn::ModelError::Io(
                "injected: the rank's device was lost".into(),
            )),
            Injected::OutOfMemory => Err(memfit_nn::ModelError::OutOfMemory(
                "injected: CUDA_ERROR_OUT_OF_MEMORY".into(),
            )),
            Injected::Panic => panic!("injected: a bug on this rank"),
        }
    }
}

impl Engine for Failing {
    type Batch = Seq2SeqBatch;
    type Error = memfit_nn::ModelError;

    fn accumulate(&mut self, b: &Seq2SeqBatch, scale: f32, seed: u64) -> Result<f32, Self::Error> {
        self.call()?;
        self.inner.accumulate(b, scale, seed)
    }
    fn is_out_of_memory(error: &Self::Error) -> bool {
        T5Engine::is_out_of_memory(error)
    }
    fn discard_gradients(&mut self) {
        self.inner.discard_gradients()
    }
    fn step(&mut self, lr: f64, clip: Option<f64>) -> Result<StepStats, Self::Error> {
        self.inner.step(lr, clip)
    }
    fn eval_loss(&self, b: &Seq2SeqBatch) -> Result<f32, Self::Error> {
        self.inner.eval_loss(b)
    }
    fn param_counts(&self) -> ParamCounts {
        self.inner.param_counts()
    }
    fn save(&mut self, dir: &Path) -> Result<(), Self::Error> {
        self.inner.save(dir)
    }
    fn load(&mut self, dir: &Path, with_optimizer: bool) -> Result<(), Self::Error> {
        self.inner.load(dir, with_optimizer)
    }
}

impl Replica for Failing {
    fn accumulate_and_send(
        &mut self,
        b: &Seq2SeqBatch,
        scale_and_seed: (f32, u64),
        send: &mut SendBucket<'_>,
    ) -> Result<f32, Self::Error> {
        self.call()?;
        self.inner.accumulate_and_send(b, scale_and_seed, send)
    }
    fn take_gradients(&mut self) -> Result<Vec<Option<Tensor<2>>>, Self::Error> {
        self.inner.take_gradients()
    }
    fn device(&self) -> burn::prelude::Device {
        self.inner.device()
    }
    fn put_gradients(&mut self, grads: Vec<Option<Tensor<2>>>) -> Result<(), Self::Error> {
        self.inner.put_gradients(grads)
    }
    fn trained_sizes(&self) -> Vec<Option<usize>> {
        self.inner.trained_sizes()
    }
    fn keep_optimizer_states(&mut self, keep: &[bool]) -> Result<(), Self::Error> {
        self.inner.keep_optimizer_states(keep)
    }
    fn optimizer_state(&self) -> Result<Optimizer, Self::Error> {
        self.inner.optimizer_state()
    }
    fn masters_for_gather(&self, owned: &[bool]) -> Result<Vec<Option<Tensor<2>>>, Self::Error> {
        self.inner.masters_for_gather(owned)
    }
    fn put_masters(&mut self, masters: Vec<Option<Tensor<2>>>) -> Result<(), Self::Error> {
        self.inner.put_masters(masters)
    }
}

impl Generate for Failing {
    fn generate(&self, s: &TokenRows, c: &GenerateConfig) -> Result<Vec<Vec<u32>>, Self::Error> {
        self.inner.generate(s, c)
    }
}

/// The stop event of a run that stopped for a failed rank, and the step it checkpointed.
fn rank_failure_stop(dir: &Path) -> (serde_json::Value, u64) {
    let events = read_jsonl(&dir.join("events.jsonl"));
    let stop = events
        .iter()
        .rev()
        .find(|e| e["kind"] == "stop")
        .unwrap()
        .clone();
    assert_eq!(stop["reason"], RANK_FAILED, "{stop}");
    assert_eq!(stop["exit"], 75);
    let step = stop["step"].as_u64().unwrap();
    let checkpoint = stop["checkpoint"].as_str().unwrap();
    assert!(checkpoint.ends_with(&format!("step-{step}")), "{stop}");
    (stop, step)
}

/// Resumes `dir` on 2 healthy ranks; the whole run then matches the one-device run.
fn assert_resumes_as_uninterrupted(dir: &Path, one: &Path) {
    let at = (Backend::Flex, Placement::Host);
    let layer = ConfigLayer::default();
    let finish = run(
        dir,
        &mut group(2, at),
        Some(&layer),
        StopFlag::new(),
        &mut Silent,
    )
    .unwrap();
    assert_eq!(finish, Finish::Completed);
    let diff = max_rel_diff(&step_losses(dir), &step_losses(one));
    assert!(
        diff <= 1e-5,
        "resumed after the failure: losses differ by {diff}"
    );
}

#[test]
fn a_failing_rank_stops_every_rank_at_the_last_completed_step() {
    let at = (Backend::Flex, Placement::Host);
    let tmp = tempfile::tempdir().unwrap();
    let one = one_device_run(tmp.path(), at);
    let dir = tmp.path().join("failing");
    // rank 1 runs 2 micro-batches a step: its 12th call is in step 6's second group
    let replicas = vec![
        Failing {
            inner: engine(at),
            fail_at: None,
            calls: 0,
            injected: Injected::Lost,
        },
        Failing {
            inner: engine(at),
            fail_at: Some(12),
            calls: 0,
            injected: Injected::Lost,
        },
    ];
    let collective = Arc::new(HostCollective::new(2, Duration::from_secs(60)));
    let mut dp = DataParallel::new(replicas, collective);
    let finish = run(&dir, &mut dp, None, StopFlag::new(), &mut Silent).unwrap();
    assert_eq!(finish, Finish::Stopped);
    let (stop, step) = rank_failure_stop(&dir);
    assert_eq!(step, 5, "{stop}");
    assert!(
        stop["message"].as_str().unwrap().contains("rank 1"),
        "{stop}"
    );
    assert!(
        stop["message"]
            .as_str()
            .unwrap()
            .contains("device was lost"),
        "{stop}"
    );
    assert_eq!(step_losses(&dir).len(), 5);
    assert_resumes_as_uninterrupted(&dir, &one);
}

/// A rank out of device memory in its last micro-batch of a step, while the other is already
/// reducing its first buckets: the group gives up the step, meets afresh and redoes it at half the
/// micro-batch on every rank, and the run ends as one device out of memory in the same step does
/// (the same smaller micro-batches, so the same dropout draws).
#[test]
fn a_rank_out_of_memory_during_the_overlapped_reduction_halves_every_rank() {
    let at = (Backend::Flex, Placement::Host);
    let tmp = tempfile::tempdir().unwrap();
    let replica = |fail_at| Failing {
        inner: engine(at),
        fail_at,
        calls: 0,
        injected: Injected::OutOfMemory,
    };
    // one device: 4 calls a step, the 24th is step 6's last
    let one = tmp.path().join("one-oom");
    let finish = run(
        &one,
        &mut replica(Some(24)),
        None,
        StopFlag::new(),
        &mut Silent,
    )
    .unwrap();
    assert_eq!(finish, Finish::Completed);
    let dir = tmp.path().join("oom");
    // rank 1's 12th call: the second (last) group of step 6
    let replicas = vec![replica(None), replica(Some(12))];
    let collective = Arc::new(HostCollective::new(2, Duration::from_secs(60)));
    let mut dp = DataParallel::new(replicas, collective);
    let finish = run(&dir, &mut dp, None, StopFlag::new(), &mut Silent).unwrap();
    let events = read_jsonl(&dir.join("events.jsonl"));
    assert_eq!(finish, Finish::Completed, "{events:?}");
    let downgrade = events.iter().find(|e| e["kind"] == "downgrade").unwrap();
    assert_eq!(downgrade["step"], 5, "{downgrade}");
    assert_eq!(downgrade["new_micro_batch"], 1, "{downgrade}");
    assert!(
        downgrade["message"].as_str().unwrap().contains("rank 1"),
        "{downgrade}"
    );
    let diff = max_rel_diff(&step_losses(&dir), &step_losses(&one));
    assert!(diff <= 1e-5, "losses differ by {diff}");
    assert_lockstep(&dp.replicas().iter().map(|f| &f.inner).collect::<Vec<_>>());
}

/// A rank whose thread panics in its last micro-batch, the other rank already waiting in the
/// overlapped reduction for its buckets: the panicking rank gives the collective up at once, the
/// run stops at the last completed step (exit 75) long before the collective's timeout.
#[test]
fn a_rank_panicking_during_the_overlapped_reduction_stops_the_group_at_once() {
    let at = (Backend::Flex, Placement::Host);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("panic");
    let replica = |fail_at| Failing {
        inner: engine(at),
        fail_at,
        calls: 0,
        injected: Injected::Panic,
    };
    let collective = Arc::new(HostCollective::new(2, Duration::from_secs(120)));
    let mut dp = DataParallel::new(vec![replica(None), replica(Some(12))], collective);
    let started = std::time::Instant::now();
    let finish = run(&dir, &mut dp, None, StopFlag::new(), &mut Silent).unwrap();
    assert_eq!(finish, Finish::Stopped);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    let (stop, step) = rank_failure_stop(&dir);
    assert_eq!(step, 5, "{stop}");
    assert!(
        stop["message"].as_str().unwrap().contains("panicked"),
        "{stop}"
    );
}

#[test]
fn a_collective_that_times_out_stops_every_rank_at_the_last_completed_step() {
    let at = (Backend::Flex, Placement::Host);
    let tmp = tempfile::tempdir().unwrap();
    let one = one_device_run(tmp.path(), at);
    let dir = tmp.path().join("timing-out");
    // in the middle of step 4's overlapped reduction
    let collective = Arc::new(Counting::new(2, Some(3 * T5_BUCKETS + 5)));
    let mut dp = DataParallel::new(vec![engine(at), engine(at)], collective);
    let finish = run(&dir, &mut dp, None, StopFlag::new(), &mut Silent).unwrap();
    assert_eq!(finish, Finish::Stopped);
    let (stop, step) = rank_failure_stop(&dir);
    assert_eq!(step, 3, "{stop}");
    assert!(
        stop["message"].as_str().unwrap().contains("timed out"),
        "{stop}"
    );
    assert_resumes_as_uninterrupted(&dir, &one);
}
