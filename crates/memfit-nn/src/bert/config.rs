//! The BERT-family configuration, read from a Hugging Face `config.json` with transformers' field
//! names and defaults (`transformers/models/{bert,roberta,xlm_roberta}/configuration_*.py`, and
//! `PreTrainedConfig` for `id2label` / `num_labels` / `problem_type`). RoBERTa and XLM-RoBERTa are
//! BERT with another embedding layer and head; one struct holds all three.

use serde::Deserialize;
use serde_json::{Map, Value};
use std::path::Path;

use crate::ModelError;
use crate::layers::activation::Activation;

/// Which transformers model class the config describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `BertForSequenceClassification`: `bert.` prefix, pooler, one linear classifier.
    Bert,
    /// `RobertaForSequenceClassification` (and XLM-RoBERTa's, the same code): `roberta.` prefix,
    /// positions offset past the padding id, no pooler, a dense + tanh + out_proj head.
    Roberta,
}

impl Family {
    /// The `model_type`s this family reads, and the family of one.
    fn of(model_type: &str) -> Option<Self> {
        match model_type {
            "bert" => Some(Self::Bert),
            "roberta" | "xlm-roberta" => Some(Self::Roberta),
            _ => None,
        }
    }

    /// The base model's attribute name in the classification model (`base_model_prefix`).
    pub fn prefix(self) -> &'static str {
        match self {
            Self::Bert => "bert",
            Self::Roberta => "roberta",
        }
    }
}

#[derive(Debug, Deserialize)]
struct RawBertConfig {
    vocab_size: Option<usize>,
    #[serde(default = "d::hidden_size")]
    hidden_size: usize,
    #[serde(default = "d::layers_heads")]
    num_hidden_layers: usize,
    #[serde(default = "d::layers_heads")]
    num_attention_heads: usize,
    #[serde(default = "d::intermediate_size")]
    intermediate_size: usize,
    #[serde(default = "d::hidden_act")]
    hidden_act: String,
    #[serde(default = "d::dropout")]
    hidden_dropout_prob: f64,
    #[serde(default = "d::dropout")]
    attention_probs_dropout_prob: f64,
    #[serde(default = "d::max_position_embeddings")]
    max_position_embeddings: usize,
    #[serde(default = "d::type_vocab_size")]
    type_vocab_size: usize,
    #[serde(default = "d::initializer_range")]
    initializer_range: f64,
    #[serde(default = "d::layer_norm_eps")]
    layer_norm_eps: f64,
    #[serde(default)]
    position_embedding_type: Option<String>,
    #[serde(default)]
    classifier_dropout: Option<f64>,
    #[serde(default)]
    num_labels: Option<usize>,
    #[serde(default)]
    id2label: Option<Map<String, Value>>,
    #[serde(default)]
    label2id: Option<Map<String, Value>>,
    #[serde(default)]
    problem_type: Option<String>,
    #[serde(default)]
    is_decoder: bool,
}

/// transformers' `BertConfig` / `RobertaConfig` defaults (bert-base's shape); those that differ by
/// family are in [`BertConfig::from_json`].
mod d {
    pub fn hidden_size() -> usize {
        768
    }
    pub fn layers_heads() -> usize {
        12
    }
    pub fn intermediate_size() -> usize {
        3072
    }
    pub fn hidden_act() -> String {
        "gelu".into()
    }
    pub fn dropout() -> f64 {
        0.1
    }
    pub fn max_position_embeddings() -> usize {
        512
    }
    pub fn type_vocab_size() -> usize {
        2
    }
    pub fn initializer_range() -> f64 {
        0.02
    }
    pub fn layer_norm_eps() -> f64 {
        1e-12
    }
}

/// A resolved BERT / RoBERTa / XLM-RoBERTa configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct BertConfig {
    pub family: Family,
    /// `bert`, `roberta` or `xlm-roberta`, as read.
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: Activation,
    pub hidden_dropout_prob: f64,
    pub attention_probs_dropout_prob: f64,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub initializer_range: f64,
    pub layer_norm_eps: f64,
    /// The word embedding's `padding_idx` (and RoBERTa's position offset).
    pub pad_token_id: Option<u32>,
    /// `None`: the classifier uses `hidden_dropout_prob`.
    pub classifier_dropout: Option<f64>,
    /// Label names in id order: `id2label[i]`; its length is `num_labels`.
    pub id2label: Vec<String>,
    /// The JSON it came from; unknown fields are written back unchanged on save.
    pub raw: Map<String, Value>,
}

fn bad(field: &str, what: String) -> ModelError {
    ModelError::Config(format!("{field}: {what}"))
}

