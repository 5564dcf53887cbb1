//! The same optimizers as [`super::Optimizer`], with their state as f32 tensors on the engine's
//! device: a step reads the gradients where they were accumulated and writes the master weights in
//! place of the old ones, with no host traffic. The arithmetic is the host's, term for term, in
//! tensor ops (f32 sums where the host sums in f64: a GPU reduction is not ordered anyway).
//!
//! The state saves and loads through the host [`super::Optimizer`] ([`DeviceOptimizer::to_host`],
//! [`DeviceOptimizer::from_host`]), so `optimizer.safetensors` is one format whichever placement
//! wrote it: a run trained on a GPU resumes on the CPU and the reverse.

use burn::prelude::*;
use burn::tensor::DType;

use super::adafactor::AdafactorLr;
use super::{AdafactorConfig, AdamWConfig, Optimizer, OptimizerConfig, ParamShape, State};
use memfit_nn::ModelError;
use memfit_nn::layers::host::float_tensor;

/// One parameter's state on the device.
#[derive(Clone)]
enum DeviceState {
    Adam {
        exp_avg: Tensor<2>,
        exp_avg_sq: Tensor<2>,
    },
    /// Adafactor's factored moments in transformers' orientation: `row` `[rows, 1]`, `col`
    /// `[1, cols]`.
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
    states: Vec<Option<DeviceState>>,
}

impl DeviceOptimizer {
    /// The host optimizer's state (fresh or loaded), moved to `device`.
    pub fn from_host(host: &Optimizer, device: &Device) -> Self {
        let states = host
            .states
            .iter()
            .zip(&host.shapes)
            .map(|(state, shape)| state.as_ref().map(|s| upload_state(s, shape, device)))
            .collect();
        Self {
            config: host.config.clone(),
            step: host.step,
            shapes: host.shapes.clone(),
            states,
        }
    }

    /// Drops the states of the parameters not in `keep` (one rank's ZeRO-1 shard).
    pub fn keep_only(&mut self, keep: &[bool]) {
        for (state, &k) in self.states.iter_mut().zip(keep) {
            if !k {
                *state = None;
            }
        }
    }

    /// The state as a host optimizer (for `optimizer.safetensors`).
    pub fn to_host(&self) -> Result<Optimizer, ModelError> {
        let states = self
            .states
            .iter()
            .map(|s| s.as_ref().map(download_state).transpose())
            .collect::<Result<_, _>>()?;
        Ok(Optimizer {
            config: self.config.clone(),
            step: self.step,
            shapes: self.shapes.clone(),
            states,
        })
    }

    /// One update of `weights` (f32 masters, `None` for frozen parameters) from `grads`, each
    /// gradient multiplied by `grad_scale` first (clipping's coefficient). `lr` is the scheduler's
    /// rate (ignored by Adafactor's relative step).
    pub fn step_scaled(
        &mut self,
        weights: &mut [Option<Tensor<2>>],
        grads: &[Option<Tensor<2>>],
        lr: f64,
        grad_scale: f32,
    ) {
        self.step += 1;
        let step = self.step;
        let slots = self.states.iter_mut().zip(weights.iter_mut()).zip(grads);
        for (((slot, w), g), shape) in slots.zip(&self.shapes) {
            // Taken, not cloned: the update may then write the old buffers in place. A parameter
            // without a state (another rank's ZeRO-1 shard) or a gradient keeps its weight.
            let Some(g) = g.as_ref() else { continue };
            let Some(state) = slot.take() else { continue };
            let Some(old) = w.take() else {
                *slot = Some(state);
                continue;
            };
            let g = scaled(g, grad_scale);
            let (new_w, new_state) = match (&self.config, state) {
                (
                    OptimizerConfig::AdamW(c),
                    DeviceState::Adam {
                        exp_avg,
                        exp_avg_sq,
                    },
                ) => {
                    let [w, m, v] = adamw(c, (step, lr), [old, exp_avg, exp_avg_sq], g);
                    let state = DeviceState::Adam {
                        exp_avg: m,
                        exp_avg_sq: v,
                    };
                    (w, state)
                }
                (OptimizerConfig::Adafactor(c), DeviceState::Factored { mut row, mut col }) => {
                    let w = adafactor_factored(c, (step, lr), shape, old, g, &mut row, &mut col);
                    (w, DeviceState::Factored { row, col })
                }
                (OptimizerConfig::Adafactor(c), DeviceState::Full { mut exp_avg_sq }) => {
                    let w = adafactor_full(c, (step, lr), old, g, &mut exp_avg_sq);
                    (w, DeviceState::Full { exp_avg_sq })
                }
                _ => unreachable!("state kind follows the optimizer kind (built in from_host)"),
            };
            *w = Some(new_w);
            *slot = Some(new_state);
        }
    }
}

