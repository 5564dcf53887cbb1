//! A tiny engine in plain Rust (one weight per vocabulary entry, squared error, SGD with momentum) and
//! helpers, so the loop's bookkeeping is tested without burn.
#![allow(dead_code)]

use memfit_train::checkpoint::FreeSpace;
use memfit_train::engine::{
    Engine, Generate, GenerateConfig, ParamCounts, Seq2SeqBatch, StepStats, TokenRows,
};
use memfit_train::session::CheckpointSpec;
use memfit_train::task::seq2seq::{Collate, Pair, Seq2SeqTask};
use memfit_train::task::{InMemory, RowSource};
use memfit_train::text::TextDecoder;
use std::cell::RefCell;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct MockError(pub String);

#[derive(Debug, Clone)]
pub struct Call {
    pub loss_scale: f32,
    pub seed: u64,
    pub rows: usize,
    pub first_label: u32,
}

pub struct LinearEngine {
    pub w: Vec<f32>,
    pub momentum: Vec<f32>,
    pub grad: Vec<f32>,
    pub calls: Vec<Call>,
    pub lrs: Vec<f64>,
    pub steps_done: u64,
    /// Run a closure after the optimizer step with this (1-based) number.
    pub after_step: Option<(u64, Box<dyn FnMut()>)>,
    /// Run a closure after the `accumulate` call with this (1-based) number.
    pub after_accumulate: Option<(usize, Box<dyn FnMut()>)>,
    pub fail_save: bool,
    /// The seeded target perturbation ("dropout"); off, a step's gradient depends only on its rows.
    pub noise: bool,
    /// Every engine call in order: `accumulate`, `step`, `eval_loss`, `generate`, `save`.
    pub log: RefCell<Vec<&'static str>>,
    /// Run a closure during the engine call with this (1-based) number in `log` (at the end of the
    /// call; for `generate`, before its first row, which then sees a stop requested by the closure).
    pub on_call: RefCell<Option<(usize, Hook)>>,
    /// A micro-batch of more rows than this fails as a device out of memory would.
    pub device_rows: Option<usize>,
    /// An evaluation batch (loss or generation) of more rows than this fails the same way.
    pub eval_device_rows: Option<usize>,
}

pub const VOCAB: usize = 32;

/// How the mock's injected device out-of-memory error starts.
pub const OUT_OF_MEMORY: &str = "out of device memory";

/// A closure run at a chosen engine call.
pub type Hook = Box<dyn FnMut()>;

impl LinearEngine {
    pub fn new() -> Self {
        Self {
            w: (0..VOCAB).map(|i| (i as f32 * 0.37).sin()).collect(),
            momentum: vec![0.0; VOCAB],
            grad: vec![0.0; VOCAB],
            calls: Vec::new(),
            lrs: Vec::new(),
            steps_done: 0,
            after_step: None,
            after_accumulate: None,
            fail_save: false,
            noise: true,
            log: RefCell::new(Vec::new()),
            on_call: RefCell::new(None),
            device_rows: None,
            eval_device_rows: None,
        }
    }

    /// The injected out-of-memory error of an evaluation batch of `rows` rows, if it is one.
    fn eval_out_of_memory(&self, rows: usize) -> Result<(), MockError> {
        match self.eval_device_rows.filter(|&n| rows > n) {
            Some(limit) => Err(MockError(format!(
                "{OUT_OF_MEMORY}: evaluating {rows} rows, room for {limit}"
            ))),
            None => Ok(()),
        }
    }

    /// Records a call of `kind` and runs `on_call` if this is its call.
    fn called(&self, kind: &'static str) {
        let n = {
            let mut log = self.log.borrow_mut();
            log.push(kind);
            log.len()
        };
        if let Some((at, f)) = &mut *self.on_call.borrow_mut()
            && *at == n
        {
            f();
        }
    }

    fn target(label: u32, noise: f32) -> f32 {
        (label % 5) as f32 * 0.1 * (1.0 + noise)
    }

