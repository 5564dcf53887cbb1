//! What the engine tests share: small models of each family, their batches, and a training loop
//! of `STEPS` optimizer steps of `ACCUM` micro-batches.
#![allow(dead_code)] // each test file uses its own part

use burn::prelude::*;
use memfit_nn::ModelError;
use memfit_nn::bert::BertConfig;
use memfit_nn::decoder::{DecoderConfig, DecoderModel, DecoderOptions};
use memfit_nn::kernels::dropout::SplitMix64;
use memfit_nn::layers::lora::LoraSettings;
use memfit_nn::model::TrainModel;
use memfit_nn::t5::T5Config;
use memfit_train::engine::{
    Backend, CausalLmBatch, ClassificationBatch, Engine, EngineOptions, Placement, Seq2SeqBatch,
    TokenRows,
};
use memfit_train::optim::{AdamWConfig, OptimizerConfig};
use serde_json::json;

pub const STEPS: usize = 20;
/// Micro-batches per optimizer step.
pub const ACCUM: usize = 2;

pub fn options(
    backend: Backend,
    placement: Placement,
    optimizer: OptimizerConfig,
) -> EngineOptions {
    EngineOptions {
        optimizer,
        backend,
        placement,
        ..Default::default()
    }
}

pub fn adamw() -> OptimizerConfig {
    OptimizerConfig::AdamW(AdamWConfig {
        weight_decay: 0.01,
        ..Default::default()
    })
}

/// Tokens in `2..vocab`, rows of random lengths (at least 2) padded to `len`.
pub fn rows(rng: &mut SplitMix64, batch: usize, len: usize, vocab: u64) -> TokenRows {
    let mut ids = vec![0u32; batch * len];
    let mut mask = vec![false; batch * len];
    for r in 0..batch {
        let n = 2 + rng.below((len - 1) as u64) as usize;
        for t in 0..n {
            ids[r * len + t] = 2 + rng.below(vocab - 2) as u32;
            mask[r * len + t] = true;
        }
    }
    TokenRows {
        batch,
        len,
        ids,
        mask,
    }
}

/// Trains `STEPS` optimizer steps of `ACCUM` micro-batches; the mean loss of each step.
pub fn train<E: Engine>(engine: &mut E, batches: &[E::Batch]) -> Vec<f32>
where
    E::Error: std::fmt::Debug,
{
    train_steps(engine, batches, 0..STEPS)
}

/// Every step's loss within `tol` relative of the reference's, and the run did learn.
pub fn assert_same_losses(what: &str, reference: &[f32], got: &[f32], tol: f32) {
    for (step, (a, b)) in reference.iter().zip(got).enumerate() {
        assert!(
            (a - b).abs() <= tol * a.abs().max(1.0),
            "{what}: step {step}: {b} vs the host placement's {a}\nhost:   {reference:?}\ndevice: {got:?}"
        );
    }
    assert!(
        reference[STEPS - 1] < reference[0],
        "{what}: the reference did not learn: {reference:?}"
    );
}

pub fn t5_config() -> T5Config {
    T5Config::from_json(&json!({
        "vocab_size": 40, "d_model": 16, "d_kv": 4, "d_ff": 32, "num_layers": 2,
        "num_decoder_layers": 2, "num_heads": 4, "relative_attention_num_buckets": 8,
        "relative_attention_max_distance": 16, "dropout_rate": 0.0,
        "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0
    }))
    .unwrap()
}

/// Copy task: the target is the source.
pub fn t5_batches() -> Vec<Seq2SeqBatch> {
    let mut rng = SplitMix64::new(5);
    (0..4)
        .map(|_| {
            let source = rows(&mut rng, 3, 6, 40);
            Seq2SeqBatch {
                labels: source.ids.clone(),
                label_mask: source.mask.clone(),
                tgt_len: source.len,
                source,
            }
        })
        .collect()
}

pub fn bert_config() -> BertConfig {
    BertConfig::from_json(&json!({
        "model_type": "bert", "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 24, "max_position_embeddings": 20,
        "type_vocab_size": 2, "num_labels": 3, "initializer_range": 0.3,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0
    }))
    .unwrap()
}

/// The label is the first token's residue mod 3.
pub fn bert_batches() -> Vec<ClassificationBatch> {
    let mut rng = SplitMix64::new(7);
    (0..4)
        .map(|_| {
            let input = rows(&mut rng, 4, 8, 40);
            let labels = (0..4).map(|r| input.ids[r * 8] % 3).collect();
            ClassificationBatch {
                input,
                token_types: None,
                labels,
            }
        })
        .collect()
}

pub fn decoder_config() -> DecoderConfig {
    DecoderConfig::from_json(&json!({
        "model_type": "qwen2", "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 64, "initializer_range": 0.3, "pad_token_id": 0
    }))
    .unwrap()
}

pub fn decoder_batches() -> Vec<CausalLmBatch> {
    let mut rng = SplitMix64::new(9);
    (0..4)
        .map(|_| {
            let input = rows(&mut rng, 3, 8, 40);
            // every token after the first of a row is trained
            let target_mask = (0..input.ids.len())
                .map(|i| i % 8 != 0 && input.mask[i])
                .collect();
            CausalLmBatch { input, target_mask }
        })
        .collect()
}

/// LoRA on every projection (adapters trained, the base frozen on the engine's device).
pub fn decoder_model(device: Device) -> Result<DecoderModel, ModelError> {
    decoder_model_with_dropout(device, 0.0)
}

/// [`decoder_model`] with LoRA dropout `dropout`.
pub fn decoder_model_with_dropout(
    device: Device,
    dropout: f64,
) -> Result<DecoderModel, ModelError> {
    let settings = LoraSettings {
        r: 4,
        alpha: 8.0,
        dropout,
        use_rslora: false,
    };
    let targets: Vec<String> = ["q", "k", "v", "o", "gate", "up", "down"]
        .map(String::from)
        .to_vec();
    let mut options = DecoderOptions::lora(settings, &targets)?.with_seed(4);
    options.device = device;
    let mut model = DecoderModel::init(decoder_config(), &options)?;
    // B starts at zero: move it so that every adapter's gradient is generic from step 1
    for (i, w) in model.params_mut().iter_mut().enumerate() {
        for (j, x) in w.iter_mut().enumerate() {
            *x += (((i * 7919 + j * 104_729) % 1000) as f32 / 1000.0 - 0.5) * 0.1;
        }
    }
    Ok(model)
}

/// [`train`] over the steps `range` (their batches and seeds as in a whole run).
pub fn train_steps<E: Engine>(
    engine: &mut E,
    batches: &[E::Batch],
    range: std::ops::Range<usize>,
) -> Vec<f32>
where
    E::Error: std::fmt::Debug,
{
    range
        .map(|step| {
            let mut sum = 0.0;
            for micro in 0..ACCUM {
                let b = &batches[(step * ACCUM + micro) % batches.len()];
                sum += engine
                    .accumulate(b, 1.0 / ACCUM as f32, step as u64)
                    .unwrap();
            }
            engine.step(1e-2, Some(1.0)).unwrap();
            sum / ACCUM as f32
        })
        .collect()
}
