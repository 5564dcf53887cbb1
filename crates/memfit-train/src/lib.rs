//! memfit-train: the Rust trainer on burn.
//!
//! - `model`      — T5 (v1.0 ReLU and v1.1 gated-GELU): config.json, transformers' tensor names,
//!   forward pass, masked cross-entropy, safetensors weights. (BERT, decoder LM + LoRA: later.)
//! - `optim`      — AdamW, Adafactor; global-norm gradient clipping; state in `optimizer.safetensors`.
//! - `t5_engine`  — `T5Engine`: the `engine::Engine` the loop drives (accumulate, step, eval, generate,
//!   save/load) on burn's flex backend (cuda / tch behind cargo features).
//! - `bench`      — `memfit bench train`: synthetic-token throughput and peak RSS.
//! - `schedule`   — OneCycle, warmup + cosine.
//! - `train_loop` — gradient accumulation, evaluation, metrics.
//! - `checkpoint` — HF-compatible checkpoints, atomic writes, exact resume.
//! - `guard`      — the in-process memory guard.

pub mod bench;
pub mod engine;
pub mod model;
pub mod optim;
pub mod t5_engine;

// The loop half (plain Rust, no tensors): see each module's doc.
pub mod batches;
pub mod checkpoint;
pub mod config;
pub mod eval;
pub mod metrics;
pub mod presets;
pub mod run_dir;
pub mod schedule;
pub mod signals;
pub mod text;
pub mod train_loop;
pub mod session;
pub mod demo;
pub mod model_spec;
pub mod plan_file;
pub mod run_data;
