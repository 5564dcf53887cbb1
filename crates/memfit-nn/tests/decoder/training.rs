//! The training pass: the loss is the mean next-token NLL over the trained tokens only (prompt and
//! padding ignored), per-layer checkpointing gives the plain pass's loss and gradients (dropout
//! replayed), gradients agree with finite differences, and bad batches and configs are named.

use memfit_nn::batch::CausalLmBatch;
use memfit_nn::decoder::{DecoderConfig, DecoderModel, DecoderOptions};
use memfit_nn::layers::lora::LoraSettings;
use memfit_nn::model::{Pass, Precision, TrainModel};
use serde_json::json;

use crate::lora::{batch, loss_and_grads, pass};
use crate::{full, params, rel_diff, tiny, wiggle};

fn full_model(model_type: &str) -> DecoderModel {
    let mut m = DecoderModel::init(tiny(model_type, json!({})), &full().with_seed(9)).unwrap();
    wiggle(&mut m);
    m
}

/// −log softmax(logits at t−1)[token t], averaged over the trained tokens, from the full logits.
fn reference_loss(model: &DecoderModel, b: &CausalLmBatch) -> f64 {
    let logits = model
        .logits(&params(model), &b.input, Precision::Fp32)
        .unwrap();
    let (len, vocab) = (b.input.len, model.config.vocab_size);
    let (mut sum, mut n) = (0.0f64, 0);
    for (i, _) in b.target_mask.iter().enumerate().filter(|(_, m)| **m) {
        let row = &logits[(i - 1) * vocab..i * vocab];
        let max = row.iter().fold(f32::NEG_INFINITY, |m, x| m.max(*x)) as f64;
        let lse = max
            + row
                .iter()
                .map(|x| (*x as f64 - max).exp())
                .sum::<f64>()
                .ln();
        sum += lse - row[b.input.ids[i] as usize] as f64;
        n += 1;
        assert!(i % len != 0);
    }
    sum / n as f64
}

#[test]
fn the_loss_counts_trained_tokens_only() {
    let model = full_model("llama");
    let b = batch();
    let (loss, _) = loss_and_grads(&model, &pass());
    let want = reference_loss(&model, &b);
    assert!((loss as f64 - want).abs() < 1e-5, "{loss} vs {want}");
    let eval = model
        .eval_loss(&params(&model), &b, Precision::Fp32)
        .unwrap();
    assert!((eval - loss).abs() < 1e-6);
    // A prompt token's identity changes the context, not the loss's terms: replacing the last
    // (untrained, padded) tokens changes nothing; un-masking the prompt changes the loss.
    let mut padded = b.clone();
    padded.input.ids[10] = 17;
    padded.input.ids[11] = 23;
    let again = model
        .eval_loss(&params(&model), &padded, Precision::Fp32)
        .unwrap();
    assert_eq!(again, eval, "padding is neither context nor target");
    let mut all = b.clone();
    all.target_mask[1] = true;
    let more = model
        .eval_loss(&params(&model), &all, Precision::Fp32)
        .unwrap();
    assert!((more - eval).abs() > 1e-4);
}

#[test]
fn checkpointing_gives_the_plain_pass_with_dropout_replayed() {
    let lora = DecoderOptions::lora(
        LoraSettings {
            r: 2,
            alpha: 4.0,
            dropout: 0.3,
            use_rslora: false,
        },
        &["all-linear".to_string()],
    )
    .unwrap();
    let config = tiny(
        "mistral",
        json!({"attention_dropout": 0.2, "sliding_window": 3}),
    );
    let mut adapted = DecoderModel::init(config.clone(), &lora).unwrap();
    wiggle(&mut adapted);
    let bf16_base = lora.with_base_precision(memfit_nn::decoder::BasePrecision::Bf16);
    let mut on_bf16 = DecoderModel::init(config, &bf16_base).unwrap();
    wiggle(&mut on_bf16);
    for model in [full_model("qwen3"), adapted, on_bf16] {
        for precision in [Precision::Fp32, Precision::Bf16] {
            let plain = Pass {
                precision,
                ..pass()
            };
            let ckpt = Pass {
                grad_ckpt: true,
                ..plain
            };
            let (l1, g1) = loss_and_grads(&model, &plain);
            let (l2, g2) = loss_and_grads(&model, &ckpt);
            assert!((l1 - l2).abs() < 1e-5, "{precision:?}: {l1} vs {l2}");
            for ((spec, a), b) in model.param_shapes().iter().zip(&g1).zip(&g2) {
                let tol = if precision == Precision::Bf16 {
                    2e-2
                } else {
                    1e-4
                };
                assert!(
                    rel_diff(b, a) < tol,
                    "{precision:?} {}: {:e}",
                    spec.name,
                    rel_diff(b, a)
                );
            }
            // Dropout is drawn: another seed, another loss.
            let (l3, _) = loss_and_grads(&model, &Pass { seed: 4, ..plain });
            if model.lora_layout().is_some() {
                assert_ne!(l1, l3);
            }
        }
    }
}

