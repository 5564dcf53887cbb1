//! Architectures: what a model is made of, read from a Hugging Face `config.json` or a preset.
//!
//! - [`config`]  — `config.json` → [`Arch`] for every supported `model_type`, with `cfg` (field
//!   access that names file and field in its errors), `decoders` (gpt_neox, gptj, opt, phi3,
//!   gemma2, qwen3, starcoder2) and `moe` (mixtral, qwen2_moe).
//! - [`presets`] — named models (`t5-small`, `chatlm-mini`, `qwen2.5-0.5b`, …) as config.json values.
//! - [`params`]  — the parameter inventory: every weight tensor with its shape, role and group, so the
//!   count is exact (tied weights once) and later stages can ask "which tensors are trainable / LoRA
//!   targets / larger than N elements".

pub mod bounds;
mod cfg;
pub mod config;
mod decoders;
mod generic;
mod moe;
pub mod params;
pub mod presets;
mod remote;

pub use config::{ArchError, parse_config};
pub use params::{Group, ParamTensor, Role};
pub use presets::{PRESET_NAMES, preset, preset_config_json};

use serde::Serialize;

/// The family decides the block layout (which linears, norms and dropouts a block has).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Family {
    /// t5 and mt5: encoder-decoder, RMS norm without bias, relative position bias, no linear biases.
    T5,
    /// bert and roberta: post-LN encoder with biases and absolute positions.
    Bert,
    /// gpt2: pre-LN decoder with fused qkv (`c_attn`) and learned positions.
    Gpt2,
    /// llama-style pre-RMS-norm decoders with gated SiLU/GELU MLP and GQA: llama, mistral, qwen2,
    /// qwen3, gemma, gemma2, phi3, and the mixtures of experts mixtral and qwen2_moe.
    Llama,
    /// phi: parallel attention + MLP sharing one LayerNorm, biases everywhere.
    Phi,
    /// stablelm: llama-like but LayerNorm with bias and optional qkv bias.
    StableLm,
    /// falcon: fused qkv, multi-query or grouped, parallel attention.
    Falcon,
    /// bloom: fused qkv with biases, ALiBi, embedding LayerNorm.
    Bloom,
    /// gpt_neox (pythia): fused qkv, partial rotary, two LayerNorms feeding attention and MLP in
    /// parallel (`use_parallel_residual`).
    GptNeox,
    /// gptj: separate q/k/v without bias, partial rotary, one LayerNorm, parallel attention + MLP.
    GptJ,
    /// opt: post- or pre-LN decoder with learned positions (offset 2), ReLU MLP, biases.
    Opt,
    /// starcoder2: LayerNorm with bias, GQA with biases, non-gated GELU MLP.
    Starcoder2,
}

/// How a decoder block is wired, as far as its memory is concerned (what `memory/activations.rs`
/// reads besides the family).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub struct Block {
    /// Attention and MLP read the same block input and add into one residual (gpt-j, gpt-neox
    /// with `use_parallel_residual`, phi, falcon with `parallel_attn`, stablelm with
    /// `use_parallel_residual`): no intermediate residual tensor between them.
    pub parallel: bool,
    /// Norms per block: 2 for a sequential pre-norm block, 1 or 2 for a parallel one, 4 for
    /// gemma2's sandwich (pre and post norm around attention and MLP).
    pub norms: u64,
    /// RMS norms written in Python (upcast to fp32, `pow`, `rsqrt`), as in T5 and llama-style
    /// code, rather than `nn.LayerNorm`.
    pub rms_norm: bool,
    /// The RMS norm multiplies its weight in fp32 (gemma's `output * (1.0 + self.weight.float())`,
    /// chatglm's `self.weight * hidden_states` before `.to(input_dtype)`), where T5's and
    /// llama-style code cast the normalized tensor back to the weight's dtype first.
    pub rms_weight_fp32: bool,
    /// qwen3's per-head RMS norm of q and k (`q_norm`, `k_norm`) before rotary.
    pub qk_norm: bool,
    /// Rotary position embedding applied to q and k (new tensors; partial rotary concatenates the
    /// rotated and the passed-through parts back into full-size q and k).
    pub rotary: bool,
    /// gemma2's `attn_logit_softcapping`: eager attention passes the scores through tanh.
    pub attn_softcap: bool,
    /// gemma2's `final_logit_softcapping`: the logits pass through tanh.
    pub logit_softcap: bool,
}

