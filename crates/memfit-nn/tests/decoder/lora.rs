//! LoRA on the decoder: only A and B are parameters, their gradients are the dense formula's, the
//! adapter is written under PEFT's names and read back, and an adapter of another base or shape is
//! refused with what differs.

use burn::prelude::*;
use burn::tensor::DType;
use memfit_nn::batch::CausalLmBatch;
use memfit_nn::decoder::{BasePrecision, DecoderModel, DecoderOptions};
use memfit_nn::layers::lora::LoraSettings;
use memfit_nn::model::{Pass, Precision, TrainModel};
use memfit_nn::weights::SafetensorsFile;
use serde_json::json;

use crate::torch_save::{Storage, write_bin};
use crate::{Grads, full, params, rel_diff, rows, tiny, wiggle};

fn settings() -> LoraSettings {
    LoraSettings {
        r: 3,
        alpha: 6.0,
        dropout: 0.0,
        use_rslora: false,
    }
}

fn targets(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// A tiny qwen2 (biases, tied head) with adapters on `names`, A and B drawn away from PEFT's
/// init (B ≠ 0).
fn lora_model(names: &[&str], precision: BasePrecision) -> DecoderModel {
    let options = DecoderOptions::lora(settings(), &targets(names))
        .unwrap()
        .with_base_precision(precision)
        .with_seed(5);
    let mut m = DecoderModel::init(
        tiny("qwen2", json!({"tie_word_embeddings": true})),
        &options,
    )
    .unwrap();
    wiggle(&mut m);
    m
}

pub fn batch() -> CausalLmBatch {
    let input = rows(&[(&[3, 7, 9, 11, 4, 5], 0), (&[8, 2, 6, 1], 0)], 6);
    // Row 0: a 2-token prompt, then the response; row 1: all but the first token.
    let target_mask = vec![
        false, false, true, true, true, true, false, true, true, true, false, false,
    ];
    CausalLmBatch { input, target_mask }
}

pub fn pass() -> Pass {
    Pass {
        seed: 3,
        loss_scale: 1.0,
        precision: Precision::Fp32,
        grad_ckpt: false,
    }
}

/// The loss and every parameter's gradient of one pass.
pub fn loss_and_grads(model: &DecoderModel, pass: &Pass) -> (f32, Vec<Vec<f32>>) {
    let trainable = vec![true; model.params().len()];
    let mut grads = Grads::for_model(model);
    let loss = model
        .accumulate(&params(model), &trainable, &batch(), pass, &mut grads)
        .unwrap();
    (loss, grads.0)
}

fn matmul(a: &[f32], b: &[f32], shape: [usize; 3]) -> Vec<f32> {
    let [m, k, n] = shape;
    let t = |v: &[f32], r, c| {
        Tensor::<2>::from_data(
            burn::tensor::TensorData::new(v.to_vec(), [r, c]),
            &Device::flex(),
        )
    };
    t(a, m, k)
        .matmul(t(b, k, n))
        .into_data()
        .try_to_vec()
        .unwrap()
}

fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = v[r * cols + c];
        }
    }
    out
}

#[test]
fn only_the_adapters_are_parameters() {
    let m = lora_model(&["q", "v_proj", "mlp"], BasePrecision::F32);
    let shapes = m.param_shapes();
    // 5 targets × 2 layers × (A, B).
    assert_eq!(shapes.len(), 20);
    assert_eq!(
        shapes[0].name,
        "model.layers.0.self_attn.q_proj.lora_A.weight"
    );
    assert_eq!(
        (shapes[0].hf_shape.clone(), shapes[0].dims),
        (vec![3, 16], [16, 3])
    );
    assert!(shapes.iter().all(|s| s.name.contains(".lora_")));
    assert_eq!(m.trainable(&[]).unwrap(), vec![true; 20]);
    let e = m.trainable(&["embeddings".into()]).unwrap_err().to_string();
    assert!(e.contains("--freeze"), "{e}");
    assert!(m.total_params() > m.params().iter().map(|p| p.len() as u64).sum());
}

