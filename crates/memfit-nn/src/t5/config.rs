//! The T5 configuration, read from a Hugging Face `config.json` with transformers' field names and
//! defaults (`transformers/models/t5/configuration_t5.py`, `T5Config.__init__`).

use serde::Deserialize;
use serde_json::{Map, Value};
use std::path::Path;

use crate::ModelError;

/// The feed-forward block: activation and whether it is gated (`wi_0`/`wi_1`) or plain (`wi`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedForward {
    pub activation: Activation,
    pub gated: bool,
}

pub use crate::layers::activation::Activation;

impl FeedForward {
    /// Parses `feed_forward_proj` as `T5Config.__init__` does: `"[gated-]ACT"`, with `"gated-gelu"`
    /// meaning the tanh GELU (`gelu_new`) for backwards compatibility.
    pub fn parse(proj: &str) -> Result<Self, ModelError> {
        let (gated, act) = match proj.split_once('-') {
            Some(("gated", act)) => (true, act),
            Some(_) => {
                return Err(ModelError::Config(format!(
                    "feed_forward_proj {proj:?}: expected \"ACT\" or \"gated-ACT\""
                )));
            }
            None => (false, proj),
        };
        let activation = match (gated, act) {
            (true, "gelu") => Activation::GeluNew,
            _ => Activation::from_hf_name(act).ok_or_else(|| {
                ModelError::Config(format!(
                    "feed_forward_proj {proj:?}: activation {act:?} is not one of relu, gelu, gelu_new, silu"
                ))
            })?,
        };
        Ok(Self { activation, gated })
    }
}

#[derive(Debug, Deserialize)]
struct RawT5Config {
    #[serde(default = "d::vocab_size")]
    vocab_size: usize,
    #[serde(default = "d::d_model")]
    d_model: usize,
    #[serde(default = "d::d_kv")]
    d_kv: usize,
    #[serde(default = "d::d_ff")]
    d_ff: usize,
    #[serde(default = "d::num_layers")]
    num_layers: usize,
    #[serde(default)]
    num_decoder_layers: Option<usize>,
    #[serde(default = "d::num_heads")]
    num_heads: usize,
    #[serde(default = "d::buckets")]
    relative_attention_num_buckets: usize,
    #[serde(default = "d::max_distance")]
    relative_attention_max_distance: usize,
    #[serde(default = "d::dropout_rate")]
    dropout_rate: f64,
    #[serde(default = "d::layer_norm_epsilon")]
    layer_norm_epsilon: f64,
    #[serde(default = "d::initializer_factor")]
    initializer_factor: f64,
    #[serde(default = "d::feed_forward_proj")]
    feed_forward_proj: String,
    #[serde(default = "d::tie")]
    tie_word_embeddings: bool,
    #[serde(default)]
    decoder_start_token_id: Option<u32>,
    #[serde(default = "d::pad")]
    pad_token_id: u32,
    #[serde(default = "d::eos")]
    eos_token_id: EosId,
}

/// `eos_token_id` may be an integer or a list (generation configs); the first is T5's EOS.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum EosId {
    One(u32),
    Many(Vec<u32>),
}

/// transformers' `T5Config` defaults (t5-small's shape).
mod d {
    use super::EosId;
    pub fn vocab_size() -> usize {
        32128
    }
    pub fn d_model() -> usize {
        512
    }
    pub fn d_kv() -> usize {
        64
    }
    pub fn d_ff() -> usize {
        2048
    }
    pub fn num_layers() -> usize {
        6
    }
    pub fn num_heads() -> usize {
        8
    }
    pub fn buckets() -> usize {
        32
    }
    pub fn max_distance() -> usize {
        128
    }
    pub fn dropout_rate() -> f64 {
        0.1
    }
    pub fn layer_norm_epsilon() -> f64 {
        1e-6
    }
    pub fn initializer_factor() -> f64 {
        1.0
    }
    pub fn feed_forward_proj() -> String {
        "relu".into()
    }
    pub fn tie() -> bool {
        true
    }
    pub fn pad() -> u32 {
        0
    }
    pub fn eos() -> EosId {
        EosId::One(1)
    }
}

