//! The memory model: GPU and host peak of a training setup, as a breakdown by component.
//!
//! - [`setup`]       — the resolved setup (precision, optimizer, LoRA, ZeRO, …).
//! - [`states`]      — weights, gradients, optimizer states; ZeRO sharding and offload.
//! - [`activations`] — saved tensors per block, logits, autocast copies, temporaries; a block's
//!   norms and attention in `block`, its dense or mixture-of-experts feed-forward in `ffn`, the
//!   logits and loss in `logits`.
//! - [`stack`]       — the training stacks (`--stack`) as profiles: loss, model code, FSDP
//!   gradients, QLoRA preparation, each with the source file it comes from.
//! - [`framework`]   — measured constants of the software stack (CUDA context, allocator, NCCL…).
//! - [`allocator`] / [`caching_allocator`] — what the caching allocator reserves beyond the
//!   tensors when lengths vary; a replay of its rules for traces and modelled steps.
//! - [`gpu`] / [`host`] — the two peaks, assembled from the above.
//! - [`memfit_host`] — the host peak of memfit's own trainer on the CPU, from what it holds
//!   (measured by `memfit bench memory-grid`).
//!
//! GPU peak = persistent state + max over phases (forward/backward with activations; optimizer
//! step with its temporaries) + framework overheads + allocator slack (docs/architecture.md §2).

pub mod activations;
pub mod allocator;
pub mod band;
mod block;
pub mod caching_allocator;
mod ffn;
pub mod framework;
pub mod gpu;
pub mod host;
mod logits;
pub mod magnitude;
pub mod memfit_device;
pub mod memfit_host;
pub mod setup;
pub mod stack;
pub mod states;

pub use framework::Framework;
pub use setup::*;

use crate::arch::Arch;
use serde::Serialize;

/// What a component's size grows with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scaling {
    /// Fixed for the model and setup.
    Neither,
    /// Grows with micro-batch size.
    Batch,
    /// Grows with sequence length (linearly or quadratically).
    Sequence,
    /// Grows with both.
    BatchAndSequence,
}

impl Scaling {
    pub fn as_str(self) -> &'static str {
        match self {
            Scaling::Neither => "neither",
            Scaling::Batch => "batch",
            Scaling::Sequence => "sequence",
            Scaling::BatchAndSequence => "batch × sequence",
        }
    }
}

/// One line of a breakdown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Component {
    pub name: String,
    pub bytes: u64,
    pub note: String,
    #[serde(skip)]
    pub scales: Scaling,
}

impl Component {
    pub fn new(name: &str, bytes: u64, scales: Scaling, note: impl Into<String>) -> Component {
        Component {
            name: name.to_string(),
            bytes,
            note: note.into(),
            scales,
        }
    }
}

/// GPU memory of one rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuEstimate {
    /// `torch.cuda.max_memory_allocated()`.
    pub peak_allocated_bytes: u64,
    /// `torch.cuda.max_memory_reserved()`.
    pub peak_reserved_bytes: u64,
    /// What nvidia-smi / NVML shows as used.
    pub nvml_used_bytes: u64,
    pub components: Vec<Component>,
}

/// Host memory of one node (all ranks and loader workers on it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostEstimate {
    /// Peak over loading and training.
    pub peak_rss_bytes: u64,
    /// Peak while training (after loading), what a mid-epoch RSS reading shows.
    #[serde(skip)]
    pub train_rss_bytes: u64,
    /// memfit's trainer: evaluation as its own phase at the micro-batch (states, the weights'
    /// evaluation copy, one forward pass without a graph; `memfit_host::eval`); 0 where not modelled.
    /// Not in `peak_rss_bytes`: a start shrinks the evaluation batch to fit it instead.
    #[serde(skip_serializing_if = "is_zero")]
    pub eval_rss_bytes: u64,
    pub components: Vec<Component>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// A whole estimate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Estimate {
    /// `None` with `--device cpu`.
    pub gpu: Option<GpuEstimate>,
    pub host: HostEstimate,
}

/// Estimates a setup under a software stack (`Framework::default()` = current PyTorch).
pub fn estimate(arch: &Arch, setup: &Setup, fw: &Framework) -> Result<Estimate, String> {
    setup.validate()?;
    magnitude::check(arch, setup)?;
    memfit_runtime_modeled(arch, setup)?;
    let arch = &*stack::model_view(arch, &setup.stack.profile());
    let gpu = match (setup.device, setup.runtime) {
        (Device::Cuda, Runtime::Memfit) => Some(memfit_device::device(arch, setup, fw)),
        (Device::Cuda, Runtime::Pytorch) => Some(gpu::gpu(arch, setup, fw)),
        (Device::Cpu, _) => None,
    };
    let host = host::host(arch, setup, fw);
    Ok(Estimate { gpu, host })
}

/// memfit's own trainer is modeled term by term from its code (memfit_host/ on the CPU,
/// memfit_device/ on a GPU) for the families it trains: T5, the BERT family and the Llama-style
/// decoders (llama, qwen2, mistral, qwen3). Other families would be a guess.
pub fn memfit_runtime_modeled(arch: &Arch, setup: &Setup) -> Result<(), String> {
    use crate::arch::Family;
    if setup.runtime != Runtime::Memfit {
        return Ok(());
    }
    let decoder = matches!(
        arch.model_type.as_str(),
        "llama" | "qwen2" | "mistral" | "qwen3"
    );
    match arch.family {
        Family::T5 | Family::Bert => Ok(()),
        Family::Llama if decoder => Ok(()),
        _ => Err(format!(
            "memfit-plan's model of memfit's own trainer has no terms for {} ({}): it \
             models T5, the BERT family and llama/qwen2/mistral/qwen3 decoders, so it cannot plan \
             this run",
            arch.name, arch.model_type
        )),
    }
}

/// Bytes → GiB with two decimals, the display unit everywhere.
pub fn gib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / (1u64 << 30) as f64)
}