impl BertConfig {
    /// Reads a config from a JSON value.
    pub fn from_json(value: &Value) -> Result<Self, ModelError> {
        let raw = value
            .as_object()
            .ok_or_else(|| ModelError::Config("expected a JSON object".into()))?
            .clone();
        let model_type = raw
            .get("model_type")
            .and_then(Value::as_str)
            .unwrap_or("bert")
            .to_string();
        let family = Family::of(&model_type).ok_or_else(|| {
            bad(
                "model_type",
                format!("{model_type:?}: the BERT engine handles \"bert\", \"roberta\" and \"xlm-roberta\""),
            )
        })?;
        let r: RawBertConfig =
            serde_json::from_value(value.clone()).map_err(|e| ModelError::Config(e.to_string()))?;
        let hidden_act = Activation::from_hf_name(&r.hidden_act).ok_or_else(|| {
            bad(
                "hidden_act",
                format!(
                    "{:?} is not one of gelu, gelu_new, gelu_pytorch_tanh, relu, silu",
                    r.hidden_act
                ),
            )
        })?;
        if let Some(kind) = r
            .position_embedding_type
            .as_deref()
            .filter(|k| *k != "absolute")
        {
            return Err(bad(
                "position_embedding_type",
                format!("{kind:?}: only \"absolute\" is supported"),
            ));
        }
        if r.is_decoder {
            return Err(bad(
                "is_decoder",
                "true: only the bidirectional encoder is supported".into(),
            ));
        }
        // Defaults that differ by class: RobertaConfig (vocab 50265, pad 1), XLMRobertaConfig (30522, 1).
        let (vocab_default, pad_default) = match model_type.as_str() {
            "roberta" => (50265, 1),
            "xlm-roberta" => (30522, 1),
            _ => (30522, 0),
        };
        // Absent: the class's default; `null`: no padding id (serde reads both as `None`).
        let pad_token_id = match raw.get("pad_token_id") {
            None => Some(pad_default),
            Some(Value::Null) => None,
            Some(v) => Some(
                v.as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .ok_or_else(|| bad("pad_token_id", format!("{v}: not a token id")))?,
            ),
        };
        let id2label = labels(r.num_labels, r.id2label.as_ref(), r.label2id.as_ref())?;
        check_problem_type(r.problem_type.as_deref(), id2label.len())?;
        let cfg = Self {
            family,
            model_type,
            vocab_size: r.vocab_size.unwrap_or(vocab_default),
            hidden_size: r.hidden_size,
            num_hidden_layers: r.num_hidden_layers,
            num_attention_heads: r.num_attention_heads,
            intermediate_size: r.intermediate_size,
            hidden_act,
            hidden_dropout_prob: r.hidden_dropout_prob,
            attention_probs_dropout_prob: r.attention_probs_dropout_prob,
            max_position_embeddings: r.max_position_embeddings,
            type_vocab_size: r.type_vocab_size,
            initializer_range: r.initializer_range,
            layer_norm_eps: r.layer_norm_eps,
            pad_token_id,
            classifier_dropout: r.classifier_dropout,
            id2label,
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
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("type_vocab_size", self.type_vocab_size),
        ])?;
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(bad(
                "num_attention_heads",
                format!(
                    "{} does not divide hidden_size {}",
                    self.num_attention_heads, self.hidden_size
                ),
            ));
        }
        for (name, p) in [
            ("hidden_dropout_prob", Some(self.hidden_dropout_prob)),
            (
                "attention_probs_dropout_prob",
                Some(self.attention_probs_dropout_prob),
            ),
            ("classifier_dropout", self.classifier_dropout),
        ] {
            if let Some(p) = p.filter(|p| !(0.0..1.0).contains(p)) {
                return Err(bad(name, format!("{p}: must be in [0, 1)")));
            }
        }
        if self.layer_norm_eps.is_nan() || self.layer_norm_eps <= 0.0 {
            return Err(bad(
                "layer_norm_eps",
                format!("{}: must be > 0", self.layer_norm_eps),
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
            // RoBERTa's positions start past the padding id.
            None if self.family == Family::Roberta => Err(bad(
                "pad_token_id",
                "null: RoBERTa's positions need a padding id".into(),
            )),
            Some(id)
                if self.family == Family::Roberta
                    && id as usize + 2 > self.max_position_embeddings =>
            {
                Err(bad(
                    "max_position_embeddings",
                    format!(
                        "{}: leaves no position past pad_token_id {id}",
                        self.max_position_embeddings
                    ),
                ))
            }
            _ => Ok(()),
        }
    }

    pub fn num_labels(&self) -> usize {
        self.id2label.len()
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// The classifier's dropout: `classifier_dropout`, else `hidden_dropout_prob`.
    pub fn classifier_dropout_prob(&self) -> f64 {
        self.classifier_dropout.unwrap_or(self.hidden_dropout_prob)
    }

    /// The longest sequence the position table holds: RoBERTa's positions start at `pad + 1`.
    pub fn max_len(&self) -> usize {
        match (self.family, self.pad_token_id) {
            (Family::Roberta, Some(pad)) => self.max_position_embeddings - pad as usize - 1,
            _ => self.max_position_embeddings,
        }
    }

    /// The sequence-classification class transformers builds from this config.
    pub fn architecture(&self) -> &'static str {
        match self.model_type.as_str() {
            "roberta" => "RobertaForSequenceClassification",
            "xlm-roberta" => "XLMRobertaForSequenceClassification",
            _ => "BertForSequenceClassification",
        }
    }

    /// The `config.json` to write beside the weights: the original object with the resolved fields.
    pub fn to_json(&self) -> Value {
        let mut m = self.raw.clone();
        let mut set = |k: &str, v: Value| {
            m.insert(k.to_string(), v);
        };
        set("model_type", self.model_type.clone().into());
        set(
            "architectures",
            Value::Array(vec![self.architecture().into()]),
        );
        set("vocab_size", self.vocab_size.into());
        set("hidden_size", self.hidden_size.into());
        set("num_hidden_layers", self.num_hidden_layers.into());
        set("num_attention_heads", self.num_attention_heads.into());
        set("intermediate_size", self.intermediate_size.into());
        set("hidden_dropout_prob", self.hidden_dropout_prob.into());
        set(
            "attention_probs_dropout_prob",
            self.attention_probs_dropout_prob.into(),
        );
        set(
            "max_position_embeddings",
            self.max_position_embeddings.into(),
        );
        set("type_vocab_size", self.type_vocab_size.into());
        set("initializer_range", self.initializer_range.into());
        set("layer_norm_eps", self.layer_norm_eps.into());
        set(
            "pad_token_id",
            self.pad_token_id.map_or(Value::Null, Value::from),
        );
        set(
            "classifier_dropout",
            self.classifier_dropout.map_or(Value::Null, Value::from),
        );
        set("num_labels", self.num_labels().into());
        let id2label: Map<String, Value> = (self.id2label.iter().enumerate())
            .map(|(i, l)| (i.to_string(), l.clone().into()))
            .collect();
        let label2id: Map<String, Value> = (self.id2label.iter().enumerate())
            .map(|(i, l)| (l.clone(), i.into()))
            .collect();
        set("id2label", Value::Object(id2label));
        set("label2id", Value::Object(label2id));
        Value::Object(m)
    }
}

