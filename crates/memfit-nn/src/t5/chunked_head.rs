//! The LM head and the loss in row chunks, forward and backward by hand: only one chunk's logits
//! exist at a time, instead of `[tokens, vocab]` several times over while every activation of the
//! model is still alive (with a 32k vocabulary that was the largest single term of a step's peak).
//!
//! The decoder output is cut from the graph: each chunk yields the head weight's gradient and the
//! chunk rows' cotangent; the caller pushes the assembled cotangent back through the decoder
//! (`sum(out ⊙ cotangent)`), as per-block checkpointing does for every block.

use burn::prelude::*;
use burn::tensor::Gradients;

use burn::tensor::{DType, FloatDType, TensorData};

use crate::kernels::gemm_bf16::Products;
use crate::kernels::linear_op::product;
use crate::kernels::xent::nll_and_grad_in_place;
use crate::layers::grad_sink::GradSink;
use crate::t5::block_ckpt::pull;
use crate::t5::forward::T5Forward;

/// Logit elements per chunk: 8 Mi f32 = 32 MiB (a 32k vocabulary gives 256 rows); small enough
/// to be negligible beside activations, large enough that the head's GEMM stays efficient. The
/// planner's host model uses the same figure (`memfit_host::HEAD_CHUNK_LOGITS`; a test checks).
pub const CHUNK_LOGITS: usize = 8 << 20;

/// The targets of a micro-batch and how to run the head over them.
#[derive(Clone, Copy)]
pub struct HeadInputs<'a> {
    /// `[b·t]` target ids, row-major like the decoder output.
    pub labels: &'a [u32],
    pub label_mask: &'a [bool],
    /// The micro-batch's share of the step (multiplies the loss before backward).
    pub loss_scale: f64,
    /// Logits per chunk ([`CHUNK_LOGITS`] in training).
    pub chunk_logits: usize,
}

/// The loss over decoder output `hidden` `[b, t, d]` (values only; untracked) and the cotangent of
/// `hidden` for `loss · loss_scale`; the head weight's gradient goes to `sink` chunk by chunk, of
/// at most `chunk_logits` logits each.
///
/// No autodiff here: per chunk, the logits (one GEMM), the loss and its logit gradient in one fused
/// sweep over them ([`nll_and_grad_in_place`]), then the weight's and the rows' gradients (two
/// GEMMs). The weight gradient is produced in the weight's own layout, so a tied head's `[vocab, d]`
/// gradient is not a transposed view to copy.
fn head_loss_and_cotangent<E>(
    tracked: &T5Forward,
    hidden: Tensor<3>,
    head: HeadInputs,
    sink: &mut dyn GradSink<Error = E>,
) -> Result<(Tensor<1>, Tensor<3>), E> {
    let HeadInputs {
        labels,
        label_mask,
        loss_scale,
        chunk_logits,
    } = head;
    let [b, t, d] = hidden.dims();
    let hidden_dtype = hidden.dtype();
    let vocab = tracked.cfg.vocab_size;
    let n = b * t;
    let device = hidden.device();
    let count = label_mask.iter().filter(|m| **m).count();
    let grad_scale = (loss_scale / count.max(1) as f64) as f32;
    // Tied: transformers rescales by d_model^-½ and projects onto the embedding `[vocab, d]`;
    // untied, the head is `[d, vocab]`.
    let (index, tied) = match tracked.layout.lm_head {
        Some(head) => (head, false),
        None => (tracked.layout.shared, true),
    };
    let weight = tracked.params[index].clone();
    let weight_grad_wanted = weight.is_require_grad();
    let products = tracked.products();
    // bf16 products read the weight rounded: round it once, not in every chunk's two products
    let weight = match products {
        Products::Bf16 => weight.inner().cast(DType::BF16),
        Products::F32 => weight.inner(),
    };
    let input_scale = if tied { (d as f64).powf(-0.5) } else { 1.0 };

    let rows_per_chunk = (chunk_logits / vocab.max(1)).clamp(1, n.max(1));
    let flat = hidden.reshape([n, d]);
    let mut nll = 0.0f64;
    let mut cotangent = Vec::with_capacity(n.div_ceil(rows_per_chunk));
    for start in (0..n).step_by(rows_per_chunk) {
        let end = (start + rows_per_chunk).min(n);
        // f32 rows (exact from bf16), so the logits come out f32 (an op's output takes its first
        // operand's dtype); bf16 activations still take bf16 products, as autocast's head does.
        let rows = flat.clone().slice([start..end, 0..d]).cast(DType::F32);
        if !label_mask[start..end].iter().any(|m| *m) {
            // No target here: no loss, no gradient.
            cotangent.push(rows.zeros_like());
            continue;
        }
        let x = if tied { rows * input_scale } else { rows };
        let logits = if tied {
            product(x.clone(), weight.clone().transpose(), products)
        } else {
            product(x.clone(), weight.clone(), products)
        };
        // The loss in f32 whatever the compute dtype (as transformers upcasts logits for it).
        let dtype = logits.dtype();
        // Worked on in the tensor's own buffer: no copy out and back.
        let mut values = logits.cast(FloatDType::F32).into_data();
        nll += nll_and_grad_in_place(
            values.as_mut_slice().expect("f32 logits"),
            vocab,
            &labels[start..end],
            &label_mask[start..end],
            grad_scale,
        );
        let grad_logits = Tensor::<2>::from_data(values, (&device, dtype));
        if weight_grad_wanted {
            let grad_weight = if tied {
                product(grad_logits.clone().transpose(), x, products)
            } else {
                product(x.transpose(), grad_logits.clone(), products)
            };
            sink.parameter(index, grad_weight)?;
        }
        cotangent.push(if tied {
            product(grad_logits, weight.clone(), products) * input_scale
        } else {
            product(grad_logits, weight.clone().transpose(), products)
        });
    }
    let loss = Tensor::from_data(
        TensorData::new(vec![(nll / count.max(1) as f64) as f32], [1]),
        &device,
    );
    let cotangent = Tensor::cat(cotangent, 0)
        .reshape([b, t, d])
        .cast(hidden_dtype);
    Ok((loss, cotangent))
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
    let (loss, cotangent) = head_loss_and_cotangent(tracked, out.clone().inner(), head, sink)?;
    let grads = match pull(out, &cotangent) {
        Some(mut grads) => {
            sink.gradients(&mut grads)?;
            Some(grads)
        }
        None => None,
    };
    Ok((loss, grads))
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
    fn the_planner_models_this_chunk_size() {
        assert_eq!(
            CHUNK_LOGITS as u64,
            memfit_plan::memory::memfit_host::HEAD_CHUNK_LOGITS
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
