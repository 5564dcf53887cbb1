//! The decoder configuration, read from a Hugging Face `config.json` with transformers' field names
//! and each family's defaults (`transformers/models/{llama,qwen2,mistral,qwen3}/configuration_*.py`).
//! The four are one architecture (pre-norm blocks of RMSNorm, RoPE attention with grouped KV heads,
//! SwiGLU) that differ in biases, QK norms, sliding windows and defaults. An option memfit does not
//! implement is an error naming the field, never silently ignored.

use serde_json::{Map, Value};
use std::path::Path;

use crate::ModelError;
use crate::decoder::fields::{Fields, bad};
use crate::decoder::rope::Rope;

/// Which transformers model class the config describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `LlamaForCausalLM`: optional biases on attention (`attention_bias`) and MLP (`mlp_bias`).
    Llama,
    /// `Qwen2ForCausalLM`: q/k/v biases always, none on o; sliding window on the upper layers
    /// when `use_sliding_window`.
    Qwen2,
    /// `MistralForCausalLM`: no biases; one sliding window for every layer.
    Mistral,
    /// `Qwen3ForCausalLM`: Qwen2 with `attention_bias` for q/k/v/o and an RMSNorm over each head of
    /// q and k (`q_norm`, `k_norm`) before RoPE.
    Qwen3,
}

impl Family {
    fn of(model_type: &str) -> Option<Self> {
        match model_type {
            "llama" => Some(Self::Llama),
            "qwen2" => Some(Self::Qwen2),
            "mistral" => Some(Self::Mistral),
            "qwen3" => Some(Self::Qwen3),
            _ => None,
        }
    }

    /// The causal-LM class transformers builds from this config.
    pub fn architecture(self) -> &'static str {
        match self {
            Self::Llama => "LlamaForCausalLM",
            Self::Qwen2 => "Qwen2ForCausalLM",
            Self::Mistral => "MistralForCausalLM",
            Self::Qwen3 => "Qwen3ForCausalLM",
        }
    }
}

/// Which projections carry a bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Biases {
    pub qkv: bool,
    pub o: bool,
    pub mlp: bool,
}

/// A resolved decoder configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderConfig {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope: Rope,
    pub biases: Biases,
    /// Qwen3's per-head RMSNorm of q and k.
    pub qk_norm: bool,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    /// Per layer: the sliding window (keys at most `window − 1` positions back), or `None`.
    pub sliding_windows: Vec<Option<usize>>,
    pub initializer_range: f64,
    pub attention_dropout: f64,
    /// The embedding's `padding_idx` (its row starts at zero).
    pub pad_token_id: Option<u32>,
    /// `eos_token_id`, one id or several.
    pub eos_token_ids: Vec<u32>,
    /// The JSON it came from; written back on save with the resolved fields.
    pub raw: Map<String, Value>,
}

/// A family's defaults where its config class differs from `LlamaConfig`'s.
struct Defaults {
    vocab_size: usize,
    intermediate_size: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    max_position_embeddings: usize,
}

fn defaults(family: Family) -> Defaults {
    match family {
        Family::Llama => Defaults {
            vocab_size: 32000,
            intermediate_size: 11008,
            num_key_value_heads: None,
            head_dim: None,
            max_position_embeddings: 2048,
        },
        Family::Qwen2 | Family::Qwen3 => Defaults {
            vocab_size: 151_936,
            intermediate_size: 22016,
            num_key_value_heads: Some(32),
            head_dim: (family == Family::Qwen3).then_some(128),
            max_position_embeddings: 32768,
        },
        Family::Mistral => Defaults {
            vocab_size: 32000,
            intermediate_size: 14336,
            num_key_value_heads: Some(8),
            head_dim: None,
            max_position_embeddings: 4096 * 32,
        },
    }
}

/// Config fields of mixture-of-experts variants: memfit trains dense decoders only.
const MOE_FIELDS: [&str; 6] = [
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "n_routed_experts",
    "moe_intermediate_size",
    "decoder_sparse_step",
];

