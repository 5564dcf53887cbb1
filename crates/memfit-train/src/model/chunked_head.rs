//! The LM head and the loss in row chunks, each back-propagated on its own: only one chunk's logits
//! (and log-softmax intermediates) exist at a time, instead of `[tokens, vocab]` several times over
//! while every activation of the model is still alive (with a 32k vocabulary that was the largest
//! single term of a step's peak).
//!
//! The decoder output is cut from the graph: each chunk starts from a leaf holding its rows, its
//! backward yields the head's parameter gradients and the chunk's cotangent; the caller pushes the
//! assembled cotangent back through the decoder (`sum(out ⊙ cotangent)`), as per-block
//! checkpointing does for every block.

use burn::prelude::*;
use burn::tensor::Gradients;

use crate::model::block_ckpt::pull;
use crate::model::loss::masked_nll_sum;
use crate::model::t5::T5Forward;

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
/// `hidden` for `loss · loss_scale`; the head's parameter gradients go to `sink` chunk by chunk, of
/// at most `chunk_logits` logits each.
fn head_loss_and_cotangent<E>(
    tracked: &T5Forward,
    hidden: Tensor<3>,
    head: HeadInputs,
    sink: &mut dyn FnMut(&mut Gradients) -> Result<(), E>,
) -> Result<(Tensor<1>, Tensor<3>), E> {
    let HeadInputs {
        labels,
        label_mask,
        loss_scale,
        chunk_logits,
    } = head;
    let [b, t, d] = hidden.dims();
    let n = b * t;
    let count = label_mask.iter().filter(|m| **m).count();
    let rows_per_chunk = (chunk_logits / tracked.cfg.vocab_size.max(1)).clamp(1, n.max(1));
    let flat = hidden.reshape([n, d]);
    let mut loss: Option<Tensor<1>> = None;
    let mut cotangent = Vec::with_capacity(n.div_ceil(rows_per_chunk));
    for start in (0..n).step_by(rows_per_chunk) {
        let end = (start + rows_per_chunk).min(n);
        let rows = flat.clone().slice([start..end, 0..d]);
        if !label_mask[start..end].iter().any(|m| *m) {
            // No target here: no loss, no gradient.
            cotangent.push(rows.zeros_like());
            continue;
        }
        let leaf = rows.autodiff().require_grad();
        let logits = tracked.lm_logits(leaf.clone().reshape([1, end - start, d]));
        let part = masked_nll_sum(logits, &labels[start..end], &label_mask[start..end], count);
        let mut grads = (part.clone() * loss_scale).backward();
        sink(&mut grads)?;
        let grad = leaf.grad(&grads);
        cotangent.push(grad.unwrap_or_else(|| leaf.inner().zeros_like()));
        let part = part.inner();
        loss = Some(match loss {
            Some(l) => l + part,
            None => part,
        });
    }
    let loss = loss.unwrap_or_else(|| Tensor::zeros([1], &flat.device()));
    Ok((loss, Tensor::cat(cotangent, 0).reshape([b, t, d])))
}

/// The loss of `batch`'s targets over the tracked decoder output `out` `[b, t, d]`, back-propagated
/// through the head in chunks and then through `out`'s graph: every parameter gradient of
/// `loss · loss_scale` goes to `sink`. Returns the loss and the gradients of the last backward
/// (after `sink`), where the caller finds the gradients of its own leaves under `out`.
pub fn loss_through_head<E>(
    tracked: &T5Forward,
    out: Tensor<3>,
    head: HeadInputs,
    sink: &mut dyn FnMut(&mut Gradients) -> Result<(), E>,
) -> Result<(Tensor<1>, Option<Gradients>), E> {
    let (loss, cotangent) = head_loss_and_cotangent(tracked, out.clone().inner(), head, sink)?;
    let grads = match pull(out, &cotangent) {
        Some(mut grads) => {
            sink(&mut grads)?;
            Some(grads)
        }
        None => None,
    };
    Ok((loss, grads))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::T5Model;
    use crate::model::loss::masked_cross_entropy;
    use burn::tensor::{DType, TensorData};
    use serde_json::json;

    /// Loss and the gradients of (head weight, hidden) for the head run in chunks of `chunk_logits`.
    fn run(chunk_logits: usize, tie: bool) -> (f32, Vec<f32>, Vec<f32>) {
        let cfg = crate::model::T5Config::from_json(&json!({
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
        let fwd = T5Forward::of(&model, &leaves, DType::F32);
        let (b, t, d) = (3, 5, 8);
        let values: Vec<f32> = (0..b * t * d)
            .map(|i| ((i * 37 % 17) as f32 - 8.0) / 8.0)
            .collect();
        let hidden = Tensor::<3>::from_data(TensorData::new(values, [b, t, d]), &device)
            .autodiff()
            .require_grad();
        // The tracked decoder output: a function of `hidden`, so the cotangent travels on.
        let out = hidden.clone() * 2.0;
        let labels: Vec<u32> = (0..b * t).map(|i| (i * 7 % 40) as u32).collect();
        // Row 1 fully padded: a chunk without targets; row 2 partly.
        let mask: Vec<bool> = (0..b * t).map(|i| i / t != 1 && i != 13).collect();
        let head_index = model.layout.lm_head.unwrap_or(model.layout.shared);
        let mut head_grad = vec![0.0f32; model.weights[head_index].len()];
        let head = HeadInputs {
            labels: &labels,
            label_mask: &mask,
            loss_scale: 0.5,
            chunk_logits,
        };
        let (loss, grads) = loss_through_head(&fwd, out, head, &mut |g: &mut Gradients| {
            if let Some(gw) = leaves[head_index].grad(g) {
                let gw: Vec<f32> = gw.into_data().try_to_vec().unwrap();
                head_grad.iter_mut().zip(gw).for_each(|(a, b)| *a += b);
            }
            Ok::<(), ()>(())
        })
        .unwrap();
        let hidden_grad: Vec<f32> = hidden
            .grad(&grads.unwrap())
            .unwrap()
            .into_data()
            .try_to_vec()
            .unwrap();
        // The reference loss: the unchunked cross-entropy.
        let reference: f32 = masked_cross_entropy(
            fwd.lm_logits(hidden.clone().inner().autodiff() * 2.0),
            &labels,
            &mask,
        )
        .into_scalar();
        let loss: f32 = loss.into_scalar();
        assert!((loss - reference).abs() < 1e-6, "{loss} vs {reference}");
        (loss, head_grad, hidden_grad)
    }

    #[test]
    fn the_planner_models_this_chunk_size() {
        assert_eq!(
            CHUNK_LOGITS as u64,
            memfit_plan::memory::memfit_host::HEAD_CHUNK_LOGITS
        );
    }

    #[test]
    fn chunks_give_the_unchunked_loss_and_gradients() {
        for tie in [true, false] {
            // 40 logits per chunk: one row at a time; 10,000: everything in one chunk.
            let (l1, w1, h1) = run(40, tie);
            let (l2, w2, h2) = run(10_000, tie);
            assert!((l1 - l2).abs() < 1e-6);
            for (a, b) in w1.iter().zip(&w2).chain(h1.iter().zip(&h2)) {
                assert!((a - b).abs() < 1e-5, "{a} vs {b}");
            }
            assert!(
                h1.iter().any(|g| *g != 0.0),
                "the cotangent reaches the input"
            );
            assert!(w1.iter().any(|g| *g != 0.0), "the head has a gradient");
        }
    }
}