    fn loss_and_grad(&self, b: &Seq2SeqBatch, seed: Option<u64>) -> (f32, Vec<(usize, f32)>) {
        // The "dropout": a seeded perturbation of the targets, so the seed matters.
        let noise = seed
            .filter(|_| self.noise)
            .map_or(0.0, |s| ((s >> 11) % 1000) as f32 * 1e-5);
        let n = b.target_tokens().max(1) as f32;
        let mut loss = 0.0;
        let mut grads = Vec::new();
        for (t, m) in b.labels.iter().zip(&b.label_mask) {
            if *m {
                let i = *t as usize % VOCAB;
                let d = self.w[i] - Self::target(*t, noise);
                loss += d * d / n;
                grads.push((i, 2.0 * d / n));
            }
        }
        (loss, grads)
    }

    pub fn weight_bits(&self) -> Vec<u32> {
        self.w
            .iter()
            .chain(&self.momentum)
            .map(|x| x.to_bits())
            .collect()
    }
}

/// One tensor `v` as a safetensors file, as real engines write them (a resume checks the layout).
fn write_f32s(path: &Path, v: &[f32]) -> std::io::Result<()> {
    let tensor = memfit_nn::weights::NamedTensor {
        name: "v".into(),
        shape: vec![v.len()],
        values: std::borrow::Cow::Borrowed(v),
        transpose: None,
    };
    memfit_nn::weights::write_f32(path, &[tensor], None).map_err(std::io::Error::other)
}

fn read_f32s(path: &Path) -> std::io::Result<Vec<f32>> {
    let (mut tensors, _) = memfit_nn::weights::read_f32(path).map_err(std::io::Error::other)?;
    tensors
        .remove("v")
        .map(|t| t.values)
        .ok_or_else(|| std::io::Error::other(format!("{}: no tensor v", path.display())))
}

impl Engine for LinearEngine {
    type Batch = Seq2SeqBatch;
    type Error = MockError;

    fn accumulate(
        &mut self,
        b: &Seq2SeqBatch,
        loss_scale: f32,
        seed: u64,
    ) -> Result<f32, MockError> {
        if let Some(limit) = self.device_rows.filter(|&n| b.source.batch > n) {
            // half the gradient added, as a micro-batch that failed mid-way
            self.grad[0] += 1.0;
            return Err(MockError(format!(
                "{OUT_OF_MEMORY}: {} rows, room for {limit}",
                b.source.batch
            )));
        }
        let (loss, grads) = self.loss_and_grad(b, Some(seed));
        for (i, g) in grads {
            self.grad[i] += g * loss_scale;
        }
        self.calls.push(Call {
            loss_scale,
            seed,
            rows: b.source.batch,
            first_label: b.labels[0],
        });
        if let Some((n, f)) = &mut self.after_accumulate
            && *n == self.calls.len()
        {
            f();
        }
        self.called("accumulate");
        Ok(loss)
    }

    fn discard_gradients(&mut self) {
        self.grad.iter_mut().for_each(|g| *g = 0.0);
    }

    fn is_out_of_memory(error: &MockError) -> bool {
        error.0.starts_with(OUT_OF_MEMORY)
    }

    fn step(&mut self, lr: f64, max_grad_norm: Option<f64>) -> Result<StepStats, MockError> {
        let norm = self
            .grad
            .iter()
            .map(|g| f64::from(*g).powi(2))
            .sum::<f64>()
            .sqrt();
        let clip = max_grad_norm.map_or(1.0, |m| if norm > m { m / norm } else { 1.0 });
        for i in 0..VOCAB {
            self.momentum[i] = 0.9 * self.momentum[i] + self.grad[i] * clip as f32;
            self.w[i] -= lr as f32 * self.momentum[i];
            self.grad[i] = 0.0;
        }
        self.lrs.push(lr);
        self.steps_done += 1;
        if let Some((n, f)) = &mut self.after_step
            && *n == self.steps_done
        {
            f();
        }
        self.called("step");
        Ok(StepStats { grad_norm: norm })
    }

