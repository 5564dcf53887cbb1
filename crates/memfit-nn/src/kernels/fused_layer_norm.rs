//! LayerNorm, `(x − mean) · rsqrt(var + ε) · γ + β` over the last dimension, as one operation with
//! a hand-written backward: a burn backend extension for the flex CPU backend (BERT's post-LN
//! layers run two per layer). It computes in f32; x, γ and β may be stored as f32 or bf16, and the
//! output and gradients leave in their inputs' dtypes.
//!
//! burn's composite ops run about ten element-wise passes and keep the centred input, its square's
//! mean and the normalised `x̂` for backward: several `[tokens, d]` tensors per norm. Here the
//! forward is one sweep per row and backward keeps γ, β, a mean and `r` per row, and one
//! `[tokens, d]` tensor: the output when it is f32 (`x̂ = (y − β) / γ`, as Apex's memory-efficient
//! LayerNorm does; the next layer keeps that output anyway, so the norm adds nothing), else the
//! input (a bf16 output would give backward a coarser `x̂` than forward used).

use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::prelude::*;
use burn_flex::FlexTensor;

use crate::kernels::autodiff_record::record;
use crate::kernels::flex_values::{is_flex_float, tensor_like, values};

#[backend_extension(Flex, Autodiff)]
pub trait LayerNormOp: Backend {
    /// `(x − mean) · rsqrt(var + eps) · gamma + beta` over the last dim (biased variance, as
    /// `nn.LayerNorm`); `gamma` and `beta` hold `d` elements each (any shape).
    fn layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
    ) -> FloatTensor<Self>;
}

/// Whether [`layer_norm`] runs for `x` (flex, f32 or bf16); the GPU's code path takes the device
/// op (`kernels/device/norm.rs`), other backends and dtypes the composite ops.
pub fn supported(x: &Tensor<3>) -> bool {
    is_flex_float(x)
}

/// [`LayerNormOp::layer_norm`] on tensors (see [`supported`]).
pub fn layer_norm(x: Tensor<3>, gamma: Tensor<3>, beta: Tensor<3>, eps: f64) -> Tensor<3> {
    Tensor::from_dispatch(<Dispatch as LayerNormOp>::layer_norm(
        x.into_dispatch(),
        gamma.into_dispatch(),
        beta.into_dispatch(),
        eps,
    ))
}

impl LayerNormOp for Flex {
    fn layer_norm(x: FlexTensor, gamma: FlexTensor, beta: FlexTensor, eps: f64) -> FlexTensor {
        forward(&x, &gamma, &beta, eps).0
    }
}

/// What backward keeps: the input or the output, γ, β (for its dtype and shape) and each row's
/// mean and `r`.
#[derive(Debug, Clone)]
struct Saved {
    kept: Kept,
    gamma: FlexTensor,
    beta: FlexTensor,
    rows: Vec<(f32, f32)>,
}

impl<C: CheckpointStrategy> LayerNormOp for Autodiff<Flex, C> {
    fn layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct Norm;

        impl Backward<Flex, 3> for Norm {
            type State = Saved;

            fn backward(
                self,
                ops: Ops<Self::State, 3>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [x_node, g_node, b_node] = ops.parents;
                let grad = grads.consume::<Flex>(&ops.node);
                let want = [x_node.is_some(), g_node.is_some(), b_node.is_some()];
                let [dx, dgamma, dbeta] = backward(&ops.state, grad, want);
                for (node, d) in [(x_node, dx), (g_node, dgamma), (b_node, dbeta)] {
                    if let (Some(node), Some(d)) = (node, d) {
                        grads.register::<Flex>(node.id, d);
                    }
                }
            }
        }

        record::<_, C, _, 3>(Norm, [x, gamma, beta], |[x, gamma, beta]| {
            let (out, rows) = forward(&x, &gamma, &beta, eps);
            let kept = Kept::choose(x, &out, &gamma);
            let saved = Saved {
                kept,
                gamma,
                beta,
                rows,
            };
            (out, saved)
        })
    }
}

/// The `[tokens, d]` tensor backward recovers `x̂` from.
#[derive(Debug, Clone)]
enum Kept {
    Input(FlexTensor),
    Output(FlexTensor),
}

impl Kept {
    /// The output where it is f32 and every `|γ|` is large enough to divide by without losing
    /// `x̂`'s precision; the input otherwise.
    fn choose(x: FlexTensor, out: &FlexTensor, gamma: &FlexTensor) -> Self {
        let f32_out = out.dtype() == burn::tensor::DType::F32;
        if f32_out && values(gamma).iter().all(|g| g.abs() >= 1e-2) {
            Kept::Output(out.clone())
        } else {
            Kept::Input(x)
        }
    }