/// The most classes a classifier may have here: memfit_data's `MAX_LABELS`, the most a store
/// holds (memfit-nn does not depend on memfit-data; a test in memfit-train holds the two equal).
pub const MAX_NUM_LABELS: usize = 65_536;

/// Label names in id order, as `PreTrainedConfig.__init__` resolves them: `id2label` when given
/// (keys `"0".."n-1"`; `num_labels`, if also given, must match its length), else `num_labels`
/// (default 2) names `LABEL_i`. `label2id`, when given, must be `id2label` inverted.
fn labels(
    num_labels: Option<usize>,
    id2label: Option<&Map<String, Value>>,
    label2id: Option<&Map<String, Value>>,
) -> Result<Vec<String>, ModelError> {
    // Bounded before the names are made: a config.json can say any number.
    let given = num_labels.or(id2label.map(Map::len)).unwrap_or(2);
    if given > MAX_NUM_LABELS {
        return Err(bad(
            "num_labels",
            format!("{given}: past the {MAX_NUM_LABELS} labels memfit takes"),
        ));
    }
    let names: Vec<String> = match id2label {
        None => (0..num_labels.unwrap_or(2))
            .map(|i| format!("LABEL_{i}"))
            .collect(),
        Some(map) => {
            let mut names = vec![None; map.len()];
            for (key, name) in map {
                let i = key
                    .parse::<usize>()
                    .ok()
                    .filter(|i| *i < map.len())
                    .ok_or_else(|| {
                        bad(
                            "id2label",
                            format!("key {key:?} is not an id in 0..{}", map.len()),
                        )
                    })?;
                let name = name
                    .as_str()
                    .ok_or_else(|| bad("id2label", format!("[{key:?}] is not a string")))?;
                names[i] = Some(name.to_string());
            }
            let names: Vec<String> = names.into_iter().flatten().collect();
            if let Some(n) = num_labels.filter(|n| *n != names.len()) {
                return Err(bad(
                    "num_labels",
                    format!(
                        "{n} does not match id2label, which has {} labels",
                        names.len()
                    ),
                ));
            }
            names
        }
    };
    if names.is_empty() {
        return Err(bad("num_labels", "must be > 0".into()));
    }
    if let Some(map) = label2id {
        for (name, id) in map {
            let fits = id
                .as_u64()
                .is_some_and(|i| names.get(i as usize) == Some(name));
            if !fits {
                return Err(bad(
                    "label2id",
                    format!("{name:?}: {id} is not its id in id2label"),
                ));
            }
        }
    }
    Ok(names)
}

