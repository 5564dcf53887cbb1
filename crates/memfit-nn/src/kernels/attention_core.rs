//! Attention's `dropout(softmax(q·kᵀ + bias)) · v` as one operation with a hand-written backward:
//! a burn backend extension for the flex CPU backend. Softmax and its backward run in f32; the six
//! products are f32, or for bf16 inputs bf16 products summed in f32 ([`Products`], as PyTorch's
//! bf16 attention); outputs and gradients leave in their input's dtype.
//!
//! burn's composite softmax runs five element-wise passes (max, subtract, scalar `expf`, sum,
//! divide) and keeps the `exp` output for backward, dropout keeps its mask, and the probs·V matmul
//! keeps the dropped-out probabilities: two `batch × heads × q × k` matrices and a byte mask per
//! attention. Here the forward is one sweep per row (vectorised `exp`), and backward keeps no
//! `q × k` matrix at all, only q, k, v, the bias (which the linear layers and the other blocks keep
//! anyway) and two numbers per row (max and 1/sum): the probabilities are recomputed from them in
//! backward (one more `q·kᵀ` GEMM, the same arithmetic as the forward's), and the dropout mask is
//! drawn again from its seed — the recomputation FlashAttention makes, for the same reason.

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::prelude::*;
use burn_flex::FlexTensor;

use crate::kernels::autodiff_record::record;
use crate::kernels::device;
use crate::kernels::dropout::{Dropout, drop_and_scale};
use crate::kernels::dropout_op;
use crate::kernels::flex_values::{cast, in_f32, into_values, is_flex_float, values};
use crate::kernels::gemm_bf16::Products;
use crate::kernels::xent::exp_shifted_in_place;

#[backend_extension(Flex, Autodiff)]
pub trait AttentionCore: Backend {
    /// `dropout(softmax(q·kᵀ + bias, last dim)) · v`: q `[b, h, tq, d]`, k and v `[b, h, tk, d]`,
    /// bias broadcastable to `[b, h, tq, tk]`; the dropout mask (probability `p`) is drawn from
    /// `SplitMix64::new(seed)` in row-major order of the `[b, h, tq, tk]` probabilities.
    fn attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        seed: u64,
        p: f64,
    ) -> FloatTensor<Self>;
}

/// Whether [`attention`] runs for these tensors (flex, f32 or bf16: it computes in f32 and keeps
/// its inputs in their dtype); other backends use the composite ops.
pub fn supported(q: &Tensor<4>) -> bool {
    is_flex_float(q)
}

/// `dropout(softmax(q·kᵀ + bias)) · v` on any device: [`attention`] where it runs, burn's ops
/// elsewhere. The mask comes from the dropout's next seed either way, drawn over the probabilities
/// in row-major order, so a device that draws the CPU's masks (cubecl's kernels, `kernels/device`)
/// trains as the CPU does.
pub fn attend(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    bias: &Tensor<4>,
    drop: &mut Dropout,
) -> Tensor<4> {
    let seed = drop.next_seed();
    if supported(&q) {
        return attention(q, k, v, bias.clone(), seed, drop.p());
    }
    let probs = device::softmax_last(q.matmul(k.swap_dims(2, 3)) + bias.clone());
    let probs = if drop.p() > 0.0 && dropout_op::supported(&probs) {
        dropout_op::dropout(probs, seed, drop.p())
    } else {
        drop.apply(probs)
    };
    probs.matmul(v)
}

/// [`AttentionCore::attention`] on tensors (see [`supported`]).
pub fn attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    bias: Tensor<4>,
    seed: u64,
    p: f64,
) -> Tensor<4> {
    Tensor::from_dispatch(<Dispatch as AttentionCore>::attention(
        q.into_dispatch(),
        k.into_dispatch(),
        v.into_dispatch(),
        bias.into_dispatch(),
        seed,
        p,
    ))
}

impl AttentionCore for Flex {
    fn attention(
        q: FlexTensor,
        k: FlexTensor,
        v: FlexTensor,
        bias: FlexTensor,
        seed: u64,
        p: f64,
    ) -> FlexTensor {
        forward([q, k, v, bias], seed, p).0
    }
}

/// What the backward pass keeps: the inputs in their own dtype (shared with the tensors that
/// produced them, so no copy) and each softmax row's max and 1/sum.
#[derive(Debug, Clone)]
struct Saved {
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    bias: FlexTensor,
    rows: RowStats,
    seed: u64,
    p: f64,
}

