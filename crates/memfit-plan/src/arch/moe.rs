//! Mixtures of experts: mixtral, qwen2_moe and qwen3_moe. Field names and defaults follow their
//! `configuration_*.py` in transformers 5.23; the tensors are listed by `params::experts` from
//! their `modeling_*.py`.

use super::cfg::{Cfg, activation_of};
use super::config::{ArchError, Kind, decoder_dims, llama_block, lm_head};
use super::params::Dims;
use super::{Family, Moe};

/// Reads mixtral, qwen2_moe or qwen3_moe into `d` (attention and norms as llama's, the MLP as
/// [`Moe`]).
pub(crate) fn parse(model_type: &str, cfg: &Cfg, d: &mut Dims) -> Result<Kind, ArchError> {
    decoder_dims(cfg, d)?;
    llama_block(d);
    let moe = match model_type {
        "mixtral" => mixtral(cfg, d)?,
        "qwen2_moe" => qwen2_moe(cfg, d)?,
        "qwen3_moe" => qwen3_moe(cfg, d)?,
        other => unreachable!("config.rs dispatches only mixtures here, not {other:?}"),
    };
    if moe.top_k > moe.experts {
        return Err(cfg.err(
            "num_experts_per_tok",
            format!(
                "({}) exceeds the number of experts ({})",
                moe.top_k, moe.experts
            ),
        ));
    }
    d.moe = Some(Moe {
        router_aux_loss: cfg.bool_or("output_router_logits", false)?,
        ..moe
    });
    Ok(Kind {
        family: Family::Llama,
        activation: activation_of(cfg, "hidden_act", "silu")?,
        head: lm_head(cfg, false, false)?, // both default tie_word_embeddings False
        hidden_dropout: 0.0,
        attention_dropout: cfg.f64_or("attention_dropout", 0.0)?,
    })
}

/// MixtralSparseMoeBlock in every block: `num_local_experts` (default 8; `num_experts` is its
/// alias) experts of `intermediate_size`, `num_experts_per_tok` (default 2) per token; q/k/v/o
/// without bias.
fn mixtral(cfg: &Cfg, d: &mut Dims) -> Result<Moe, ArchError> {
    let experts = match cfg.opt_u64("num_local_experts")? {
        Some(e) => e,
        None => cfg.u64_or("num_experts", 8)?,
    };
    Ok(Moe {
        experts,
        top_k: cfg.u64_or("num_experts_per_tok", 2)?,
        expert_ffn: d.ffn,
        shared_ffn: 0,
        sparse_layers: d.decoder_layers,
        router_aux_loss: false, // read by `parse` for every mixture
    })
}

/// Qwen2MoeSparseMoeBlock in the blocks [`qwen_sparse_layers`] picks; other blocks have a dense MLP
/// of `intermediate_size`. `num_experts` (default 60) experts of `moe_intermediate_size` (default
/// 1408), `num_experts_per_tok` (default 4), a shared expert of
/// `shared_expert_intermediate_size` (default 5632); q/k/v with `qkv_bias` (default True), o
/// without.
fn qwen2_moe(cfg: &Cfg, d: &mut Dims) -> Result<Moe, ArchError> {
    d.qkv_bias = cfg.bool_or("qkv_bias", true)?;
    Ok(Moe {
        experts: cfg.u64_or("num_experts", 60)?,
        top_k: cfg.u64_or("num_experts_per_tok", 4)?,
        expert_ffn: cfg.u64_or("moe_intermediate_size", 1408)?,
        shared_ffn: cfg.u64_or("shared_expert_intermediate_size", 5632)?,
        sparse_layers: qwen_sparse_layers(cfg, d.decoder_layers)?,
        router_aux_loss: false, // read by `parse` for every mixture
    })
}

/// Qwen3MoeSparseMoeBlock, chosen per block as qwen2_moe's: `num_experts` (default 128) experts of
/// `moe_intermediate_size` (default 768), `num_experts_per_tok` (default 8), no shared expert;
/// attention as qwen3's (q/k/v/o with `attention_bias`, default False; `q_norm`/`k_norm`).
fn qwen3_moe(cfg: &Cfg, d: &mut Dims) -> Result<Moe, ArchError> {
    let bias = cfg.bool_or("attention_bias", false)?;
    (d.qkv_bias, d.o_bias) = (bias, bias);
    d.qk_norm = 2 * d.head_dim;
    d.block.qk_norm = true;
    Ok(Moe {
        experts: cfg.u64_or("num_experts", 128)?,
        top_k: cfg.u64_or("num_experts_per_tok", 8)?,
        expert_ffn: cfg.u64_or("moe_intermediate_size", 768)?,
        shared_ffn: 0,
        sparse_layers: qwen_sparse_layers(cfg, d.decoder_layers)?,
        router_aux_loss: false, // read by `parse` for every mixture
    })
}

/// Blocks i with a mixture in qwen2_moe/qwen3_moe: i not in `mlp_only_layers` (default none) and
/// (i + 1) a multiple of `decoder_sparse_step` (default 1).
fn qwen_sparse_layers(cfg: &Cfg, layers: u64) -> Result<u64, ArchError> {
    let step = cfg.u64_or("decoder_sparse_step", 1)?;
    let dense = cfg.u64_list("mlp_only_layers")?;
    Ok((0..layers)
        .filter(|i| !dense.contains(i) && (i + 1).is_multiple_of(step))
        .count() as u64)
}
