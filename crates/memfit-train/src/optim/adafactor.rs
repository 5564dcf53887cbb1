//! Adafactor (Shazeer & Stern 2018) as transformers' `transformers.optimization.Adafactor` runs it
//! with `beta1=None` (no first moment): factored second moments for ≥2-D parameters, update clipping
//! by RMS, and either the relative step size (`relative_step=True`, `warmup_init=False`) or an
//! external learning rate.

use super::ParamShape;

/// Where the step size comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AdafactorLr {
    /// `relative_step=True, warmup_init=False`: `min(1e-2, 1/√step)`; the scheduler's lr is ignored.
    Relative,
    /// `relative_step=False`: the lr the caller passes.
    External,
}

/// transformers' defaults: eps (1e-30, 1e-3), clip_threshold 1.0, decay_rate -0.8,
/// scale_parameter True, weight_decay 0.
#[derive(Debug, Clone, PartialEq)]
pub struct AdafactorConfig {
    pub lr: AdafactorLr,
    pub eps1: f64,
    pub eps2: f64,
    pub clip_threshold: f64,
    pub decay_rate: f64,
    pub scale_parameter: bool,
    pub weight_decay: f64,
}

impl Default for AdafactorConfig {
    fn default() -> Self {
        Self {
            lr: AdafactorLr::Relative,
            eps1: 1e-30,
            eps2: 1e-3,
            clip_threshold: 1.0,
            decay_rate: -0.8,
            scale_parameter: true,
            weight_decay: 0.0,
        }
    }
}

fn rms(v: &[f32]) -> f64 {
    (super::sum_of_squares(v) / v.len().max(1) as f64).sqrt()
}

/// `Adafactor._get_lr`.
fn step_size(c: &AdafactorConfig, step: u64, lr: f64, w: &[f32]) -> f64 {
    let rel = match c.lr {
        AdafactorLr::Relative => (1e-2f64).min(1.0 / (step as f64).sqrt()),
        AdafactorLr::External => lr,
    };
    let scale = if c.scale_parameter {
        c.eps2.max(rms(w))
    } else {
        1.0
    };
    scale * rel
}

/// Shared tail: clip the update by its RMS, scale by the step size, decay, apply.
fn apply(c: &AdafactorConfig, lr_t: f64, w: &mut [f32], update: &mut [f32]) {
    let clip = (rms(update) / c.clip_threshold).max(1.0);
    let scale = (lr_t / clip) as f32;
    if c.weight_decay != 0.0 {
        let decay = (-c.weight_decay * lr_t) as f32;
        for x in w.iter_mut() {
            *x += *x * decay;
        }
    }
    for (x, u) in w.iter_mut().zip(update.iter()) {
        *x -= u * scale;
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn update_factored(
    c: &AdafactorConfig,
    step: u64,
    lr: f64,
    shape: &ParamShape,
    w: &mut [f32],
    g: &[f32],
    row: &mut [f32],
    col: &mut [f32],
) {
    let lr_t = step_size(c, step, lr, w);
    let beta2t = 1.0 - (step as f64).powf(c.decay_rate);
    let (rows, cols) = (row.len(), col.len());
    // Index of transformers' (r, c) element in memory.
    let at = |r: usize, cc: usize| {
        if shape.transposed {
            cc * rows + r
        } else {
            r * cols + cc
        }
    };
    let eps1 = c.eps1 as f32;
    let mut row_mean = vec![0f64; rows];
    let mut col_mean = vec![0f64; cols];
    for r in 0..rows {
        for cc in 0..cols {
            let gi = g[at(r, cc)];
            let u = (gi * gi + eps1) as f64;
            row_mean[r] += u;
            col_mean[cc] += u;
        }
    }
    let (b, a) = (beta2t as f32, (1.0 - beta2t) as f32);
    for r in 0..rows {
        row[r] = b * row[r] + a * (row_mean[r] / cols as f64) as f32;
    }
    for cc in 0..cols {
        col[cc] = b * col[cc] + a * (col_mean[cc] / rows as f64) as f32;
    }
    // _approx_sq_grad: rsqrt(row / mean(row)) ⊗ rsqrt(col).
    let row_avg = (row.iter().map(|&x| x as f64).sum::<f64>() / rows as f64) as f32;
    let r_factor: Vec<f32> = row.iter().map(|&x| (x / row_avg).sqrt().recip()).collect();
    let c_factor: Vec<f32> = col.iter().map(|&x| x.sqrt().recip()).collect();
    let mut update = vec![0f32; w.len()];
    for (r, rf) in r_factor.iter().enumerate() {
        for (cc, cf) in c_factor.iter().enumerate() {
            let i = at(r, cc);
            update[i] = rf * cf * g[i];
        }
    }
    apply(c, lr_t, w, &mut update);
}

pub(super) fn update_full(
    c: &AdafactorConfig,
    step: u64,
    lr: f64,
    w: &mut [f32],
    g: &[f32],
    v: &mut [f32],
) {
    let lr_t = step_size(c, step, lr, w);
    let beta2t = 1.0 - (step as f64).powf(c.decay_rate);
    let (b, a, eps1) = (beta2t as f32, (1.0 - beta2t) as f32, c.eps1 as f32);
    let mut update = vec![0f32; w.len()];
    for i in 0..w.len() {
        v[i] = b * v[i] + a * (g[i] * g[i] + eps1);
        update[i] = v[i].sqrt().recip() * g[i];
    }
    apply(c, lr_t, w, &mut update);
}
