//! AdamW with decoupled weight decay, as `torch.optim.AdamW` computes it (Loshchilov & Hutter 2019).

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
/// move and decay).
pub(super) fn update(
    c: &AdamWConfig,
    (step, lr): (u64, f64),
    w: &mut [f32],
    (g, scale): (Option<&[f32]>, f32),
    m: &mut [f32],
    v: &mut [f32],
) {
    with_avx512(|| match g {
        Some(g) => update_with(c, step, lr, w, g.iter().map(|x| x * scale), m, v),
        None => update_with(c, step, lr, w, std::iter::repeat(0.0), m, v),
    })
}

#[inline(always)]
fn update_with(
    c: &AdamWConfig,
    step: u64,
    lr: f64,
    w: &mut [f32],
    g: impl Iterator<Item = f32>,
    m: &mut [f32],
    v: &mut [f32],
) {
    let t = step as i32;
    let bc1 = 1.0 - c.beta1.powi(t);
    let bc2_sqrt = (1.0 - c.beta2.powi(t)).sqrt();
    let step_size = (lr / bc1) as f32;
    let decay = (1.0 - lr * c.weight_decay) as f32;
    let (b1, b2, eps) = (c.beta1 as f32, c.beta2 as f32, c.eps as f32);
    let inv_bc2_sqrt = (1.0 / bc2_sqrt) as f32;
    for (((w, m), v), g) in w.iter_mut().zip(m).zip(v).zip(g) {
        *m = b1 * *m + (1.0 - b1) * g;
        *v = b2 * *v + (1.0 - b2) * g * g;
        let denom = v.sqrt() * inv_bc2_sqrt + eps;
        *w = *w * decay - step_size * *m / denom;
    }
}
