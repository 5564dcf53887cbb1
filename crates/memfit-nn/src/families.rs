//! The one place that names every family (as tokenizers' `ModelWrapper` does): which family a
//! `config.json` describes, and the model a task trains, built from a config (random init from a
//! seed) or from a directory (a Hugging Face model or a memfit checkpoint, `--init`). Everything
//! outside a family's folder reaches the families through here and the traits of [`crate::model`].

use std::path::Path;

use burn::prelude::Device;
use serde_json::Value;

use crate::ModelError;
use crate::batch::{CausalLmBatch, ClassificationBatch, Seq2SeqBatch};
use crate::bert::{BertConfig, BertModel};
use crate::model::{CausalGenerate, Seq2SeqGenerate, SequenceClassifier};
use crate::t5::{T5Config, T5Layout, T5Model};
use crate::weights::LoadReport;

/// The `model_type` of a config (`t5`, `bert`, …), `t5` when absent (T5 configs of old omitted it).
pub fn model_type(config: &Value) -> &str {
    config
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("t5")
}

/// The task a family trains for, by `model_type`: `seq2seq`, `classification` or `causal-lm`;
/// `None` for a model_type no family implements.
pub fn task_of(config: &Value) -> Option<&'static str> {
    match model_type(config) {
        "t5" | "mt5" => Some("seq2seq"),
        "bert" | "roberta" | "xlm-roberta" => Some("classification"),
        "llama" | "qwen2" | "mistral" | "qwen3" => Some("causal-lm"),
        _ => None,
    }
}

/// How long a sequence a model takes: `limit` tokens, a hard limit where a position table ends
/// there (BERT's family: a longer batch fails), else what the model was trained for (a decoder's
/// `max_position_embeddings`, T5's `n_positions`; longer runs but is out of its training).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Positions {
    pub limit: usize,
    pub hard: bool,
}

/// The positions of a model's config; `None` when it names none (a T5 config without
/// `n_positions`: relative positions take any length).
pub fn positions(config: &Value) -> Result<Option<Positions>, ModelError> {
    let field = |name: &str| config.get(name).and_then(Value::as_u64).map(|n| n as usize);
    Ok(match task_of(config) {
        Some("classification") => Some(Positions {
            limit: BertConfig::from_json(config)?.max_len(),
            hard: true,
        }),
        Some("seq2seq") => field("n_positions").map(|limit| Positions { limit, hard: false }),
        _ => field("max_position_embeddings").map(|limit| Positions { limit, hard: false }),
    })
}

/// How a decoder trains.
#[derive(Debug, Clone, PartialEq)]
pub enum Training {
    /// Every weight (less frozen groups).
    Full,
    /// LoRA adapters on a frozen base held in f32 or (`base_bf16`) bf16.
    Lora {
        settings: crate::layers::lora::LoraSettings,
        targets: Vec<String>,
        base_bf16: bool,
    },
}

/// The causal LM of `config` (`source` names it in errors), trained as `training` says: drawn from
/// `seed`, or, with `init`, the weights of that directory (a transformers model; under LoRA its
/// base, with fresh adapters drawn from `seed`). A LoRA base is held on `device`.
pub fn causal_lm(
    config: &Value,
    source: &str,
    init: Option<&Path>,
    training: &Training,
    (seed, device): (u64, Device),
) -> Result<
    (
        impl CausalGenerate<Batch = CausalLmBatch> + use<>,
        Option<LoadReport>,
    ),
    ModelError,
> {
    use crate::decoder::{BasePrecision, DecoderConfig, DecoderModel, DecoderOptions};
    let options = match training {
        Training::Full => DecoderOptions::full(),
        Training::Lora {
            settings,
            targets,
            base_bf16,
        } => DecoderOptions::lora(*settings, targets)?.with_base_precision(if *base_bf16 {
            BasePrecision::Bf16
        } else {
            BasePrecision::F32
        }),
    }
    .with_seed(seed)
    .on(device);
    match init {
        Some(dir) => {
            let (model, report) = DecoderModel::load(dir, &options)?;
            Ok((model, Some(report)))
        }
        None => {
            let cfg = DecoderConfig::from_json(config).map_err(|e| named(source, e))?;
            Ok((DecoderModel::init(cfg, &options)?, None))
        }
    }
}

/// A config error named by where the config came from (a preset name or its file).
fn named(source: &str, e: ModelError) -> ModelError {
    match e {
        ModelError::Config(m) => ModelError::Config(format!("model {source}: {m}")),
        other => other,
    }
}

