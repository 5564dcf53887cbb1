//! The same optimizers as [`super::Optimizer`], with their state as f32 tensors on the engine's
//! device: a step reads the gradients and the master weights laid out end to end ([`FlatLayout`])
//! and writes the new masters in place of the old ones, with no host traffic. The arithmetic is the host's, term for term, in
//! tensor ops (f32 sums where the host sums in f64: a GPU reduction is not ordered anyway).
//!
//! The state saves and loads through the host [`super::Optimizer`] ([`DeviceOptimizer::to_host`],
//! [`DeviceOptimizer::from_host`]), so `optimizer.safetensors` is one format whichever placement
//! wrote it: a run trained on a GPU resumes on the CPU and the reverse.

use burn::prelude::*;
use burn::tensor::DType;

use super::adafactor::AdafactorLr;
use super::adamw;
use super::flat::{Flat, FlatLayout};
use super::{AdafactorConfig, AdamWConfig, Optimizer, OptimizerConfig, ParamShape, State};
use memfit_nn::ModelError;
use memfit_nn::kernels::device::adamw::{AdamWConstants, adamw_update, fused_update_on, scalar};
use memfit_nn::kernels::device::staged_sum;
use memfit_nn::layers::host::{float_tensor, to_f32_vec};

/// The optimizer's state on the device.
#[derive(Clone)]
enum Moments {
    /// AdamW's two moments of the parameters `layout` holds (those this optimizer steps), laid
    /// out end to end: a step updates them all in a dozen launches.
    Adam {
        layout: FlatLayout,
        exp_avg: Flat,
        exp_avg_sq: Flat,
    },
    /// Adafactor's, per parameter (its factors are per matrix).
    Adafactor(Vec<Option<Factors>>),
}

/// One parameter's Adafactor state (one per parameter: not worth boxing the larger variant).
#[derive(Clone)]
#[allow(clippy::large_enum_variant)]
enum Factors {
    /// The factored moments in transformers' orientation: `row` `[rows, 1]`, `col` `[1, cols]`.
    Factored {
        row: Tensor<2>,
        col: Tensor<2>,
    },
    Full {
        exp_avg_sq: Tensor<2>,
    },
}

/// An optimizer whose state lives on a device.
#[derive(Clone)]
pub struct DeviceOptimizer {
    pub config: OptimizerConfig,
    /// Optimizer steps taken.
    pub step: u64,
    shapes: Vec<ParamShape>,
    moments: Moments,
    /// AdamW updates a chunk in one fused launch ([`fused_update_on`] the device), else in burn's
    /// ops.
    fused: bool,
}

impl DeviceOptimizer {
    /// The host optimizer's state (fresh or loaded), moved to `device`.
    pub fn from_host(host: &Optimizer, device: &Device) -> Self {
        let moments = match host.config {
            OptimizerConfig::AdamW(_) => {
                let adam = |i: usize| match &host.states[i] {
                    Some(State::Adam {
                        exp_avg,
                        exp_avg_sq,
                    }) => (exp_avg.as_slice(), exp_avg_sq.as_slice()),
                    _ => unreachable!("AdamW keeps Adam states"),
                };
                let layout = FlatLayout::new(
                    (host.states.iter().zip(&host.shapes)).map(|(s, p)| s.as_ref().map(|_| p.dims)),
                );
                Moments::Adam {
                    exp_avg: layout.join_host(|i| adam(i).0, device),
                    exp_avg_sq: layout.join_host(|i| adam(i).1, device),
                    layout,
                }
            }
            OptimizerConfig::Adafactor(_) => Moments::Adafactor(
                (host.states.iter().zip(&host.shapes))
                    .map(|(s, shape)| s.as_ref().map(|s| upload_factors(s, shape, device)))
                    .collect(),
            ),
        };
        Self {
            config: host.config.clone(),
            step: host.step,
            shapes: host.shapes.clone(),
            moments,
            fused: fused_update_on(device),
        }
    }