impl DecoderConfig {
    /// Reads a config from a JSON value.
    pub fn from_json(value: &Value) -> Result<Self, ModelError> {
        let raw = value
            .as_object()
            .ok_or_else(|| ModelError::Config("expected a JSON object".into()))?
            .clone();
        let f = Fields(&raw);
        let model_type = f.str_or("model_type", "")?;
        let family = Family::of(model_type).ok_or_else(|| {
            bad(
                "model_type",
                format!("{model_type:?}: the decoder handles \"llama\", \"qwen2\", \"mistral\" and \"qwen3\""),
            )
        })?;
        refuse_unimplemented(&f)?;
        let d = defaults(family);
        let hidden_size = f.usize_or("hidden_size", 4096)?;
        let num_attention_heads = f.usize_or("num_attention_heads", 32)?;
        let head_dim = match f.opt_usize("head_dim")?.or(d.head_dim) {
            Some(h) => h,
            None => hidden_size / num_attention_heads.max(1),
        };
        let num_hidden_layers = f.usize_or("num_hidden_layers", 32)?;
        let max_position_embeddings =
            f.usize_or("max_position_embeddings", d.max_position_embeddings)?;
        let cfg = Self {
            family,
            vocab_size: f.usize_or("vocab_size", d.vocab_size)?,
            hidden_size,
            intermediate_size: f.usize_or("intermediate_size", d.intermediate_size)?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: f
                .opt_usize("num_key_value_heads")?
                .or(d.num_key_value_heads)
                .unwrap_or(num_attention_heads),
            head_dim,
            rms_norm_eps: f.f64_or("rms_norm_eps", 1e-6)?,
            rope: Rope::from_config(&raw, head_dim, max_position_embeddings)?,
            biases: biases(family, &f)?,
            qk_norm: family == Family::Qwen3,
            tie_word_embeddings: f.bool_or("tie_word_embeddings", false)?,
            max_position_embeddings,
            sliding_windows: sliding_windows(family, &f, num_hidden_layers)?,
            initializer_range: f.f64_or("initializer_range", 0.02)?,
            attention_dropout: f.f64_or("attention_dropout", 0.0)?,
            pad_token_id: f.ids("pad_token_id")?.first().copied(),
            eos_token_ids: f.ids("eos_token_id")?,
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
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ])?;
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(bad(
                "num_key_value_heads",
                format!(
                    "{} does not divide num_attention_heads {}",
                    self.num_key_value_heads, self.num_attention_heads
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(bad(
                "head_dim",
                format!("{}: RoPE rotates pairs, it must be even", self.head_dim),
            ));
        }
        if !(0.0..1.0).contains(&self.attention_dropout) {
            return Err(bad(
                "attention_dropout",
                format!("{}: must be in [0, 1)", self.attention_dropout),
            ));
        }
        if self.rms_norm_eps.is_nan() || self.rms_norm_eps <= 0.0 {
            return Err(bad(
                "rms_norm_eps",
                format!("{}: must be > 0", self.rms_norm_eps),
            ));
        }
        match self.pad_token_id {
            Some(id) if id as usize >= self.vocab_size => Err(bad(
                "pad_token_id",
                format!(
                    "{id}: outside the vocabulary (vocab_size {})",
                    self.vocab_size
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Query heads per key/value head.
    pub fn kv_groups(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// The width of q (and of o_proj's input): heads × head_dim.
    pub fn q_width(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// The width of k and v: KV heads × head_dim.
    pub fn kv_width(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// The causal-LM class transformers builds from this config.
    pub fn architecture(&self) -> &'static str {
        self.family.architecture()
    }

    /// The `config.json` to write beside f32 weights: the original object with `architectures` and
    /// the dtype of what memfit writes (transformers 5 loads in the config's dtype by default).
    pub fn to_json(&self) -> Value {
        let mut m = self.raw.clone();
        m.insert(
            "architectures".into(),
            Value::Array(vec![self.architecture().into()]),
        );
        m.remove("torch_dtype");
        m.insert("dtype".into(), "float32".into());
        Value::Object(m)
    }
}

/// The first option of `f` that memfit does not implement, as an error naming it.
fn refuse_unimplemented(f: &Fields) -> Result<(), ModelError> {
    for field in MOE_FIELDS {
        let set = f.get(field).is_some_and(|v| v.as_u64() != Some(0));
        if set {
            return Err(bad(
                field,
                format!(
                    "{}: mixture-of-experts decoders are not implemented (dense llama/qwen2/mistral/qwen3 only)",
                    f.get(field).expect("checked")
                ),
            ));
        }
    }
    let act = f.str_or("hidden_act", "silu")?;
    if !matches!(act, "silu" | "swish") {
        return Err(bad(
            "hidden_act",
            format!("{act:?}: the decoder's MLP is SwiGLU (\"silu\")"),
        ));
    }
    Ok(())
}

fn biases(family: Family, f: &Fields) -> Result<Biases, ModelError> {
    Ok(match family {
        Family::Llama => {
            let attention = f.bool_or("attention_bias", false)?;
            Biases {
                qkv: attention,
                o: attention,
                mlp: f.bool_or("mlp_bias", false)?,
            }
        }
        // Qwen2Attention: bias=True on q/k/v, False on o, whatever the config says.
        Family::Qwen2 => Biases {
            qkv: true,
            o: false,
            mlp: false,
        },
        Family::Mistral => Biases::default(),
        Family::Qwen3 => {
            let attention = f.bool_or("attention_bias", false)?;
            Biases {
                qkv: attention,
                o: attention,
                mlp: false,
            }
        }
    })
}

/// Each layer's sliding window, as the family's `__post_init__` and attention read it: Mistral's
/// `sliding_window` for every layer; Qwen2/3's for `layer_types` marked `"sliding_attention"`
/// (by default the layers from `max_window_layers` on, when `use_sliding_window`).
fn sliding_windows(
    family: Family,
    f: &Fields,
    layers: usize,
) -> Result<Vec<Option<usize>>, ModelError> {
    match family {
        Family::Llama => Ok(vec![None; layers]),
        Family::Mistral => Ok(vec![window_field(f)?; layers]),
        Family::Qwen2 | Family::Qwen3 => {
            let window = if f.bool_or("use_sliding_window", false)? {
                window_field(f)?
            } else {
                None
            };
            let first_sliding = f.usize_or("max_window_layers", 28)?;
            match f.get("layer_types") {
                None => Ok((0..layers)
                    .map(|i| window.filter(|_| i >= first_sliding))
                    .collect()),
                Some(types) => layer_types(types, window, layers),
            }
        }
    }
}

/// `sliding_window` as the config classes read it: absent, 4096; `null`, none.
fn window_field(f: &Fields) -> Result<Option<usize>, ModelError> {
    let window = match f.0.get("sliding_window") {
        None => Some(4096),
        Some(Value::Null) => None,
        Some(_) => f.opt_usize("sliding_window")?,
    };
    match window {
        Some(0) => Err(bad("sliding_window", "0: must be > 0")),
        w => Ok(w),
    }
}

/// An explicit `layer_types` list: `"full_attention"` or `"sliding_attention"` per layer.
fn layer_types(
    types: &Value,
    window: Option<usize>,
    layers: usize,
) -> Result<Vec<Option<usize>>, ModelError> {
    let list = types
        .as_array()
        .filter(|a| a.len() == layers)
        .ok_or_else(|| {
            bad(
                "layer_types",
                format!("expected a list of {layers} layer types (num_hidden_layers)"),
            )
        })?;
    list.iter()
        .enumerate()
        .map(|(i, t)| match t.as_str() {
            Some("full_attention") => Ok(None),
            Some("sliding_attention") => Ok(window),
            _ => Err(bad(
                &format!("layer_types[{i}]"),
                format!("{t}: only \"full_attention\" and \"sliding_attention\" are implemented"),
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<DecoderConfig, ModelError> {
        DecoderConfig::from_json(&v)
    }

    fn error(v: Value) -> String {
        parse(v).unwrap_err().to_string()
    }

    #[test]
    fn family_defaults_follow_transformers() {
        let llama =
            parse(json!({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}))
                .unwrap();
        assert_eq!(
            (llama.num_key_value_heads, llama.head_dim, llama.vocab_size),
            (4, 16, 32000)
        );
        assert_eq!(llama.sliding_windows, vec![None; 32]);
        let qwen2 = parse(json!({"model_type": "qwen2", "num_hidden_layers": 2})).unwrap();
        assert_eq!(
            qwen2.biases,
            Biases {
                qkv: true,
                o: false,
                mlp: false
            }
        );
        assert_eq!(
            qwen2.sliding_windows,
            vec![None, None],
            "use_sliding_window is off"
        );
        let mistral = parse(json!({"model_type": "mistral", "num_hidden_layers": 2})).unwrap();
        assert_eq!(mistral.sliding_windows, vec![Some(4096); 2]);
        assert_eq!(mistral.num_key_value_heads, 8);
        let no_window = parse(json!({"model_type": "mistral", "sliding_window": null})).unwrap();
        assert_eq!(no_window.sliding_windows[0], None);
        let qwen3 = parse(json!({"model_type": "qwen3", "hidden_size": 64})).unwrap();
        assert_eq!((qwen3.head_dim, qwen3.qk_norm), (128, true));
    }

    #[test]
    fn qwen2_windows_start_at_max_window_layers() {
        let c = parse(
            json!({"model_type": "qwen2", "num_hidden_layers": 3, "use_sliding_window": true,
                             "sliding_window": 8, "max_window_layers": 1}),
        )
        .unwrap();
        assert_eq!(c.sliding_windows, vec![None, Some(8), Some(8)]);
        let explicit = parse(
            json!({"model_type": "qwen2", "num_hidden_layers": 2, "use_sliding_window": true,
            "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"]}),
        )
        .unwrap();
        assert_eq!(explicit.sliding_windows, vec![Some(8), None]);
    }

    #[test]
    fn unimplemented_options_are_named() {
        for (v, field) in [
            (json!({"model_type": "gpt2"}), "model_type"),
            (
                json!({"model_type": "qwen2", "num_experts": 8}),
                "num_experts",
            ),
            (
                json!({"model_type": "mistral", "num_local_experts": 8}),
                "num_local_experts",
            ),
            (
                json!({"model_type": "llama", "hidden_act": "gelu"}),
                "hidden_act",
            ),
            (
                json!({"model_type": "llama", "num_key_value_heads": 3}),
                "num_key_value_heads",
            ),
            (
                json!({"model_type": "llama", "pad_token_id": 40000}),
                "pad_token_id",
            ),
            (
                json!({"model_type": "llama", "hidden_size": "big"}),
                "hidden_size",
            ),
            (
                json!({"model_type": "qwen2", "num_hidden_layers": 2,
                    "layer_types": ["chunked_attention", "full_attention"]}),
                "layer_types[0]",
            ),
        ] {
            let e = error(v.clone());
            assert!(e.contains(field), "{v}: {e}");
        }
    }

    #[test]
    fn saved_config_names_the_class_and_f32() {
        let c =
            parse(json!({"model_type": "qwen2", "torch_dtype": "bfloat16", "custom": 1})).unwrap();
        let j = c.to_json();
        assert_eq!(j["architectures"][0], "Qwen2ForCausalLM");
        assert_eq!(j["dtype"], "float32");
        assert!(j.get("torch_dtype").is_none());
        assert_eq!(j["custom"], 1);
        assert_eq!(DecoderConfig::from_json(&j).unwrap().rope, c.rope);
    }
}
