//! Attention's `dropout(softmax(scores)) · v` as one operation with a hand-written backward: a burn
//! backend extension for the flex CPU backend, in f32.
//!
//! burn's composite softmax runs five element-wise passes (max, subtract, scalar `expf`, sum,
//! divide) and keeps the `exp` output for backward, dropout keeps its mask, and the probs·V matmul
//! keeps the dropped-out probabilities: two `batch × heads × q × k` f32 matrices and a byte mask per
//! attention. Here the forward is one sweep per row (vectorised `exp`), and backward keeps only the
//! softmax output: the dropout mask is drawn again from its seed and the dropped-out probabilities
//! are rebuilt from the softmax output when they are needed.

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use burn_flex::FlexTensor;

use crate::model::dropout::{SplitMix64, fill_dropped};
use crate::model::flex_f32::{tensor_like, values};
use crate::model::xent::exp_shifted_in_place;

#[backend_extension(Flex, Autodiff)]
pub trait AttentionCore: Backend {
    /// `dropout(softmax(scores, last dim)) · v`: scores `[b, h, q, k]`, v `[b, h, k, d]`; the
    /// dropout mask (probability `p`) is drawn from `SplitMix64::new(seed)` in row-major order.
    fn softmax_dropout_matmul(
        scores: FloatTensor<Self>,
        v: FloatTensor<Self>,
        seed: u64,
        p: f64,
    ) -> FloatTensor<Self>;
}

/// Whether [`softmax_dropout_matmul`] runs for these tensors (flex, f32); other backends and
/// dtypes use the composite ops.
pub fn supported(scores: &Tensor<4>) -> bool {
    scores.dtype() == DType::F32 && scores.device() == Device::flex()
}

/// [`AttentionCore::softmax_dropout_matmul`] on tensors (see [`supported`]).
pub fn softmax_dropout_matmul(scores: Tensor<4>, v: Tensor<4>, seed: u64, p: f64) -> Tensor<4> {
    Tensor::from_dispatch(<Dispatch as AttentionCore>::softmax_dropout_matmul(
        scores.into_dispatch(),
        v.into_dispatch(),
        seed,
        p,
    ))
}

impl AttentionCore for Flex {
    fn softmax_dropout_matmul(scores: FlexTensor, v: FlexTensor, seed: u64, p: f64) -> FlexTensor {
        let mut probs = softmax_rows(scores);
        drop_and_scale(probs.storage_mut::<f32>(), seed, p);
        Flex::float_matmul(probs, v)
    }
}

impl<C: CheckpointStrategy> AttentionCore for Autodiff<Flex, C> {
    fn softmax_dropout_matmul(
        scores: FloatTensor<Self>,
        v: FloatTensor<Self>,
        seed: u64,
        p: f64,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Core;

        impl Backward<Flex, 2> for Core {
            /// The softmax output, v, the mask's seed and p.
            type State = (FlexTensor, FlexTensor, u64, f64);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [scores_node, v_node] = ops.parents;
                let grad = grads.consume::<Flex>(&ops.node);
                let (probs, v, seed, p) = ops.state;
                if let Some(node) = v_node {
                    // dv = dropout(probs)ᵀ · g
                    let mut dropped = copy_f32(&probs);
                    drop_and_scale(dropped.storage_mut::<f32>(), seed, p);
                    let dv = Flex::float_matmul(Flex::float_transpose(dropped), grad.clone());
                    grads.register::<Flex>(node.id, dv);
                }
                if let Some(node) = scores_node {
                    let d_dropped = Flex::float_matmul(grad, Flex::float_transpose(v));
                    grads.register::<Flex>(
                        node.id,
                        softmax_dropout_backward(&probs, d_dropped, seed, p),
                    );
                }
            }
        }

        match Core
            .prepare::<C>([scores.node(), v.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let probs = softmax_rows(scores.into_primitive());
                let v = v.into_primitive();
                let mut dropped = copy_f32(&probs);
                drop_and_scale(dropped.storage_mut::<f32>(), seed, p);
                let out = Flex::float_matmul(dropped, v.clone());
                prep.finish((probs, v, seed, p), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(Flex::softmax_dropout_matmul(
                scores.into_primitive(),
                v.into_primitive(),
                seed,
                p,
            )),
        }
    }
}

/// `t` as contiguous f32 data (no copy when `t` is already contiguous and not shared).
fn into_f32_data(t: FlexTensor) -> TensorData {
    assert_eq!(t.dtype(), DType::F32, "the fused attention runs in f32");
    t.into_data()
}

/// A copy of the f32 tensor `t` (one copy; `to_contiguous` + `into_data` would make two).
fn copy_f32(t: &FlexTensor) -> FlexTensor {
    tensor_like(values(t).into_owned(), t)
}

/// Softmax over the last dimension, in the tensor's own buffer when it is not shared.
fn softmax_rows(scores: FlexTensor) -> FlexTensor {
    let k = *scores
        .layout()
        .shape()
        .last()
        .expect("scores have a last dimension");
    let mut data = into_f32_data(scores);
    for row in data.as_mut_slice::<f32>().expect("f32").chunks_exact_mut(k) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let inv = (1.0 / exp_shifted_in_place(row, max)) as f32;
        row.iter_mut().for_each(|x| *x *= inv);
    }
    FlexTensor::from_data(data)
}

