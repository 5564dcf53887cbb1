//! `pytorch_model.bin` for `--init`: checkpoints written here in torch.save's zip layout (the pickle of
//! an `OrderedDict` state dict whose tensors refer to storages by persistent id, and one storage per
//! entry under `data/`), from the committed transformers fixture, load as its safetensors does.

use std::collections::BTreeMap;
use std::path::Path;

use burn::tensor::{DType, bf16, f16};
use memfit_nn::bert::BertModel;
use memfit_nn::weights::{LoadedTensor, read_f32};

use crate::torch_save::{Storage, write_bin};
use crate::{Batch, logits};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/bert-tiny");

/// The fixture's tensors (a checkpoint transformers wrote), each tagged to be stored as `storage`.
fn fixture_tensors(storage: Storage) -> BTreeMap<String, (Storage, LoadedTensor)> {
    let (tensors, _) = read_f32(&Path::new(FIXTURE).join("model.safetensors")).unwrap();
    tensors
        .into_iter()
        .map(|(n, t)| (n, (storage, t)))
        .collect()
}

/// A model directory: the fixture's config.json and `files` written by `write`.
fn model_dir(write: impl FnOnce(&Path)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        Path::new(FIXTURE).join("config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    write(dir.path());
    dir
}

fn bits(model: &BertModel) -> Vec<Vec<u32>> {
    let bits = |w: &Vec<f32>| w.iter().map(|x| x.to_bits()).collect();
    model.weights.iter().map(bits).collect()
}

#[test]
fn a_pytorch_bin_loads_as_its_safetensors_does() {
    let (want, want_report) = BertModel::load(Path::new(FIXTURE)).unwrap();
    let mut tensors = fixture_tensors(Storage::F32);
    // The buffer older transformers saved (int64): never read, listed as unused.
    let prefix = want.config.family.prefix();
    let positions = LoadedTensor {
        shape: vec![1, 4],
        values: vec![0.0, 1.0, 2.0, 3.0],
    };
    let position_ids = format!("{prefix}.embeddings.position_ids");
    tensors.insert(position_ids.clone(), (Storage::I64, positions));
    let word = format!("{prefix}.embeddings.word_embeddings.weight");
    let dir = model_dir(|d| {
        write_bin(
            &d.join("pytorch_model.bin"),
            &tensors,
            &[("cls.predictions.decoder.weight", &word)],
        )
    });
    let (got, report) = BertModel::load(dir.path()).unwrap();
    assert_eq!(bits(&got), bits(&want));
    assert_eq!(report.initialised, want_report.initialised);
    let mut unused = want_report.unused.clone();
    unused.extend(["cls.predictions.decoder.weight".to_string(), position_ids]);
    unused.sort();
    assert_eq!(report.unused, unused);
    let batch = Batch::new(got.config.pad_token_id.unwrap_or(0));
    assert_eq!(
        logits(&got, &batch.inputs(), DType::F32),
        logits(&want, &batch.inputs(), DType::F32)
    );
}

#[test]
fn f16_bf16_and_sharded_bins_load_their_values() {
    let (want, _) = BertModel::load(Path::new(FIXTURE)).unwrap();
    for (storage, round) in [
        (
            Storage::F16,
            (|x: f32| f16::from_f32(x).to_f32()) as fn(f32) -> f32,
        ),
        (Storage::BF16, |x: f32| bf16::from_f32(x).to_f32()),
    ] {
        let dir =
            model_dir(|d| write_bin(&d.join("pytorch_model.bin"), &fixture_tensors(storage), &[]));
        let (got, _) = BertModel::load(dir.path()).unwrap();
        for (g, w) in got.weights.iter().zip(&want.weights) {
            let rounded: Vec<f32> = w.iter().map(|x| round(*x)).collect();
            assert_eq!(g, &rounded, "{storage:?}");
        }
    }

    // Two shards and the index transformers writes for them.
    let mut first = fixture_tensors(Storage::F32);
    let second_name = first.keys().nth(first.len() / 2).unwrap().clone();
    let second = first.split_off(&second_name);
    let shards = [
        "pytorch_model-00001-of-00002.bin",
        "pytorch_model-00002-of-00002.bin",
    ];
    let dir = model_dir(|d| {
        let mut weight_map = serde_json::Map::new();
        for (shard, part) in shards.iter().zip([first, second]) {
            for name in part.keys() {
                weight_map.insert(name.clone(), (*shard).into());
            }
            write_bin(&d.join(shard), &part, &[]);
        }
        let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
        std::fs::write(d.join("pytorch_model.bin.index.json"), index.to_string()).unwrap();
    });
    let (got, _) = BertModel::load(dir.path()).unwrap();
    assert_eq!(bits(&got), bits(&want));
}

#[test]
fn safetensors_come_first_and_a_bad_bin_is_named() {
    // Beside model.safetensors a .bin is not read (transformers' order), even a broken one.
    let dir = model_dir(|d| {
        std::fs::copy(
            Path::new(FIXTURE).join("model.safetensors"),
            d.join("model.safetensors"),
        )
        .unwrap();
        std::fs::write(d.join("pytorch_model.bin"), b"not a checkpoint").unwrap();
    });
    assert!(BertModel::load(dir.path()).is_ok());

    let dir = model_dir(|d| {
        write_bin(
            &d.join("pytorch_model.bin"),
            &fixture_tensors(Storage::F32),
            &[],
        )
    });
    let bin = dir.path().join("pytorch_model.bin");
    let whole = std::fs::read(&bin).unwrap();
    let broken: [(&str, Vec<u8>); 2] = [
        ("garbage", b"\x80\x02 not a checkpoint".to_vec()),
        ("truncated", whole[..whole.len() - 200].to_vec()),
    ];
    for (what, bytes) in broken {
        std::fs::write(&bin, bytes).unwrap();
        let err = BertModel::load(dir.path()).err().unwrap().to_string();
        assert!(err.contains(&bin.display().to_string()), "{what}: {err}");
    }

    // A weight stored as integers is refused, naming the file, the tensor and its dtype.
    let mut tensors = fixture_tensors(Storage::F32);
    let (name, entry) = tensors.iter_mut().next().unwrap();
    let name = name.clone();
    entry.0 = Storage::I64;
    std::fs::write(&bin, b"").unwrap();
    write_bin(&bin, &tensors, &[]);
    let err = BertModel::load(dir.path()).err().unwrap().to_string();
    assert!(
        err.contains("pytorch_model.bin") && err.contains(&name) && err.contains("I64"),
        "{err}"
    );
}
