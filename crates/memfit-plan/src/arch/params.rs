//! The parameter inventory: every weight and bias tensor of a model, grouped and labelled.
//!
//! Each family's builder lists the tensors exactly as transformers' modeling code creates them
//! (modeling_t5.py, modeling_bert.py, modeling_gpt2.py, modeling_llama.py, …), so the sum is the
//! exact parameter count with tied matrices listed once.

use super::{Block, Family, Head, Moe};
use serde::Serialize;

/// Where a tensor lives (what `--freeze embeddings,encoder` refers to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Group {
    /// Token/position/type embeddings and the embedding LayerNorm (and a tied LM head).
    Embeddings,
    /// Encoder blocks, the encoder's final norm and the pooler.
    Encoder,
    /// Decoder blocks (all blocks of a decoder-only model) and the final norm.
    Decoder,
    /// Task head with its own weights (classifier, untied LM head).
    Head,
}

/// What a tensor does (what `--lora-targets` refers to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    Q,
    K,
    V,
    O,
    /// A fused query-key-value projection (gpt2 c_attn, bloom/falcon query_key_value).
    Qkv,
    Gate,
    Up,
    Down,
    LmHead,
    Embedding,
    /// Norm weights/biases, linear biases, position biases, pooler, classifier.
    Other,
}

/// One parameter tensor shape, repeated `count` times (e.g. once per layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ParamTensor {
    pub group: Group,
    pub role: Role,
    /// Input features of a linear (1 for vectors).
    pub rows: u64,
    /// Output features of a linear (the vector length for vectors).
    pub cols: u64,
    pub count: u64,
    /// A routed expert's weight: each token passes through `top_k` of the mixture's experts, so
    /// it computes with `top_k / experts` of these instances (see [`super::Moe`]).
    pub routed: bool,
}

impl ParamTensor {
    /// Elements of one instance.
    pub fn size(&self) -> u64 {
        self.rows * self.cols
    }
    /// Elements over all instances.
    pub fn elements(&self) -> u64 {
        self.size() * self.count
    }
    /// A linear weight (as opposed to a bias, norm or embedding).
    pub fn is_linear(&self) -> bool {
        self.rows > 1
            && !matches!(self.role, Role::Embedding | Role::Other)
            && self.group != Group::Embeddings
    }
}

/// The dimensions and switches a builder needs; filled from config.json by `config.rs`.
#[derive(Debug, Clone, Default)]
pub struct Dims {
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub ffn: u64,
    pub gated: bool,
    pub vocab: u64,
    pub encoder_layers: u64,
    pub decoder_layers: u64,
    /// Learned absolute positions (bert, gpt2); 0 for none.
    pub max_positions: u64,
    /// bert token-type embeddings.
    pub type_vocab: u64,
    /// t5 relative attention buckets.
    pub rel_buckets: u64,
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// Norms carry a bias (LayerNorm) or only a weight (RMSNorm / T5LayerNorm).
    pub norm_bias: bool,
    /// Block wiring; `block.norms` is the number of norms per decoder-only block.
    pub block: Block,
    /// Norms have neither weight nor bias (OPT's `layer_norm_elementwise_affine: false`).
    pub norms_without_params: bool,
    /// No final norm after the last block (OPT with `do_layer_norm_before: false`).
    pub no_final_norm: bool,
    /// Embedding width when it differs from `hidden` (OPT's `word_embed_proj_dim`, with
    /// bias-free `project_in` / `project_out` linears between it and the blocks).
    pub embed_dim: Option<u64>,
    /// The mixture of experts (mixtral, qwen2_moe).
    pub moe: Option<Moe>,
    /// bert pooler (hidden × hidden + bias) present.
    pub pooler: bool,
    /// Elements of the q/k norms of one block (stablelm's per-head LayerNorms, qwen3's
    /// `q_norm`/`k_norm` over head_dim); 0 for none.
    pub qk_norm: u64,
    /// falcon: one fused qkv with output (heads + 2·kv_heads)·head_dim.
    pub fused_qkv: bool,
}

fn t(group: Group, role: Role, rows: u64, cols: u64, count: u64) -> ParamTensor {
    ParamTensor {
        group,
        role,
        rows,
        cols,
        count,
        routed: false,
    }
}