impl<C: CheckpointStrategy> AttentionCore for Autodiff<Flex, C> {
    fn attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        seed: u64,
        p: f64,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Core;

        impl Backward<Flex, 4> for Core {
            type State = Saved;

            fn backward(
                self,
                ops: Ops<Self::State, 4>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [q_node, k_node, v_node, bias_node] = ops.parents;
                let s = ops.state;
                // Gradients leave in their input's dtype; softmax's arithmetic is f32 throughout.
                let dtypes = [&s.q, &s.k, &s.v, &s.bias].map(|t| t.dtype());
                let products = Products::for_activations(dtypes[0]);
                let grad = grads.consume::<Flex>(&ops.node);
                let (q, k, v, bias) = (s.q, s.k, s.v, s.bias);
                let scores = scores(products, &q, &k, &bias);
                let mut probs = softmax_rows_again(scores, &s.rows);
                if q_node.is_some() || k_node.is_some() || bias_node.is_some() {
                    let d_dropped = products.matmul(&grad, &Flex::float_transpose(v.clone()));
                    let d_scores = softmax_dropout_backward(&probs, d_dropped, s.seed, s.p);
                    if let Some(node) = q_node {
                        let dq = products.matmul_into(&d_scores, &k, None, dtypes[0]);
                        grads.register::<Flex>(node.id, dq);
                    }
                    if let Some(node) = k_node {
                        let d_scores_t = Flex::float_transpose(d_scores.clone());
                        let dk = products.matmul_into(&d_scores_t, &q, None, dtypes[1]);
                        grads.register::<Flex>(node.id, dk);
                    }
                    if let Some(node) = bias_node {
                        let shape = bias.layout().shape().clone();
                        let d_bias = sum_to_shape(d_scores, &shape);
                        grads.register::<Flex>(node.id, cast(d_bias, dtypes[3]));
                    }
                }
                if let Some(node) = v_node {
                    // dv = dropout(probs)ᵀ · g, the probabilities dropped out in their own buffer.
                    drop_and_scale(probs.storage_mut::<f32>(), s.seed, s.p);
                    let probs_t = Flex::float_transpose(probs);
                    let dv = products.matmul_into(&probs_t, &grad, None, dtypes[2]);
                    grads.register::<Flex>(node.id, dv);
                }
            }
        }

        record::<_, C, _, 4>(Core, [q, k, v, bias], |[q, k, v, bias]| {
            let (out, rows) = forward([q.clone(), k.clone(), v.clone(), bias.clone()], seed, p);
            let saved = Saved {
                q,
                k,
                v,
                bias,
                rows,
                seed,
                p,
            };
            (out, saved)
        })
    }
}

/// The output (in v's dtype) of `[q, k, v, bias]` and the softmax rows' statistics; the arithmetic
/// is f32 whatever the inputs' dtype.
fn forward(inputs: [FlexTensor; 4], seed: u64, p: f64) -> (FlexTensor, RowStats) {
    let [q, k, v, bias] = inputs;
    let products = Products::for_activations(q.dtype());
    let (mut probs, rows) = softmax_rows(scores(products, &q, &k, &bias));
    drop_and_scale(probs.storage_mut::<f32>(), seed, p);
    (products.matmul_into(&probs, &v, None, v.dtype()), rows)
}

/// `q·kᵀ + bias`, `[b, h, tq, tk]`.
fn scores(products: Products, q: &FlexTensor, k: &FlexTensor, bias: &FlexTensor) -> FlexTensor {
    let qk = products.matmul(q, &Flex::float_transpose(k.clone()));
    Flex::float_add(qk, in_f32(bias.clone()))
}

/// Each softmax row's max and 1/sum: all backward needs to rebuild the probabilities from scores.
#[derive(Debug, Clone, Default)]
struct RowStats {
    max: Vec<f32>,
    inv_sum: Vec<f32>,
}

fn last_dim(t: &FlexTensor) -> usize {
    *t.layout().shape().last().expect("a 4-d attention tensor")
}

