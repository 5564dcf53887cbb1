//! The BERT family end to end: weights in and out of transformers' layout (round trips,
//! pretrained checkpoints with other heads, bad tensors named), parity with transformers' logits on
//! committed fixtures, and gradients against finite differences.

mod grads;
mod parity;
mod torch_bin;
#[path = "../support/torch_save.rs"]
mod torch_save;
mod weights;

use burn::prelude::*;
use burn::tensor::DType;
use memfit_nn::bert::forward::{BertForward, ClsInputs, Dropouts};
use memfit_nn::bert::{BertConfig, BertModel};
use serde_json::json;

/// A tiny random config of `model_type` (3 labels).
pub fn tiny(model_type: &str) -> BertConfig {
    BertConfig::from_json(&json!({
        "model_type": model_type, "vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 24, "max_position_embeddings": 20,
        "type_vocab_size": 2, "num_labels": 3, "initializer_range": 0.3
    }))
    .unwrap()
}

/// Fixed inputs for [`tiny`] models: a full row (a sentence pair), a padded one, and a padded pair.
pub struct Batch {
    pub ids: Vec<u32>,
    pub mask: Vec<bool>,
    pub types: Vec<u32>,
    pub labels: Vec<u32>,
}

impl Batch {
    pub fn new(pad: u32) -> Self {
        let p = pad;
        Self {
            ids: vec![
                2, 5, 9, 3, 11, 12, 3, 2, 7, 8, 3, p, p, p, 2, 30, 3, 21, 22, 3, p,
            ],
            mask: [
                [true; 7],
                [true, true, true, true, false, false, false],
                [true; 7],
            ]
            .concat()
            .into_iter()
            .enumerate()
            .map(|(i, m)| m && i != 20)
            .collect(),
            types: vec![
                0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0,
            ],
            labels: vec![2, 0, 1],
        }
    }

    pub fn inputs(&self) -> ClsInputs<'_> {
        ClsInputs {
            ids: &self.ids,
            mask: &self.mask,
            token_types: Some(&self.types),
            batch: 3,
            len: 7,
        }
    }
}

/// The model's logits for `inputs` in eval mode with activations in `dtype`, as f32 values.
pub fn logits(model: &BertModel, inputs: &ClsInputs, dtype: DType) -> Vec<f32> {
    let params = model.tensors(&Device::flex(), DType::F32);
    let fwd = BertForward::of(model, &params, dtype);
    let out = fwd.logits(inputs, &mut Dropouts::disabled()).unwrap();
    out.cast(DType::F32)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
