//! memfit-plan: the pure memory model.
//!
//! Stages, in the order data passes through them:
//! - [`arch`]   — architectures from Hugging Face `config.json` or presets; exact parameter counts.
//! - [`memory`] — GPU and host peak memory of a training setup, as a breakdown by component.
//! - [`search`] — the setup space and the planner that picks the fastest setup that fits.
//! - [`emit`]   — configs for DeepSpeed, accelerate, HF TrainingArguments, `memfit train` and
//!   `memfit run --profiles`.
//!
//! Beside them, [`validation`] runs the published measurements of `validation/cases.csv` through
//! [`memory`] (the accuracy test and `docs/accuracy.md` use it), and [`grid`] compares the measured
//! host peaks of memfit's own trainer (`validation/memfit_grid.csv`) with the model.
//!
//! This crate does no I/O except parsing what it is handed, and depends on no other memfit crate.
//! The model itself is explained in `docs/memory-model.md`.
//!
//! ```
//! use memfit_plan::{arch, memory, search};
//!
//! let model = arch::preset("chatlm-mini").unwrap();
//! assert_eq!(model.params_total(), 187_692_288);
//! let mut setup = memory::Setup::new(&model);
//! setup.batch = 8;
//! setup.seq = 256;
//! setup.precision = memory::Precision::AmpBf16;
//! let fw = memory::Framework::default(); // PyTorch 2.x behaviour
//! let estimate = memory::estimate(&model, &setup, &fw).unwrap();
//! assert!(estimate.gpu.unwrap().peak_allocated_bytes > 2 << 30);
//!
//! let budget = search::Budget { gpu_bytes: Some(8 << 30), host_bytes: 16 << 30, headroom: 0.1 };
//! let request = search::Request { base: setup, target_batch: 32, budget };
//! let plan = search::plan(&model, &request, &fw).unwrap();
//! let chosen = plan.chosen.unwrap();
//! assert_eq!(chosen.setup.batch * chosen.setup.accum, 32);
//! ```

pub mod arch;
pub mod emit;
pub mod grid;
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

    /// The CLI spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Task::Seq2seq => "seq2seq",
            Task::CausalLm => "causal-lm",
            Task::Classification => "classification",
        }
    }

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