    /// Drops the states of the parameters not in `keep` (one rank's ZeRO-1 shard).
    pub fn keep_only(&mut self, keep: &[bool]) {
        match &mut self.moments {
            Moments::Adam {
                layout,
                exp_avg,
                exp_avg_sq,
            } => {
                let kept = FlatLayout::new(
                    (self.shapes.iter().enumerate())
                        .map(|(i, s)| (layout.contains(i) && keep[i]).then_some(s.dims)),
                );
                let Some(device) = exp_avg.first().map(Tensor::device) else {
                    return;
                };
                let moved = |flat: &Flat| kept.flatten(|i| layout.view(flat, i), &device);
                (*exp_avg, *exp_avg_sq) = (moved(exp_avg), moved(exp_avg_sq));
                *layout = kept;
            }
            Moments::Adafactor(factors) => {
                for (f, &k) in factors.iter_mut().zip(keep) {
                    if !k {
                        *f = None;
                    }
                }
            }
        }
    }

    /// The state as a host optimizer (for `optimizer.safetensors`).
    pub fn to_host(&self) -> Result<Optimizer, ModelError> {
        let states = match &self.moments {
            Moments::Adam {
                layout,
                exp_avg,
                exp_avg_sq,
            } => {
                let m = layout.to_host(exp_avg)?;
                let v = layout.to_host(exp_avg_sq)?;
                (m.into_iter().zip(v))
                    .map(|(m, v)| {
                        m.zip(v).map(|(exp_avg, exp_avg_sq)| State::Adam {
                            exp_avg,
                            exp_avg_sq,
                        })
                    })
                    .collect()
            }
            Moments::Adafactor(factors) => (factors.iter())
                .map(|f| f.as_ref().map(download_factors).transpose())
                .collect::<Result<_, _>>()?,
        };
        Ok(Optimizer {
            config: self.config.clone(),
            step: self.step,
            shapes: self.shapes.clone(),
            states,
        })
    }

    /// One update of `masters` (the f32 masters laid out as `layout`) from `grads` (laid out
    /// alike), the gradients multiplied by `grad_scale` first (clipping's coefficient, a `[1]`
    /// tensor computed on the device; `None`: no clipping); the new masters. `lr` is the
    /// scheduler's rate (ignored by Adafactor's relative step). A parameter without a state here
    /// (another rank's ZeRO-1 shard) keeps its value.
    pub fn step_flat(
        &mut self,
        masters: Flat,
        layout: &FlatLayout,
        grads: Flat,
        (lr, grad_scale): (f64, Option<Tensor<1>>),
    ) -> Flat {
        self.step += 1;
        let at = (self.step, lr);
        let Some(device) = masters.first().map(Tensor::device) else {
            return masters;
        };
        match (&self.config, &mut self.moments) {
            (
                OptimizerConfig::AdamW(c),
                Moments::Adam {
                    layout: own,
                    exp_avg,
                    exp_avg_sq,
                },
            ) => {
                let update = AdamWUpdate::new(c, at, grad_scale, (&device, self.fused));
                let moments = (std::mem::take(exp_avg), std::mem::take(exp_avg_sq));
                let (w, m, v) = adamw_shard(&update, (own, moments), (masters, layout), grads);
                (*exp_avg, *exp_avg_sq) = (m, v);
                w
            }
            (OptimizerConfig::Adafactor(c), Moments::Adafactor(factors)) => {
                let g: Flat = (grads.into_iter())
                    .map(|c| scaled(c, grad_scale.as_ref()))
                    .collect();
                let at = AdafactorScalars::new(c, at, &device);
                let mut masters = masters;
                for i in layout.indices() {
                    let Some(f) = factors[i].as_mut() else {
                        continue;
                    };
                    let w = layout.view(&masters, i).expect("laid out");
                    let g = layout.view(&g, i).expect("laid out");
                    let new = match f {
                        Factors::Factored { row, col } => {
                            adafactor_factored(c, &at, &self.shapes[i], w, g, row, col)
                        }
                        Factors::Full { exp_avg_sq } => adafactor_full(c, &at, w, g, exp_avg_sq),
                    };
                    layout.assign(&mut masters, i, new);
                }
                masters
            }
            _ => unreachable!("the state follows the optimizer kind (built in from_host)"),
        }
    }
}