#[test]
fn full_training_gradients_match_finite_differences() {
    let model = full_model("qwen2");
    let (_, grads) = loss_and_grads(&model, &pass());
    let loss_at =
        |m: &DecoderModel| m.eval_loss(&params(m), &batch(), Precision::Fp32).unwrap() as f64;
    let h = 1e-2f32;
    // The embedding (rows and tied head), a bias, a norm, a projection.
    let picks = [
        (0usize, 3 * 16 + 2),
        (0, 11 * 16 + 5),
        (3, 1),
        (1, 4),
        (2, 17),
    ];
    for (param, at) in picks {
        let mut up = model.clone();
        up.params_mut()[param][at] += h;
        let mut down = model.clone();
        down.params_mut()[param][at] -= h;
        let fd = (loss_at(&up) - loss_at(&down)) / (2.0 * h as f64);
        let g = grads[param][at] as f64;
        let name = &model.param_shapes()[param].name;
        assert!(
            (fd - g).abs() < 2e-3 * (1.0 + g.abs()),
            "{name}[{at}]: {g} vs {fd}"
        );
    }
    assert!(
        grads.iter().all(|g| g.iter().any(|x| *x != 0.0)),
        "every weight has a gradient"
    );
}

#[test]
fn frozen_groups_get_no_gradient() {
    let model = full_model("llama");
    let trainable = model
        .trainable(&["embeddings".into(), "layers".into()])
        .unwrap();
    assert!(!trainable[model.layout.embed] && trainable[model.layout.norm]);
    let mut grads = crate::Grads::for_model(&model);
    model
        .accumulate(&params(&model), &trainable, &batch(), &pass(), &mut grads)
        .unwrap();
    for (i, g) in grads.0.iter().enumerate() {
        assert_eq!(
            g.iter().any(|x| *x != 0.0),
            trainable[i],
            "{}",
            model.param_shapes()[i].name
        );
    }
    let e = model
        .trainable(&["encoder".into()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("embeddings, layers, norm, lm_head"), "{e}");
}

#[test]
fn bad_batches_are_named() {
    let model = full_model("llama");
    let mut first = batch();
    first.target_mask[6] = true;
    let e = model.check_batch(&first).unwrap_err().to_string();
    assert!(
        e.contains("target_mask[1][0]") && e.contains("first position"),
        "{e}"
    );
    let mut pad = batch();
    pad.target_mask[11] = true;
    let e = model.check_batch(&pad).unwrap_err().to_string();
    assert!(e.contains("padding"), "{e}");
    let mut outside = batch();
    outside.input.ids[2] = 30;
    let e = model.check_batch(&outside).unwrap_err().to_string();
    assert!(e.contains("vocabulary"), "{e}");
}

#[test]
fn bad_configs_name_the_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    for (config, field) in [
        (json!({"model_type": "qwen2_moe"}), "model_type"),
        (
            json!({"model_type": "mixtral", "num_local_experts": 8}),
            "model_type",
        ),
        (
            json!({"model_type": "mistral", "num_local_experts": 8}),
            "num_local_experts",
        ),
        (
            json!({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}),
            "yarn",
        ),
        (
            json!({"model_type": "llama", "hidden_act": "gelu_pytorch_tanh"}),
            "hidden_act",
        ),
    ] {
        std::fs::write(&path, config.to_string()).unwrap();
        let e = DecoderConfig::from_file(&path).unwrap_err().to_string();
        assert!(
            e.contains(field) && e.contains("config.json"),
            "{config}: {e}"
        );
    }
    let e = DecoderModel::init(
        tiny("llama", json!({})),
        &full().with_base_precision(memfit_nn::decoder::BasePrecision::Bf16),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("--method lora"), "{e}");
}