/// A resolved T5 configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct T5Config {
    pub vocab_size: usize,
    pub d_model: usize,
    pub d_kv: usize,
    pub d_ff: usize,
    pub num_layers: usize,
    pub num_decoder_layers: usize,
    pub num_heads: usize,
    pub relative_attention_num_buckets: usize,
    pub relative_attention_max_distance: usize,
    pub dropout_rate: f64,
    pub layer_norm_epsilon: f64,
    pub initializer_factor: f64,
    pub feed_forward: FeedForward,
    pub feed_forward_proj: String,
    pub tie_word_embeddings: bool,
    pub decoder_start_token_id: u32,
    pub pad_token_id: u32,
    pub eos_token_id: u32,
    /// The JSON it came from; unknown fields are written back unchanged on save.
    pub raw: Map<String, Value>,
}

impl T5Config {
    /// Reads a config from a JSON value (e.g. `memfit_plan::arch::preset_config_json(name)`).
    pub fn from_json(value: &Value) -> Result<Self, ModelError> {
        let raw = value
            .as_object()
            .ok_or_else(|| ModelError::Config("expected a JSON object".into()))?
            .clone();
        if let Some(t) = raw.get("model_type").and_then(Value::as_str)
            && t != "t5"
            && t != "mt5"
        {
            return Err(ModelError::Config(format!(
                "model_type {t:?}: the T5 engine handles \"t5\" and \"mt5\""
            )));
        }
        let r: RawT5Config =
            serde_json::from_value(value.clone()).map_err(|e| ModelError::Config(e.to_string()))?;
        let eos = match r.eos_token_id {
            EosId::One(id) => id,
            EosId::Many(ids) => *ids
                .first()
                .ok_or_else(|| ModelError::Config("eos_token_id: empty list".into()))?,
        };
        let cfg = Self {
            vocab_size: r.vocab_size,
            d_model: r.d_model,
            d_kv: r.d_kv,
            d_ff: r.d_ff,
            num_layers: r.num_layers,
            // T5Config: `num_decoder_layers if num_decoder_layers is not None else num_layers`.
            num_decoder_layers: r.num_decoder_layers.unwrap_or(r.num_layers),
            num_heads: r.num_heads,
            relative_attention_num_buckets: r.relative_attention_num_buckets,
            relative_attention_max_distance: r.relative_attention_max_distance,
            dropout_rate: r.dropout_rate,
            layer_norm_epsilon: r.layer_norm_epsilon,
            initializer_factor: r.initializer_factor,
            feed_forward: FeedForward::parse(&r.feed_forward_proj)?,
            feed_forward_proj: r.feed_forward_proj,
            tie_word_embeddings: r.tie_word_embeddings,
            // T5 checkpoints start decoding with the pad id (t5-small's config.json: 0).
            decoder_start_token_id: r.decoder_start_token_id.unwrap_or(r.pad_token_id),
            pad_token_id: r.pad_token_id,
            eos_token_id: eos,
            raw,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads `config.json` from a file; errors name it.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        crate::weights::read_config(path, Self::from_json)
    }

    fn validate(&self) -> Result<(), ModelError> {
        crate::weights::require_positive(&[
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("d_kv", self.d_kv),
            ("d_ff", self.d_ff),
            ("num_layers", self.num_layers),
            ("num_decoder_layers", self.num_decoder_layers),
            ("num_heads", self.num_heads),
            (
                "relative_attention_num_buckets",
                self.relative_attention_num_buckets,
            ),
        ])?;
        // The bucket formula halves the buckets (bidirectional) and halves again for the exact range.
        if self.relative_attention_num_buckets < 4 {
            return Err(ModelError::Config(format!(
                "relative_attention_num_buckets {}: must be >= 4",
                self.relative_attention_num_buckets
            )));
        }
        if !(0.0..1.0).contains(&self.dropout_rate) {
            return Err(ModelError::Config(format!(
                "dropout_rate {}: must be in [0, 1)",
                self.dropout_rate
            )));
        }
        if self.layer_norm_epsilon.is_nan() || self.layer_norm_epsilon <= 0.0 {
            return Err(ModelError::Config(format!(
                "layer_norm_epsilon {}: must be > 0",
                self.layer_norm_epsilon
            )));
        }
        for (name, id) in [
            ("pad_token_id", self.pad_token_id),
            ("eos_token_id", self.eos_token_id),
            ("decoder_start_token_id", self.decoder_start_token_id),
        ] {
            if id as usize >= self.vocab_size {
                return Err(ModelError::Config(format!(
                    "{name} {id}: outside the vocabulary (vocab_size {})",
                    self.vocab_size
                )));
            }
        }
        Ok(())
    }

    /// Inner dimension of attention: heads × d_kv (need not equal d_model).
    pub fn inner_dim(&self) -> usize {
        self.num_heads * self.d_kv
    }

    /// The `config.json` to write beside the weights: the original object with the resolved fields.
    pub fn to_json(&self) -> Value {
        let mut m = self.raw.clone();
        let mut set = |k: &str, v: Value| {
            m.insert(k.to_string(), v);
        };
        set("vocab_size", self.vocab_size.into());
        set("d_model", self.d_model.into());
        set("d_kv", self.d_kv.into());
        set("d_ff", self.d_ff.into());
        set("num_layers", self.num_layers.into());
        set("num_decoder_layers", self.num_decoder_layers.into());
        set("num_heads", self.num_heads.into());
        set(
            "relative_attention_num_buckets",
            self.relative_attention_num_buckets.into(),
        );
        set(
            "relative_attention_max_distance",
            self.relative_attention_max_distance.into(),
        );
        set("dropout_rate", self.dropout_rate.into());
        set("layer_norm_epsilon", self.layer_norm_epsilon.into());
        set("initializer_factor", self.initializer_factor.into());
        set("feed_forward_proj", self.feed_forward_proj.clone().into());
        set("tie_word_embeddings", self.tie_word_embeddings.into());
        set("decoder_start_token_id", self.decoder_start_token_id.into());
        set("pad_token_id", self.pad_token_id.into());
        set("eos_token_id", self.eos_token_id.into());
        set("is_encoder_decoder", true.into());
        if !m.contains_key("model_type") {
            m.insert("model_type".into(), "t5".into());
        }
        if !m.contains_key("architectures") {
            m.insert(
                "architectures".into(),
                Value::Array(vec!["T5ForConditionalGeneration".into()]),
            );
        }
        Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_follow_transformers() {
        let c = T5Config::from_json(&json!({})).unwrap();
        assert_eq!(
            (c.vocab_size, c.d_model, c.d_kv, c.d_ff),
            (32128, 512, 64, 2048)
        );
        assert_eq!((c.num_layers, c.num_decoder_layers, c.num_heads), (6, 6, 8));
        assert_eq!(
            c.feed_forward,
            FeedForward {
                activation: Activation::Relu,
                gated: false
            }
        );
        assert!(c.tie_word_embeddings);
        assert_eq!(
            (c.pad_token_id, c.eos_token_id, c.decoder_start_token_id),
            (0, 1, 0)
        );
    }

    #[test]
    fn gated_gelu_is_tanh_gelu() {
        let c = T5Config::from_json(
            &json!({"feed_forward_proj": "gated-gelu", "tie_word_embeddings": false}),
        )
        .unwrap();
        assert_eq!(
            c.feed_forward,
            FeedForward {
                activation: Activation::GeluNew,
                gated: true
            }
        );
        assert!(!c.tie_word_embeddings);
    }

    #[test]
    fn bad_fields_are_named() {
        let e = T5Config::from_json(&json!({"feed_forward_proj": "tanh"})).unwrap_err();
        assert!(e.to_string().contains("feed_forward_proj"), "{e}");
        let e = T5Config::from_json(&json!({"d_model": "big"})).unwrap_err();
        assert!(
            e.to_string().contains("d_model") || e.to_string().contains("invalid type"),
            "{e}"
        );
        let e = T5Config::from_json(&json!({"vocab_size": 10, "eos_token_id": 12})).unwrap_err();
        assert!(e.to_string().contains("eos_token_id"), "{e}");
        let e = T5Config::from_json(&json!({"model_type": "bert"})).unwrap_err();
        assert!(e.to_string().contains("bert"), "{e}");
    }
}