/// Builds the inventory for a family; the head is appended by [`push_head`].
pub fn build(family: Family, d: &Dims, head: Head) -> Vec<ParamTensor> {
    let mut v = Vec::new();
    match family {
        Family::T5 => t5(&mut v, d),
        Family::Bert => bert(&mut v, d),
        _ => decoder_only(&mut v, family, d),
    }
    v.retain(|p| p.count > 0 && p.size() > 0);
    push_head(&mut v, d.hidden, d.vocab, head, family);
    v
}

/// Appends the head's own tensors (a tied LM head adds none).
pub fn push_head(v: &mut Vec<ParamTensor>, hidden: u64, vocab: u64, head: Head, family: Family) {
    match head {
        Head::None | Head::LmTied => {}
        Head::Classifier { labels } => {
            // bert/roberta: BertForSequenceClassification = pooler output → Linear(hidden, labels).
            // RobertaClassificationHead has dense(h,h)+out_proj; others a bias-free score linear.
            match family {
                Family::Bert => {
                    v.push(t(Group::Head, Role::Other, hidden, labels, 1));
                    v.push(t(Group::Head, Role::Other, 1, labels, 1));
                }
                _ => v.push(t(Group::Head, Role::Other, hidden, labels, 1)),
            }
        }
        Head::LmUntied { bias } => {
            v.push(t(Group::Head, Role::LmHead, hidden, vocab, 1));
            if bias {
                v.push(t(Group::Head, Role::Other, 1, vocab, 1));
            }
        }
    }
}

/// modeling_t5.py: shared embedding; blocks with q,k,v,o (no bias), T5LayerNorm (weight only),
/// DenseReluDense (wi or wi_0+wi_1, wo); relative_attention_bias only in each stack's first layer.
fn t5(v: &mut Vec<ParamTensor>, d: &Dims) {
    let h = d.hidden;
    let inner = d.heads * d.head_dim;
    v.push(t(Group::Embeddings, Role::Embedding, d.vocab, h, 1));
    for (group, layers, attentions) in [
        (Group::Encoder, d.encoder_layers, 1),
        (Group::Decoder, d.decoder_layers, 2),
    ] {
        if layers == 0 {
            continue;
        }
        let n = layers * attentions;
        v.push(t(group, Role::Q, h, inner, n));
        v.push(t(group, Role::K, h, inner, n));
        v.push(t(group, Role::V, h, inner, n));
        v.push(t(group, Role::O, inner, h, n));
        if d.gated {
            v.push(t(group, Role::Gate, h, d.ffn, layers));
        }
        v.push(t(group, Role::Up, h, d.ffn, layers));
        v.push(t(group, Role::Down, d.ffn, h, layers));
        // one norm per sub-layer + the stack's final norm
        v.push(t(group, Role::Other, 1, h, layers * (attentions + 1) + 1));
        v.push(t(group, Role::Other, d.rel_buckets, d.heads, 1));
    }
}

/// modeling_bert.py / modeling_roberta.py.
fn bert(v: &mut Vec<ParamTensor>, d: &Dims) {
    let h = d.hidden;
    let n = d.encoder_layers;
    v.push(t(Group::Embeddings, Role::Embedding, d.vocab, h, 1));
    v.push(t(Group::Embeddings, Role::Embedding, d.max_positions, h, 1));
    v.push(t(Group::Embeddings, Role::Embedding, d.type_vocab, h, 1));
    v.push(t(Group::Embeddings, Role::Other, 1, h, 2)); // embeddings LayerNorm
    for role in [Role::Q, Role::K, Role::V, Role::O] {
        v.push(t(Group::Encoder, role, h, h, n));
    }
    v.push(t(Group::Encoder, Role::Other, 1, h, 4 * n)); // q,k,v,o biases
    v.push(t(Group::Encoder, Role::Up, h, d.ffn, n));
    v.push(t(Group::Encoder, Role::Other, 1, d.ffn, n));
    v.push(t(Group::Encoder, Role::Down, d.ffn, h, n));
    v.push(t(Group::Encoder, Role::Other, 1, h, n));
    v.push(t(Group::Encoder, Role::Other, 1, h, 4 * n)); // two LayerNorms (weight + bias)
    if d.pooler {
        v.push(t(Group::Encoder, Role::Other, h, h, 1));
        v.push(t(Group::Encoder, Role::Other, 1, h, 1));
    }
}