#[test]
fn adapter_gradients_are_the_dense_formula() {
    // x·(W + s·A·B): with the adapters merged into W, dL/dW gives dA = s·dW·Bᵀ and dB = s·Aᵀ·dW.
    let model = lora_model(
        &["q", "k", "v", "o", "gate", "up", "down"],
        BasePrecision::F32,
    );
    let (loss, grads) = loss_and_grads(&model, &pass());
    let tmp = tempfile::tempdir().unwrap();
    model.save_merged(tmp.path()).unwrap();
    let (merged, _) = DecoderModel::load(tmp.path(), &full()).unwrap();
    let (dense_loss, dense) = loss_and_grads(&merged, &pass());
    assert!(
        (loss - dense_loss).abs() < 1e-5,
        "{loss} vs merged {dense_loss}"
    );
    let lora = model.lora_layout().unwrap();
    let s = lora.settings.scale() as f32;
    let r = lora.settings.r;
    for (layer, p, pair) in lora.modules() {
        let (d_in, d_out) = p.dims(&model.config);
        let dw = &dense[model.layout.layers[layer].proj(p).weight];
        let (a, b) = (&model.params()[pair.a], &model.params()[pair.b]);
        let want_a: Vec<f32> = matmul(dw, &transpose(b, r, d_out), [d_in, d_out, r])
            .iter()
            .map(|x| x * s)
            .collect();
        let want_b: Vec<f32> = matmul(&transpose(a, d_in, r), dw, [r, d_in, d_out])
            .iter()
            .map(|x| x * s)
            .collect();
        let (da, db) = (
            rel_diff(&grads[pair.a], &want_a),
            rel_diff(&grads[pair.b], &want_b),
        );
        assert!(
            da < 1e-4 && db < 1e-4,
            "layer {layer} {p:?}: dA {da:e}, dB {db:e}"
        );
        assert!(grads[pair.b].iter().any(|g| *g != 0.0));
    }
}

#[test]
fn a_fresh_adapter_leaves_the_base_unchanged() {
    let options = DecoderOptions::lora(settings(), &targets(&["all-linear"])).unwrap();
    let config = tiny("llama", json!({}));
    let adapted = DecoderModel::init(config.clone(), &options).unwrap();
    let base = DecoderModel::init(config, &full()).unwrap();
    let b = batch();
    let a = adapted
        .logits(&params(&adapted), &b.input, Precision::Fp32)
        .unwrap();
    let z = base
        .logits(&params(&base), &b.input, Precision::Fp32)
        .unwrap();
    assert_eq!(a, z, "B starts at zero: the adapter adds nothing");
}

