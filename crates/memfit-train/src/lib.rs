//! memfit-train: the Rust trainer on burn. The models and their kernels are memfit-nn's; this crate
//! is the run around them.
//!
//! - `optim`      — AdamW, Adafactor; global-norm gradient clipping; state in `optimizer.safetensors`.
//! - `engine`     — the `Engine` the loop drives (accumulate, step, eval loss, save/load) and the task
//!   capabilities (generate, classify); `ModelEngine`, the engine of any memfit-nn family, on burn's
//!   flex backend (cuda / wgpu behind cargo features).
//! - `task`       — what a run trains for: seq2seq, classification; each owns its rows, its
//!   micro-batch, what its loss averages over, and its evaluation.
//! - `bench`      — `memfit bench train`: synthetic-token throughput and peak RSS.
//! - `schedule`   — OneCycle (torch semantics), warmup + cosine: pure functions of the step.
//! - `config`, `presets`, `task_defaults` — the resolved setup (`config.toml`), its layers and hash; the
//!   seed's profiles; the defaults of a run on real data per task and method.
//! - `batches`    — rows (token store or memory) → padded micro-batches; memfit-data's sampler orders them.
//! - `train_loop` — accumulation, optimizer steps, metrics, evaluation, best/, checkpoints, a stop on
//!   SIGINT/SIGTERM within seconds at any point (step, evaluation, generation, checkpoint write).
//! - `eval`       — an evaluation's report and plan, whatever the task; how many rows an evaluation
//!   uses by default (a small share of the training between two).
//! - `progress`   — plain progress lines when stderr is not a terminal (cadence, ETA, the line).
//! - `checkpoint` — `step-N/` and `best/`: atomic writes, disk check, retention, `trainer_state.json`.
//! - `session`    — start a run or resume one (config-hash check, newest checkpoint).
//! - `run_dir`, `metrics`, `signals` — the run directory's files, RSS, SIGINT/SIGTERM.
//! - `run_data`, `model_spec`, `plan_file`, `engine_setup`, `demo`, `text` — what `memfit train` wires up:
//!   data stores, the model config, plan.json and the planned start within a memory budget (planner or
//!   the seed's policy tables), the engine, the demo task, tokenizer files.
//! - `verdict`    — whether a finished run ended worse than it started, or collapsed to one class.
//! - `predict`    — `memfit predict`: a checkpoint over the rows of a file, one JSON line each.
//! - `memory_guard` — the in-process memory guard: a thread samples RSS (and device memory where a hook
//!   is given) every 250 ms against soft/hard limits of the budget (or the `RUN/budget` override); the
//!   loop halves the micro-batch at the soft limit and checkpoints + stops (exit 75) at the hard one.

pub mod bench;
pub mod engine;
pub mod optim;
pub mod task;

// The loop half (plain Rust, no tensors): see each module's doc.
pub mod alloc_reserve;
pub mod batches;
pub mod checkpoint;
pub mod config;
pub mod data_parallel;
pub mod demo;
pub mod device;
pub mod engine_setup;
pub mod eval;
#[cfg(feature = "cuda")]
pub mod kernel_cache;
pub mod malloc_tuning;
pub mod memory_guard;
pub mod metrics;
pub mod model_spec;
pub mod peak_flops;
pub mod plan_file;
pub mod predict;
pub mod presets;
pub mod progress;
pub mod run_data;
pub mod run_dir;
pub mod run_lock;
pub mod schedule;
pub mod session;
pub mod signals;
pub mod task_defaults;
pub mod text;
pub mod train_loop;
pub mod verdict;