/// The seq2seq model of `config` (`source` names it in errors): drawn from `seed`, or, with
/// `init`, the weights of that directory under `config`'s hyper-parameters (dropout, …); the
/// directory must hold the same tensors. Returns what loading left out.
pub fn seq2seq(
    config: &Value,
    source: &str,
    init: Option<&Path>,
    seed: u64,
) -> Result<
    (
        impl Seq2SeqGenerate<Batch = Seq2SeqBatch> + Clone + use<>,
        Option<LoadReport>,
    ),
    ModelError,
> {
    let t5 = T5Config::from_json(config).map_err(|e| named(source, e))?;
    let Some(dir) = init else {
        return Ok((T5Model::init(t5, seed), None));
    };
    let (loaded, report) = T5Model::load(dir)?;
    let layout = T5Layout::new(&t5);
    if !layout.same_tensors(&loaded.layout) || loaded.config.feed_forward != t5.feed_forward {
        return Err(ModelError::Input(format!(
            "--init {}: its config.json describes another model than {source:?} (tensors or feed-forward differ)",
            dir.display()
        )));
    }
    let model = T5Model {
        config: t5,
        layout,
        weights: loaded.weights,
    };
    Ok((model, Some(report)))
}

/// The classifier of `config` with `labels` (the data's label names, by id): drawn from `seed`,
/// or, with `init`, the encoder (and head, when it fits) of that directory — a pretrained encoder
/// gets a new head for these labels, initialised and listed in the report.
pub fn classifier(
    config: &Value,
    source: &str,
    labels: &[String],
    init: Option<&Path>,
    seed: u64,
) -> Result<
    (
        impl SequenceClassifier<Batch = ClassificationBatch> + Clone + use<>,
        Option<LoadReport>,
    ),
    ModelError,
> {
    let mut cfg = BertConfig::from_json(config).map_err(|e| named(source, e))?;
    cfg.set_labels(labels)?;
    let Some(dir) = init else {
        return Ok((BertModel::init(cfg, seed), None));
    };
    let (model, report) = BertModel::load_for_labels(dir, &cfg, seed)?;
    Ok((model, Some(report)))
}

/// Writes into `out` the full model of a LoRA checkpoint: its base (`base_model_name_or_path` of
/// the adapter's config) with the adapter merged in, `W + B·A·alpha/r`, in transformers' layout.
/// `Ok(false)` when `checkpoint` holds no adapter (nothing to merge).
pub fn merge_adapter(checkpoint: &Path, out: &Path) -> Result<bool, ModelError> {
    if !crate::weights::peft::is_adapter_dir(checkpoint) {
        return Ok(false);
    }
    let adapter = crate::weights::peft::AdapterConfig::from_dir(checkpoint)?;
    let base = adapter.base_model_name_or_path.ok_or_else(|| {
        ModelError::Format(format!(
            "{}: adapter_config.json names no base_model_name_or_path to merge into",
            checkpoint.display()
        ))
    })?;
    let base = Path::new(&base);
    let (model, _) = crate::decoder::DecoderModel::load_with_adapter(
        base,
        checkpoint,
        crate::decoder::BasePrecision::F32,
    )?;
    model.save_merged(out)?;
    Ok(true)
}

/// The `config.json` a checkpoint's model is described by: its own, or, for a LoRA adapter, its
/// base's (`base_model_name_or_path`).
pub fn checkpoint_config(dir: &Path) -> Result<Value, ModelError> {
    let own = dir.join("config.json");
    let path = if own.is_file() || !crate::weights::peft::is_adapter_dir(dir) {
        own
    } else {
        let adapter = crate::weights::peft::AdapterConfig::from_dir(dir)?;
        let base = adapter.base_model_name_or_path.ok_or_else(|| {
            ModelError::Format(format!(
                "{}: adapter_config.json names no base_model_name_or_path",
                dir.display()
            ))
        })?;
        Path::new(&base).join("config.json")
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| ModelError::Input(format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| ModelError::Config(format!("{}: {e}", path.display())))
}

/// A trained causal LM to run: a full model's directory, or a LoRA adapter over the base its
/// `adapter_config.json` names (an adapter of another base is refused, naming what differs).
pub fn causal_lm_checkpoint(
    dir: &Path,
) -> Result<impl CausalGenerate<Batch = CausalLmBatch> + use<>, ModelError> {
    use crate::decoder::{BasePrecision, DecoderModel, DecoderOptions};
    if !crate::weights::peft::is_adapter_dir(dir) {
        return Ok(DecoderModel::load(dir, &DecoderOptions::full())?.0);
    }
    let adapter = crate::weights::peft::AdapterConfig::from_dir(dir)?;
    let base = adapter.base_model_name_or_path.unwrap_or_default();
    let (model, _) = DecoderModel::load_with_adapter(Path::new(&base), dir, BasePrecision::F32)?;
    Ok(model)
}
