//! A decoder whose `model_type` memfit does not know, read from the fields every decoder config
//! names in one spelling or another (hidden size, blocks, heads, MLP width, vocabulary) and
//! estimated as a llama-style decoder. The assumption is returned, to be shown with the estimate.

use super::cfg::Cfg;
use super::config::{ArchError, Kind, llama_block, lm_head};
use super::params::Dims;
use super::{Activation, Family};

/// The spellings of each field across decoder configs (transformers' `attribute_map`s and the
/// remote-code configs): the first present is used.
const HIDDEN: &[&str] = &["hidden_size", "n_embd", "d_model", "dim"];
const LAYERS: &[&str] = &["num_hidden_layers", "n_layer", "num_layers", "n_layers"];
const HEADS: &[&str] = &["num_attention_heads", "n_head", "num_heads", "n_heads"];
const KV_HEADS: &[&str] = &["num_key_value_heads", "n_kv_heads", "num_kv_heads"];
const FFN: &[&str] = &["intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim"];
const VOCAB: &[&str] = &["vocab_size", "padded_vocab_size", "n_vocab"];

/// The first of `fields` present in the config.
fn first(cfg: &Cfg, fields: &[&str]) -> Result<Option<u64>, ArchError> {
    for f in fields {
        if let Some(n) = cfg.opt_u64(f)? {
            return Ok(Some(n));
        }
    }
    Ok(None)
}

/// Reads an unknown `model_type` as a generic decoder. `Err(missing)`: the spelling list of the
/// first field the config does not give (or why it is not a decoder).
pub(crate) fn parse(cfg: &Cfg, d: &mut Dims) -> Result<Result<(Kind, String), String>, ArchError> {
    if cfg.bool_or("is_encoder_decoder", false)? {
        return Ok(Err(
            "`is_encoder_decoder` is true: not a decoder-only model".into(),
        ));
    }
    let need = |fields: &[&str]| -> Result<Result<u64, String>, ArchError> {
        Ok(first(cfg, fields)?.ok_or_else(|| format!("`{}` is missing", fields.join("` / `"))))
    };
    macro_rules! need {
        ($fields:expr) => {
            match need($fields)? {
                Ok(n) => n,
                Err(missing) => return Ok(Err(missing)),
            }
        };
    }
    d.hidden = need!(HIDDEN);
    d.decoder_layers = need!(LAYERS);
    d.heads = need!(HEADS);
    d.ffn = need!(FFN);
    d.vocab = need!(VOCAB);
    d.kv_heads = first(cfg, KV_HEADS)?.unwrap_or(d.heads);
    if !d.heads.is_multiple_of(d.kv_heads) {
        return Ok(Err(format!(
            "the key/value heads ({}) do not divide the heads ({})",
            d.kv_heads, d.heads
        )));
    }
    d.head_dim = match cfg.opt_u64("head_dim")? {
        Some(h) => h,
        None => cfg.divides(d.hidden, d.heads, HEADS[0])?,
    };
    llama_block(d);
    let head = lm_head(cfg, false, false)?;
    let assumption = format!(
        "{}: model_type {:?} is not one memfit reads; estimated as a generic llama-style decoder \
         from its fields (hidden {}, {} blocks, {} heads / {} key-value heads, MLP width {}, \
         vocabulary {}): separate q/k/v/o without biases, a gated SiLU MLP (gate, up, down), RMS \
         norms, rotary positions, {} LM head. Parameters and activations hold only as far as the \
         model is built that way",
        cfg.file,
        cfg.v
            .get("model_type")
            .and_then(|v| v.as_str())
            .unwrap_or(""),
        d.hidden,
        d.decoder_layers,
        d.heads,
        d.kv_heads,
        d.ffn,
        d.vocab,
        if head == super::Head::LmTied {
            "a tied"
        } else {
            "an untied"
        }
    );
    let kind = Kind {
        family: Family::Llama,
        activation: Activation::Silu,
        head,
        hidden_dropout: 0.0,
        attention_dropout: 0.0,
    };
    Ok(Ok((kind, assumption)))
}
