//! The parameter inventory: every weight and bias tensor of a model, grouped and labelled.
//!
//! Each family's builder lists the tensors exactly as transformers' modeling code creates them
//! (modeling_t5.py, modeling_bert.py, modeling_gpt2.py, modeling_llama.py, …), so the sum is the
//! exact parameter count with tied matrices listed once.

use super::{Family, Head};
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
    /// Norms per decoder-only block (2 sequential, 1 parallel).
    pub norms_per_block: u64,
    /// bert pooler (hidden × hidden + bias) present.
    pub pooler: bool,
    /// stablelm per-head q/k LayerNorm.
    pub qk_layernorm: bool,
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

/// gpt2, llama/mistral/qwen2/gemma, phi, stablelm, falcon, bloom.
fn decoder_only(v: &mut Vec<ParamTensor>, family: Family, d: &Dims) {
    let h = d.hidden;
    let n = d.decoder_layers;
    let q_out = d.heads * d.head_dim;
    let kv_out = d.kv_heads * d.head_dim;
    let g = Group::Decoder;
    v.push(t(Group::Embeddings, Role::Embedding, d.vocab, h, 1));
    if d.max_positions > 0 {
        v.push(t(Group::Embeddings, Role::Embedding, d.max_positions, h, 1));
    }
    if family == Family::Bloom {
        v.push(t(Group::Embeddings, Role::Other, 1, h, 2)); // word_embeddings_layernorm
    }
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
    if d.qk_layernorm {
        v.push(t(g, Role::Other, 1, q_out + kv_out, n));
    }
    if d.gated {
        v.push(t(g, Role::Gate, h, d.ffn, n));
    }
    v.push(t(g, Role::Up, h, d.ffn, n));
    v.push(t(g, Role::Down, d.ffn, h, n));
    if d.mlp_bias {
        let up_bias = if d.gated { 2 * d.ffn } else { d.ffn };
        v.push(t(g, Role::Other, 1, up_bias + h, n));
    }
    let per_norm = if d.norm_bias { 2 * h } else { h };
    v.push(t(g, Role::Other, 1, per_norm, n * d.norms_per_block + 1)); // + final norm
}