/// A mixture-of-experts feed-forward (mixtral, qwen2_moe), in the blocks that have one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Moe {
    /// Routed experts per sparse block (`num_local_experts`, `num_experts`).
    pub experts: u64,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub top_k: u64,
    /// Intermediate size of one routed expert.
    pub expert_ffn: u64,
    /// Intermediate size of qwen2_moe's shared expert, 0 for none.
    pub shared_ffn: u64,
    /// Blocks whose feed-forward is the mixture; the others have a dense MLP of `Arch::ffn`.
    pub sparse_layers: u64,
    /// `output_router_logits` (default False): the model returns every sparse block's router
    /// logits and adds the load-balancing loss computed from them.
    pub router_aux_loss: bool,
}

/// How the FFN turns its up-projection into the down-projection's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Activation {
    Relu,
    /// erf GELU (`gelu`): one fused kernel, saves its input.
    Gelu,
    /// tanh GELU written out in Python in transformers (`gelu_new`, T5 v1.1/mT5): saves several tensors.
    GeluNew,
    /// fused tanh GELU kernel (`gelu_pytorch_tanh`, bloom's jit gelu).
    GeluTanh,
    Silu,
}

/// The task head on top of the trunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Head {
    /// The bare trunk (`AutoModel`, e.g. `BertModel`): no head.
    None,
    /// Sequence classification: a linear `hidden → labels` (with bias) on the pooled output.
    Classifier { labels: u64 },
    /// Language-model head, tied to the input embedding (counted once).
    LmTied,
    /// Language-model head with its own matrix.
    LmUntied { bias: bool },
}

/// Everything later stages need to know about a model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Arch {
    /// Preset name or the config's `_name_or_path` / file stem.
    pub name: String,
    pub model_type: String,
    pub family: Family,
    pub hidden: u64,
    /// Width of the token embedding and the LM head: `hidden`, except OPT's
    /// `word_embed_proj_dim` (projected in and out of the blocks).
    pub embed_dim: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub ffn: u64,
    pub gated_ffn: bool,
    pub activation: Activation,
    pub vocab: u64,
    /// Encoder blocks (encoder-only and encoder-decoder models), 0 for decoder-only.
    pub encoder_layers: u64,
    /// Decoder blocks (decoder-only and encoder-decoder models), 0 for encoder-only.
    pub decoder_layers: u64,
    /// Dropout on the residual branches / hidden states (0 = no dropout kernels, no masks saved).
    pub hidden_dropout: f64,
    /// Dropout on the attention probabilities.
    pub attention_dropout: f64,
    pub head: Head,
    /// Block wiring that changes what autograd saves.
    pub block: Block,
    /// The mixture of experts, if the model has one.
    pub moe: Option<Moe>,
    /// The parameter inventory (see [`params`]).
    pub tensors: Vec<ParamTensor>,
    /// What was assumed because the config's `model_type` is not one memfit reads (a generic
    /// llama-style decoder, `generic.rs`): shown with every estimate of it. `None`: read as is.
    pub assumption: Option<String>,
}

impl Arch {
    pub fn is_encoder_decoder(&self) -> bool {
        self.encoder_layers > 0 && self.decoder_layers > 0
    }

    /// The modeling code lives in the model's repository (`trust_remote_code`: qwen, chatglm,
    /// baichuan, internlm2), not in transformers.
    pub fn runs_remote_code(&self) -> bool {
        remote::MODEL_TYPES.contains(&self.model_type.as_str())
    }

    /// Total parameters, tied tensors once.
    pub fn params_total(&self) -> u64 {
        self.tensors.iter().map(ParamTensor::elements).sum()
    }

    /// Parameters in one group.
    pub fn params_in(&self, group: Group) -> u64 {
        self.tensors
            .iter()
            .filter(|t| t.group == group)
            .map(ParamTensor::elements)
            .sum()
    }

    /// Total parameters of the trunk blocks (what one transformer layer costs × layers).
    pub fn layers_total(&self) -> u64 {
        self.encoder_layers + self.decoder_layers
    }

    /// Replaces the head the config described with the one a task needs (e.g. a bare `BertModel`
    /// config used for classification gets a 2-label classifier). Keeps the config's head when it
    /// already fits the task.
    pub fn with_task(mut self, task: crate::Task) -> Self {
        let wanted = match (task, self.head) {
            (crate::Task::Classification, Head::Classifier { .. }) => return self,
            (crate::Task::Classification, _) => Head::Classifier { labels: 2 },
            (_, Head::LmTied | Head::LmUntied { .. }) => return self,
            (_, _) => Head::LmTied,
        };
        self.tensors.retain(|t| t.group != Group::Head);
        self.head = wanted;
        params::push_head(
            &mut self.tensors,
            self.embed_dim,
            self.vocab,
            wanted,
            self.family,
        );
        self
    }
}
