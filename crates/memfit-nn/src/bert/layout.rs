//! Every parameter of `BertForSequenceClassification` / `RobertaForSequenceClassification`: its
//! transformers name, storage, module group (for freezing) and initialisation
//! (`PreTrainedModel._init_weights`: linear weights and embeddings normal(0, initializer_range),
//! biases 0, LayerNorm 1 and 0, an embedding's `padding_idx` row 0). The forward pass refers to
//! parameters by the indices this layout hands out.

use crate::bert::config::{BertConfig, Family};
use crate::layers::params::{self, Init, Kind};

/// The module groups `--freeze` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Group {
    Embeddings,
    Encoder,
    /// BERT's pooler (`bert.pooler.dense`), pretrained with the encoder.
    Pooler,
    /// The classifier: new for every task.
    Head,
}

impl Group {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "embeddings" => Some(Self::Embeddings),
            "encoder" => Some(Self::Encoder),
            "pooler" => Some(Self::Pooler),
            "head" | "classifier" => Some(Self::Head),
            _ => None,
        }
    }
}

/// A BERT parameter (transformers' name `bert.encoder.layer.0.attention.self.query.weight`, …).
pub type ParamSpec = crate::layers::params::ParamSpec<Group>;

/// A linear layer with bias: `weight` `[in, out]`, `bias` `[1, out]`.
#[derive(Debug, Clone, Copy)]
pub struct Dense {
    pub weight: usize,
    pub bias: usize,
}

/// A LayerNorm's `weight` (γ) and `bias` (β), `[1, d]` each.
#[derive(Debug, Clone, Copy)]
pub struct Norm {
    pub weight: usize,
    pub bias: usize,
}

/// One post-LN encoder layer.
#[derive(Debug, Clone, Copy)]
pub struct EncoderLayer {
    pub query: Dense,
    pub key: Dense,
    pub value: Dense,
    pub attn_out: Dense,
    pub attn_norm: Norm,
    pub intermediate: Dense,
    pub output: Dense,
    pub output_norm: Norm,
}

/// The classification head on the first token: BERT's pooler (dense + tanh) then dropout and the
/// classifier; RoBERTa's dropout, dense + tanh, dropout, out_proj. The same shapes either way.
#[derive(Debug, Clone, Copy)]
pub struct Head {
    pub dense: Dense,
    pub out: Dense,
}

/// Indices of every parameter in [`BertLayout::specs`].
#[derive(Debug, Clone)]
pub struct BertLayout {
    pub specs: Vec<ParamSpec>,
    pub word: usize,
    pub position: usize,
    pub token_type: usize,
    pub embed_norm: Norm,
    pub layers: Vec<EncoderLayer>,
    pub head: Head,
}

struct Builder {
    specs: Vec<ParamSpec>,
    std: f64,
    d: usize,
}

impl Builder {
    fn push(&mut self, name: String, kind: Kind, group: Group, init: Init) -> usize {
        crate::layers::params::push(&mut self.specs, name, kind, group, init)
    }

    fn dense(&mut self, prefix: &str, d_in: usize, d_out: usize, group: Group) -> Dense {
        let std = self.std;
        Dense {
            weight: self.push(
                format!("{prefix}.weight"),
                Kind::Linear { d_in, d_out },
                group,
                Init::Normal { std },
            ),
            bias: self.push(
                format!("{prefix}.bias"),
                Kind::Vector { d: d_out },
                group,
                Init::Zeros,
            ),
        }
    }

    fn norm(&mut self, prefix: &str, group: Group) -> Norm {
        let kind = Kind::Vector { d: self.d };
        Norm {
            weight: self.push(format!("{prefix}.weight"), kind, group, Init::Ones),
            bias: self.push(format!("{prefix}.bias"), kind, group, Init::Zeros),
        }
    }

    /// An `nn.Embedding` of `rows`, its `padding_idx` row (if any) zero.
    fn table(&mut self, name: String, rows: usize, pad: Option<u32>) -> usize {
        let std = self.std;
        let init = match pad {
            Some(row) => Init::NormalZeroRow {
                std,
                row: row as usize,
            },
            None => Init::Normal { std },
        };
        let kind = Kind::Table { rows, cols: self.d };
        self.push(name, kind, Group::Embeddings, init)
    }

    fn layer(&mut self, p: &str, cfg: &BertConfig) -> EncoderLayer {
        let (d, ff) = (self.d, cfg.intermediate_size);
        let e = Group::Encoder;
        EncoderLayer {
            query: self.dense(&format!("{p}.attention.self.query"), d, d, e),
            key: self.dense(&format!("{p}.attention.self.key"), d, d, e),
            value: self.dense(&format!("{p}.attention.self.value"), d, d, e),
            attn_out: self.dense(&format!("{p}.attention.output.dense"), d, d, e),
            attn_norm: self.norm(&format!("{p}.attention.output.LayerNorm"), e),
            intermediate: self.dense(&format!("{p}.intermediate.dense"), d, ff, e),
            output: self.dense(&format!("{p}.output.dense"), ff, d, e),
            output_norm: self.norm(&format!("{p}.output.LayerNorm"), e),
        }
    }
}

