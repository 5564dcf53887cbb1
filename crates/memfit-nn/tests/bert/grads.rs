//! Backward through burn's autodiff: every parameter gets a gradient, and a sample of them agree
//! with central finite differences of the loss; dropout is seeded (same seed, same result).

use burn::prelude::*;
use burn::tensor::DType;
use memfit_nn::bert::BertModel;
use memfit_nn::bert::forward::{BertForward, Dropouts};

use crate::{Batch, logits, max_abs_diff, tiny};

/// A tiny model with every parameter drawn away from its init (biases 0, norms 1), so that each
/// one's gradient is generic.
fn model(model_type: &str) -> BertModel {
    let mut m = BertModel::init(tiny(model_type), 21);
    for (i, w) in m.weights.iter_mut().enumerate() {
        for (j, x) in w.iter_mut().enumerate() {
            let wiggle = (((i * 7919 + j * 104_729) % 1000) as f32 / 1000.0 - 0.5) * 0.4;
            *x += wiggle;
        }
    }
    m
}

/// Loss of `model` on the fixed batch in eval mode, and the gradient of every parameter (`None`
/// where autodiff gave none).
fn loss_and_grads(model: &BertModel, dtype: DType) -> (f32, Vec<Option<Vec<f32>>>) {
    let batch = Batch::new(model.config.pad_token_id.unwrap());
    let leaves: Vec<Tensor<2>> = model
        .tensors(&Device::flex(), DType::F32)
        .into_iter()
        .map(|t| t.autodiff().require_grad())
        .collect();
    let fwd = BertForward::of(model, &leaves, dtype);
    let (loss, _) = fwd
        .loss(&batch.inputs(), &batch.labels, &mut Dropouts::disabled())
        .unwrap();
    let grads = loss.clone().backward();
    let values = |t: Tensor<2>| t.cast(DType::F32).into_data().try_to_vec::<f32>().unwrap();
    let g = leaves.iter().map(|l| l.grad(&grads).map(values)).collect();
    (loss.into_scalar(), g)
}

fn loss_at(model: &BertModel) -> f64 {
    let batch = Batch::new(model.config.pad_token_id.unwrap());
    let params = model.tensors(&Device::flex(), DType::F32);
    let fwd = BertForward::of(model, &params, DType::F32);
    let (loss, _) = fwd
        .loss(&batch.inputs(), &batch.labels, &mut Dropouts::disabled())
        .unwrap();
    loss.into_scalar::<f32>() as f64
}

#[test]
fn every_parameter_gets_a_gradient_in_f32_and_bf16() {
    for model_type in ["bert", "roberta"] {
        let m = model(model_type);
        for dtype in [DType::F32, DType::BF16] {
            let (loss, grads) = loss_and_grads(&m, dtype);
            assert!(
                loss.is_finite() && loss > 0.0,
                "{model_type} {dtype:?}: loss {loss}"
            );
            for (spec, g) in m.layout.specs.iter().zip(&grads) {
                let g = g
                    .as_ref()
                    .unwrap_or_else(|| panic!("{}: no gradient", spec.name));
                assert_eq!(g.len(), spec.kind.numel(), "{}", spec.name);
                let nonzero = g.iter().any(|x| *x != 0.0);
                assert!(
                    nonzero && g.iter().all(|x| x.is_finite()),
                    "{model_type} {dtype:?} {}",
                    spec.name
                );
            }
        }
    }
}

#[test]
fn gradients_match_finite_differences() {
    // Central differences of an f32 loss: step 1e-2 keeps rounding (~1e-7 / 1e-2) and the
    // truncation (~step² · f''') near 1e-5 for these magnitudes.
    const STEP: f32 = 1e-2;
    for model_type in ["bert", "roberta"] {
        let mut m = model(model_type);
        let (_, grads) = loss_and_grads(&m, DType::F32);
        let l = m.layout.clone();
        let probe = [
            l.word,
            l.position,
            l.token_type,
            l.embed_norm.weight,
            l.layers[0].query.weight,
            l.layers[0].key.bias,
            l.layers[1].value.weight,
            l.layers[0].attn_norm.bias,
            l.layers[1].intermediate.weight,
            l.layers[1].output_norm.weight,
            l.head.dense.weight,
            l.head.out.bias,
        ];
        for p in probe {
            let g = grads[p].as_ref().unwrap();
            // The entry with the largest gradient and one fixed entry.
            let top = (0..g.len())
                .max_by(|a, b| g[*a].abs().total_cmp(&g[*b].abs()))
                .unwrap();
            for j in [top, g.len() / 3] {
                let x = m.weights[p][j];
                m.weights[p][j] = x + STEP;
                let up = loss_at(&m);
                m.weights[p][j] = x - STEP;
                let down = loss_at(&m);
                m.weights[p][j] = x;
                let fd = ((up - down) / (2.0 * STEP as f64)) as f32;
                let name = &l.specs[p].name;
                assert!(
                    (g[j] - fd).abs() <= 2e-3 + 2e-2 * fd.abs(),
                    "{model_type} {name}[{j}]: autodiff {} vs finite difference {fd}",
                    g[j]
                );
            }
        }
    }
}

#[test]
fn dropout_is_seeded_and_changes_training_logits() {
    let m = model("bert");
    let batch = Batch::new(0);
    let params = m.tensors(&Device::flex(), DType::F32);
    let fwd = BertForward::of(&m, &params, DType::F32);
    let run = |seed: u64| -> Vec<f32> {
        let out = fwd
            .logits(&batch.inputs(), &mut Dropouts::new(&m.config, seed))
            .unwrap();
        out.into_data().try_to_vec::<f32>().unwrap()
    };
    let eval = logits(&m, &batch.inputs(), DType::F32);
    assert_eq!(run(3), run(3));
    assert!(max_abs_diff(&run(3), &run(4)) > 1e-3);
    assert!(max_abs_diff(&run(3), &eval) > 1e-3);
}

