//! Saving and loading with transformers' names: exact round trips, the checkpoints transformers
//! loads into a classifier (pretrained encoders with their pretraining heads, base models without
//! the prefix, legacy LayerNorm names), and the tensors that do not fit, named.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use memfit_nn::bert::BertModel;
use memfit_nn::weights::{LoadedTensor, NamedTensor, read_f32, write_f32};

use crate::tiny;

/// A saved model's tensors, by name, in transformers' layout.
fn saved(model: &BertModel, dir: &Path) -> BTreeMap<String, LoadedTensor> {
    model.save(dir).unwrap();
    read_f32(&dir.join("model.safetensors")).unwrap().0
}

/// Rewrites `dir/model.safetensors` with `tensors`.
fn rewrite(dir: &Path, tensors: &BTreeMap<String, LoadedTensor>) {
    let named: Vec<NamedTensor> = tensors
        .iter()
        .map(|(name, t)| NamedTensor {
            name: name.clone(),
            shape: t.shape.clone(),
            values: Cow::Borrowed(&t.values),
            transpose: None,
        })
        .collect();
    write_f32(&dir.join("model.safetensors"), &named, None).unwrap();
}

fn extra(shape: &[usize]) -> LoadedTensor {
    LoadedTensor {
        shape: shape.to_vec(),
        values: vec![0.5; shape.iter().product()],
    }
}

#[test]
fn save_then_load_is_bit_identical() {
    for model_type in ["bert", "roberta", "xlm-roberta"] {
        let model = BertModel::init(tiny(model_type), 11);
        let dir = tempfile::tempdir().unwrap();
        model.save(dir.path()).unwrap();
        let (back, report) = BertModel::load(dir.path()).unwrap();
        assert_eq!(report, Default::default(), "{model_type}");
        assert_eq!(back.config.id2label, model.config.id2label);
        assert_eq!(back.config.family, model.config.family);
        assert!(back.layout.same_tensors(&model.layout));
        for ((a, b), spec) in back
            .weights
            .iter()
            .zip(&model.weights)
            .zip(&back.layout.specs)
        {
            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same && a.len() == b.len(), "{model_type}: {}", spec.name);
        }
    }
}

#[test]
fn saved_linear_weights_are_out_by_in() {
    let model = BertModel::init(tiny("bert"), 1);
    let dir = tempfile::tempdir().unwrap();
    let t = saved(&model, dir.path());
    assert_eq!(t["classifier.weight"].shape, vec![3, 16]);
    assert_eq!(
        t["bert.encoder.layer.1.intermediate.dense.weight"].shape,
        vec![24, 16]
    );
    assert_eq!(t["bert.embeddings.LayerNorm.bias"].shape, vec![16]);
    // Memory is [in, out]: element (in 2, out 1) is saved at row 1, column 2.
    let w = &model.weights[model.layout.head.out.weight];
    assert_eq!(t["classifier.weight"].values[16 + 2], w[2 * 3 + 1]);
}

#[test]
fn a_pretrained_bert_gets_a_new_head_and_its_pretraining_heads_go_unused() {
    let model = BertModel::init(tiny("bert"), 5);
    let dir = tempfile::tempdir().unwrap();
    let mut t = saved(&model, dir.path());
    // What bert-base-chinese holds besides the encoder: MLM and NSP heads, the position-id buffer.
    for name in [
        "classifier.weight",
        "classifier.bias",
        "bert.pooler.dense.weight",
        "bert.pooler.dense.bias",
    ] {
        t.remove(name);
    }
    t.insert("cls.predictions.bias".into(), extra(&[50]));
    t.insert("cls.seq_relationship.weight".into(), extra(&[2, 16]));
    t.insert("bert.embeddings.position_ids".into(), extra(&[1, 20]));
    rewrite(dir.path(), &t);
    let (loaded, report) = BertModel::load_seeded(dir.path(), 9).unwrap();
    let mut initialised = report.initialised.clone();
    initialised.sort();
    assert_eq!(
        initialised,
        [
            "bert.pooler.dense.bias",
            "bert.pooler.dense.weight",
            "classifier.bias",
            "classifier.weight"
        ]
    );
    assert_eq!(
        report.unused,
        [
            "bert.embeddings.position_ids",
            "cls.predictions.bias",
            "cls.seq_relationship.weight"
        ]
    );
    // The encoder is the checkpoint's; the new head is the seed's init (normal weights, zero bias).
    let l = &loaded.layout;
    assert_eq!(loaded.weights[l.word], model.weights[l.word]);
    assert_eq!(
        loaded.weights[l.layers[1].output.weight],
        model.weights[l.layers[1].output.weight]
    );
    let head = &loaded.weights[l.head.out.weight];
    assert_eq!(
        *head,
        BertModel::init(tiny("bert"), 9).weights[l.head.out.weight]
    );
    assert_ne!(*head, model.weights[l.head.out.weight]);
    assert!(loaded.weights[l.head.out.bias].iter().all(|b| *b == 0.0));
}