impl BertLayout {
    /// The head's parameters (pooler or dense, classifier): final once the loss's backward is done.
    pub fn head_params(&self) -> Vec<usize> {
        let Head { dense, out } = self.head;
        vec![dense.weight, dense.bias, out.weight, out.bias]
    }

    /// Each encoder layer's parameters, final once that layer's backward is done.
    pub fn layer_params(&self) -> Vec<Vec<usize>> {
        let names: Vec<&str> = self.specs.iter().map(|s| s.name.as_str()).collect();
        let part = |i| format!(".encoder.layer.{i}.");
        crate::layers::grad_sink::block_params(&names, self.layers.len(), part, &[])
    }

    pub fn new(cfg: &BertConfig) -> Self {
        let mut b = Builder {
            specs: Vec::new(),
            std: cfg.initializer_range,
            d: cfg.hidden_size,
        };
        let base = cfg.family.prefix();
        let e = format!("{base}.embeddings");
        let word = b.table(
            format!("{e}.word_embeddings.weight"),
            cfg.vocab_size,
            cfg.pad_token_id,
        );
        // RoBERTa's position table also has `padding_idx` (the pad id, below the first position).
        let position_pad = match cfg.family {
            Family::Bert => None,
            Family::Roberta => cfg.pad_token_id,
        };
        let position = b.table(
            format!("{e}.position_embeddings.weight"),
            cfg.max_position_embeddings,
            position_pad,
        );
        let token_type = b.table(
            format!("{e}.token_type_embeddings.weight"),
            cfg.type_vocab_size,
            None,
        );
        let embed_norm = b.norm(&format!("{e}.LayerNorm"), Group::Embeddings);
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| b.layer(&format!("{base}.encoder.layer.{i}"), cfg))
            .collect();
        let (d, n) = (cfg.hidden_size, cfg.num_labels());
        let head = match cfg.family {
            Family::Bert => Head {
                dense: b.dense(&format!("{base}.pooler.dense"), d, d, Group::Pooler),
                out: b.dense("classifier", d, n, Group::Head),
            },
            Family::Roberta => Head {
                dense: b.dense("classifier.dense", d, d, Group::Head),
                out: b.dense("classifier.out_proj", d, n, Group::Head),
            },
        };
        Self {
            specs: b.specs,
            word,
            position,
            token_type,
            embed_norm,
            layers,
            head,
        }
    }

    /// Whether parameter `i` trains when `frozen` groups are frozen.
    pub fn trainable(&self, i: usize, frozen: &[Group]) -> bool {
        !frozen.contains(&self.specs[i].group)
    }

    /// Total and trainable parameter counts.
    pub fn param_counts(&self, frozen: &[Group]) -> (u64, u64) {
        params::counts(&self.specs, |i| self.trainable(i, frozen))
    }

    /// Whether two layouts hold the same tensors (names and shapes, in order).
    pub fn same_tensors(&self, other: &BertLayout) -> bool {
        params::same_tensors(&self.specs, &other.specs)
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.specs.iter().position(|s| s.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Parameter counts of transformers' classes for the base shapes (2 labels), as
    /// `sum(p.numel() for p in model.parameters())` gives them (transformers 5.23).
    #[test]
    fn base_models_have_transformers_parameter_counts() {
        let bert = BertConfig::from_json(&json!({"model_type": "bert"})).unwrap();
        assert_eq!(BertLayout::new(&bert).param_counts(&[]).0, 109_483_778);
        let roberta = BertConfig::from_json(&json!({
            "model_type": "roberta", "max_position_embeddings": 514, "type_vocab_size": 1
        }))
        .unwrap();
        let layout = BertLayout::new(&roberta);
        assert_eq!(layout.param_counts(&[]).0, 124_647_170);
        let (total, trainable) = layout.param_counts(&[Group::Embeddings, Group::Encoder]);
        // Only the head trains: dense 768² + 768, out_proj 768·2 + 2.
        assert_eq!((total - trainable, trainable), (total - 592_130, 592_130));
    }

    #[test]
    fn names_follow_transformers() {
        let cfg = BertConfig::from_json(&json!({"num_hidden_layers": 1})).unwrap();
        let l = BertLayout::new(&cfg);
        let name = |i: usize| l.specs[i].name.as_str();
        assert_eq!(name(l.word), "bert.embeddings.word_embeddings.weight");
        assert_eq!(
            name(l.layers[0].query.bias),
            "bert.encoder.layer.0.attention.self.query.bias"
        );
        assert_eq!(
            name(l.layers[0].output_norm.weight),
            "bert.encoder.layer.0.output.LayerNorm.weight"
        );
        assert_eq!(name(l.head.dense.weight), "bert.pooler.dense.weight");
        assert_eq!(name(l.head.out.bias), "classifier.bias");
        assert_eq!(l.specs[l.head.out.weight].kind.hf_shape(), vec![2, 768]);
    }
}