/// AdamW over the parameters `own` lays out (the moments' layout: every trained parameter, or a
/// ZeRO-1 shard of them) of `masters` laid out as `layout`: the new masters and moments.
fn adamw_shard(
    update: &AdamWUpdate,
    (own, (m, v)): (&FlatLayout, (Flat, Flat)),
    (masters, layout): (Flat, &FlatLayout),
    g: Flat,
) -> (Flat, Flat, Flat) {
    let update = |w: Flat, g: Flat, m: Flat, v: Flat| {
        let (mut new_w, mut new_m, mut new_v) = (Vec::new(), Vec::new(), Vec::new());
        for (((w, g), m), v) in w.into_iter().zip(g).zip(m).zip(v) {
            let [w, m, v] = update.apply([w, m, v], g);
            new_w.push(w);
            new_m.push(m);
            new_v.push(v);
        }
        (new_w, new_m, new_v)
    };
    if own == layout {
        return update(masters, g, m, v);
    }
    // a ZeRO-1 shard: the owned parameters gathered, updated, put back
    let Some(device) = masters.first().map(Tensor::device) else {
        return (masters, m, v);
    };
    let w = own.flatten(|i| layout.view(&masters, i), &device);
    let g = own.flatten(|i| layout.view(&g, i), &device);
    let (w, m, v) = update(w, g, m, v);
    let mut masters = masters;
    for i in own.indices() {
        layout.assign(&mut masters, i, own.view(&w, i).expect("laid out"));
    }
    (masters, m, v)
}

/// A gradient times clipping's coefficient, where there is one.
fn scaled(g: Tensor<1>, grad_scale: Option<&Tensor<1>>) -> Tensor<1> {
    match grad_scale {
        None => g,
        Some(scale) => g * scale.clone(),
    }
}

/// How a step's AdamW update runs. Its scalars that change from step to step (the rate over the
/// first moment's bias correction, the second's as 1 / sqrt, the decoupled decay, clipping's
/// coefficient) are tensor contents on the device, never kernel constants, which a replayed CUDA
/// graph would keep at their values at capture (tracel-ai/burn#5779); the betas and eps are the
/// run's constants. One per step, not boxed.
#[allow(clippy::large_enum_variant)]
enum AdamWUpdate {
    /// One launch per chunk ([`adamw_update`]): the masters and moments written in place.
    Fused {
        constants: AdamWConstants,
        scalars: Tensor<1>,
    },
    /// burn's ops, about a dozen launches per chunk: where memfit's kernels are not built (burn's
    /// fusion) or are turned off.
    Composed {
        config: AdamWConfig,
        scalars: [Tensor<1>; 3],
        grad_scale: Option<Tensor<1>>,
    },
}

impl AdamWUpdate {
    fn new(
        c: &AdamWConfig,
        at: (u64, f64),
        grad_scale: Option<Tensor<1>>,
        (device, fused): (&Device, bool),
    ) -> Self {
        let s = adamw::step_scalars(c, at, 1.0);
        if !fused {
            return Self::Composed {
                config: c.clone(),
                scalars: step_scalars([s.step_size, s.inv_bc2_sqrt, s.decay], device),
                grad_scale,
            };
        }
        let uploaded = upload_scalars(&s.values(), device);
        let scalars = match grad_scale {
            None => uploaded,
            Some(scale) => Tensor::cat(vec![uploaded.narrow(0, 0, scalar::GRAD_SCALE), scale], 0),
        };
        Self::Fused {
            constants: c.constants(),
            scalars,
        }
    }

    /// The new `[w, m, v]` of one chunk from its gradient.
    fn apply(&self, wmv: [Tensor<1>; 3], g: Tensor<1>) -> [Tensor<1>; 3] {
        match self {
            Self::Fused { constants, scalars } => adamw_update(*constants, wmv, g, scalars),
            Self::Composed {
                config,
                scalars,
                grad_scale,
            } => adamw(config, scalars, wmv, scaled(g, grad_scale.as_ref())),
        }
    }
}

/// A step's scalars as one f32 tensor on `device`: one upload.
fn upload_scalars(values: &[f32], device: &Device) -> Tensor<1> {
    Tensor::from_data(
        TensorData::new(values.to_vec(), [values.len()]),
        (device, DType::F32),
    )
}

