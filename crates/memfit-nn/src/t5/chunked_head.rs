//! T5's LM head and loss in row chunks: the shared mechanism ([`crate::layers::chunked_head`])
//! over T5's head weight — the untied `lm_head`, or the shared embedding rescaled by d_model^-½.

use burn::prelude::*;
use burn::tensor::Gradients;

use crate::layers::chunked_head::{self, LmHead};
pub use crate::layers::chunked_head::{CHUNK_LOGITS, HeadInputs, training_chunk_logits};
use crate::layers::grad_sink::GradSink;
use crate::t5::forward::T5Forward;

/// T5's head over `tracked`'s parameters: tied, transformers rescales by d_model^-½ and projects
/// onto the embedding `[vocab, d]`; untied, the head is `[d, vocab]`.
pub fn lm_head(tracked: &T5Forward) -> LmHead {
    let (index, tied) = match tracked.layout.lm_head {
        Some(head) => (head, false),
        None => (tracked.layout.shared, true),
    };
    LmHead {
        weight: tracked.params[index].clone(),
        index,
        tied,
        input_scale: if tied {
            (tracked.cfg.d_model as f64).powf(-0.5)
        } else {
            1.0
        },
        products: tracked.products(),
    }
}

/// The loss of `batch`'s targets over the tracked decoder output `out` `[b, t, d]`, back-propagated
/// through the head in chunks and then through `out`'s graph: every parameter gradient of
/// `loss · loss_scale` goes to `sink`. Returns the loss and the gradients of the last backward
/// (after `sink`), where the caller finds the gradients of its own leaves under `out`.
pub fn loss_through_head<E>(
    tracked: &T5Forward,
    out: Tensor<3>,
    head: HeadInputs,
    sink: &mut dyn GradSink<Error = E>,
) -> Result<(Tensor<1>, Option<Gradients>), E> {
    chunked_head::loss_through_head(&lm_head(tracked), out, head, sink)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::loss::masked_cross_entropy;
    use crate::t5::T5Model;
    use burn::tensor::{DType, TensorData};
    use serde_json::json;

    fn head_index(model: &T5Model) -> usize {
        model.layout.lm_head.unwrap_or(model.layout.shared)
    }

    /// Sums the head weight's gradient, from autodiff passes and by hand alike.
    struct HeadGrad<'a> {
        leaves: &'a [Tensor<2>],
        index: usize,
        sum: Vec<f32>,
    }

    impl HeadGrad<'_> {
        fn add(&mut self, g: Tensor<2>) {
            let g: Vec<f32> = g.into_data().try_to_vec().unwrap();
            self.sum.iter_mut().zip(g).for_each(|(a, b)| *a += b);
        }
    }

    impl GradSink for HeadGrad<'_> {
        type Error = ();
        fn gradients(&mut self, grads: &mut Gradients) -> Result<(), ()> {
            if let Some(g) = self.leaves[self.index].grad(grads) {
                self.add(g);
            }
            Ok(())
        }
        fn parameter(&mut self, index: usize, grad: Tensor<2>) -> Result<(), ()> {
            assert_eq!(
                index, self.index,
                "only the head's weight is computed by hand"
            );
            self.add(grad);
            Ok(())
        }
        fn rows(&mut self, _: usize, _: &[usize], _: Tensor<2>) -> Result<(), ()> {
            unreachable!("the head's tests look up no embeddings")
        }
    }

    type Setup = (T5Model, Vec<Tensor<2>>, Tensor<3>, Vec<u32>, Vec<bool>);

    /// A one-layer model (tied or not), its parameters as tracked leaves, a tracked decoder output
    /// `[3, 5, 8]`, labels, and a mask with a fully padded row and a partly padded one.
    fn setup(tie: bool) -> Setup {
        let cfg = crate::t5::T5Config::from_json(&json!({
            "vocab_size": 40, "d_model": 8, "d_kv": 4, "d_ff": 16, "num_layers": 1,
            "num_heads": 2, "tie_word_embeddings": tie
        }))
        .unwrap();
        let model = T5Model::init(cfg, 3);
        let device = Device::flex();
        let leaves: Vec<Tensor<2>> = model
            .tensors(&device, DType::F32)
            .into_iter()
            .map(|t| t.autodiff().require_grad())
            .collect();
        let (b, t, d) = (3, 5, 8);
        let values: Vec<f32> = (0..b * t * d)
            .map(|i| ((i * 37 % 17) as f32 - 8.0) / 8.0)
            .collect();
        let hidden = Tensor::<3>::from_data(TensorData::new(values, [b, t, d]), &device)
            .autodiff()
            .require_grad();
        let labels: Vec<u32> = (0..b * t).map(|i| (i * 7 % 40) as u32).collect();
        let mask: Vec<bool> = (0..b * t).map(|i| i / t != 1 && i != 13).collect();
        (model, leaves, hidden, labels, mask)
    }

    /// Loss and the gradients of (head weight, hidden) for the head run in chunks of `chunk_logits`.
    fn run(chunk_logits: usize, tie: bool) -> (f32, Vec<f32>, Vec<f32>) {
        let (model, leaves, hidden, labels, mask) = setup(tie);
        let fwd = T5Forward::of(&model, &leaves, DType::F32);
        // The tracked decoder output: a function of `hidden`, so the cotangent travels on.
        let out = hidden.clone() * 2.0;
        let head = HeadInputs {
            labels: &labels,
            label_mask: &mask,
            loss_scale: 0.5,
            chunk_logits,
        };
        let mut sink = HeadGrad {
            leaves: &leaves,
            index: head_index(&model),
            sum: vec![0.0f32; model.weights[head_index(&model)].len()],
        };
        let (loss, grads) = loss_through_head(&fwd, out, head, &mut sink).unwrap();
        let head_grad = sink.sum;
        let hidden_grad: Vec<f32> = hidden
            .grad(&grads.unwrap())
            .unwrap()
            .into_data()
            .try_to_vec()
            .unwrap();
        let loss: f32 = loss.into_scalar();
        (loss, head_grad, hidden_grad)
    }

    /// The same through burn's autodiff, unchunked: log-softmax cross-entropy · 0.5.
    fn autodiff_reference(tie: bool) -> (f32, Vec<f32>, Vec<f32>) {
        let (model, leaves, hidden, labels, mask) = setup(tie);
        let fwd = T5Forward::of(&model, &leaves, DType::F32);
        let loss = masked_cross_entropy(fwd.lm_logits(hidden.clone() * 2.0), &labels, &mask);
        let grads = (loss.clone() * 0.5).backward();
        let values = |t: Tensor<2>| -> Vec<f32> { t.into_data().try_to_vec().unwrap() };
        let head = values(leaves[head_index(&model)].grad(&grads).unwrap());
        let hidden = values(hidden.grad(&grads).unwrap().reshape([15, 8]));
        (loss.into_scalar(), head, hidden)
    }

    #[test]
    fn the_planner_models_these_chunk_sizes() {
        assert_eq!(
            CHUNK_LOGITS as u64,
            memfit_plan::memory::memfit_host::HEAD_CHUNK_LOGITS
        );
        assert_eq!(
            crate::layers::chunked_head::DEVICE_CHUNK_LOGITS as u64,
            memfit_plan::memory::memfit_device::HEAD_CHUNK_LOGITS_GPU
        );
    }

    #[test]
    fn chunks_give_autodiffs_loss_and_gradients() {
        for tie in [true, false] {
            // 40 logits per chunk: one row at a time; 10,000: everything in one chunk.
            let (l1, w1, h1) = run(40, tie);
            let (l2, w2, h2) = run(10_000, tie);
            let (l0, w0, h0) = autodiff_reference(tie);
            for l in [l1, l2] {
                assert!((l - l0).abs() < 1e-6, "{l} vs autodiff {l0}");
            }
            for (w, h) in [(&w1, &h1), (&w2, &h2)] {
                for (a, b) in w.iter().zip(&w0).chain(h.iter().zip(&h0)) {
                    assert!((a - b).abs() < 1e-5, "{a} vs autodiff {b}");
                }
            }
            assert!(
                h1.iter().any(|g| *g != 0.0),
                "the cotangent reaches the input"
            );
            assert!(w1.iter().any(|g| *g != 0.0), "the head has a gradient");
        }
    }
}
