//! Every weight of a decoder (`*ForCausalLM`): its transformers name, storage, module group (for
//! freezing) and initialisation (`PreTrainedModel._init_weights`: linear weights and embeddings
//! normal(0, initializer_range), biases 0, RMSNorm 1, the embedding's `padding_idx` row 0). The
//! forward pass refers to weights by the indices this layout hands out.

use crate::decoder::config::DecoderConfig;
use crate::layers::params::{self, Init, Kind};

/// The module groups `--freeze` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Group {
    Embeddings,
    /// The decoder layers (attention, MLP, their norms).
    Layers,
    /// The final RMSNorm (`model.norm`).
    Norm,
    LmHead,
}

/// The names `--freeze` accepts for the decoder.
pub const GROUPS: &str = "embeddings, layers, norm, lm_head";

impl Group {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "embeddings" => Some(Self::Embeddings),
            "layers" => Some(Self::Layers),
            "norm" => Some(Self::Norm),
            "lm_head" => Some(Self::LmHead),
            _ => None,
        }
    }
}

/// A decoder parameter (transformers' name `model.layers.0.self_attn.q_proj.weight`, …).
pub type ParamSpec = params::ParamSpec<Group>;

/// The seven linear projections of a layer, in the order the layer applies them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proj {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Proj {
    pub const ALL: [Proj; 7] = [
        Proj::Q,
        Proj::K,
        Proj::V,
        Proj::O,
        Proj::Gate,
        Proj::Up,
        Proj::Down,
    ];

    /// The module's attribute name (`q_proj`, …: PEFT's target names).
    pub fn module(self) -> &'static str {
        match self {
            Proj::Q => "q_proj",
            Proj::K => "k_proj",
            Proj::V => "v_proj",
            Proj::O => "o_proj",
            Proj::Gate => "gate_proj",
            Proj::Up => "up_proj",
            Proj::Down => "down_proj",
        }
    }

    /// The module's path inside layer `layer` (`model.layers.0.self_attn.q_proj`).
    pub fn path(self, layer: usize) -> String {
        let block = match self {
            Proj::Q | Proj::K | Proj::V | Proj::O => "self_attn",
            Proj::Gate | Proj::Up | Proj::Down => "mlp",
        };
        format!("model.layers.{layer}.{block}.{}", self.module())
    }

    /// `[in, out]` of the projection.
    pub fn dims(self, cfg: &DecoderConfig) -> (usize, usize) {
        let (d, ff) = (cfg.hidden_size, cfg.intermediate_size);
        match self {
            Proj::Q => (d, cfg.q_width()),
            Proj::K | Proj::V => (d, cfg.kv_width()),
            Proj::O => (cfg.q_width(), d),
            Proj::Gate | Proj::Up => (d, ff),
            Proj::Down => (ff, d),
        }
    }

    fn has_bias(self, cfg: &DecoderConfig) -> bool {
        match self {
            Proj::Q | Proj::K | Proj::V => cfg.biases.qkv,
            Proj::O => cfg.biases.o,
            Proj::Gate | Proj::Up | Proj::Down => cfg.biases.mlp,
        }
    }
}

/// A linear layer: `weight` `[in, out]`, and `bias` `[1, out]` where the config has one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Linear {
    pub weight: usize,
    pub bias: Option<usize>,
}

/// One decoder layer.
#[derive(Debug, Clone, PartialEq)]
pub struct Layer {
    pub input_norm: usize,
    /// By [`Proj`] order.
    pub projs: [Linear; 7],
    /// Qwen3's per-head RMSNorms of q and k (`[1, head_dim]`).
    pub q_norm: Option<usize>,
    pub k_norm: Option<usize>,
    pub post_attention_norm: usize,
}

impl Layer {
    pub fn proj(&self, p: Proj) -> Linear {
        self.projs[p as usize]
    }
}

/// Indices of every weight in [`DecoderLayout::specs`].
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderLayout {
    pub specs: Vec<ParamSpec>,
    pub embed: usize,
    pub layers: Vec<Layer>,
    pub norm: usize,
    /// `None` when the head is tied to the embedding.
    pub lm_head: Option<usize>,
}

struct Builder<'a> {
    specs: Vec<ParamSpec>,
    cfg: &'a DecoderConfig,
}

