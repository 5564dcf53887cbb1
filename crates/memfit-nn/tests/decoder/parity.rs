//! Parity with transformers and PEFT: tiny random llama / qwen2 / mistral / qwen3 models and a
//! LoRA adapter saved by them (`scripts/decoder_reference.py`, versions in each `expected.json`),
//! loaded here, give transformers' logits on the real tokens of a full, a right-padded and a
//! left-padded row; RoPE tables and the first layer's output match too. What memfit saves of them
//! loads back to the same logits; `MEMFIT_DECODER_EXPORT=DIR` keeps those directories for
//! `scripts/decoder_reference.py --check`.

use std::path::{Path, PathBuf};

use burn::prelude::*;
use burn::tensor::DType;
use memfit_nn::batch::TokenRows;
use memfit_nn::decoder::attention::{Context, Visibility};
use memfit_nn::decoder::forward::Dropouts;
use memfit_nn::decoder::{BasePrecision, DecoderModel};
use memfit_nn::layers::host::int_tensor;
use memfit_nn::model::{Precision, TrainModel};
use serde_json::Value;

use crate::{fixture, full, max_abs_diff, params};

/// The bar for memfit vs transformers logits in f32.
const LOGIT_TOLERANCE: f32 = 1e-4;

const MODELS: [&str; 4] = ["llama-tiny", "qwen2-tiny", "mistral-tiny", "qwen3-tiny"];

