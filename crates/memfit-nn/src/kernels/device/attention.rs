//! Causal self-attention on the GPU's code path without a kept `q × k` matrix, for attention
//! without dropout: burn's fused attention forward (`ModuleOps::attention` with its causal flag:
//! on a cubecl device cubek's flash kernels, autotuned against burn's composite form; flex's own
//! on the CPU), and a backward that recomputes the probabilities from q and k, as FlashAttention's
//! backward does. The composite form keeps the device softmax's output, one `b × h × t × t` matrix
//! per attention (Qwen2.5-0.5B at b8 s512 bf16: 1.4 GB over its 24 layers); this keeps q, k and v,
//! which the products kept anyway.
//!
//! Grouped-query heads: the forward repeats k and v to every query head (a transient copy, as
//! transformers' `repeat_kv`); backward works on the stacked layout of `decoder/attention.rs` (the
//! query heads of a KV group along the query axis), whose additive mask the caller passes, so that
//! k's and v's gradients come out at their own width.

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::ops::AttentionModuleOptions;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, TensorMetadata, backend_extension};
use burn::tensor::{Shape, Tensor};

use super::softmax::{SoftmaxGrad, SoftmaxOp};
use crate::kernels::autodiff_record::record;

#[backend_extension(Flex, Cube: cfg(cube_kernels), Autodiff)]
pub trait CausalAttentionOp: Backend {
    /// `softmax(q·kᵀ/√d, causal)·v` for q `[b, h, t, d]` and k, v `[b, kv_heads, t, d]` (each KV head
    /// shared by `h / kv_heads` consecutive query heads); `mask` `[b, 1, (h / kv_heads)·t, t]` is
    /// the same causal mask, additive and stacked as `decoder/attention.rs` lays it out (0 where a
    /// query sees a key): backward reads it, the forward takes burn's causal flag. Every row whose
    /// output matters must see exactly its causal prefix under `mask` (right padding: a padded
    /// query row differs, and its cotangent is zero).
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}

/// [`CausalAttentionOp::causal_attention`] on tensors of the device path (`super::runs_on`).
pub fn causal_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, mask: &Tensor<4>) -> Tensor<4> {
    Tensor::from_dispatch(<Dispatch as CausalAttentionOp>::causal_attention(
        q.into_dispatch(),
        k.into_dispatch(),
        v.into_dispatch(),
        mask.clone().into_dispatch(),
    ))
}

fn dims4<B: Backend>(x: &FloatTensor<B>) -> [usize; 4] {
    x.shape().dims()
}

/// `[b, kv_heads, t, d]` → `[b, kv_heads·groups, t, d]`, each KV head repeated for its group.
fn repeat_heads<B: Backend>(x: FloatTensor<B>, groups: usize) -> FloatTensor<B> {
    if groups == 1 {
        return x;
    }
    let [b, kv, t, d] = dims4::<B>(&x);
    let x = B::float_reshape(x, Shape::new([b, kv, 1, t, d]));
    let x = B::float_expand(x, Shape::new([b, kv, groups, t, d]));
    B::float_reshape(x, Shape::new([b, kv * groups, t, d]))
}

/// The forward on any backend: burn's attention over the repeated heads, causal, default scale.
fn forward<B: Backend>(q: FloatTensor<B>, k: FloatTensor<B>, v: FloatTensor<B>) -> FloatTensor<B> {
    let groups = dims4::<B>(&q)[1] / dims4::<B>(&k)[1].max(1);
    let options = AttentionModuleOptions {
        scale: None,
        softcap: None,
        is_causal: true,
    };
    let (k, v) = (repeat_heads::<B>(k, groups), repeat_heads::<B>(v, groups));
    B::attention(q, k, v, None, None, options)
}

/// The forward of a backend that computes (flex, cubecl): [`forward`] through its own attention.
macro_rules! causal_attention_through_burn {
    ($backend:ty) => {
        impl CausalAttentionOp for $backend {
            fn causal_attention(
                q: FloatTensor<Self>,
                k: FloatTensor<Self>,
                v: FloatTensor<Self>,
                _mask: FloatTensor<Self>,
            ) -> FloatTensor<Self> {
                forward::<Self>(q, k, v)
            }
        }
    };
}

causal_attention_through_burn!(Flex);
#[cfg(cube_kernels)]
causal_attention_through_burn!(burn::backend::Cube);

/// What backward keeps: the inputs (shared with the tensors that made them: no copy).
#[derive(Debug, Clone)]
struct Saved<B: Backend> {
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    mask: FloatTensor<B>,
}

#[derive(Debug)]
struct CausalAttentionBackward;

impl<B: SoftmaxOp + SoftmaxGrad> Backward<B, 4> for CausalAttentionBackward {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [q_node, k_node, v_node, _mask] = ops.parents.map(|p| p.map(|node| node.id));
        let dout = grads.consume::<B>(&ops.node);
        let [dq, dk, dv] = gradients::<B>(ops.state, dout);
        for (node, grad) in [(q_node, dq), (k_node, dk), (v_node, dv)] {
            if let Some(node) = node {
                grads.register::<B>(node, grad);
            }
        }
    }
}

