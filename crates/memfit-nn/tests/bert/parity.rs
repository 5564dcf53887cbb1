//! Parity with transformers: tiny random `BertForSequenceClassification` and
//! `RobertaForSequenceClassification` saved by transformers (`scripts/bert_reference.py`, versions in
//! each `expected.json`), loaded here, give transformers' logits and loss for inputs with padding
//! and sentence pairs.

use std::path::{Path, PathBuf};

use burn::prelude::*;
use burn::tensor::DType;
use memfit_nn::bert::BertModel;
use memfit_nn::bert::forward::{BertForward, ClsInputs, Dropouts};
use serde_json::Value;

use crate::{logits, max_abs_diff};

/// The bar for memfit vs transformers logits in f32.
const LOGIT_TOLERANCE: f32 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A fixture's inputs (flattened), labels, logits and loss.
struct Expected {
    ids: Vec<u32>,
    mask: Vec<bool>,
    types: Vec<u32>,
    labels: Vec<u32>,
    logits: Vec<f32>,
    loss: f32,
    batch: usize,
    len: usize,
}

impl Expected {
    fn inputs(&self) -> ClsInputs<'_> {
        ClsInputs {
            ids: &self.ids,
            mask: &self.mask,
            token_types: Some(&self.types),
            batch: self.batch,
            len: self.len,
        }
    }
}

fn expected(dir: &Path) -> Expected {
    let text = std::fs::read_to_string(dir.join("expected.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let rows = |k: &str| -> Vec<Vec<f64>> { serde_json::from_value(v[k].clone()).unwrap() };
    let flat = |k: &str| -> Vec<f64> { rows(k).concat() };
    let ids = rows("input_ids");
    Expected {
        batch: ids.len(),
        len: ids[0].len(),
        ids: flat("input_ids").iter().map(|x| *x as u32).collect(),
        mask: flat("attention_mask").iter().map(|x| *x != 0.0).collect(),
        types: flat("token_type_ids").iter().map(|x| *x as u32).collect(),
        labels: serde_json::from_value(v["labels"].clone()).unwrap(),
        logits: flat("logits").iter().map(|x| *x as f32).collect(),
        loss: v["loss"].as_f64().unwrap() as f32,
    }
}

/// Max abs logit difference and loss difference against transformers in `dtype`.
fn compare(name: &str, dtype: DType) -> (f32, f32) {
    let dir = fixture(name);
    let (model, report) = BertModel::load(&dir).unwrap();
    assert_eq!(
        report,
        Default::default(),
        "{name}: transformers' own classifier loads whole"
    );
    let e = expected(&dir);
    let inputs = e.inputs();
    let got = logits(&model, &inputs, dtype);
    let params = model.tensors(&Device::flex(), DType::F32);
    let fwd = BertForward::of(&model, &params, dtype);
    let (loss, _) = fwd
        .loss(&inputs, &e.labels, &mut Dropouts::disabled())
        .unwrap();
    let loss: f32 = loss.into_scalar();
    let diffs = (max_abs_diff(&got, &e.logits), (loss - e.loss).abs());
    println!(
        "{name} {dtype:?}: max abs logit diff {:.3e}, loss diff {:.3e}",
        diffs.0, diffs.1
    );
    diffs
}

#[test]
fn f32_logits_and_loss_match_transformers() {
    for name in ["bert-tiny", "roberta-tiny"] {
        let (logit, loss) = compare(name, DType::F32);
        assert!(logit <= LOGIT_TOLERANCE, "{name}: {logit:e}");
        assert!(loss <= LOGIT_TOLERANCE, "{name}: loss diff {loss:e}");
    }
}

#[test]
fn bf16_activations_stay_near_transformers() {
    for name in ["bert-tiny", "roberta-tiny"] {
        // bf16 keeps 8 bits of mantissa: relative error ~4e-3 per op over a 2-layer model.
        let (logit, _) = compare(name, DType::BF16);
        assert!(logit <= 0.1, "{name}: {logit:e}");
    }
}

#[test]
fn roberta_positions_skip_padding() {
    let (model, _) = BertModel::load(&fixture("roberta-tiny")).unwrap();
    let params = model.tensors(&Device::flex(), DType::F32);
    let fwd = BertForward::of(&model, &params, DType::F32);
    // pad id 1: positions count real tokens from 2; padding keeps 1.
    let ids = [0, 5, 1, 7, 1, 1];
    let inputs = ClsInputs {
        ids: &ids,
        mask: &[true; 6],
        token_types: None,
        batch: 2,
        len: 3,
    };
    assert_eq!(fwd.position_ids(&inputs), [2, 3, 1, 2, 1, 1]);
}

/// memfit's save of transformers' classifier gives the same logits when loaded back. With
/// `MEMFIT_BERT_EXPORT=DIR` the saved directories are kept in `DIR/<fixture>`, for
/// `scripts/bert_reference.py --check` to load them in transformers.
#[test]
fn a_saved_fixture_loads_back_with_the_same_logits() {
    for name in ["bert-tiny", "roberta-tiny"] {
        let (model, _) = BertModel::load(&fixture(name)).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = match std::env::var_os("MEMFIT_BERT_EXPORT") {
            Some(root) => Path::new(&root).join(name),
            None => tmp.path().to_path_buf(),
        };
        std::fs::create_dir_all(&dir).unwrap();
        model.save(&dir).unwrap();
        let (back, report) = BertModel::load(&dir).unwrap();
        assert_eq!(report, Default::default());
        let e = expected(&fixture(name));
        let inputs = e.inputs();
        let (a, b) = (
            logits(&model, &inputs, DType::F32),
            logits(&back, &inputs, DType::F32),
        );
        assert_eq!(a, b, "{name}");
    }
}