/// gpt2, the llama-style decoders, phi, stablelm, falcon, bloom, gpt_neox, gptj, opt, starcoder2,
/// and the mixtures of experts.
fn decoder_only(v: &mut Vec<ParamTensor>, family: Family, d: &Dims) {
    let h = d.hidden;
    let n = d.decoder_layers;
    let g = Group::Decoder;
    let embed = d.embed_dim.unwrap_or(h);
    v.push(t(Group::Embeddings, Role::Embedding, d.vocab, embed, 1));
    if d.max_positions > 0 {
        v.push(t(Group::Embeddings, Role::Embedding, d.max_positions, h, 1));
    }
    if family == Family::Bloom {
        v.push(t(Group::Embeddings, Role::Other, 1, h, 2)); // word_embeddings_layernorm
    }
    if embed != h {
        // OPTDecoder.project_in / project_out: Linear(word_embed_proj_dim ↔ hidden, bias=False)
        v.push(t(Group::Embeddings, Role::Other, embed, h, 1));
        v.push(t(g, Role::Other, h, embed, 1));
    }
    attention(v, d);
    match d.moe {
        Some(m) => {
            mlp(v, d, d.ffn, n - m.sparse_layers);
            experts(v, d, m);
        }
        None => mlp(v, d, d.ffn, n),
    }
    let per_norm = match (d.norms_without_params, d.norm_bias) {
        (true, _) => 0,
        (false, true) => 2 * h,
        (false, false) => h,
    };
    let final_norm = if d.no_final_norm { 0 } else { 1 };
    v.push(t(
        g,
        Role::Other,
        1,
        per_norm,
        n * d.block.norms + final_norm,
    ));
}

/// One attention per decoder block: fused or separate q/k/v, output projection, q/k norms.
fn attention(v: &mut Vec<ParamTensor>, d: &Dims) {
    let (h, n, g) = (d.hidden, d.decoder_layers, Group::Decoder);
    let q_out = d.heads * d.head_dim;
    let kv_out = d.kv_heads * d.head_dim;
    if d.fused_qkv {
        let out = q_out + 2 * kv_out;
        v.push(t(g, Role::Qkv, h, out, n));
        if d.qkv_bias {
            v.push(t(g, Role::Other, 1, out, n));
        }
    } else {
        v.push(t(g, Role::Q, h, q_out, n));
        v.push(t(g, Role::K, h, kv_out, n));
        v.push(t(g, Role::V, h, kv_out, n));
        if d.qkv_bias {
            v.push(t(g, Role::Other, 1, q_out + 2 * kv_out, n));
        }
    }
    v.push(t(g, Role::O, q_out, h, n));
    if d.o_bias {
        v.push(t(g, Role::Other, 1, h, n));
    }
    v.push(t(g, Role::Other, 1, d.qk_norm, n));
}

/// A dense MLP of intermediate size `ffn` in `layers` blocks (gated: gate + up + down).
fn mlp(v: &mut Vec<ParamTensor>, d: &Dims, ffn: u64, layers: u64) {
    let (h, g) = (d.hidden, Group::Decoder);
    if d.gated {
        v.push(t(g, Role::Gate, h, ffn, layers));
    }
    v.push(t(g, Role::Up, h, ffn, layers));
    v.push(t(g, Role::Down, ffn, h, layers));
    if d.mlp_bias {
        let up_bias = if d.gated { 2 * ffn } else { ffn };
        v.push(t(g, Role::Other, 1, up_bias + h, layers));
    }
}

/// The sparse blocks' mixtures (modeling_mixtral.py, modeling_qwen2_moe.py): the router
/// (`num_experts × hidden`, no bias), every routed expert's gate/up/down (`gate_up_proj`
/// `E × 2f × h` and `down_proj` `E × h × f` in transformers 5; `w1`/`w3`/`w2` per expert before),
/// and qwen2_moe's shared expert with its sigmoid gate (`Linear(hidden, 1, bias=False)`).
fn experts(v: &mut Vec<ParamTensor>, d: &Dims, m: Moe) {
    let (h, g, n) = (d.hidden, Group::Decoder, m.sparse_layers);
    v.push(t(g, Role::Other, h, m.experts, n));
    let gated = Dims {
        mlp_bias: false,
        ..d.clone()
    };
    let first_expert = v.len();
    mlp(v, &gated, m.expert_ffn, n * m.experts);
    for p in &mut v[first_expert..] {
        p.routed = true;
    }
    if m.shared_ffn > 0 {
        mlp(v, &gated, m.shared_ffn, n);
        v.push(t(g, Role::Other, h, 1, n));
    }
}
