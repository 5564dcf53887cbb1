//! memfit-train: the Rust trainer on burn.
//!
//! - `model`      — T5 (v1.0 ReLU and v1.1 gated-GELU), BERT, decoder LM + LoRA.
//! - `optim`      — AdamW, Adafactor; global-norm gradient clipping.
//! - `schedule`   — OneCycle, warmup + cosine.
//! - `train_loop` — gradient accumulation, evaluation, metrics.
//! - `checkpoint` — HF-compatible checkpoints, atomic writes, exact resume.
//! - `guard`      — the in-process memory guard.

pub mod engine;