/// `[dq, dk, dv]` from the output's gradient, the probabilities recomputed in the stacked layout:
/// `qs = q·d^-½` stacked, `P = softmax(qs·kᵀ + mask)`, `dv = Pᵀ·dO`, `dS = softmax'(P, dO·vᵀ)`,
/// `dq = dS·k·d^-½`, `dk = dSᵀ·qs`.
fn gradients<B: SoftmaxOp + SoftmaxGrad>(s: Saved<B>, dout: FloatTensor<B>) -> [FloatTensor<B>; 3] {
    let [b, h, t, d] = dims4::<B>(&s.q);
    let kv = dims4::<B>(&s.k)[1];
    let stacked = Shape::new([b, kv, (h / kv.max(1)) * t, d]);
    let scale = (d as f64).powf(-0.5);
    let qs = B::float_mul_scalar(B::float_reshape(s.q, stacked.clone()), scale.into());
    let scores = B::float_matmul(qs.clone(), B::float_swap_dims(s.k.clone(), 2, 3));
    let p = B::softmax_last(B::float_add(scores, s.mask));
    let dos = B::float_reshape(dout, stacked);
    let dv = B::float_matmul(B::float_swap_dims(p.clone(), 2, 3), dos.clone());
    let dp = B::float_matmul(dos, B::float_swap_dims(s.v, 2, 3));
    let ds = B::softmax_last_grad(p, dp);
    let dq = B::float_matmul(ds.clone(), s.k);
    let dq = B::float_mul_scalar(B::float_reshape(dq, Shape::new([b, h, t, d])), scale.into());
    let dk = B::float_matmul(B::float_swap_dims(ds, 2, 3), qs);
    [dq, dk, dv]
}

impl<B, C> CausalAttentionOp for Autodiff<B, C>
where
    B: CausalAttentionOp + SoftmaxOp + SoftmaxGrad,
    C: CheckpointStrategy,
{
    fn causal_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        record::<B, C, _, 4>(
            CausalAttentionBackward,
            [q, k, v, mask],
            |[q, k, v, mask]| {
                let out = B::causal_attention(q.clone(), k.clone(), v.clone(), mask.clone());
                (out, Saved { q, k, v, mask })
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use burn::prelude::*;
    use burn::tensor::{DType, TensorData};

    use crate::decoder::attention::Visibility;
    use crate::kernels::test_tensors::{assert_close, device_op_devices, pattern};

    /// The stacked causal mask `[b, 1, groups·t, t]` (every key real), as the decoder builds it.
    fn stacked_mask(b: usize, groups: usize, t: usize, device: &Device) -> Tensor<4> {
        let key_mask = vec![true; b * t];
        let vis = Visibility {
            key_mask: &key_mask,
            keys: t,
            queries: t,
        };
        vis.bias(None, groups, device, DType::F32)
    }

    /// Output and the gradients of q, k, v (for a fixed cotangent) of `f` on `device`.
    fn run(
        device: &Device,
        [b, h, kv, t, d]: [usize; 5],
        f: impl Fn(Tensor<4>, Tensor<4>, Tensor<4>, &Tensor<4>) -> Tensor<4>,
    ) -> [Vec<f32>; 4] {
        // laid out `[b, t, heads, d]` and viewed as `[b, heads, t, d]`, as the decoder's heads are
        let make = |heads: usize, salt: usize| {
            let n = b * heads * t * d;
            let x =
                Tensor::<4>::from_data(TensorData::new(pattern(n, salt), [b, t, heads, d]), device);
            (x * 2.0).autodiff().require_grad()
        };
        let (q, k, v) = (make(h, 1), make(kv, 2), make(kv, 3));
        let heads_view = |x: &Tensor<4>| x.clone().swap_dims(1, 2);
        let w = Tensor::<4>::from_data(
            TensorData::new(pattern(b * h * t * d, 7), [b, h, t, d]),
            device,
        );
        let mask = stacked_mask(b, h / kv, t, device);
        let out = f(heads_view(&q), heads_view(&k), heads_view(&v), &mask);
        let grads = (out.clone() * w).sum().backward();
        let values = |x: Tensor<4>| x.into_data().try_to_vec::<f32>().unwrap();
        let grad = |x: &Tensor<4>| values(x.grad(&grads).unwrap());
        [values(out.inner()), grad(&q), grad(&k), grad(&v)]
    }

    /// burn's composite grouped attention (the path this replaces): q scaled and stacked, the
    /// stacked mask added, softmax, the product with v, heads back in place.
    fn composite(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, mask: &Tensor<4>) -> Tensor<4> {
        let [b, h, t, d] = q.dims();
        let kv = k.dims()[1];
        let qs = (q * (d as f64).powf(-0.5)).reshape([b, kv, (h / kv) * t, d]);
        let p = burn::tensor::activation::softmax(qs.matmul(k.swap_dims(2, 3)) + mask.clone(), 3);
        p.matmul(v).reshape([b, h, t, d])
    }

    /// Equal to the composite form in value and in every input's gradient, with grouped heads
    /// (4 query heads over 2 and over 1 KV heads) and without; on flex and, built with
    /// `--features wgpu`, on cubecl's kernels.
    #[test]
    fn equals_the_composite_attention_in_value_and_gradient() {
        for device in device_op_devices() {
            for shape in [[2, 4, 4, 5, 8], [1, 4, 2, 7, 16], [2, 4, 1, 3, 8]] {
                let fused = run(&device, shape, super::causal_attention);
                let reference = run(&Device::flex(), shape, composite);
                for (name, (a, b)) in ["out", "dq", "dk", "dv"]
                    .iter()
                    .zip(fused.iter().zip(&reference))
                {
                    assert_close(&format!("{name} {shape:?} {device:?}"), a, b, 1e-4);
                }
            }
        }
    }
}
