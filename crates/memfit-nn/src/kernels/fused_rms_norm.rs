//! T5's RMS norm, `x · rsqrt(mean(x²) + ε) · w`, as one operation with a hand-written backward: a
//! burn backend extension for the flex CPU backend. It computes in f32; x and w may be stored as f32
//! or bf16, and the output and gradients leave in their inputs' dtypes.
//!
//! burn's composite ops run seven element-wise passes and keep, besides the input, the normalised
//! `x · r` for the weight's gradient: one extra `[tokens, d]` tensor per norm. Here the forward is one
//! sweep per row and backward keeps the input, the weight and one `r` per row.

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::prelude::*;
use burn::tensor::DType;
use burn_flex::FlexTensor;

use crate::kernels::autodiff_record::record;
use crate::kernels::device;
use crate::kernels::flex_values::{is_flex_float, tensor_like, values};

#[backend_extension(Flex, Autodiff)]
pub trait RmsNormOp: Backend {
    /// `x · rsqrt(mean(x², last dim) + eps) · w`; `w` holds `d` elements (any shape).
    fn rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f64) -> FloatTensor<Self>;
}

/// Whether [`rms_norm`] runs for `x` (flex, f32 or bf16); the GPU's code path takes the device op
/// (`kernels/device/norm.rs`), other backends and dtypes the composite ops.
pub fn supported(x: &Tensor<3>) -> bool {
    is_flex_float(x)
}

/// [`RmsNormOp::rms_norm`] on tensors (see [`supported`]).
pub fn rms_norm(x: Tensor<3>, w: Tensor<3>, eps: f64) -> Tensor<3> {
    Tensor::from_dispatch(<Dispatch as RmsNormOp>::rms_norm(
        x.into_dispatch(),
        w.into_dispatch(),
        eps,
    ))
}

/// The RMS norm on any device: [`rms_norm`] where it runs, the device op on the GPU's code path,
/// else burn's composite ops in f32 (as transformers' T5LayerNorm and LlamaRMSNorm take the
/// variance), the result in `dtype`.
pub fn rms_norm_any_device(x: Tensor<3>, w: Tensor<3>, eps: f64, dtype: DType) -> Tensor<3> {
    if supported(&x) {
        return rms_norm(x, w, eps);
    }
    if device::runs_on(&x) {
        return device::norm::rms_norm(x, w, eps).cast(dtype);
    }
    let x32 = x.cast(DType::F32);
    let var = x32.clone().square().mean_dim(2);
    (x32 * (var + eps).sqrt().recip() * w.cast(DType::F32)).cast(dtype)
}

impl RmsNormOp for Flex {
    fn rms_norm(x: FlexTensor, w: FlexTensor, eps: f64) -> FlexTensor {
        forward(&x, &w, eps).0
    }
}

impl<C: CheckpointStrategy> RmsNormOp for Autodiff<Flex, C> {
    fn rms_norm(x: FloatTensor<Self>, w: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Norm;

        impl Backward<Flex, 2> for Norm {
            /// The input, the weight and each row's `r = rsqrt(mean(x²) + ε)`.
            type State = (FlexTensor, FlexTensor, Vec<f32>);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [x_node, w_node] = ops.parents;
                let grad = grads.consume::<Flex>(&ops.node);
                let (x, w, r) = ops.state;
                let (dx, dw) = backward(&x, &w, &r, grad, x_node.is_some(), w_node.is_some());
                if let (Some(node), Some(dx)) = (x_node, dx) {
                    grads.register::<Flex>(node.id, dx);
                }
                if let (Some(node), Some(dw)) = (w_node, dw) {
                    grads.register::<Flex>(node.id, dw);
                }
            }
        }

        record::<_, C, _, 2>(Norm, [x, w], |[x, w]| {
            let (out, r) = forward(&x, &w, eps);
            (out, (x, w, r))
        })
    }
}

/// The output and each row's `r`.
pub(crate) fn forward(x: &FlexTensor, w: &FlexTensor, eps: f64) -> (FlexTensor, Vec<f32>) {
    let (xs, ws) = (values(x), values(w));
    let d = ws.len();
    let mut out = vec![0.0f32; xs.len()];
    let mut r = Vec::with_capacity(xs.len() / d.max(1));
    for (o, row) in out.chunks_exact_mut(d).zip(xs.chunks_exact(d)) {
        let mean_sq = row.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / d as f64;
        let ri = (1.0 / (mean_sq + eps).sqrt()) as f32;
        for ((o, &v), &wj) in o.iter_mut().zip(row).zip(ws.iter()) {
            *o = v * ri * wj;
        }
        r.push(ri);
    }
    (tensor_like(out, x), r)
}

