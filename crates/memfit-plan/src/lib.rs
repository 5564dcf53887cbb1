//! memfit-plan: the pure memory model.
//!
//! Stages, in the order data passes through them:
//! - `arch`   — architectures from Hugging Face `config.json` or presets; exact parameter counts.
//! - `memory` — GPU and host peak memory of a training setup, as a breakdown by component.
//! - `search` — the setup space and the planner that picks the fastest setup that fits.
//! - `emit`   — configs for DeepSpeed, accelerate, HF TrainingArguments and `memfit train`.
//!
//! This crate does no I/O except parsing what it is handed, and depends on no other memfit crate.