#[test]
fn the_adapter_is_written_under_peft_names_and_read_back() {
    let model = lora_model(&["q", "down"], BasePrecision::F32);
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["peft_type"], "LORA");
    assert_eq!(config["task_type"], "CAUSAL_LM");
    assert_eq!(
        (config["r"].clone(), config["lora_alpha"].clone()),
        (json!(3), json!(6))
    );
    assert_eq!(config["target_modules"], json!(["q_proj", "down_proj"]));
    let file = SafetensorsFile::open(&dir.path().join("adapter_model.safetensors")).unwrap();
    let names: Vec<&str> = file.names().collect();
    assert_eq!(names.len(), 8);
    assert!(names.contains(&"base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
    assert_eq!(
        file.shape("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"),
        Some(&[3usize, 16][..])
    );
    let mut other = lora_model(&["q", "down"], BasePrecision::Bf16);
    other.params_mut()[3][1] = 9.0;
    other.load(dir.path()).unwrap();
    assert_eq!(other.params(), model.params());
}

/// PEFT before 0.7 saved `adapter_model.bin` (torch.save): read as data when no safetensors file is
/// there, the same weights; with both, the safetensors file is read, as PEFT does.
#[test]
fn an_adapter_saved_by_torch_save_is_read_as_its_safetensors() {
    let model = lora_model(&["q", "down"], BasePrecision::F32);
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    let safetensors = dir.path().join("adapter_model.safetensors");
    let (tensors, _) = memfit_nn::weights::read_f32(&safetensors).unwrap();
    let tensors = (tensors.into_iter())
        .map(|(n, t)| (n, (Storage::F32, t)))
        .collect();
    write_bin(&dir.path().join("adapter_model.bin"), &tensors, &[]);
    std::fs::remove_file(&safetensors).unwrap();
    let mut other = lora_model(&["q", "down"], BasePrecision::F32);
    other.params_mut()[3][1] = 9.0;
    other.load(dir.path()).unwrap();
    assert_eq!(other.params(), model.params());
    // both files: the safetensors one wins (written from other weights, to tell them apart)
    let mut changed = lora_model(&["q", "down"], BasePrecision::F32);
    changed.params_mut()[3][1] = 9.0;
    let fresh = tempfile::tempdir().unwrap();
    changed.save(fresh.path()).unwrap();
    std::fs::copy(fresh.path().join("adapter_model.safetensors"), &safetensors).unwrap();
    other.load(dir.path()).unwrap();
    assert_eq!(other.params(), changed.params());
}

#[test]
fn an_adapter_of_another_shape_or_base_is_refused_whole() {
    let model = lora_model(&["q", "v"], BasePrecision::F32);
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    let check = |mut target: DecoderModel, expect: &str| {
        let before = target.params().to_vec();
        let e = target.load(dir.path()).unwrap_err().to_string();
        assert!(e.contains(expect), "expected {expect:?} in: {e}");
        assert_eq!(target.params(), before, "nothing half-loaded");
    };
    // Another rank, other targets.
    let options = DecoderOptions::lora(LoraSettings { r: 2, ..settings() }, &targets(&["q", "v"]));
    let config = tiny("qwen2", json!({"tie_word_embeddings": true}));
    check(
        DecoderModel::init(config.clone(), &options.unwrap()).unwrap(),
        "r is 3",
    );
    let options = DecoderOptions::lora(settings(), &targets(&["q", "k"])).unwrap();
    check(
        DecoderModel::init(config, &options).unwrap(),
        "target_modules",
    );
    // Another base: wider layers.
    let options = DecoderOptions::lora(settings(), &targets(&["q", "v"])).unwrap();
    let wider = tiny("qwen2", json!({"hidden_size": 32}));
    check(
        DecoderModel::init(wider, &options).unwrap(),
        "another base model",
    );
    // Another recorded base.
    let mut named = lora_model(&["q", "v"], BasePrecision::F32);
    named.base_name = Some("/models/elsewhere".into());
    let mut theirs = model.clone();
    theirs.base_name = Some("/models/qwen".into());
    theirs.save(dir.path()).unwrap();
    check(named, "base_model_name_or_path");
    // A full model has no adapter to load.
    let e = DecoderModel::init(tiny("qwen2", json!({})), &full())
        .unwrap()
        .load(dir.path())
        .unwrap_err()
        .to_string();
    assert!(e.contains("config.json") || e.contains("adapter"), "{e}");
}

#[test]
fn a_bf16_base_halves_its_memory_and_stays_near_f32() {
    let m32 = lora_model(&["all-linear"], BasePrecision::F32);
    let mut m16 = lora_model(&["all-linear"], BasePrecision::Bf16);
    assert!(
        m16.frozen_base()
            .unwrap()
            .iter()
            .all(|t| t.dtype() == DType::BF16)
    );
    assert!(
        m32.frozen_base()
            .unwrap()
            .iter()
            .all(|t| t.dtype() == DType::F32)
    );
    // The same adapters over both bases.
    m16.params_mut().clone_from_slice(m32.params());
    let b = batch();
    let a = m32
        .logits(&params(&m32), &b.input, Precision::Fp32)
        .unwrap();
    let h = m16
        .logits(&params(&m16), &b.input, Precision::Fp32)
        .unwrap();
    let diff = rel_diff(&h, &a);
    assert!(diff < 0.05, "bf16 base vs f32 base: {diff:e}");
    let (loss, grads) = loss_and_grads(&m16, &pass());
    assert!(loss.is_finite());
    assert!(grads.iter().flatten().all(|g| g.is_finite()));
    assert!(
        m16.params()
            .iter()
            .zip(&grads)
            .all(|(p, g)| p.len() == g.len())
    );
}