#[test]
fn bad_inputs_are_named() {
    let m = model("bert");
    let params = m.tensors(&Device::flex(), DType::F32);
    let fwd = BertForward::of(&m, &params, DType::F32);
    let mut batch = Batch::new(0);
    let err = |b: &Batch, labels: &[u32]| {
        let e = fwd
            .loss(&b.inputs(), labels, &mut Dropouts::disabled())
            .unwrap_err();
        e.to_string()
    };
    assert!(err(&batch, &[0, 3, 1]).contains("label 3"));
    batch.types[4] = 2;
    assert!(err(&batch, &[0, 1, 1]).contains("token type 2"));
    batch.types[4] = 1;
    batch.ids[0] = 50;
    assert!(err(&batch, &[0, 1, 1]).contains("token id 50"));
    let long = vec![2u32; 21];
    let inputs = memfit_nn::bert::forward::ClsInputs {
        ids: &long,
        mask: &[true; 21],
        token_types: None,
        batch: 1,
        len: 21,
    };
    let e = fwd
        .logits(&inputs, &mut Dropouts::disabled())
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_position_embeddings"), "{e}");
}

/// Collects a micro-batch's gradients per parameter, as a trainer's accumulator does.
struct Grads(Vec<Vec<f32>>);

impl memfit_nn::layers::grad_sink::GradTarget for Grads {
    fn parameter(&mut self, index: usize, grad: Tensor<2>) -> Result<(), memfit_nn::ModelError> {
        let g = grad
            .cast(DType::F32)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        for (a, g) in self.0[index].iter_mut().zip(g) {
            *a += g;
        }
        Ok(())
    }

    fn rows(
        &mut self,
        index: usize,
        ids: &[usize],
        grad: Tensor<2>,
    ) -> Result<(), memfit_nn::ModelError> {
        let [n, d] = grad.dims();
        let g = grad
            .cast(DType::F32)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        for (r, &id) in ids.iter().enumerate().take(n) {
            for c in 0..d {
                self.0[index][id * d + c] += g[r * d + c];
            }
        }
        Ok(())
    }
}

/// One training pass through the trainer's entry point: its loss and every gradient.
fn train_pass(m: &BertModel, pass: &memfit_nn::model::Pass) -> (f32, Vec<Vec<f32>>) {
    use memfit_nn::batch::{ClassificationBatch, TokenRows};
    use memfit_nn::model::TrainModel;
    let b = Batch::new(m.config.pad_token_id.unwrap());
    let batch = ClassificationBatch {
        input: TokenRows {
            batch: 3,
            len: 7,
            ids: b.ids.clone(),
            mask: b.mask.clone(),
        },
        token_types: Some(b.types.clone()),
        labels: b.labels.clone(),
    };
    let trainable = vec![true; m.weights.len()];
    let mut grads = Grads(m.weights.iter().map(|w| vec![0.0; w.len()]).collect());
    let params = m.tensors(&Device::flex(), DType::F32);
    let loss = m
        .accumulate(&params, &trainable, &batch, pass, &mut grads)
        .unwrap();
    (loss, grads.0)
}

#[test]
fn checkpointing_gives_the_plain_pass_with_dropout_replayed() {
    use memfit_nn::model::{Pass, Precision};
    for model_type in ["bert", "roberta"] {
        let m = model(model_type);
        for precision in [Precision::Fp32, Precision::Bf16] {
            let plain = Pass {
                seed: 3,
                loss_scale: 0.5,
                precision,
                grad_ckpt: false,
            };
            let ckpt = Pass {
                grad_ckpt: true,
                ..plain
            };
            let (l1, g1) = train_pass(&m, &plain);
            let (l2, g2) = train_pass(&m, &ckpt);
            assert!(
                (l1 - l2).abs() < 1e-5,
                "{model_type} {precision:?}: {l1} vs {l2}"
            );
            let tol = if precision == Precision::Bf16 {
                2e-2
            } else {
                1e-4
            };
            for ((spec, a), b) in m.layout.specs.iter().zip(&g1).zip(&g2) {
                let scale = a.iter().fold(1e-3f32, |s, x| s.max(x.abs()));
                let diff = max_abs_diff(a, b) / scale;
                assert!(
                    diff < tol,
                    "{model_type} {precision:?} {}: {diff:e}",
                    spec.name
                );
                assert!(b.iter().any(|x| *x != 0.0), "{}: no gradient", spec.name);
            }
            // dropout is drawn: another seed, another loss
            let (l3, _) = train_pass(&m, &Pass { seed: 4, ..ckpt });
            assert_ne!(l2, l3, "{model_type} {precision:?}");
        }
    }
}

#[test]
fn a_training_step_gives_the_gradients_of_plain_backward() {
    use memfit_nn::model::{Pass, Precision};
    let mut m = model("bert");
    // No dropout, so that the step's pass and the plain one are the same function.
    m.config.hidden_dropout_prob = 0.0;
    m.config.attention_probs_dropout_prob = 0.0;
    let (_, expected) = loss_and_grads(&m, DType::F32);
    let pass = Pass {
        seed: 7,
        loss_scale: 1.0,
        precision: Precision::Fp32,
        grad_ckpt: false,
    };
    // the word embeddings' gradient arrives as rows, the rest as whole tensors
    let (_, got) = train_pass(&m, &pass);
    for (spec, (a, e)) in m.layout.specs.iter().zip(got.iter().zip(&expected)) {
        assert!(
            max_abs_diff(a, e.as_ref().unwrap()) <= 1e-5,
            "{}",
            spec.name
        );
    }
}