/// Softmax over the last dimension, in the scores' own buffer when it is not shared, and the rows'
/// statistics.
fn softmax_rows(scores: FlexTensor) -> (FlexTensor, RowStats) {
    let k = last_dim(&scores);
    let mut data = into_values(scores);
    let mut rows = RowStats::default();
    for row in data.as_mut_slice::<f32>().expect("f32").chunks_exact_mut(k) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let inv = (1.0 / exp_shifted_in_place(row, max)) as f32;
        row.iter_mut().for_each(|x| *x *= inv);
        rows.max.push(max);
        rows.inv_sum.push(inv);
    }
    (FlexTensor::from_data(data), rows)
}

/// The forward's softmax of the same scores from its row statistics: the same operations in the
/// same order, so the same probabilities.
fn softmax_rows_again(scores: FlexTensor, rows: &RowStats) -> FlexTensor {
    let k = last_dim(&scores);
    let mut data = into_values(scores);
    let chunks = data.as_mut_slice::<f32>().expect("f32").chunks_exact_mut(k);
    for ((row, &max), &inv) in chunks.zip(&rows.max).zip(&rows.inv_sum) {
        exp_shifted_in_place(row, max);
        row.iter_mut().for_each(|x| *x *= inv);
    }
    FlexTensor::from_data(data)
}

/// The scores' gradient from the dropped-out probabilities' gradient `d_dropped`, in its buffer:
/// `g = dropout'(d_dropped)`, then `probs ⊙ (g − Σ_row g ⊙ probs)`.
fn softmax_dropout_backward(
    probs: &FlexTensor,
    d_dropped: FlexTensor,
    seed: u64,
    p: f64,
) -> FlexTensor {
    let k = last_dim(probs);
    let probs = values(probs);
    let mut data = into_values(d_dropped);
    let grad = data.as_mut_slice::<f32>().expect("f32");
    drop_and_scale(grad, seed, p);
    for (g, y) in grad.chunks_exact_mut(k).zip(probs.chunks_exact(k)) {
        let dot: f32 = g.iter().zip(y).map(|(g, y)| g * y).sum();
        g.iter_mut().zip(y).for_each(|(g, y)| *g = y * (*g - dot));
    }
    FlexTensor::from_data(data)
}