impl Builder<'_> {
    fn push(&mut self, name: String, kind: Kind, group: Group, init: Init) -> usize {
        params::push(&mut self.specs, name, kind, group, init)
    }

    fn norm(&mut self, name: String, d: usize, group: Group) -> usize {
        self.push(name, Kind::Vector { d }, group, Init::Ones)
    }

    fn linear(&mut self, layer: usize, p: Proj) -> Linear {
        let (d_in, d_out) = p.dims(self.cfg);
        let path = p.path(layer);
        let std = self.cfg.initializer_range;
        let weight = self.push(
            format!("{path}.weight"),
            Kind::Linear { d_in, d_out },
            Group::Layers,
            Init::Normal { std },
        );
        let bias = p.has_bias(self.cfg).then(|| {
            self.push(
                format!("{path}.bias"),
                Kind::Vector { d: d_out },
                Group::Layers,
                Init::Zeros,
            )
        });
        Linear { weight, bias }
    }

    fn layer(&mut self, i: usize) -> Layer {
        let (d, hd) = (self.cfg.hidden_size, self.cfg.head_dim);
        let prefix = format!("model.layers.{i}");
        let input_norm = self.norm(format!("{prefix}.input_layernorm.weight"), d, Group::Layers);
        let projs = Proj::ALL.map(|p| self.linear(i, p));
        let (q_norm, k_norm) = if self.cfg.qk_norm {
            let attn = format!("{prefix}.self_attn");
            (
                Some(self.norm(format!("{attn}.q_norm.weight"), hd, Group::Layers)),
                Some(self.norm(format!("{attn}.k_norm.weight"), hd, Group::Layers)),
            )
        } else {
            (None, None)
        };
        let post_attention_norm = self.norm(
            format!("{prefix}.post_attention_layernorm.weight"),
            d,
            Group::Layers,
        );
        Layer {
            input_norm,
            projs,
            q_norm,
            k_norm,
            post_attention_norm,
        }
    }
}

impl DecoderLayout {
    pub fn new(cfg: &DecoderConfig) -> Self {
        let mut b = Builder {
            specs: Vec::new(),
            cfg,
        };
        let (vocab, d, std) = (cfg.vocab_size, cfg.hidden_size, cfg.initializer_range);
        let embed_init = match cfg.pad_token_id {
            Some(row) => Init::NormalZeroRow {
                std,
                row: row as usize,
            },
            None => Init::Normal { std },
        };
        let embed = b.push(
            "model.embed_tokens.weight".into(),
            Kind::Table {
                rows: vocab,
                cols: d,
            },
            Group::Embeddings,
            embed_init,
        );
        let layers = (0..cfg.num_hidden_layers).map(|i| b.layer(i)).collect();
        let norm = b.norm("model.norm.weight".into(), d, Group::Norm);
        let lm_head = (!cfg.tie_word_embeddings).then(|| {
            b.push(
                "lm_head.weight".into(),
                Kind::Linear {
                    d_in: d,
                    d_out: vocab,
                },
                Group::LmHead,
                Init::Normal { std },
            )
        });
        Self {
            specs: b.specs,
            embed,
            layers,
            norm,
            lm_head,
        }
    }

    /// Whether weight `i` trains when `frozen` groups are frozen; the tied embedding trains unless
    /// either of its roles is frozen.
    pub fn trainable(&self, i: usize, frozen: &[Group]) -> bool {
        if i == self.embed && self.lm_head.is_none() {
            return !frozen.contains(&Group::Embeddings) && !frozen.contains(&Group::LmHead);
        }
        !frozen.contains(&self.specs[i].group)
    }

    /// Total and trainable weight counts (the tied embedding counted once).
    pub fn param_counts(&self, frozen: &[Group]) -> (u64, u64) {
        params::counts(&self.specs, |i| self.trainable(i, frozen))
    }

    /// The head's weight: `lm_head`, or the embedding when tied.
    pub fn head(&self) -> usize {
        self.lm_head.unwrap_or(self.embed)
    }

    pub fn same_tensors(&self, other: &Self) -> bool {
        params::same_tensors(&self.specs, &other.specs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_and_shapes_follow_transformers() {
        let cfg = DecoderConfig::from_json(&json!({
            "model_type": "qwen2", "vocab_size": 50, "hidden_size": 16, "intermediate_size": 24,
            "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
            "tie_word_embeddings": true
        }))
        .unwrap();
        let layout = DecoderLayout::new(&cfg);
        let names: Vec<(&str, Vec<usize>)> = layout
            .specs
            .iter()
            .map(|s| (s.name.as_str(), s.kind.hf_shape()))
            .collect();
        assert_eq!(
            names,
            [
                ("model.embed_tokens.weight", vec![50, 16]),
                ("model.layers.0.input_layernorm.weight", vec![16]),
                ("model.layers.0.self_attn.q_proj.weight", vec![16, 16]),
                ("model.layers.0.self_attn.q_proj.bias", vec![16]),
                ("model.layers.0.self_attn.k_proj.weight", vec![8, 16]),
                ("model.layers.0.self_attn.k_proj.bias", vec![8]),
                ("model.layers.0.self_attn.v_proj.weight", vec![8, 16]),
                ("model.layers.0.self_attn.v_proj.bias", vec![8]),
                ("model.layers.0.self_attn.o_proj.weight", vec![16, 16]),
                ("model.layers.0.mlp.gate_proj.weight", vec![24, 16]),
                ("model.layers.0.mlp.up_proj.weight", vec![24, 16]),
                ("model.layers.0.mlp.down_proj.weight", vec![16, 24]),
                ("model.layers.0.post_attention_layernorm.weight", vec![16]),
                ("model.norm.weight", vec![16]),
            ]
        );
        assert_eq!(layout.head(), layout.embed);
        // Tied: freezing either role freezes the shared table.
        assert!(!layout.trainable(layout.embed, &[Group::LmHead]));
        assert!(layout.trainable(layout.norm, &[Group::Layers]));
    }
}