/// Inverted dropout in place (the forward values, or their gradient): zero the dropped elements,
/// scale the kept ones by `1/(1−p)`.
fn drop_and_scale(values: &mut [f32], seed: u64, p: f64) {
    if p <= 0.0 {
        return;
    }
    let mut dropped = vec![false; values.len()];
    fill_dropped(&mut SplitMix64::new(seed), p, &mut dropped);
    let keep_scale = (1.0 / (1.0 - p)) as f32;
    for (x, &d) in values.iter_mut().zip(&dropped) {
        *x = if d { 0.0 } else { *x * keep_scale };
    }
}

/// The scores' gradient from the dropped-out probabilities' gradient `d_dropped`, in its buffer:
/// `g = dropout'(d_dropped)`, then `probs ⊙ (g − Σ_row g ⊙ probs)`.
fn softmax_dropout_backward(
    probs: &FlexTensor,
    d_dropped: FlexTensor,
    seed: u64,
    p: f64,
) -> FlexTensor {
    let k = *probs
        .layout()
        .shape()
        .last()
        .expect("probs have a last dimension");
    let probs = values(probs);
    let mut data = into_f32_data(d_dropped);
    let grad = data.as_mut_slice::<f32>().expect("f32");
    drop_and_scale(grad, seed, p);
    for (g, y) in grad.chunks_exact_mut(k).zip(probs.chunks_exact(k)) {
        let dot: f32 = g.iter().zip(y).map(|(g, y)| g * y).sum();
        g.iter_mut().zip(y).for_each(|(g, y)| *g = y * (*g - dot));
    }
    FlexTensor::from_data(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::dropout::Dropout;
    use burn::tensor::activation::softmax;

    fn tensor(shape: [usize; 4], salt: usize) -> Tensor<4> {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n)
            .map(|i| (((i + salt) * 7919 % 211) as f32 - 105.0) / 40.0)
            .collect();
        Tensor::from_data(TensorData::new(values, shape), &Device::flex())
            .autodiff()
            .require_grad()
    }

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().try_to_vec().unwrap()
    }

    /// Output and gradients of (scores, v) through `f`, weighted by a fixed cotangent.
    fn run(f: impl Fn(Tensor<4>, Tensor<4>) -> Tensor<4>) -> [Vec<f32>; 3] {
        let (scores, v) = (tensor([2, 3, 5, 7], 1), tensor([2, 3, 7, 4], 2));
        let out = f(scores.clone(), v.clone());
        let weight = tensor([2, 3, 5, 4], 3).inner();
        let grads = (out.clone() * weight).sum().backward();
        [
            values(out.inner()),
            values(scores.grad(&grads).unwrap()),
            values(v.grad(&grads).unwrap()),
        ]
    }

    #[test]
    fn equals_the_composite_ops_with_and_without_dropout() {
        for p in [0.0, 0.25] {
            let fused = run(|s, v| {
                assert!(supported(&s));
                softmax_dropout_matmul(s, v, 99, p)
            });
            // The same mask: `Dropout::new(seed)` draws its first mask from `SplitMix64::new(seed)`.
            let composite = run(|s, v| Dropout::new(99, p).apply(softmax(s, 3)).matmul(v));
            for (which, (a, b)) in ["output", "d scores", "d v"]
                .iter()
                .zip(fused.iter().zip(&composite))
            {
                for (x, y) in a.iter().zip(b) {
                    assert!((x - y).abs() < 1e-5, "p {p}, {which}: {x} vs {y}");
                }
            }
        }
    }

    #[test]
    fn masked_scores_get_exactly_zero_probability() {
        // A causal/padding mask adds -1e9: those probabilities must be 0, not subnormal.
        let scores = TensorData::new(vec![0.5f32, -1e9, 2.0, -1e9 - 3.0], [1, 1, 1, 4]);
        let probs = softmax_rows(FlexTensor::from_data(scores));
        let p = probs.as_slice::<f32>().unwrap();
        assert_eq!((p[1], p[3]), (0.0, 0.0));
        assert!(p.iter().all(|x| *x == 0.0 || x.is_normal()));
        assert!((p[0] + p[2] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn runs_untracked_too() {
        let (scores, v) = (
            tensor([1, 2, 3, 4], 5).inner(),
            tensor([1, 2, 4, 2], 6).inner(),
        );
        let fused = values(softmax_dropout_matmul(scores.clone(), v.clone(), 1, 0.0));
        let composite = values(softmax(scores, 3).matmul(v));
        for (x, y) in fused.iter().zip(&composite) {
            assert!((x - y).abs() < 1e-6, "{x} vs {y}");
        }
    }
}
