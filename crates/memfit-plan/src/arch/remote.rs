//! Remote-code decoders (`trust_remote_code`: the modeling file lives in the model's repository,
//! not in transformers): qwen (Qwen's first generation), chatglm (ChatGLM2/3, GLM-4), baichuan
//! (Baichuan 1 and 2) and internlm2. Field names and defaults follow each repository's
//! `configuration_*.py`; the tensors its `modeling_*.py`. Every one is a pre-RMS-norm decoder with
//! a fused query-key-value linear and a gated SiLU MLP, read into the llama family's terms.

use super::cfg::{Cfg, activation_of};
use super::config::{ArchError, Kind, kv_heads_divide, llama_block};
use super::params::Dims;
use super::{Family, Head};

/// The model types whose modeling code lives in the model's repository (read by this module).
pub const MODEL_TYPES: [&str; 4] = ["qwen", "chatglm", "baichuan", "internlm2"];

/// Reads one of this module's model types into `d` and says what else it decided.
pub(crate) fn parse(model_type: &str, cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    match model_type {
        "qwen" => qwen(cfg, d),
        "chatglm" => chatglm(cfg, d),
        "baichuan" => baichuan(cfg, d),
        "internlm2" => internlm2(cfg, d),
        other => unreachable!("config.rs dispatches only this module's types, not {other:?}"),
    }
}

/// The llama-family [`Kind`] of these models: no dropout in training by default, untied head
/// unless the reader says otherwise.
fn kind(cfg: &Cfg, head: Head, attention_dropout: f64) -> Result<Kind, ArchError> {
    Ok(Kind {
        family: Family::Llama,
        activation: activation_of(cfg, "hidden_act", "silu")?,
        head,
        hidden_dropout: 0.0,
        attention_dropout,
    })
}

/// Qwen (v1) `modeling_qwen.py`: `c_attn` = Linear(hidden, 3·projection, bias=True) with
/// projection = kv_channels · heads (kv_channels default hidden / heads), `c_proj` with
/// `bias=not no_bias` (no_bias default True); `QWenMLP`: `w1`, `w2` = Linear(hidden,
/// intermediate_size // 2) and `c_proj` back (w1(x) · silu(w2(x))): the gated MLP's width is half
/// the config's `intermediate_size`; `ln_1`, `ln_2`, `ln_f` RMSNorm; untied `lm_head`.
fn qwen(cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    d.hidden = cfg.u64("hidden_size")?;
    d.heads = cfg.u64("num_attention_heads")?;
    d.kv_heads = d.heads;
    d.head_dim = match cfg.opt_u64("kv_channels")? {
        Some(k) => k,
        None => cfg.divides(d.hidden, d.heads, "num_attention_heads")?,
    };
    d.decoder_layers = cfg.u64("num_hidden_layers")?;
    d.ffn = cfg.u64("intermediate_size")? / 2;
    d.vocab = cfg.u64("vocab_size")?;
    llama_block(d);
    d.fused_qkv = true;
    let no_bias = cfg.bool_or("no_bias", true)?;
    (d.qkv_bias, d.o_bias, d.mlp_bias) = (true, !no_bias, !no_bias);
    let dropout = cfg.f64_or("attn_dropout_prob", 0.0)?;
    kind(cfg, Head::LmUntied { bias: false }, dropout)
}