/// Only single-label classification is trained: transformers infers regression for one label.
fn check_problem_type(problem_type: Option<&str>, num_labels: usize) -> Result<(), ModelError> {
    match problem_type {
        None | Some("single_label_classification") if num_labels > 1 => Ok(()),
        None | Some("single_label_classification") => Err(bad(
            "num_labels",
            format!(
                "{num_labels}: single-label classification needs at least 2 labels (1 is regression)"
            ),
        )),
        Some(other) => Err(bad(
            "problem_type",
            format!("{other:?}: only \"single_label_classification\" is supported"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_follow_transformers() {
        let c = BertConfig::from_json(&json!({"model_type": "bert"})).unwrap();
        assert_eq!(c.family, Family::Bert);
        assert_eq!(
            (c.vocab_size, c.hidden_size, c.num_hidden_layers),
            (30522, 768, 12)
        );
        assert_eq!((c.num_attention_heads, c.intermediate_size), (12, 3072));
        assert_eq!((c.max_position_embeddings, c.type_vocab_size), (512, 2));
        assert_eq!((c.layer_norm_eps, c.pad_token_id), (1e-12, Some(0)));
        assert_eq!(c.hidden_act, Activation::Gelu);
        assert_eq!(c.id2label, ["LABEL_0", "LABEL_1"]);
        assert_eq!(c.classifier_dropout_prob(), 0.1);
        let r = BertConfig::from_json(&json!({"model_type": "roberta"})).unwrap();
        assert_eq!(
            (r.family, r.vocab_size, r.pad_token_id),
            (Family::Roberta, 50265, Some(1))
        );
        assert_eq!(r.max_len(), 510);
        let x = BertConfig::from_json(&json!({"model_type": "xlm-roberta"})).unwrap();
        assert_eq!(
            (x.family, x.vocab_size, x.pad_token_id),
            (Family::Roberta, 30522, Some(1))
        );
        assert_eq!(x.architecture(), "XLMRobertaForSequenceClassification");
    }

    #[test]
    fn labels_come_from_id2label_and_round_trip() {
        let c = BertConfig::from_json(&json!({
            "id2label": {"1": "pos", "0": "neg", "2": "mixed"},
            "label2id": {"neg": 0, "pos": 1, "mixed": 2},
            "classifier_dropout": 0.3, "hidden_act": "gelu_new"
        }))
        .unwrap();
        assert_eq!(c.id2label, ["neg", "pos", "mixed"]);
        assert_eq!(c.num_labels(), 3);
        assert_eq!(c.classifier_dropout_prob(), 0.3);
        assert_eq!(c.hidden_act, Activation::GeluNew);
        let back = BertConfig::from_json(&c.to_json()).unwrap();
        assert_eq!(
            back,
            BertConfig {
                raw: back.raw.clone(),
                ..c
            }
        );
        assert_eq!(
            back.to_json()["architectures"],
            json!(["BertForSequenceClassification"])
        );
        assert_eq!(back.to_json()["num_labels"], json!(3));
        let n = BertConfig::from_json(&json!({"num_labels": 4})).unwrap();
        assert_eq!(n.id2label, ["LABEL_0", "LABEL_1", "LABEL_2", "LABEL_3"]);
    }

    #[test]
    fn bad_fields_are_named() {
        let cases = [
            (json!({"model_type": "gpt2"}), "gpt2"),
            (
                json!({"position_embedding_type": "relative_key"}),
                "position_embedding_type",
            ),
            (
                json!({"problem_type": "multi_label_classification"}),
                "problem_type",
            ),
            (json!({"num_labels": 1}), "num_labels"),
            (json!({"num_labels": 1_000_000_000_000u64}), "num_labels"),
            (
                json!({"num_labels": 3, "id2label": {"0": "a", "1": "b"}}),
                "num_labels",
            ),
            (json!({"id2label": {"0": "a", "2": "b"}}), "id2label"),
            (
                json!({"id2label": {"0": "a", "1": "b"}, "label2id": {"a": 1}}),
                "label2id",
            ),
            (json!({"hidden_act": "tanh"}), "hidden_act"),
            (
                json!({"hidden_size": 10, "num_attention_heads": 4}),
                "num_attention_heads",
            ),
            (json!({"vocab_size": 5, "pad_token_id": 7}), "pad_token_id"),
            (json!({"hidden_dropout_prob": 1.5}), "hidden_dropout_prob"),
            (
                json!({"model_type": "roberta", "pad_token_id": null}),
                "pad_token_id",
            ),
            (json!({"is_decoder": true}), "is_decoder"),
        ];
        for (json, field) in cases {
            let e = BertConfig::from_json(&json).unwrap_err().to_string();
            assert!(e.contains(field), "{json}: {e}");
        }
    }
}
