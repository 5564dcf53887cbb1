//! The named choices of a setup: task, optimizer, training method, the metric that picks `best/`.

use serde::{Deserialize, Serialize};

/// Activation precision (master weights, gradients and optimizer state stay f32).
pub use memfit_nn::model::Precision;

/// What a run trains for (`--task`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum TaskKind {
    /// Source → target with an encoder-decoder (T5).
    #[default]
    Seq2seq,
    /// Text (or a text pair) → label with an encoder (BERT family).
    Classification,
    /// Next-token prediction with a decoder (Llama, Qwen2, Mistral).
    CausalLm,
}

impl TaskKind {
    pub fn name(self) -> &'static str {
        match self {
            TaskKind::Seq2seq => "seq2seq",
            TaskKind::Classification => "classification",
            TaskKind::CausalLm => "causal-lm",
        }
    }

    /// What picks `best/` unless the config says: the seed's BLEU-4 for seq2seq, accuracy for
    /// classification (transformers' text-classification examples), the loss otherwise.
    pub fn default_best_metric(self) -> BestMetric {
        match self {
            TaskKind::Seq2seq => BestMetric::Bleu4,
            TaskKind::Classification => BestMetric::Accuracy,
            TaskKind::CausalLm => BestMetric::ValidLoss,
        }
    }

    /// The metrics an evaluation of this task reports.
    pub fn metrics(self) -> &'static [BestMetric] {
        match self {
            TaskKind::Seq2seq => &[BestMetric::Bleu4, BestMetric::ValidLoss],
            TaskKind::Classification => &[
                BestMetric::Accuracy,
                BestMetric::MacroF1,
                BestMetric::ValidLoss,
            ],
            TaskKind::CausalLm => &[BestMetric::ValidLoss],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerKind {
    Adamw,
    Adafactor,
}

/// How the weights train (`--method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// Every weight (less the groups `freeze` names).
    #[default]
    Full,
    /// Full training with `freeze` naming the frozen groups (the planner's name for it).
    Freeze,
    /// Low-rank adapters on a frozen base (decoder models).
    Lora,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Full => "full",
            Method::Freeze => "freeze",
            Method::Lora => "lora",
        }
    }
}

/// What picks `best/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BestMetric {
    /// The seed's BLEU-4 formula on greedy generations (higher is better; the seed's choice).
    Bleu4,
    /// Validation loss (lower is better).
    ValidLoss,
    /// Share of validation rows classified right (higher is better).
    Accuracy,
    /// Mean F1 over the classes (higher is better).
    MacroF1,
}

impl BestMetric {
    /// The score's name in an evaluation report, `best` records and events.
    pub fn key(self) -> &'static str {
        match self {
            BestMetric::Bleu4 => "bleu4",
            BestMetric::ValidLoss => "valid_loss",
            BestMetric::Accuracy => "accuracy",
            BestMetric::MacroF1 => "macro_f1",
        }
    }

    /// The flag value (`--best-metric`).
    pub fn flag(self) -> &'static str {
        match self {
            BestMetric::Bleu4 => "bleu4",
            BestMetric::ValidLoss => "valid-loss",
            BestMetric::Accuracy => "accuracy",
            BestMetric::MacroF1 => "macro-f1",
        }
    }

    pub fn higher_is_better(self) -> bool {
        self != BestMetric::ValidLoss
    }
}
