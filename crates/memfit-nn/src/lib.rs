//! memfit-nn: the models, in burn tensor ops with CPU fast paths beside them. It knows tensors and
//! models and nothing of runs (memfit-train drives them).
//!
//! - `kernels` — the flex CPU fast paths: hand-written forward/backward ops and the GEMMs they call.
//! - `layers`  — what families share: parameter layouts, activations, masks, gradient collection,
//!   the masked token loss, the chunked LM head, embedding leaves, LoRA.
//! - `weights` — named tensors in safetensors files (Hugging Face names), atomic writes.
//! - `model`   — what a family implements to be trained ([`model::TrainModel`]) and the task
//!   capabilities on top (generation, classification); `batch` — the micro-batch of each task;
//!   `decoding` — greedy decoding settings and logits processors; `families` — the one place that
//!   names every family: which one a config.json describes, and the model a task trains.
//! - `bert`    — BERT, RoBERTa, XLM-RoBERTa sequence classifiers: config.json, transformers' tensor
//!   names (with the pretrained checkpoints' extra and missing tensors), the forward pass and loss.
//! - `t5`      — T5 (v1.0 ReLU and v1.1 gated-GELU): config.json, transformers' tensor names, the
//!   forward pass, per-block checkpointing, the chunked LM head.
//! - `decoder` — decoder-only LMs (Llama, Qwen2, Mistral, Qwen3): config.json, transformers' tensor
//!   names, RoPE and grouped-query attention, full training or LoRA over a frozen f32/bf16 base,
//!   the masked next-token loss, per-layer checkpointing, KV-cache generation, checkpoints as
//!   transformers and PEFT write them (adapters, merged models).

pub mod batch;
pub mod bert;
pub mod decoder;
pub mod decoding;
pub mod families;
pub mod kernels;
pub mod layers;
pub mod model;
pub mod t5;
pub mod weights;

mod error;
pub use error::ModelError;