/// ChatGLM2/3 and GLM-4 `modeling_chatglm.py`: `query_key_value` = Linear(hidden, projection +
/// 2 · kv_channels · multi_query_group_num) when `multi_query_attention` (else 3 · projection),
/// bias `add_bias_linear or add_qkv_bias`; `dense` with `add_bias_linear`; `dense_h_to_4h` =
/// Linear(hidden, 2 · ffn_hidden_size) (swiglu: a gate and an up of ffn each) and `dense_4h_to_h`,
/// both with `add_bias_linear`; RMSNorm when `rmsnorm` (default True), else LayerNorm; a final
/// norm when `post_layer_norm` (default True); `output_layer` its own linear (the model has no
/// `get_output_embeddings`, so it is never tied). Vocabulary: `padded_vocab_size`.
fn chatglm(cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    d.hidden = cfg.u64("hidden_size")?;
    d.heads = cfg.u64("num_attention_heads")?;
    d.head_dim = match cfg.opt_u64("kv_channels")? {
        Some(k) => k,
        None => cfg.divides(d.hidden, d.heads, "num_attention_heads")?,
    };
    d.kv_heads = if cfg.bool_or("multi_query_attention", false)? {
        cfg.u64("multi_query_group_num")?
    } else {
        d.heads
    };
    kv_heads_divide(cfg, d, "multi_query_group_num")?;
    // ChatGLM-6B (v1) has neither `ffn_hidden_size` nor `padded_vocab_size`: named as missing
    d.decoder_layers = cfg.u64("num_layers")?;
    d.ffn = cfg.u64("ffn_hidden_size")?;
    d.vocab = cfg.u64("padded_vocab_size")?;
    llama_block(d);
    d.block.rms_norm = cfg.bool_or("rmsnorm", true)?;
    d.block.rms_weight_fp32 = d.block.rms_norm;
    d.norm_bias = !d.block.rms_norm;
    d.no_final_norm = !cfg.bool_or("post_layer_norm", true)?;
    d.fused_qkv = true;
    let bias = cfg.bool_or("add_bias_linear", false)?;
    d.qkv_bias = bias || cfg.bool_or("add_qkv_bias", false)?;
    (d.o_bias, d.mlp_bias) = (bias, bias);
    let dropout = cfg.f64_or("attention_dropout", 0.0)?;
    kind(cfg, Head::LmUntied { bias: false }, dropout)
}

/// Baichuan 1 and 2 `modeling_baichuan.py`: `W_pack` = Linear(hidden, 3 · hidden, bias=False),
/// `o_proj`, `gate_proj`/`up_proj`/`down_proj` without bias, RMSNorm, `lm_head` (Baichuan 2's
/// `NormHead`: a vocab × hidden weight, no bias), untied (tie_word_embeddings default False).
/// The 7B models use rotary positions and carry `max_position_embeddings`; the 13B ones use
/// ALiBi and carry only `model_max_length`.
fn baichuan(cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    d.hidden = cfg.u64("hidden_size")?;
    d.heads = cfg.u64("num_attention_heads")?;
    d.kv_heads = d.heads;
    d.head_dim = cfg.divides(d.hidden, d.heads, "num_attention_heads")?;
    d.decoder_layers = cfg.u64("num_hidden_layers")?;
    d.ffn = cfg.u64("intermediate_size")?;
    d.vocab = cfg.u64("vocab_size")?;
    llama_block(d);
    d.block.rotary = cfg.opt_u64("max_position_embeddings")?.is_some();
    d.fused_qkv = true;
    let head = if cfg.bool_or("tie_word_embeddings", false)? {
        Head::LmTied
    } else {
        Head::LmUntied { bias: false }
    };
    kind(cfg, head, 0.0)
}

/// InternLM2 `modeling_internlm2.py`: `wqkv` = Linear(hidden, (heads + 2 · kv_heads) ·
/// head_dim, bias=config.bias) (the grouped layout), `wo` with `bias`; `feed_forward` `w1`, `w3`
/// (gate, up) and `w2` (down) without bias; `attention_norm`, `ffn_norm`, `norm` RMSNorm; untied
/// `output` (tie_word_embeddings default False). `bias` defaults to True in its configuration
/// class; the released configs set it False.
fn internlm2(cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    super::config::decoder_dims(cfg, d)?;
    llama_block(d);
    d.fused_qkv = true;
    let bias = cfg.bool_or("bias", true)?;
    (d.qkv_bias, d.o_bias) = (bias, bias);
    let head = super::config::lm_head(cfg, false, false)?;
    let dropout = cfg.f64_or("attention_dropout", 0.0)?;
    kind(cfg, head, dropout)
}
