//! The decoder-only model types added for issue 17: gpt_neox, gptj, opt, phi3, gemma2, qwen3,
//! starcoder2. Field names and defaults follow each `configuration_*.py` of transformers 5.23 (the
//! default used when a key is absent is noted inline); the tensors follow its `modeling_*.py`.

use super::cfg::{Cfg, activation_of};
use super::config::{ArchError, Kind, decoder_dims, gpt2_dims, llama_block, lm_head, mha_dims};
use super::params::Dims;
use super::{Block, Family};

/// Reads one of this module's model types into `d` and says what else it decided.
pub(crate) fn parse(model_type: &str, cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    match model_type {
        "gpt_neox" => gpt_neox(cfg, d),
        "gptj" => gptj(cfg, d),
        "opt" => opt(cfg, d),
        "phi3" => phi3(cfg, d),
        "gemma2" => gemma2(cfg, d),
        "qwen3" => qwen3(cfg, d),
        "starcoder2" => starcoder2(cfg, d),
        other => unreachable!("config.rs dispatches only this module's types, not {other:?}"),
    }
}

/// modeling_gpt_neox.py: fused `query_key_value` (3·hidden, `attention_bias` default True),
/// `dense`, `dense_h_to_4h`/`dense_4h_to_h` with biases, `input_layernorm` and
/// `post_attention_layernorm` (both read the block input when `use_parallel_residual`, default
/// True), `final_layer_norm`, untied `embed_out` (tie_word_embeddings default False).
fn gpt_neox(cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    decoder_dims(cfg, d)?; // no num_key_value_heads or head_dim: one kv head per head
    d.fused_qkv = true;
    let bias = cfg.bool_or("attention_bias", true)?;
    (d.qkv_bias, d.o_bias, d.mlp_bias, d.norm_bias) = (bias, bias, true, true);
    d.block = Block {
        parallel: cfg.bool_or("use_parallel_residual", true)?,
        norms: 2,
        rotary: true,
        ..Block::default()
    };
    Ok(Kind {
        family: Family::GptNeox,
        activation: activation_of(cfg, "hidden_act", "gelu")?,
        head: lm_head(cfg, false, false)?,
        hidden_dropout: cfg.f64_or("hidden_dropout", 0.0)?,
        attention_dropout: cfg.f64_or("attention_dropout", 0.0)?,
    })
}

/// modeling_gptj.py: `q_proj`/`k_proj`/`v_proj`/`out_proj` without bias, `fc_in`/`fc_out` with
/// bias (n_inner default 4·n_embd), one `ln_1` feeding attention and MLP in parallel, `ln_f`, and
/// an untied `lm_head` with a bias (tie_word_embeddings default False).
fn gptj(cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    gpt2_dims(cfg, d)?;
    (d.mlp_bias, d.norm_bias) = (true, true);
    d.block = Block {
        parallel: true,
        norms: 1,
        rotary: true,
        ..Block::default()
    };
    Ok(Kind {
        family: Family::GptJ,
        activation: activation_of(cfg, "activation_function", "gelu_new")?,
        head: lm_head(cfg, false, true)?,
        hidden_dropout: cfg.f64_or("resid_pdrop", 0.0)?,
        attention_dropout: cfg.f64_or("attn_pdrop", 0.0)?,
    })
}

/// modeling_opt.py: token embeddings of `word_embed_proj_dim` (default hidden_size) with
/// `project_in`/`project_out` when it differs, learned positions of `max_position_embeddings + 2`
/// (OPTLearnedPositionalEmbedding's offset), q/k/v/out_proj and fc1/fc2 with `enable_bias`
/// (default True), two LayerNorms per block (`layer_norm_elementwise_affine` default True), a
/// final LayerNorm only when `do_layer_norm_before` (default True), lm_head tied by default.
fn opt(cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    mha_dims(cfg, d)?;
    d.decoder_layers = cfg.u64("num_hidden_layers")?;
    d.ffn = cfg.u64("ffn_dim")?;
    d.max_positions = cfg.u64_or("max_position_embeddings", 2048)? + 2;
    d.embed_dim = Some(cfg.u64_or("word_embed_proj_dim", d.hidden)?);
    let bias = cfg.bool_or("enable_bias", true)?;
    (d.qkv_bias, d.o_bias, d.mlp_bias, d.norm_bias) = (bias, bias, bias, true);
    d.norms_without_params = !cfg.bool_or("layer_norm_elementwise_affine", true)?;
    d.no_final_norm = !cfg.bool_or("do_layer_norm_before", true)?
        || cfg.bool_or("_remove_final_layer_norm", false)?;
    d.block.norms = 2;
    Ok(Kind {
        family: Family::Opt,
        activation: activation_of(cfg, "activation_function", "relu")?,
        head: lm_head(cfg, true, false)?,
        hidden_dropout: cfg.f64_or("dropout", 0.1)?,
        attention_dropout: cfg.f64_or("attention_dropout", 0.0)?,
    })
}