    fn eval_loss(&self, b: &Seq2SeqBatch) -> Result<f32, MockError> {
        self.eval_out_of_memory(b.source.batch)?;
        self.called("eval_loss");
        Ok(self.loss_and_grad(b, None).0)
    }

    fn param_counts(&self) -> ParamCounts {
        ParamCounts {
            total: VOCAB as u64,
            trainable: VOCAB as u64,
        }
    }

    fn save(&mut self, dir: &Path) -> Result<(), MockError> {
        let err = |e: std::io::Error| MockError(e.to_string());
        assert_eq!(
            std::fs::read_dir(dir).unwrap().count(),
            0,
            "save into an empty dir"
        );
        std::fs::write(
            dir.join("config.json"),
            format!("{{\"vocab_size\": {VOCAB}}}"),
        )
        .map_err(err)?;
        write_f32s(&dir.join("model.safetensors"), &self.w).map_err(err)?;
        if self.fail_save {
            return Err(MockError(
                "simulated failure half-way through a save".into(),
            ));
        }
        write_f32s(&dir.join("optimizer.safetensors"), &self.momentum).map_err(err)?;
        self.called("save");
        Ok(())
    }

    fn load(&mut self, dir: &Path, with_optimizer: bool) -> Result<(), MockError> {
        let err = |e: std::io::Error| MockError(e.to_string());
        self.w = read_f32s(&dir.join("model.safetensors")).map_err(err)?;
        if with_optimizer {
            self.momentum = read_f32s(&dir.join("optimizer.safetensors")).map_err(err)?;
        }
        Ok(())
    }
}

impl Generate for LinearEngine {
    fn generate(
        &self,
        sources: &TokenRows,
        config: &GenerateConfig,
    ) -> Result<Vec<Vec<u32>>, MockError> {
        self.eval_out_of_memory(sources.batch)?;
        self.called("generate");
        // Echo the source: deterministic, so BLEU is a fixed function of the data. A row stands for
        // a token: a stop ends the generation early, as the real engine's does between tokens.
        let len = sources.len;
        Ok((0..sources.batch)
            .take_while(|_| !config.stop_requested())
            .map(|r| {
                (0..len)
                    .filter(|j| sources.mask[r * len + j])
                    .map(|j| sources.ids[r * len + j])
                    .filter(|t| *t != 1)
                    .collect()
            })
            .collect())
    }
}

/// Ids shown as letters.
pub struct Letters;
impl TextDecoder for Letters {
    fn decode(&self, ids: &[u32]) -> String {
        ids.iter()
            .filter(|t| **t > 1)
            .map(|t| char::from(b'a' + (*t % 26) as u8))
            .collect()
    }
}

/// Pairs held in memory.
pub type InMemoryPairs = InMemory<Pair>;

/// Rows held in memory, with their token counts.
pub fn in_memory(rows: Vec<Pair>) -> InMemoryPairs {
    let lengths = rows
        .iter()
        .map(|(s, t)| (s.len() + t.len()) as u32)
        .collect();
    InMemory { rows, lengths }
}

/// `rows` deterministic pairs; sources and targets end in EOS (1).
pub fn pairs(rows: usize) -> InMemoryPairs {
    in_memory(
        (0..rows)
            .map(|i| {
                let i = i as u32;
                (
                    vec![2 + i % 7, 3 + i % 5, 4 + i % 3, 5, 1],
                    vec![2 + i % 7, 3 + i % 5, 4 + i % 3, 5 + i % 2, 1],
                )
            })
            .collect(),
    )
}

pub fn collate() -> Collate {
    Collate {
        max_src: 8,
        max_tgt: 8,
        pad_id: 0,
        eos_id: 1,
    }
}