/// A fixture's inputs and transformers' values, flattened row-major.
struct Expected {
    rows: TokenRows,
    positions: Vec<usize>,
    logits: Vec<f32>,
    layer0: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

fn flat(v: &Value) -> Vec<f64> {
    match v {
        Value::Array(a) => a.iter().flat_map(flat).collect(),
        x => vec![x.as_f64().unwrap()],
    }
}

fn expected(dir: &Path) -> Expected {
    let text = std::fs::read_to_string(dir.join("expected.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let f32s = |k: &str| {
        flat(&v[k])
            .into_iter()
            .map(|x| x as f32)
            .collect::<Vec<_>>()
    };
    let batch = v["input_ids"].as_array().unwrap().len();
    let ids: Vec<u32> = flat(&v["input_ids"])
        .into_iter()
        .map(|x| x as u32)
        .collect();
    Expected {
        rows: TokenRows {
            batch,
            len: ids.len() / batch,
            mask: flat(&v["attention_mask"])
                .iter()
                .map(|x| *x != 0.0)
                .collect(),
            ids,
        },
        positions: flat(&v["position_ids"])
            .iter()
            .map(|x| *x as usize)
            .collect(),
        logits: f32s("logits"),
        layer0: f32s("layer0"),
        cos: f32s("rope_cos"),
        sin: f32s("rope_sin"),
    }
}

/// The values of `all` (`[tokens, width]`) at the real tokens of `mask`.
fn real(all: &[f32], mask: &[bool]) -> Vec<f32> {
    let width = all.len() / mask.len();
    all.chunks(width)
        .zip(mask)
        .filter(|(_, m)| **m)
        .flat_map(|(row, _)| row.iter().copied())
        .collect()
}

fn logit_diff(model: &DecoderModel, e: &Expected, precision: Precision) -> f32 {
    let got = model.logits(&params(model), &e.rows, precision).unwrap();
    max_abs_diff(&real(&got, &e.rows.mask), &real(&e.logits, &e.rows.mask))
}

fn load(name: &str) -> DecoderModel {
    let (model, report) = DecoderModel::load(&fixture(name), &full()).unwrap();
    assert!(report.unused.is_empty(), "{name}: {:?}", report.unused);
    model
}

#[test]
fn f32_logits_match_transformers() {
    for name in MODELS {
        let model = load(name);
        let diff = logit_diff(&model, &expected(&fixture(name)), Precision::Fp32);
        println!("{name} f32: max abs logit diff {diff:.3e}");
        assert!(diff <= LOGIT_TOLERANCE, "{name}: {diff:e}");
    }
}

#[test]
fn bf16_activations_stay_near_transformers() {
    for name in MODELS {
        let model = load(name);
        let diff = logit_diff(&model, &expected(&fixture(name)), Precision::Bf16);
        println!("{name} bf16 activations: max abs logit diff {diff:.3e}");
        assert!(diff <= 0.1, "{name}: {diff:e}");
    }
}

#[test]
fn rope_tables_match_transformers() {
    for name in MODELS {
        let model = load(name);
        let e = expected(&fixture(name));
        let (cos, sin) = model.config.rope.angles(&e.positions);
        let diff = max_abs_diff(&cos, &e.cos).max(max_abs_diff(&sin, &e.sin));
        println!("{name}: RoPE cos/sin max abs diff {diff:.3e}");
        assert!(diff <= 1e-5, "{name}: {diff:e}");
    }
}

#[test]
fn first_layer_matches_transformers() {
    // The attention (GQA, masks, RoPE) and MLP of layer 0 alone, before any error compounds.
    for name in MODELS {
        let model = load(name);
        let e = expected(&fixture(name));
        let p = params(&model);
        let fwd = model.forward(&p, DType::F32);
        let device = Device::flex();
        let rows = &e.rows;
        let visibility = Visibility {
            key_mask: &rows.mask,
            keys: rows.len,
            queries: rows.len,
        };
        let ctx = Context::new(&model.config, &e.positions, visibility, &device, DType::F32);
        let x = fwd.embed(int_tensor(&rows.ids, rows.batch, rows.len, &device));
        let out = fwd.layer(0, x, &ctx, None, &mut Dropouts::disabled());
        let got: Vec<f32> = out.into_data().try_to_vec().unwrap();
        let diff = max_abs_diff(&real(&got, &rows.mask), &real(&e.layer0, &rows.mask));
        assert!(diff <= 1e-5, "{name}: layer 0 max abs diff {diff:e}");
    }
}

fn lora_model(precision: BasePrecision) -> DecoderModel {
    let (model, _) = DecoderModel::load_with_adapter(
        &fixture("llama-tiny"),
        &fixture("llama-tiny-lora"),
        precision,
    )
    .unwrap();
    model
}

#[test]
fn a_peft_adapter_gives_peft_logits() {
    let e = expected(&fixture("llama-tiny-lora"));
    let diff = logit_diff(&lora_model(BasePrecision::F32), &e, Precision::Fp32);
    println!("llama-tiny + PEFT LoRA f32: max abs logit diff {diff:.3e}");
    assert!(diff <= LOGIT_TOLERANCE, "{diff:e}");
    // The adapter changes the logits: the comparison sees it.
    let base = expected(&fixture("llama-tiny"));
    assert!(max_abs_diff(&e.logits, &base.logits) > 0.1);
    // A bf16 base costs no more accuracy than bf16 activations do (this adapter is large — A and B
    // ~0.3, scale 2 — so both round more than the plain model's 0.03–0.05).
    let bf16_base = logit_diff(&lora_model(BasePrecision::Bf16), &e, Precision::Fp32);
    let bf16_activations = logit_diff(&lora_model(BasePrecision::F32), &e, Precision::Bf16);
    println!(
        "llama-tiny + PEFT LoRA: bf16 base {bf16_base:.3e}, bf16 activations {bf16_activations:.3e}"
    );
    assert!(
        bf16_base <= bf16_activations,
        "{bf16_base:e} vs {bf16_activations:e}"
    );
}

/// Where a test's saved directories go: `MEMFIT_DECODER_EXPORT/<name>` when set (kept for
/// `--check`), else a temporary directory.
fn export_dir(tmp: &tempfile::TempDir, name: &str) -> PathBuf {
    let dir = match std::env::var_os("MEMFIT_DECODER_EXPORT") {
        Some(root) => Path::new(&root).join(name),
        None => tmp.path().join(name),
    };
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn saved_models_adapters_and_merges_load_back_with_the_same_logits() {
    let tmp = tempfile::tempdir().unwrap();
    for name in MODELS {
        let model = load(name);
        let dir = export_dir(&tmp, name);
        model.save(&dir).unwrap();
        let back = load_from(&dir);
        let e = expected(&fixture(name));
        let (a, b) = (
            model
                .logits(&params(&model), &e.rows, Precision::Fp32)
                .unwrap(),
            back.logits(&params(&back), &e.rows, Precision::Fp32)
                .unwrap(),
        );
        assert_eq!(a, b, "{name}");
    }
    let e = expected(&fixture("llama-tiny-lora"));
    let adapted = lora_model(BasePrecision::F32);
    let adapter = export_dir(&tmp, "llama-tiny-lora");
    adapted.save(&adapter).unwrap();
    let mut fresh = lora_model(BasePrecision::F32);
    fresh.params_mut()[0][0] += 1.0;
    fresh.load(&adapter).unwrap();
    assert_eq!(fresh.params(), adapted.params(), "the adapter round-trips");
    let merged = export_dir(&tmp, "llama-tiny-merged");
    adapted.save_merged(&merged).unwrap();
    let diff = logit_diff(&load_from(&merged), &e, Precision::Fp32);
    println!("llama-tiny LoRA merged: max abs logit diff to PEFT {diff:.3e}");
    assert!(diff <= LOGIT_TOLERANCE, "{diff:e}");
}

fn load_from(dir: &Path) -> DecoderModel {
    DecoderModel::load(dir, &full()).unwrap().0
}