/// `g` times clipping's coefficient.
fn scaled(g: &Tensor<2>, grad_scale: f32) -> Tensor<2> {
    if grad_scale == 1.0 {
        g.clone()
    } else {
        g.clone().mul_scalar(grad_scale)
    }
}

/// `torch.optim.AdamW`'s update of `[w, m, v]`, as [`super::adamw`] computes it on the host. The
/// three are taken by value, so that burn's ops may write them in place.
fn adamw(
    c: &AdamWConfig,
    (step, lr): (u64, f64),
    [w, m, v]: [Tensor<2>; 3],
    g: Tensor<2>,
) -> [Tensor<2>; 3] {
    let t = step as i32;
    let bc1 = 1.0 - c.beta1.powi(t);
    let inv_bc2_sqrt = (1.0 / (1.0 - c.beta2.powi(t)).sqrt()) as f32;
    let step_size = (lr / bc1) as f32;
    let decay = (1.0 - lr * c.weight_decay) as f32;
    let (b1, b2, eps) = (c.beta1 as f32, c.beta2 as f32, c.eps as f32);
    let m = m.mul_scalar(b1) + g.clone().mul_scalar(1.0 - b1);
    let v = v.mul_scalar(b2) + (g.clone() * g).mul_scalar(1.0 - b2);
    let denom = v.clone().sqrt().mul_scalar(inv_bc2_sqrt).add_scalar(eps);
    let w = w.mul_scalar(decay) - (m.clone() / denom).mul_scalar(step_size);
    [w, m, v]
}

/// Root mean square of all values, as a `[1, 1]` tensor (stays on the device).
fn rms(x: Tensor<2>) -> Tensor<2> {
    (x.clone() * x).mean().sqrt().reshape([1, 1])
}