    fn tensor(&self) -> &FlexTensor {
        match self {
            Kept::Input(t) | Kept::Output(t) => t,
        }
    }

    /// Row `i`'s `x̂` into `xhat`, from the kept `row`.
    fn xhat(
        &self,
        row: &[f32],
        (mean, r): (f32, f32),
        gammas: &[f32],
        betas: &[f32],
        xhat: &mut [f32],
    ) {
        match self {
            Kept::Input(_) => {
                for (h, &v) in xhat.iter_mut().zip(row) {
                    *h = (v - mean) * r;
                }
            }
            Kept::Output(_) => {
                for (((h, &y), &g), &b) in xhat.iter_mut().zip(row).zip(gammas).zip(betas) {
                    *h = (y - b) / g;
                }
            }
        }
    }
}

/// The output (in x's dtype) and each row's mean and `r = rsqrt(var + ε)`; sums in f64.
pub(crate) fn forward(
    x: &FlexTensor,
    gamma: &FlexTensor,
    beta: &FlexTensor,
    eps: f64,
) -> (FlexTensor, Vec<(f32, f32)>) {
    let (xs, gs, bs) = (values(x), values(gamma), values(beta));
    let d = gs.len();
    let mut out = vec![0.0f32; xs.len()];
    let mut rows = Vec::with_capacity(xs.len() / d.max(1));
    for (o, row) in out.chunks_exact_mut(d).zip(xs.chunks_exact(d)) {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
        let (mean, r) = (mean as f32, (1.0 / (var + eps).sqrt()) as f32);
        for (((o, &v), &g), &b) in o.iter_mut().zip(row).zip(gs.iter()).zip(bs.iter()) {
            *o = (v - mean) * r * g + b;
        }
        rows.push((mean, r));
    }
    (tensor_like(out, x), rows)
}

