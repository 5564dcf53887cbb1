//! AdamW with decoupled weight decay, as `torch.optim.AdamW` computes it (Loshchilov & Hutter 2019).

use memfit_nn::kernels::device::adamw::{AdamWConstants, AdamWStep, adamw_element};
use memfit_nn::kernels::vectorised::with_avx512;

/// Defaults are torch's: betas (0.9, 0.999), eps 1e-8, weight decay 0.01.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// One step over `w` with its moments `m` and `v`, the gradient `g` times `scale`; `g: None` is
/// a zero gradient (rows of a table no token looked up: their moments decay and the weights still
/// move and decay). Each element as the device's fused update computes it ([`adamw_element`]).
pub(super) fn update(
    c: &AdamWConfig,
    (step, lr): (u64, f64),
    w: &mut [f32],
    (g, scale): (Option<&[f32]>, f32),
    m: &mut [f32],
    v: &mut [f32],
) {
    let s = step_scalars(c, (step, lr), scale);
    let c = c.constants();
    with_avx512(|| match g {
        Some(g) => each_element(c, &s, (w, m, v), g.iter().copied()),
        None => each_element(c, &s, (w, m, v), std::iter::repeat(0.0)),
    })
}

#[inline(always)]
fn each_element(
    c: AdamWConstants,
    s: &AdamWStep,
    (w, m, v): (&mut [f32], &mut [f32], &mut [f32]),
    g: impl Iterator<Item = f32>,
) {
    for (((w, m), v), g) in w.iter_mut().zip(m).zip(v).zip(g) {
        adamw_element(c, s, (w, m, v), g);
    }
}

impl AdamWConfig {
    /// The betas and eps as the update computes with them.
    pub(super) fn constants(&self) -> AdamWConstants {
        AdamWConstants {
            beta1: self.beta1 as f32,
            beta2: self.beta2 as f32,
            eps: self.eps as f32,
        }
    }
}

/// The scalars of optimizer step `step` (from 1) at rate `lr`, computed in f64 and rounded once:
/// the host's and the device's updates read the same values.
pub(super) fn step_scalars(c: &AdamWConfig, (step, lr): (u64, f64), grad_scale: f32) -> AdamWStep {
    let t = step as i32;
    AdamWStep {
        step_size: (lr / (1.0 - c.beta1.powi(t))) as f32,
        inv_bc2_sqrt: (1.0 / (1.0 - c.beta2.powi(t)).sqrt()) as f32,
        decay: (1.0 - lr * c.weight_decay) as f32,
        grad_scale,
    }
}