/// `values` as `[1]` views of one tensor on `device` ([`upload_scalars`]).
fn step_scalars<const N: usize>(values: [f32; N], device: &Device) -> [Tensor<1>; N] {
    let all = upload_scalars(&values, device);
    std::array::from_fn(|i| all.clone().narrow(0, i, 1))
}

/// `torch.optim.AdamW`'s update of `[w, m, v]` in burn's ops, as [`super::adamw`] computes it on
/// the host, with the step's scalars from [`AdamWUpdate::new`]. The three are taken by value, so
/// that burn's ops may write them in place.
fn adamw(
    c: &AdamWConfig,
    [step_size, inv_bc2_sqrt, decay]: &[Tensor<1>; 3],
    [w, m, v]: [Tensor<1>; 3],
    g: Tensor<1>,
) -> [Tensor<1>; 3] {
    let (b1, b2, eps) = (c.beta1 as f32, c.beta2 as f32, c.eps as f32);
    // v first: m's term then takes `g` itself (no full-size copy beside it)
    let v = v.mul_scalar(b2) + (g.clone() * g.clone()).mul_scalar(1.0 - b2);
    let m = m.mul_scalar(b1) + g.mul_scalar(1.0 - b1);
    let denom = (v.clone().sqrt() * inv_bc2_sqrt.clone()).add_scalar(eps);
    // m / denom as denom's reciprocal times m: written into denom's buffer on any backend (a
    // division by it allocates where only the left operand may be overwritten), so that the
    // update holds one temporary the size of its chunk
    let update = denom.recip() * m.clone();
    let w = w * decay.clone() - update * step_size.clone();
    [w, m, v]
}

/// Root mean square of all values, as a `[1, 1]` tensor (stays on the device).
fn rms(x: Tensor<2>) -> Tensor<2> {
    mean_of_all(x.clone() * x).sqrt()
}

/// The mean of all values, as a `[1, 1]` tensor: summed in stages (`staged_sum`: burn-cubecl's
/// whole-tensor reduction is wrong past a size).
fn mean_of_all(x: Tensor<2>) -> Tensor<2> {
    let n = x.shape().num_elements() as f32;
    staged_sum(x).div_scalar(n).reshape([1, 1])
}

/// Adafactor's scalars that change from step to step — the relative (or external) rate, the
/// second moment's decay `beta2t` and `1 - beta2t` — as `[1, 1]` views of one tensor on the
/// device, for the reason given at [`AdamWUpdate`].
struct AdafactorScalars {
    rate: Tensor<2>,
    beta2t: Tensor<2>,
    one_minus_beta2t: Tensor<2>,
}

impl AdafactorScalars {
    fn new(c: &AdafactorConfig, (step, lr): (u64, f64), device: &Device) -> Self {
        let rate = match c.lr {
            AdafactorLr::Relative => (1e-2f64).min(1.0 / (step as f64).sqrt()),
            AdafactorLr::External => lr,
        };
        let beta2t = 1.0 - (step as f64).powf(c.decay_rate);
        let values = [rate as f32, beta2t as f32, (1.0 - beta2t) as f32];
        let [rate, beta2t, one_minus_beta2t] =
            step_scalars(values, device).map(|x| x.reshape([1, 1]));
        Self {
            rate,
            beta2t,
            one_minus_beta2t,
        }
    }
}

/// `Adafactor._get_lr` as a `[1, 1]` tensor: the step's rate, times the weights' RMS (at least
/// `eps2`) when `scale_parameter`.
fn step_size(c: &AdafactorConfig, at: &AdafactorScalars, w: &Tensor<2>) -> Tensor<2> {
    if c.scale_parameter {
        rms(w.clone()).clamp_min(c.eps2 as f32) * at.rate.clone()
    } else {
        at.rate.clone()
    }
}

/// The host's shared tail: clip the update by its RMS, scale by the step size, decay, apply.
fn apply(c: &AdafactorConfig, lr_t: Tensor<2>, w: Tensor<2>, update: Tensor<2>) -> Tensor<2> {
    let clip = rms(update.clone())
        .div_scalar(c.clip_threshold as f32)
        .clamp_min(1.0f32);
    let scale = lr_t.clone() / clip;
    let w = if c.weight_decay != 0.0 {
        let decay = lr_t.mul_scalar(-c.weight_decay as f32);
        w.clone() + w * decay
    } else {
        w
    };
    w - update * scale
}

