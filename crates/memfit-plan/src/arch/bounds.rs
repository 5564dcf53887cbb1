//! The largest model a config may describe here, checked before anything is multiplied: every
//! dimension within a documented bound, so no product of the parameter inventory wraps a `u64`,
//! and the parameter count within [`MAX_PARAMS`], summed in `f64` before any `u64` sum is taken.
//! A config past them is a bad input (exit 2) naming the file and the field, never a figure.

use super::config::ArchError;
use super::params::{Dims, ParamTensor};

/// Widths (hidden, feed-forward, attention heads × head width): 262,144. The widest published
/// model's feed-forward is 53,248 (Llama 3.1 405B).
pub const MAX_WIDTH: u64 = 1 << 18;
/// Vocabulary and learned positions: 16,777,216 (the largest published vocabulary is 256,000).
pub const MAX_VOCAB: u64 = 1 << 24;
/// Blocks of one stack, and routed experts of one mixture: 4,096 each.
pub const MAX_LAYERS: u64 = 1 << 12;
/// Parameters in all: 2^44 (17.6 trillion), so any byte count of them stays far inside a `u64`.
pub const MAX_PARAMS: f64 = (1u64 << 44) as f64;

/// Each dimension the config set, against its bound (the key named as transformers names it in
/// most configs; the model type's own key may differ).
pub(crate) fn check_dims(file: &str, d: &Dims) -> Result<(), ArchError> {
    let moe = d.moe.as_ref();
    let checks = [
        ("hidden_size", d.hidden, MAX_WIDTH),
        ("embedding width", d.embed_dim.unwrap_or(0), MAX_WIDTH),
        ("intermediate_size", d.ffn, MAX_WIDTH),
        (
            "num_attention_heads × head_dim",
            d.heads.saturating_mul(d.head_dim),
            MAX_WIDTH,
        ),
        (
            "num_key_value_heads × head_dim",
            d.kv_heads.saturating_mul(d.head_dim),
            MAX_WIDTH,
        ),
        ("vocab_size", d.vocab, MAX_VOCAB),
        ("max_position_embeddings", d.max_positions, MAX_VOCAB),
        ("type_vocab_size", d.type_vocab, MAX_VOCAB),
        ("relative_attention_num_buckets", d.rel_buckets, MAX_VOCAB),
        ("q/k norm width", d.qk_norm, MAX_WIDTH),
        ("encoder layers (num_layers)", d.encoder_layers, MAX_LAYERS),
        (
            "decoder layers (num_hidden_layers)",
            d.decoder_layers,
            MAX_LAYERS,
        ),
        (
            "experts (num_experts)",
            moe.map_or(0, |m| m.experts),
            MAX_LAYERS,
        ),
        ("experts per token", moe.map_or(0, |m| m.top_k), MAX_LAYERS),
        (
            "expert intermediate size",
            moe.map_or(0, |m| m.expert_ffn),
            MAX_WIDTH,
        ),
        (
            "shared expert intermediate size",
            moe.map_or(0, |m| m.shared_ffn),
            MAX_WIDTH,
        ),
        (
            "sparse layers",
            moe.map_or(0, |m| m.sparse_layers),
            MAX_LAYERS,
        ),
    ];
    for (field, value, most) in checks {
        if value > most {
            return Err(ArchError::Field {
                file: file.to_string(),
                field: field.to_string(),
                problem: format!("is {value}, past the {most} memfit estimates"),
            });
        }
    }
    Ok(())
}

/// The parameter count, summed in `f64`, against [`MAX_PARAMS`].
pub(crate) fn check_params(file: &str, tensors: &[ParamTensor]) -> Result<(), ArchError> {
    let total: f64 = tensors
        .iter()
        .map(|t| t.rows as f64 * t.cols as f64 * t.count as f64)
        .sum();
    if total > MAX_PARAMS {
        return Err(ArchError::Field {
            file: file.to_string(),
            field: "(all dimensions)".to_string(),
            problem: format!(
                "describe {total:.3e} parameters, past the {MAX_PARAMS:.3e} memfit estimates"
            ),
        });
    }
    Ok(())
}
