//! memfit-plan: the pure memory model.
//!
//! Stages, in the order data passes through them:
//! - [`arch`]   — architectures from Hugging Face `config.json` or presets; exact parameter counts.
//! - [`memory`] — GPU and host peak memory of a training setup, as a breakdown by component.
//! - [`search`] — the setup space and the planner that picks the fastest setup that fits.
//! - [`emit`]   — configs for DeepSpeed, accelerate, HF TrainingArguments and `memfit train`.
//!
//! - [`validation`] — runs the published measurements of `validation/cases.csv` through [`memory`].
//!
//! This crate does no I/O except parsing what it is handed, and depends on no other memfit crate.

pub mod arch;
pub mod emit;
pub mod memory;
pub mod search;
pub mod validation;

use serde::{Deserialize, Serialize};

/// What the model is trained to do; decides the head and which lengths matter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Task {
    /// Encoder-decoder: source length `seq`, target length `tgt_seq`.
    Seq2seq,
    /// Decoder-only language modelling.
    CausalLm,
    /// Encoder with a classification head.
    Classification,
}

impl Task {
    pub const NAMES: &'static str = "seq2seq, causal-lm, classification";

    pub fn parse(s: &str) -> Option<Task> {
        match s {
            "seq2seq" => Some(Task::Seq2seq),
            "causal-lm" => Some(Task::CausalLm),
            "classification" => Some(Task::Classification),
            _ => None,
        }
    }

    /// The task a model is naturally trained for (encoder-decoder → seq2seq, encoder → classification).
    pub fn default_for(arch: &arch::Arch) -> Task {
        if arch.is_encoder_decoder() {
            Task::Seq2seq
        } else if arch.decoder_layers == 0 {
            Task::Classification
        } else {
            Task::CausalLm
        }
    }
}