fn adafactor_factored(
    c: &AdafactorConfig,
    at: &AdafactorScalars,
    shape: &ParamShape,
    w: Tensor<2>,
    g: Tensor<2>,
    row: &mut Tensor<2>,
    col: &mut Tensor<2>,
) -> Tensor<2> {
    let lr_t = step_size(c, at, &w);
    let (b, a) = (&at.beta2t, &at.one_minus_beta2t);
    // transformers' orientation: the factors are over its rows and columns, which are memfit's
    // columns and rows when the parameter is stored transposed (read so, without a transposed copy)
    let (row_dim, col_dim) = if shape.transposed { (0, 1) } else { (1, 0) };
    let u = (g.clone() * g.clone()).add_scalar(c.eps1 as f32);
    let (row_dims, col_dims) = (row.dims(), col.dims());
    let row_mean = u.clone().mean_dim(row_dim).reshape(row_dims);
    let col_mean = u.mean_dim(col_dim).reshape(col_dims);
    *row = row.clone() * b.clone() + row_mean * a.clone();
    *col = col.clone() * b.clone() + col_mean * a.clone();
    // _approx_sq_grad: rsqrt(row / mean(row)) ⊗ rsqrt(col), laid out as the gradient is
    let row_avg = mean_of_all(row.clone());
    let r_factor = (row.clone() / row_avg).sqrt().recip();
    let c_factor = col.clone().sqrt().recip();
    let [rows, cols] = g.dims();
    let (r_factor, c_factor) = if shape.transposed {
        (r_factor.reshape([1, cols]), c_factor.reshape([rows, 1]))
    } else {
        (r_factor, c_factor)
    };
    apply(c, lr_t, w, r_factor * c_factor * g)
}

fn adafactor_full(
    c: &AdafactorConfig,
    at: &AdafactorScalars,
    w: Tensor<2>,
    g: Tensor<2>,
    v: &mut Tensor<2>,
) -> Tensor<2> {
    let lr_t = step_size(c, at, &w);
    *v = v.clone() * at.beta2t.clone()
        + (g.clone() * g.clone()).add_scalar(c.eps1 as f32) * at.one_minus_beta2t.clone();
    let update = v.clone().sqrt().recip() * g;
    apply(c, lr_t, w, update)
}

/// A host buffer as an f32 tensor of `dims` on `device`.
fn upload(values: &[f32], dims: [usize; 2], device: &Device) -> Tensor<2> {
    float_tensor(values, dims, device, DType::F32)
}

fn upload_factors(state: &State, shape: &ParamShape, device: &Device) -> Factors {
    match state {
        State::Factored { row, col } => Factors::Factored {
            row: upload(row, [row.len(), 1], device),
            col: upload(col, [1, col.len()], device),
        },
        State::Full { exp_avg_sq } => Factors::Full {
            exp_avg_sq: upload(exp_avg_sq, shape.dims, device),
        },
        State::Adam { .. } => unreachable!("Adafactor keeps Adafactor states"),
    }
}