/// With `x̂ = (x − mean)·r` and `u = g ⊙ γ`: `dx = r·(u − mean(u) − x̂·mean(u ⊙ x̂))`,
/// `dγ = Σ_rows g ⊙ x̂`, `dβ = Σ_rows g`; each only where `want` says.
fn backward(s: &Saved, grad: FlexTensor, want: [bool; 3]) -> [Option<FlexTensor>; 3] {
    let kept = s.kept.tensor();
    let (xs, gammas, gs) = (values(kept), values(&s.gamma), values(&grad));
    let betas = values(&s.beta);
    let d = gammas.len();
    let [want_x, want_gamma, want_beta] = want;
    let mut dx = vec![0.0f32; if want_x { xs.len() } else { 0 }];
    let mut dgamma = vec![0.0f64; d];
    let mut dbeta = vec![0.0f64; d];
    let mut xhat = vec![0.0f32; d];
    for (i, (row, g)) in xs.chunks_exact(d).zip(gs.chunks_exact(d)).enumerate() {
        let (_, r) = s.rows[i];
        s.kept.xhat(row, s.rows[i], &gammas, &betas, &mut xhat);
        for (((dg, db), &h), &gj) in dgamma.iter_mut().zip(&mut dbeta).zip(&xhat).zip(g) {
            *dg += (gj * h) as f64;
            *db += gj as f64;
        }
        if want_x {
            let (mut sum_u, mut sum_uh) = (0.0f32, 0.0f32);
            for ((&gj, &w), &h) in g.iter().zip(gammas.iter()).zip(&xhat) {
                sum_u += gj * w;
                sum_uh += gj * w * h;
            }
            let (mean_u, mean_uh) = (sum_u / d as f32, sum_uh / d as f32);
            let out = &mut dx[i * d..(i + 1) * d];
            for (((o, &gj), &w), &h) in out.iter_mut().zip(g).zip(gammas.iter()).zip(&xhat) {
                *o = r * (gj * w - mean_u - h * mean_uh);
            }
        }
    }
    let narrow = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect();
    [
        want_x.then(|| tensor_like(dx, kept)),
        want_gamma.then(|| tensor_like(narrow(dgamma), &s.gamma)),
        want_beta.then(|| tensor_like(narrow(dbeta), &s.beta)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_tensors::{
        Produced, assert_bf16_is_rounded_f32, assert_close, tracked, tracked_in,
    };
    use burn::tensor::{DType, TensorData};

    /// `nn.LayerNorm` written with burn's composite ops.
    fn composite(x: Tensor<3>, gamma: Tensor<3>, beta: Tensor<3>, eps: f64) -> Tensor<3> {
        let centered = x.clone() - x.mean_dim(2);
        let var = centered.clone().square().mean_dim(2);
        centered * (var + eps).sqrt().recip() * gamma + beta
    }

    /// The fused op against the composite ops, in value and gradients, for γ = `gamma`.
    fn assert_equals_the_composite_ops(gamma: [f32; 8]) {
        let run = |fused: bool| -> Vec<Vec<f32>> {
            let gamma =
                Tensor::from_data(TensorData::new(gamma.to_vec(), [1, 1, 8]), &Device::flex());
            let (x, gamma, beta) = (
                tracked([2, 3, 8], 1),
                gamma.autodiff().require_grad(),
                tracked([1, 1, 8], 3),
            );
            let y = if fused {
                assert!(supported(&x));
                layer_norm(x.clone(), gamma.clone(), beta.clone(), 1e-12)
            } else {
                composite(x.clone(), gamma.clone(), beta.clone(), 1e-12)
            };
            let g = tracked([2, 3, 8], 4).inner();
            let grads = (y.clone() * g).sum().backward();
            let v = |t: Tensor<3>| -> Vec<f32> { t.into_data().try_to_vec().unwrap() };
            vec![
                v(y.inner()),
                v(x.grad(&grads).unwrap()),
                v(gamma.grad(&grads).unwrap()),
                v(beta.grad(&grads).unwrap()),
            ]
        };
        let (fused, reference) = (run(true), run(false));
        for (which, (a, b)) in ["y", "dx", "dgamma", "dbeta"]
            .iter()
            .zip(fused.iter().zip(&reference))
        {
            assert_close(which, a, b, 1e-5);
        }
        assert!(
            fused[1].iter().any(|g| g.abs() > 1e-3),
            "dx is not trivially 0"
        );
    }

    #[test]
    fn backward_from_the_kept_output_equals_the_composite_ops() {
        assert_equals_the_composite_ops([0.5, -1.2, 2.0, 0.8, 1.5, -0.7, 1.1, 0.9]);
    }

    #[test]
    fn backward_from_the_kept_input_where_a_gamma_is_near_zero_too() {
        assert_equals_the_composite_ops([0.5, -1.2, 0.0, 0.8, 1.5, -0.7, 1e-3, 0.9]);
    }

    #[test]
    fn the_output_is_kept_only_in_f32_with_no_tiny_gamma() {
        let flex = |v: Vec<f32>, dtype| {
            let n = v.len();
            crate::kernels::flex_values::from_values(v, [n].into(), dtype)
        };
        let (x, y) = (
            flex(vec![1.0; 4], DType::F32),
            flex(vec![2.0; 4], DType::F32),
        );
        let wide = flex(vec![0.5, -0.5, 2.0, 1.0], DType::F32);
        let tiny = flex(vec![0.5, -0.001, 2.0, 1.0], DType::F32);
        assert!(matches!(
            Kept::choose(x.clone(), &y, &wide),
            Kept::Output(_)
        ));
        assert!(matches!(Kept::choose(x.clone(), &y, &tiny), Kept::Input(_)));
        let y16 = flex(vec![2.0; 4], DType::BF16);
        assert!(matches!(Kept::choose(x, &y16, &wide), Kept::Input(_)));
    }

    #[test]
    fn bf16_activations_over_f32_parameters_are_the_f32_op_rounded() {
        assert_bf16_is_rounded_f32(|dtype| {
            let x = tracked_in([2, 3, 8], 1, dtype);
            // A zero γ: the f32 op keeps its input too, so both recover x̂ the same way (the kept
            // output is compared with the composite ops above).
            let gamma = [0.5, -1.2, 0.0, 0.8, 1.5, -0.7, 1.1, 0.9];
            let gamma = TensorData::new(gamma.to_vec(), [1, 1, 8]);
            let (gamma, beta) = (
                Tensor::from_data(gamma, &Device::flex())
                    .autodiff()
                    .require_grad(),
                tracked_in([1, 1, 8], 3, DType::F32),
            );
            let y = layer_norm(x.clone(), gamma.clone(), beta.clone(), 1e-6);
            assert_eq!(y.dtype(), dtype);
            let g = tracked_in([2, 3, 8], 4, DType::F32).inner();
            let grads = (y.clone().cast(DType::F32) * g).sum().backward();
            let (dx, dgamma) = (x.grad(&grads).unwrap(), gamma.grad(&grads).unwrap());
            assert_eq!((dx.dtype(), dgamma.dtype()), (dtype, DType::F32));
            vec![
                Produced::of("y", y.inner(), true),
                Produced::of("dx", dx, true),
                Produced::of("dgamma", dgamma, false),
                Produced::of("dbeta", beta.grad(&grads).unwrap(), false),
            ]
        });
    }
}