/// `dx = r·u − x·r³·(Σ u⊙x)/d` with `u = g ⊙ w`, and `dw = Σ_rows g ⊙ x·r`.
fn backward(
    x: &FlexTensor,
    w: &FlexTensor,
    r: &[f32],
    grad: FlexTensor,
    want_x: bool,
    want_w: bool,
) -> (Option<FlexTensor>, Option<FlexTensor>) {
    let (xs, ws, gs) = (values(x), values(w), values(&grad));
    let d = ws.len();
    let mut dw = vec![0.0f64; if want_w { d } else { 0 }];
    let mut dx = vec![0.0f32; if want_x { xs.len() } else { 0 }];
    for (i, (row, g)) in xs.chunks_exact(d).zip(gs.chunks_exact(d)).enumerate() {
        let ri = r[i];
        if want_w {
            for ((acc, &v), &gj) in dw.iter_mut().zip(row).zip(g) {
                *acc += (gj * v * ri) as f64;
            }
        }
        if want_x {
            let dot: f32 = g
                .iter()
                .zip(ws.iter())
                .zip(row)
                .map(|((g, w), v)| g * w * v)
                .sum();
            let k = ri * ri * ri * dot / d as f32;
            let out = &mut dx[i * d..(i + 1) * d];
            for (((o, &gj), &wj), &v) in out.iter_mut().zip(g).zip(ws.iter()).zip(row) {
                *o = ri * gj * wj - v * k;
            }
        }
    }
    let dx = want_x.then(|| tensor_like(dx, x));
    let dw = want_w.then(|| tensor_like(dw.into_iter().map(|v| v as f32).collect(), w));
    (dx, dw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_tensors::{Produced, assert_bf16_is_rounded_f32, tracked_in};
    use burn::tensor::{DType, TensorData};

    fn tracked(values: Vec<f32>, shape: [usize; 3]) -> Tensor<3> {
        Tensor::from_data(TensorData::new(values, shape), &Device::flex())
            .autodiff()
            .require_grad()
    }

    /// transformers' T5LayerNorm written with burn's composite ops.
    fn composite(x: Tensor<3>, w: Tensor<3>, eps: f64) -> Tensor<3> {
        let var = x.clone().square().mean_dim(2);
        x * (var + eps).sqrt().recip() * w
    }

    #[test]
    fn bf16_activations_over_an_f32_weight_are_the_f32_op_rounded() {
        assert_bf16_is_rounded_f32(|dtype| {
            let (x, w) = (
                tracked_in([2, 3, 8], 1, dtype),
                tracked_in([1, 1, 8], 2, DType::F32),
            );
            let y = rms_norm(x.clone(), w.clone(), 1e-6);
            assert_eq!(y.dtype(), dtype);
            let g = tracked_in([2, 3, 8], 3, DType::F32).inner();
            let grads = (y.clone().cast(DType::F32) * g).sum().backward();
            let (dx, dw) = (x.grad(&grads).unwrap(), w.grad(&grads).unwrap());
            assert_eq!((dx.dtype(), dw.dtype()), (dtype, DType::F32));
            vec![
                Produced::of("y", y.inner(), true),
                Produced::of("dx", dx, true),
                Produced::of("dw", dw, false),
            ]
        });
    }

    #[test]
    fn equals_the_composite_ops_in_value_and_gradients() {
        let (b, t, d) = (2, 3, 8);
        let xv: Vec<f32> = (0..b * t * d)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
            .collect();
        let wv: Vec<f32> = (0..d).map(|i| 0.5 + i as f32 / 8.0).collect();
        let gv: Vec<f32> = (0..b * t * d)
            .map(|i| ((i * 13 % 17) as f32 - 8.0) / 5.0)
            .collect();
        let run = |fused: bool| -> [Vec<f32>; 3] {
            let x = tracked(xv.clone(), [b, t, d]);
            let w = tracked(wv.clone(), [1, 1, d]);
            let y = if fused {
                assert!(supported(&x));
                rms_norm(x.clone(), w.clone(), 1e-6)
            } else {
                composite(x.clone(), w.clone(), 1e-6)
            };
            let g = Tensor::<3>::from_data(TensorData::new(gv.clone(), [b, t, d]), &Device::flex());
            let grads = (y.clone() * g).sum().backward();
            let v = |t: Tensor<3>| -> Vec<f32> { t.into_data().try_to_vec().unwrap() };
            [
                v(y.inner()),
                v(x.grad(&grads).unwrap()),
                v(w.grad(&grads).unwrap()),
            ]
        };
        let (fused, reference) = (run(true), run(false));
        for (which, (a, b)) in ["y", "dx", "dw"].iter().zip(fused.iter().zip(&reference)) {
            for (p, q) in a.iter().zip(b) {
                assert!(
                    (p - q).abs() < 1e-5 * (1.0 + q.abs()),
                    "{which}: {p} vs {q}"
                );
            }
        }
    }
}