fn download_factors(factors: &Factors) -> Result<State, ModelError> {
    let host = |t: &Tensor<2>| to_f32_vec(t.clone());
    Ok(match factors {
        Factors::Factored { row, col } => State::Factored {
            row: host(row)?,
            col: host(col)?,
        },
        Factors::Full { exp_avg_sq } => State::Full {
            exp_avg_sq: host(exp_avg_sq)?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(name: &str, hf: &[usize], transposed: bool) -> ParamShape {
        let dims = match hf {
            [n] => [1, *n],
            [r, c] if transposed => [*c, *r],
            [r, c] => [*r, *c],
            _ => panic!("1-D or 2-D"),
        };
        ParamShape {
            name: name.into(),
            hf_shape: hf.to_vec(),
            transposed,
            dims,
        }
    }

    /// Three steps on the device equal three on the host (to f32 rounding), for each optimizer and
    /// layout, AdamW fused and composed, with clipping's scale, and the state comes back as the
    /// host's.
    #[test]
    fn device_steps_equal_host_steps() {
        let device = Device::flex();
        let shapes = vec![
            shape("w", &[3, 4], true),
            shape("frozen", &[2], false),
            shape("b", &[5], false),
            shape("m", &[4, 3], false),
        ];
        let trainable = [true, false, true, true];
        let start: Vec<Vec<f32>> = shapes
            .iter()
            .enumerate()
            .map(|(p, s)| {
                (0..s.numel())
                    .map(|i| ((i * 7 + p) % 11) as f32 * 0.1 - 0.5)
                    .collect()
            })
            .collect();
        let external = AdafactorConfig {
            lr: AdafactorLr::External,
            weight_decay: 0.01,
            ..Default::default()
        };
        let configs = [
            OptimizerConfig::AdamW(AdamWConfig::default()),
            OptimizerConfig::Adafactor(AdafactorConfig::default()),
            OptimizerConfig::Adafactor(external),
        ];
        // every state, and a ZeRO-1 shard without "b"'s (which then keeps its value)
        let shards = [None, Some([true, true, false, true])];
        // AdamW fused into one launch per chunk and composed of burn's ops (Adafactor: composed)
        let cases = (configs.into_iter())
            .flat_map(|c| shards.map(|k| (c.clone(), k)))
            .flat_map(|(c, k)| [true, false].map(|fused| (c.clone(), k, fused)));
        for (config, keep, fused) in cases {
            let layout = FlatLayout::new(
                shapes
                    .iter()
                    .zip(trainable)
                    .map(|(s, t)| t.then_some(s.dims)),
            );
            let mut host = Optimizer::new(config.clone(), shapes.clone(), &trainable);
            let mut dev = DeviceOptimizer::from_host(&host, &device);
            assert!(dev.fused, "flex runs the fused update");
            dev.fused = fused;
            if let Some(keep) = keep {
                host.keep_only(&keep);
                dev.keep_only(&keep);
            }
            let mut w_host = start.clone();
            let mut w_dev = layout.join_host(|i| &start[i], &device);
            // the rate and clipping's coefficient change every step (a graph replaying frozen
            // kernel scalars would train on the first step's)
            for (step, (lr, scale)) in [(0.05, 0.75), (0.02, 1.0), (0.08, 0.3)]
                .into_iter()
                .enumerate()
            {
                let grads: Vec<Option<Vec<f32>>> = shapes
                    .iter()
                    .zip(trainable)
                    .map(|(s, t)| {
                        t.then(|| {
                            (0..s.numel())
                                .map(|i| ((i * 5 + step * 3) % 13) as f32 * 0.07 - 0.4)
                                .collect()
                        })
                    })
                    .collect();
                let g_dev = layout.join_host(|i| grads[i].as_deref().unwrap(), &device);
                host.step_scaled(&mut w_host, &grads, lr, scale);
                let scale_dev = Tensor::from_data(TensorData::new(vec![scale], [1]), &device);
                w_dev = dev.step_flat(w_dev, &layout, g_dev, (lr, Some(scale_dev)));
            }
            let got = layout.to_host(&w_dev).unwrap();
            for (i, w) in got.iter().enumerate() {
                let Some(got) = w else { continue };
                for (a, b) in got.iter().zip(&w_host[i]) {
                    assert!(
                        (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                        "{} {i}: {a} vs {b}",
                        config.name()
                    );
                }
            }
            if keep.is_some() {
                assert_eq!(got[2].as_ref(), Some(&start[2]), "another rank's parameter");
            }
            let back = dev.to_host().unwrap();
            assert_eq!(back.step, host.step);
            assert_eq!(back.state_values(), host.state_values());
            for (a, b) in back.states.iter().zip(&host.states) {
                let (Some(State::Adam { exp_avg: a, .. }), Some(State::Adam { exp_avg: b, .. })) =
                    (a, b)
                else {
                    assert_eq!(a.is_some(), b.is_some());
                    continue;
                };
                assert!(
                    a.iter()
                        .zip(b)
                        .all(|(x, y)| (x - y).abs() <= 1e-6 * (1.0 + y.abs()))
                );
            }
        }
    }
}