/// modeling_phi3.py: fused `qkv_proj` and `o_proj` without bias, fused `gate_up_proj` (2·ffn,
/// listed as a gate and an up tensor of ffn each: the same elements) and `down_proj`, two RMS
/// norms, untied lm_head (tie_word_embeddings default False).
fn phi3(cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    decoder_dims(cfg, d)?;
    llama_block(d);
    d.fused_qkv = true;
    Ok(Kind {
        family: Family::Llama,
        activation: activation_of(cfg, "hidden_act", "silu")?,
        head: lm_head(cfg, false, false)?,
        hidden_dropout: cfg.f64_or("resid_pdrop", 0.0)?,
        attention_dropout: cfg.f64_or("attention_dropout", 0.0)?,
    })
}

/// modeling_gemma2.py: llama-style attention (`attention_bias` default False, head_dim default
/// 256) and gated MLP, four RMS norms per block (input, post-attention, pre- and
/// post-feed-forward), tied lm_head (default True); the activation is `hidden_activation`
/// (default gelu_pytorch_tanh); `attn_logit_softcapping` (default 50.0) and
/// `final_logit_softcapping` (default 30.0) pass scores and logits through tanh.
fn gemma2(cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    decoder_dims(cfg, d)?;
    d.head_dim = cfg.u64_or("head_dim", 256)?;
    llama_block(d);
    d.block.norms = 4;
    d.block.rms_weight_fp32 = true;
    d.block.attn_softcap = cfg.present_or("attn_logit_softcapping", true);
    d.block.logit_softcap = cfg.present_or("final_logit_softcapping", true);
    let bias = cfg.bool_or("attention_bias", false)?;
    (d.qkv_bias, d.o_bias) = (bias, bias);
    Ok(Kind {
        family: Family::Llama,
        activation: activation_of(cfg, "hidden_activation", "gelu_pytorch_tanh")?,
        head: lm_head(cfg, true, false)?,
        hidden_dropout: 0.0,
        attention_dropout: cfg.f64_or("attention_dropout", 0.0)?,
    })
}

/// modeling_qwen3.py: q/k/v/o with `attention_bias` (default False), `q_norm` and `k_norm`
/// (RMSNorm over head_dim, default 128), gated MLP, untied lm_head by default.
fn qwen3(cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    decoder_dims(cfg, d)?;
    d.head_dim = cfg.u64_or("head_dim", 128)?;
    llama_block(d);
    d.block.qk_norm = true;
    d.qk_norm = 2 * d.head_dim;
    let bias = cfg.bool_or("attention_bias", false)?;
    (d.qkv_bias, d.o_bias) = (bias, bias);
    Ok(Kind {
        family: Family::Llama,
        activation: activation_of(cfg, "hidden_act", "silu")?,
        head: lm_head(cfg, false, false)?,
        hidden_dropout: 0.0,
        attention_dropout: cfg.f64_or("attention_dropout", 0.0)?,
    })
}

/// modeling_starcoder2.py: q/k/v/o and `c_fc`/`c_proj` with `use_bias` (default True), two
/// LayerNorms with bias, final LayerNorm, tied lm_head (default True).
fn starcoder2(cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    decoder_dims(cfg, d)?;
    let bias = cfg.bool_or("use_bias", true)?;
    (d.qkv_bias, d.o_bias, d.mlp_bias, d.norm_bias) = (bias, bias, bias, true);
    d.block = Block {
        norms: 2,
        rotary: true,
        ..Block::default()
    };
    Ok(Kind {
        family: Family::Starcoder2,
        activation: activation_of(cfg, "hidden_act", "gelu_pytorch_tanh")?,
        head: lm_head(cfg, true, false)?,
        hidden_dropout: cfg.f64_or("residual_dropout", 0.0)?,
        attention_dropout: cfg.f64_or("attention_dropout", 0.0)?,
    })
}