/// `t` summed over the dimensions `shape` broadcasts (size 1 there): the gradient of a broadcast
/// input.
fn sum_to_shape(mut t: FlexTensor, shape: &[usize]) -> FlexTensor {
    for (dim, &size) in shape.iter().enumerate() {
        if size == 1 && t.layout().shape()[dim] != 1 {
            t = Flex::float_sum_dim(t, dim);
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dropout::Dropout;
    use crate::kernels::test_tensors::{assert_close, tracked as tensor, values};
    use burn::tensor::activation::softmax;
    use burn::tensor::{DType, TensorData};

    /// Output and gradients of (q, k, v, bias) through `f`, weighted by a fixed cotangent. q is a
    /// strided view (`[b, q, h, d]` with its middle dimensions swapped), as the model's heads are.
    fn run(
        bias_shape: [usize; 4],
        f: impl Fn(Tensor<4>, Tensor<4>, Tensor<4>, Tensor<4>) -> Tensor<4>,
    ) -> [Vec<f32>; 5] {
        let q = tensor([2, 5, 3, 4], 1);
        let (k, v) = (tensor([2, 3, 7, 4], 2), tensor([2, 3, 7, 4], 3));
        let bias = tensor(bias_shape, 4);
        let out = f(
            q.clone().swap_dims(1, 2),
            k.clone(),
            v.clone(),
            bias.clone(),
        );
        let weight = tensor([2, 3, 5, 4], 5).inner();
        let grads = (out.clone() * weight).sum().backward();
        [
            values(out.inner()),
            values(q.grad(&grads).unwrap()),
            values(k.grad(&grads).unwrap()),
            values(v.grad(&grads).unwrap()),
            values(bias.grad(&grads).unwrap()),
        ]
    }

    #[test]
    fn equals_the_composite_ops_with_and_without_dropout() {
        // Full bias (encoder: position bias + padding mask), batch-broadcast (decoder self-attention)
        // and key-padding only (cross-attention).
        for bias_shape in [[2, 3, 5, 7], [1, 3, 5, 7], [2, 1, 1, 7]] {
            for p in [0.0, 0.25] {
                let fused = run(bias_shape, |q, k, v, bias| {
                    assert!(supported(&q));
                    attention(q, k, v, bias, 99, p)
                });
                // The same mask: `Dropout::new(seed)` draws its first mask from `SplitMix64::new(seed)`.
                let composite = run(bias_shape, |q, k, v, bias| {
                    let scores = q.matmul(k.swap_dims(2, 3)) + bias;
                    Dropout::new(99, p).apply(softmax(scores, 3)).matmul(v)
                });
                for (which, (a, b)) in ["output", "dq", "dk", "dv", "d bias"]
                    .iter()
                    .zip(fused.iter().zip(&composite))
                {
                    assert_eq!(a.len(), b.len(), "{which}");
                    for (x, y) in a.iter().zip(b) {
                        assert!(
                            (x - y).abs() < 1e-5,
                            "bias {bias_shape:?}, p {p}, {which}: {x} vs {y}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn bf16_inputs_are_computed_on_in_f32() {
        // The same (bf16-representable) values through the op in bf16 and in f32: outputs and
        // gradients leave in the inputs' dtype and agree up to bf16 rounding.
        let weight = tensor([2, 3, 5, 4], 5).inner();
        let run = |dtype: DType| {
            let [q, k, v, bias] = [
                ([2, 3, 5, 4], 1),
                ([2, 3, 7, 4], 2),
                ([2, 3, 7, 4], 3),
                ([1, 3, 5, 7], 4),
            ]
            .map(|(shape, salt)| {
                let t = tensor(shape, salt).inner().cast(DType::BF16).cast(dtype);
                t.autodiff().require_grad()
            });
            let out = attention(q.clone(), k.clone(), v.clone(), bias.clone(), 9, 0.2);
            assert_eq!(out.dtype(), dtype);
            let grads = (out.clone().cast(DType::F32) * weight.clone())
                .sum()
                .backward();
            let mut all = vec![values(out.inner().cast(DType::F32))];
            for t in [q, k, v, bias] {
                all.push(values(t.grad(&grads).unwrap().cast(DType::F32)));
            }
            all
        };
        let (bf16, f32) = (run(DType::BF16), run(DType::F32));
        for (which, (a, b)) in ["output", "dq", "dk", "dv", "d bias"]
            .iter()
            .zip(bf16.iter().zip(&f32))
        {
            assert_close(which, a, b, 1e-2);
        }
    }

    #[test]
    fn recomputed_probabilities_equal_the_forward_ones() {
        let flex = |shape: [usize; 4], salt: usize| {
            FlexTensor::from_data(TensorData::new(values(tensor(shape, salt).inner()), shape))
        };
        for products in [Products::F32, Products::Bf16] {
            let (q, k, bias) = (
                flex([1, 2, 3, 4], 7),
                flex([1, 2, 6, 4], 8),
                flex([1, 2, 3, 6], 9),
            );
            let (probs, rows) = softmax_rows(scores(products, &q, &k, &bias));
            let again = softmax_rows_again(scores(products, &q, &k, &bias), &rows);
            assert_eq!(
                probs.as_slice::<f32>(),
                again.as_slice::<f32>(),
                "{products:?}"
            );
        }
    }

    #[test]
    fn masked_scores_get_exactly_zero_probability() {
        // A causal/padding mask adds -1e9: those probabilities must be 0, not subnormal.
        let scores = TensorData::new(vec![0.5f32, -1e9, 2.0, -1e9 - 3.0], [1, 1, 1, 4]);
        let (probs, _) = softmax_rows(FlexTensor::from_data(scores));
        let p = probs.as_slice::<f32>().unwrap();
        assert_eq!((p[1], p[3]), (0.0, 0.0));
        assert!(p.iter().all(|x| *x == 0.0 || x.is_normal()));
        assert!((p[0] + p[2] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn runs_untracked_too() {
        let q = tensor([1, 2, 3, 2], 5).inner();
        let (k, v) = (
            tensor([1, 2, 4, 2], 6).inner(),
            tensor([1, 2, 4, 2], 7).inner(),
        );
        let bias = tensor([1, 1, 3, 4], 8).inner();
        let fused = values(attention(
            q.clone(),
            k.clone(),
            v.clone(),
            bias.clone(),
            1,
            0.0,
        ));
        let composite = values(softmax(q.matmul(k.swap_dims(2, 3)) + bias, 3).matmul(v));
        for (x, y) in fused.iter().zip(&composite) {
            assert!((x - y).abs() < 1e-6, "{x} vs {y}");
        }
    }
}