#[test]
fn a_pretrained_roberta_leaves_its_lm_head_and_pooler_unused() {
    let model = BertModel::init(tiny("roberta"), 5);
    let dir = tempfile::tempdir().unwrap();
    let mut t = saved(&model, dir.path());
    t.retain(|name, _| !name.starts_with("classifier."));
    t.insert("lm_head.dense.weight".into(), extra(&[16, 16]));
    t.insert("lm_head.bias".into(), extra(&[50]));
    t.insert("roberta.pooler.dense.weight".into(), extra(&[16, 16]));
    rewrite(dir.path(), &t);
    let (_, report) = BertModel::load(dir.path()).unwrap();
    assert_eq!(report.initialised.len(), 4, "{:?}", report.initialised);
    assert!(
        report
            .initialised
            .iter()
            .all(|n| n.starts_with("classifier."))
    );
    assert_eq!(
        report.unused,
        [
            "lm_head.bias",
            "lm_head.dense.weight",
            "roberta.pooler.dense.weight"
        ]
    );
}

#[test]
fn base_model_names_and_legacy_layer_norm_names_load() {
    let model = BertModel::init(tiny("bert"), 5);
    let dir = tempfile::tempdir().unwrap();
    let t = saved(&model, dir.path());
    // As `BertModel.save_pretrained` writes it (no `bert.` prefix), with TF-era gamma/beta names.
    let renamed: BTreeMap<String, LoadedTensor> = t
        .into_iter()
        .filter(|(n, _)| !n.starts_with("classifier."))
        .map(|(n, v)| {
            let n = n.strip_prefix("bert.").unwrap_or(&n).to_string();
            let n = n
                .replace("LayerNorm.weight", "LayerNorm.gamma")
                .replace("LayerNorm.bias", "LayerNorm.beta");
            (n, v)
        })
        .collect();
    assert!(renamed.contains_key("encoder.layer.0.attention.output.LayerNorm.gamma"));
    rewrite(dir.path(), &renamed);
    let (loaded, report) = BertModel::load(dir.path()).unwrap();
    assert_eq!(report.initialised, ["classifier.weight", "classifier.bias"]);
    assert!(report.unused.is_empty());
    for (i, spec) in loaded.layout.specs.iter().enumerate() {
        if !spec.name.starts_with("classifier.") {
            assert_eq!(loaded.weights[i], model.weights[i], "{}", spec.name);
        }
    }
}

/// Loads `tensors` (the saved ones, edited) and returns the error message.
fn load_error(edit: impl FnOnce(&mut BTreeMap<String, LoadedTensor>)) -> String {
    let model = BertModel::init(tiny("bert"), 5);
    let dir = tempfile::tempdir().unwrap();
    let mut t = saved(&model, dir.path());
    edit(&mut t);
    rewrite(dir.path(), &t);
    BertModel::load(dir.path()).unwrap_err().to_string()
}

#[test]
fn tensors_that_do_not_fit_are_named() {
    let e = load_error(|t| {
        t.insert(
            "bert.encoder.layer.7.output.dense.weight".into(),
            extra(&[16, 24]),
        );
    });
    assert!(
        e.contains("bert.encoder.layer.7.output.dense.weight"),
        "{e}"
    );
    let e = load_error(|t| {
        t.insert("classifier.weight".into(), extra(&[5, 16]));
    });
    assert!(
        e.contains("classifier.weight") && e.contains("[5, 16]"),
        "{e}"
    );
    let e = load_error(|t| {
        t.remove("bert.encoder.layer.1.attention.self.key.bias");
    });
    assert!(
        e.contains("bert.encoder.layer.1.attention.self.key.bias") && e.contains("missing"),
        "{e}"
    );
}

#[test]
fn a_config_of_another_family_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), r#"{"model_type": "t5"}"#).unwrap();
    let e = BertModel::load(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("config.json") && e.contains("model_type") && e.contains("t5"),
        "{e}"
    );
}
