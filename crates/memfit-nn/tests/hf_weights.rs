//! A Hugging Face model directory's weights: one file or shards, stored in f32, f16 or bf16, with the
//! mismatches transformers reports (missing, unexpected, wrong shape, truncated file) named.

use std::collections::HashMap;
use std::path::Path;

use burn::tensor::{bf16, f16};
use memfit_nn::t5::{T5Config, T5Model};
use memfit_nn::weights::HfWeights;
use safetensors::tensor::{Dtype, TensorView};
use serde_json::json;

fn tiny() -> T5Config {
    T5Config::from_json(&json!({
        "model_type": "t5", "vocab_size": 40, "d_model": 16, "d_kv": 4, "d_ff": 24,
        "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4
    }))
    .unwrap()
}

/// The model's tensors in transformers' layout, each as (name, shape, f32 values).
fn hf_tensors(model: &T5Model) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    let mut w = HfWeights::open_dir(dir.path()).unwrap();
    let names: Vec<String> = model.layout.specs.iter().map(|s| s.name.clone()).collect();
    names
        .into_iter()
        .map(|n| {
            let t = w.take(&n).unwrap().unwrap();
            (n, t.shape, t.values)
        })
        .collect()
}

/// Writes `tensors` in `dtype` to `path`.
fn write(path: &Path, dtype: Dtype, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, v)| match dtype {
            Dtype::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Dtype::BF16 => v
                .iter()
                .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
                .collect(),
            Dtype::F16 => v
                .iter()
                .flat_map(|x| f16::from_f32(*x).to_le_bytes())
                .collect(),
            _ => unreachable!(),
        })
        .collect();
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, s, _), b)| (n.clone(), TensorView::new(dtype, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn write_config(dir: &Path, model: &T5Model) {
    let text = serde_json::to_string(&model.config.to_json()).unwrap();
    std::fs::write(dir.join("config.json"), text).unwrap();
}

#[test]
fn f16_and_bf16_checkpoints_load_as_their_rounded_values() {
    let model = T5Model::init(tiny(), 5);
    let tensors = hf_tensors(&model);
    for (dtype, round) in [
        (
            Dtype::BF16,
            (|x: f32| bf16::from_f32(x).to_f32()) as fn(f32) -> f32,
        ),
        (Dtype::F16, |x: f32| f16::from_f32(x).to_f32()),
    ] {
        let dir = tempfile::tempdir().unwrap();
        write_config(dir.path(), &model);
        write(&dir.path().join("model.safetensors"), dtype, &tensors);
        let (loaded, report) = T5Model::load(dir.path()).unwrap();
        assert!(report.unused.is_empty());
        for (spec, w) in loaded.layout.specs.iter().zip(&loaded.weights) {
            let i = model
                .layout
                .specs
                .iter()
                .position(|s| s.name == spec.name)
                .unwrap();
            let want: Vec<f32> = model.weights[i].iter().map(|x| round(*x)).collect();
            assert_eq!(w, &want, "{dtype:?} {}", spec.name);
            assert!(w != &model.weights[i] || w.iter().all(|x| round(*x) == *x));
        }
    }
}

#[test]
fn sharded_checkpoints_load_as_the_single_file_does() {
    let model = T5Model::init(tiny(), 6);
    let tensors = hf_tensors(&model);
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &model);
    let (a, b) = tensors.split_at(tensors.len() / 2);
    let shards = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    write(&dir.path().join(shards[0]), Dtype::F32, a);
    write(&dir.path().join(shards[1]), Dtype::F32, b);
    let weight_map: HashMap<&str, &str> = a
        .iter()
        .map(|t| (t.0.as_str(), shards[0]))
        .chain(b.iter().map(|t| (t.0.as_str(), shards[1])))
        .collect();
    let index = json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let (loaded, _) = T5Model::load(dir.path()).unwrap();
    assert_eq!(loaded.weights, model.weights);

    // An index that names a tensor its shard lacks is refused, naming both.
    let bad = json!({"weight_map": {"shared.weight": shards[1]}});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        bad.to_string(),
    )
    .unwrap();
    let err = T5Model::load(dir.path()).err().unwrap().to_string();
    assert!(
        err.contains("shared.weight") && err.contains(shards[1]),
        "{err}"
    );
}

#[test]
fn missing_unexpected_and_truncated_are_named() {
    let model = T5Model::init(tiny(), 7);
    let mut tensors = hf_tensors(&model);
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &model);
    let path = dir.path().join("model.safetensors");

    // A tied alias transformers may write is listed as unused, not refused.
    let shared = tensors
        .iter()
        .find(|t| t.0 == "shared.weight")
        .unwrap()
        .clone();
    tensors.push(("lm_head.weight".into(), shared.1, shared.2));
    write(&path, Dtype::F32, &tensors);
    let (_, report) = T5Model::load(dir.path()).unwrap();
    assert_eq!(report.unused, vec!["lm_head.weight".to_string()]);

    // An unknown tensor is an error naming it.
    tensors.push(("cls.predictions.bias".into(), vec![40], vec![0.0; 40]));
    write(&path, Dtype::F32, &tensors);
    let err = T5Model::load(dir.path()).err().unwrap().to_string();
    assert!(err.contains("cls.predictions.bias"), "{err}");

    // A missing one too.
    let kept: Vec<_> = tensors[1..tensors.len() - 1].to_vec();
    write(&path, Dtype::F32, &kept);
    let err = T5Model::load(dir.path()).err().unwrap().to_string();
    assert!(
        err.contains(&tensors[0].0) && err.contains("missing"),
        "{err}"
    );

    // A truncated file names the file and says so, before any tensor is read.
    write(&path, Dtype::F32, &tensors[..tensors.len() - 1]);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 8]).unwrap();
    let err = T5Model::load(dir.path()).err().unwrap().to_string();
    assert!(
        err.contains("model.safetensors") && err.contains("truncated"),
        "{err}"
    );

    // No weights at all.
    std::fs::remove_file(&path).unwrap();
    let err = T5Model::load(dir.path()).err().unwrap().to_string();
    assert!(err.contains("no model.safetensors"), "{err}");
}