/// `Adafactor._get_lr` as a `[1, 1]` tensor: the relative or external rate, times the weights'
/// RMS (at least `eps2`) when `scale_parameter`.
fn step_size(c: &AdafactorConfig, (step, lr): (u64, f64), w: &Tensor<2>) -> Tensor<2> {
    let rel = match c.lr {
        AdafactorLr::Relative => (1e-2f64).min(1.0 / (step as f64).sqrt()),
        AdafactorLr::External => lr,
    };
    if c.scale_parameter {
        rms(w.clone())
            .clamp_min(c.eps2 as f32)
            .mul_scalar(rel as f32)
    } else {
        Tensor::full([1, 1], rel as f32, &w.device())
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
    at: (u64, f64),
    shape: &ParamShape,
    w: Tensor<2>,
    g: Tensor<2>,
    row: &mut Tensor<2>,
    col: &mut Tensor<2>,
) -> Tensor<2> {
    let lr_t = step_size(c, at, &w);
    let beta2t = 1.0 - (at.0 as f64).powf(c.decay_rate);
    let (b, a) = (beta2t as f32, (1.0 - beta2t) as f32);
    // transformers' orientation: the factors are over its rows and columns, which are memfit's
    // columns and rows when the parameter is stored transposed (read so, without a transposed copy)
    let (row_dim, col_dim) = if shape.transposed { (0, 1) } else { (1, 0) };
    let u = (g.clone() * g.clone()).add_scalar(c.eps1 as f32);
    let (row_dims, col_dims) = (row.dims(), col.dims());
    let row_mean = u.clone().mean_dim(row_dim).reshape(row_dims);
    let col_mean = u.mean_dim(col_dim).reshape(col_dims);
    *row = row.clone().mul_scalar(b) + row_mean.mul_scalar(a);
    *col = col.clone().mul_scalar(b) + col_mean.mul_scalar(a);
    // _approx_sq_grad: rsqrt(row / mean(row)) ⊗ rsqrt(col), laid out as the gradient is
    let row_avg = row.clone().mean().reshape([1, 1]);
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
    at: (u64, f64),
    w: Tensor<2>,
    g: Tensor<2>,
    v: &mut Tensor<2>,
) -> Tensor<2> {
    let lr_t = step_size(c, at, &w);
    let beta2t = 1.0 - (at.0 as f64).powf(c.decay_rate);
    let (b, a) = (beta2t as f32, (1.0 - beta2t) as f32);
    *v = v.clone().mul_scalar(b)
        + (g.clone() * g.clone())
            .add_scalar(c.eps1 as f32)
            .mul_scalar(a);
    let update = v.clone().sqrt().recip() * g;
    apply(c, lr_t, w, update)
}

/// A host buffer as an f32 tensor of `dims` on `device`.
fn upload(values: &[f32], dims: [usize; 2], device: &Device) -> Tensor<2> {
    float_tensor(values, dims, device, DType::F32)
}

fn upload_state(state: &State, shape: &ParamShape, device: &Device) -> DeviceState {
    match state {
        State::Adam {
            exp_avg,
            exp_avg_sq,
        } => DeviceState::Adam {
            exp_avg: upload(exp_avg, shape.dims, device),
            exp_avg_sq: upload(exp_avg_sq, shape.dims, device),
        },
        State::Factored { row, col } => DeviceState::Factored {
            row: upload(row, [row.len(), 1], device),
            col: upload(col, [1, col.len()], device),
        },
        State::Full { exp_avg_sq } => DeviceState::Full {
            exp_avg_sq: upload(exp_avg_sq, shape.dims, device),
        },
    }
}

fn download_state(state: &DeviceState) -> Result<State, ModelError> {
    let host = |t: &Tensor<2>| memfit_nn::layers::host::to_f32_vec(t.clone());
    Ok(match state {
        DeviceState::Adam {
            exp_avg,
            exp_avg_sq,
        } => State::Adam {
            exp_avg: host(exp_avg)?,
            exp_avg_sq: host(exp_avg_sq)?,
        },
        DeviceState::Factored { row, col } => State::Factored {
            row: host(row)?,
            col: host(col)?,
        },
        DeviceState::Full { exp_avg_sq } => State::Full {
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
    /// layout, with clipping's scale, and the state comes back as the host's.
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
        for config in [
            OptimizerConfig::AdamW(AdamWConfig::default()),
            OptimizerConfig::Adafactor(AdafactorConfig::default()),
            OptimizerConfig::Adafactor(external),
        ] {
            let mut host = Optimizer::new(config.clone(), shapes.clone(), &trainable);
            let mut dev = DeviceOptimizer::from_host(&host, &device);
            let mut w_host = start.clone();
            let mut w_dev: Vec<Option<Tensor<2>>> = start
                .iter()
                .zip(&shapes)
                .zip(trainable)
                .map(|((w, s), t)| t.then(|| upload(w, s.dims, &device)))
                .collect();
            for step in 0..3 {
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
                let g_dev: Vec<Option<Tensor<2>>> = grads
                    .iter()
                    .zip(&shapes)
                    .map(|(g, s)| g.as_ref().map(|g| upload(g, s.dims, &device)))
                    .collect();
                host.step_scaled(&mut w_host, &grads, 0.05, 0.75);
                dev.step_scaled(&mut w_dev, &g_dev, 0.05, 0.75);
            }
            for (i, w) in w_dev.iter().enumerate() {
                let Some(w) = w else { continue };
                let got = memfit_nn::layers::host::to_f32_vec(w.clone()).unwrap();
                for (a, b) in got.iter().zip(&w_host[i]) {
                    assert!(
                        (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                        "{} {i}: {a} vs {b}",
                        config.name()
                    );
                }
            }
            let back = dev.to_host().unwrap();
            assert_eq!(back.step, host.step);
            for (a, b) in back.states.iter().zip(&host.states) {
                assert_eq!(a.is_some(), b.is_some());
            }
        }
    }
}