pub fn spec(free_space: FreeSpace) -> CheckpointSpec {
    CheckpointSpec {
        tokenizer_files: Vec::new(),
        free_space,
        expected_bytes: 1024,
    }
}

pub fn plenty(_: &Path) -> std::io::Result<u64> {
    Ok(u64::MAX / 2)
}

pub fn full_disk(_: &Path) -> std::io::Result<u64> {
    Ok(10)
}

use memfit_train::config::{ConfigLayer, TrainConfig};
use memfit_train::memory_guard::MemoryGuard;
use memfit_train::session::{self, Session};
use memfit_train::signals::StopFlag;
use memfit_train::train_loop::{Observer, Silent, Summary, Trainer};

/// A small config: 20 rows, batch 3, accum 2 → 7 micro-batches, 4 steps per epoch.
pub fn small_config() -> TrainConfig {
    TrainConfig {
        model: "linear-test".into(),
        batch: 3,
        accum: 2,
        epochs: 3,
        lr: 0.05,
        eval_rows: 4,
        memory_budget_bytes: None,
        ..TrainConfig::default()
    }
}

/// Starts (or, with `resume`, continues) a run in `dir` on 20 rows with a validation set of 6.
pub fn train(
    dir: &Path,
    config: &TrainConfig,
    engine: &mut LinearEngine,
    resume: Option<(&ConfigLayer, bool)>,
    stop: StopFlag,
    free: FreeSpace,
) -> Result<Summary, String> {
    train_with(
        dir,
        config,
        engine,
        resume,
        stop,
        free,
        None,
        &mut Silent,
        &pairs(20),
    )
}

/// [`train`] with a memory guard, an observer and the training rows chosen by the caller.
#[allow(clippy::too_many_arguments)]
pub fn train_with(
    dir: &Path,
    config: &TrainConfig,
    engine: &mut impl Generate<Batch = Seq2SeqBatch>,
    resume: Option<(&ConfigLayer, bool)>,
    stop: StopFlag,
    free: FreeSpace,
    guard: Option<&MemoryGuard>,
    observer: &mut dyn Observer,
    train_rows: &dyn RowSource<Pair>,
) -> Result<Summary, String> {
    let mut s: Session = match resume {
        None => session::start(config.clone(), dir, spec(free)).map_err(|e| e.to_string())?,
        Some((layer, allow)) => {
            session::resume(dir, layer, allow, spec(free)).map_err(|e| e.to_string())?
        }
    };
    let resume_state = match &s.resume_from {
        Some((ckpt, state)) => {
            session::load_checkpoint(engine, ckpt, state, Some(VOCAB))
                .map_err(|e| e.to_string())?;
            Some(state.clone())
        }
        None => None,
    };
    let valid_rows = pairs(6);
    let task = Seq2SeqTask {
        collate: collate(),
        decoder: &Letters,
        max_new_tokens: s.config.gen_max_tokens,
    };
    Trainer {
        engine,
        task: &task,
        config: &s.config,
        run: &mut s.run,
        checkpointer: &mut s.checkpointer,
        train: train_rows,
        valid: Some(&valid_rows),
        stop,
        observer,
        resume: resume_state,
        vocab_size: Some(VOCAB),
        guard,
    }
    .run()
    .map_err(|e| e.to_string())
}

pub fn read_jsonl(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The steps of the run's `events.jsonl` events of `kind`, in order.
pub fn event_steps(root: &Path, kind: &str) -> Vec<u64> {
    read_jsonl(&root.join("events.jsonl"))
        .iter()
        .filter(|e| e["kind"] == kind)
        .map(|e| e["step"].as_u64().unwrap())
        .collect()
}

/// The `loss` of every metrics line.
pub fn losses(lines: &[serde_json::Value]) -> Vec<f64> {
    lines.iter().map(|m| m["loss"].as_f64().unwrap()).collect()
}

/// The largest relative difference between two equally long series.
pub fn max_rel_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1e-12))
        .fold(0.0, f64::max)
}
