//! Optimizers on the host's f32 master weights: AdamW and Adafactor, global-norm gradient clipping,
//! and optimizer state saved per parameter under transformers' tensor names, so that a resumed run
//! continues bit-identically.
//!
//! burn's optimizers clip per tensor and keep their state keyed by burn's parameter ids; the seed's
//! semantics (global clipping, transformers' Adafactor) and an exact, readable `optimizer.safetensors`
//! are simpler to guarantee here, on plain slices.

mod adafactor;
mod adamw;
mod device;
mod flat;

pub use adafactor::{AdafactorConfig, AdafactorLr};
pub use adamw::AdamWConfig;
pub use device::DeviceOptimizer;
pub use flat::{Flat, FlatLayout};

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use rayon::prelude::*;

use memfit_nn::ModelError;
use memfit_nn::kernels::vectorised::with_avx512;
use memfit_nn::weights::{NamedTensor, read_f32, write_f32};

/// Which optimizer, with its hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum OptimizerConfig {
    AdamW(AdamWConfig),
    Adafactor(AdafactorConfig),
}

impl OptimizerConfig {
    pub fn name(&self) -> &'static str {
        match self {
            Self::AdamW(_) => "adamw",
            Self::Adafactor(_) => "adafactor",
        }
    }
}

/// Where a parameter's values sit (its transformers name and shape, and whether memory holds the
/// transpose of transformers' layout): Adafactor factors in transformers' orientation.
pub use memfit_nn::model::ParamShape;

/// Per-parameter state.
#[derive(Debug, Clone, PartialEq)]
enum State {
    Adam {
        exp_avg: Vec<f32>,
        exp_avg_sq: Vec<f32>,
    },
    /// Adafactor, ≥2-D parameter: running means of squared gradients per row and per column.
    Factored { row: Vec<f32>, col: Vec<f32> },
    /// Adafactor, 1-D parameter: full running mean of squared gradients.
    Full { exp_avg_sq: Vec<f32> },
}

/// A gradient as the optimizer reads it: dense, or only some parts stored and the rest zero (an
/// embedding table's looked-up rows).
pub trait GradientValues: Sync + Send {
    /// The parameter's `len` elements as consecutive ranges, each with its values or `None` for
    /// zeros.
    fn parts(&self, len: usize) -> Vec<(Range<usize>, Option<&[f32]>)>;
    /// The values stored (every nonzero among them): what norms and clipping read.
    fn stored(&self) -> &[f32];
    fn stored_mut(&mut self) -> &mut [f32];
    /// All `len` values.
    fn dense(&self, len: usize) -> Cow<'_, [f32]>;
}

/// A plain vector is a dense gradient.
impl GradientValues for Vec<f32> {
    fn parts(&self, len: usize) -> Vec<(Range<usize>, Option<&[f32]>)> {
        vec![(0..len, Some(self))]
    }
    fn stored(&self) -> &[f32] {
        self
    }
    fn stored_mut(&mut self) -> &mut [f32] {
        self
    }
    fn dense(&self, _len: usize) -> Cow<'_, [f32]> {
        Cow::Borrowed(self)
    }
}

/// An optimizer over a fixed list of parameters; frozen ones (`trainable[i] == false`) have no state.
#[derive(Debug, Clone, PartialEq)]
pub struct Optimizer {
    pub config: OptimizerConfig,
    /// Optimizer steps taken.
    pub step: u64,
    shapes: Vec<ParamShape>,
    states: Vec<Option<State>>,
}

/// One optimizer buffer as a tensor to write, borrowed (the file is written one tensor at a time).
fn state_tensor<'a>(param: &str, suffix: &str, dims: Vec<usize>, v: &'a [f32]) -> NamedTensor<'a> {
    NamedTensor {
        name: format!("{param}.{suffix}"),
        shape: dims,
        values: Cow::Borrowed(v),
        transpose: None,
    }
}

impl Optimizer {
    /// How many parameters it steps or holds frozen.
    pub fn param_count(&self) -> usize {
        self.shapes.len()
    }

    /// Drops the states of the parameters not in `keep`: one rank's shard under ZeRO-1 (the
    /// parameters without a state are not stepped here; their owner steps them).
    pub fn keep_only(&mut self, keep: &[bool]) {
        for (state, &k) in self.states.iter_mut().zip(keep) {
            if !k {
                *state = None;
            }
        }
    }

    /// Takes the states `shard` holds where this optimizer has none: shards merged back into one.
    pub fn absorb(&mut self, shard: Optimizer) {
        for (state, theirs) in self.states.iter_mut().zip(shard.states) {
            if state.is_none() {
                *state = theirs;
            }
        }
    }

    /// f32 values of state held (what ZeRO-1 divides between ranks).
    pub fn state_values(&self) -> usize {
        (self.states.iter().flatten())
            .map(|s| match s {
                State::Adam {
                    exp_avg,
                    exp_avg_sq,
                } => exp_avg.len() + exp_avg_sq.len(),
                State::Factored { row, col } => row.len() + col.len(),
                State::Full { exp_avg_sq } => exp_avg_sq.len(),
            })
            .sum()
    }

    pub fn new(config: OptimizerConfig, shapes: Vec<ParamShape>, trainable: &[bool]) -> Self {
        let states = shapes
            .iter()
            .zip(trainable)
            .map(|(s, &t)| t.then(|| fresh_state(&config, s)))
            .collect();
        Self {
            config,
            step: 0,
            shapes,
            states,
        }
    }

    /// Applies one update. `grads[i]` is `None` for frozen parameters. `lr` is the scheduler's rate
    /// (ignored by Adafactor in relative-step mode, which computes its own).
    pub fn step<G: GradientValues>(
        &mut self,
        weights: &mut [Vec<f32>],
        grads: &[Option<G>],
        lr: f64,
    ) {
        self.step_scaled(weights, grads, lr, 1.0)
    }

    /// [`step`](Self::step) with every gradient value multiplied by `grad_scale` first (in f32,
    /// as scaling the gradients in place would): clipping's coefficient
    /// ([`clip_coefficient`]) without a pass of its own over the gradients.
    pub fn step_scaled<G: GradientValues>(
        &mut self,
        weights: &mut [Vec<f32>],
        grads: &[Option<G>],
        lr: f64,
        grad_scale: f32,
    ) {
        self.step += 1;
        let step = self.step;
        let config = &self.config;
        self.states
            .par_iter_mut()
            .zip(weights.par_iter_mut())
            .zip(grads.par_iter())
            .zip(self.shapes.par_iter())
            .for_each(|(((state, w), g), shape)| {
                let (Some(state), Some(g)) = (state.as_mut(), g.as_ref()) else {
                    return;
                };
                match (config, state) {
                    (
                        OptimizerConfig::AdamW(c),
                        State::Adam {
                            exp_avg,
                            exp_avg_sq,
                        },
                    ) => {
                        // AdamW is elementwise: zero parts update their moments and weights too.
                        for (range, part) in g.parts(w.len()) {
                            let (m, v) =
                                (&mut exp_avg[range.clone()], &mut exp_avg_sq[range.clone()]);
                            adamw::update(c, (step, lr), &mut w[range], (part, grad_scale), m, v);
                        }
                    }
                    // Adafactor's factored moments read whole rows and columns.
                    (OptimizerConfig::Adafactor(c), State::Factored { row, col }) => {
                        let g = scaled(g.dense(w.len()), grad_scale);
                        adafactor::update_factored(c, step, lr, shape, w, &g, row, col)
                    }
                    (OptimizerConfig::Adafactor(c), State::Full { exp_avg_sq }) => {
                        let g = scaled(g.dense(w.len()), grad_scale);
                        adafactor::update_full(c, step, lr, w, &g, exp_avg_sq)
                    }
                    _ => unreachable!(
                        "state kind follows the optimizer kind (built in `new`/`load`)"
                    ),
                }
            });
    }

    /// Writes the state to `optimizer.safetensors`-style file: one tensor per state buffer, named
    /// `<param>.<buffer>`, and the optimizer name and step count as metadata.
    pub fn save(&self, path: &Path) -> Result<(), ModelError> {
        let mut tensors = Vec::new();
        for (shape, state) in self.shapes.iter().zip(&self.states) {
            let Some(state) = state else { continue };
            let mut push = |suffix: &str, dims: Vec<usize>, v| {
                tensors.push(state_tensor(&shape.name, suffix, dims, v))
            };
            match state {
                State::Adam {
                    exp_avg,
                    exp_avg_sq,
                } => {
                    push("exp_avg", vec![shape.numel()], exp_avg);
                    push("exp_avg_sq", vec![shape.numel()], exp_avg_sq);
                }
                State::Factored { row, col } => {
                    push("exp_avg_sq_row", vec![row.len()], row);
                    push("exp_avg_sq_col", vec![col.len()], col);
                }
                State::Full { exp_avg_sq } => {
                    push("exp_avg_sq", vec![exp_avg_sq.len()], exp_avg_sq)
                }
            }
        }
        let metadata: HashMap<String, String> = [
            ("optimizer".to_string(), self.config.name().to_string()),
            ("step".to_string(), self.step.to_string()),
        ]
        .into_iter()
        .collect();
        write_f32(path, &tensors, Some(metadata))
    }

    /// Restores state written by [`Optimizer::save`] for the same parameters and optimizer kind.
    pub fn load(&mut self, path: &Path) -> Result<(), ModelError> {
        let (mut tensors, meta) = read_f32(path)?;
        let bad = |m: String| ModelError::Format(format!("{}: {m}", path.display()));
        let kind = meta
            .get("optimizer")
            .map(String::as_str)
            .unwrap_or("<none>");
        if kind != self.config.name() {
            return Err(bad(format!(
                "optimizer state is for {kind:?}, this run uses {:?}",
                self.config.name()
            )));
        }
        let step: u64 = meta
            .get("step")
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("metadata \"step\" is missing or not a number".into()))?;
        let mut take = |name: &str, suffix: &str, len: usize| -> Result<Vec<f32>, ModelError> {
            let key = format!("{name}.{suffix}");
            let t = tensors.remove(&key).ok_or_else(|| {
                bad(format!(
                    "tensor {key} is missing (was the parameter frozen?)"
                ))
            })?;
            if t.values.len() != len {
                return Err(bad(format!(
                    "tensor {key} has {} values, expected {len}",
                    t.values.len()
                )));
            }
            Ok(t.values)
        };
        let mut states = Vec::with_capacity(self.states.len());
        for (shape, state) in self.shapes.iter().zip(&self.states) {
            states.push(match state {
                None => None,
                Some(State::Adam { .. }) => Some(State::Adam {
                    exp_avg: take(&shape.name, "exp_avg", shape.numel())?,
                    exp_avg_sq: take(&shape.name, "exp_avg_sq", shape.numel())?,
                }),
                Some(State::Factored { row, col }) => Some(State::Factored {
                    row: take(&shape.name, "exp_avg_sq_row", row.len())?,
                    col: take(&shape.name, "exp_avg_sq_col", col.len())?,
                }),
                Some(State::Full { exp_avg_sq }) => Some(State::Full {
                    exp_avg_sq: take(&shape.name, "exp_avg_sq", exp_avg_sq.len())?,
                }),
            });
        }
        if let Some(extra) = tensors.keys().next() {
            return Err(bad(format!(
                "tensor {extra} has no trainable parameter here (different model or freeze setting?)"
            )));
        }
        self.states = states;
        self.step = step;
        Ok(())
    }
}

fn fresh_state(config: &OptimizerConfig, shape: &ParamShape) -> State {
    let n = shape.numel();
    match config {
        OptimizerConfig::AdamW(_) => State::Adam {
            exp_avg: vec![0.0; n],
            exp_avg_sq: vec![0.0; n],
        },
        // transformers' Adafactor factors parameters with ≥ 2 dimensions.
        OptimizerConfig::Adafactor(_) if shape.hf_shape.len() >= 2 => {
            let cols = *shape.hf_shape.last().unwrap_or(&1);
            State::Factored {
                row: vec![0.0; n / cols.max(1)],
                col: vec![0.0; cols],
            }
        }
        OptimizerConfig::Adafactor(_) => State::Full {
            exp_avg_sq: vec![0.0; n],
        },
    }
}

/// Global L2 norm over all gradients (f64 accumulation).
pub fn global_norm<G: GradientValues>(grads: &[Option<G>]) -> f64 {
    grads
        .par_iter()
        .flatten()
        .map(|g| sum_of_squares(g.stored()))
        .sum::<f64>()
        .sqrt()
}

/// Σ x² in f64, over sixteen lanes of partial sums: one running sum is a chain of dependent adds
/// (four cycles each), the slowest pass over the gradients of a large model.
fn sum_of_squares(v: &[f32]) -> f64 {
    const LANES: usize = 16;
    with_avx512(|| {
        let mut lanes = [0.0f64; LANES];
        let chunks = v.chunks_exact(LANES);
        let tail: f64 = chunks
            .remainder()
            .iter()
            .map(|&x| (x as f64) * (x as f64))
            .sum();
        for chunk in chunks {
            for (s, &x) in lanes.iter_mut().zip(chunk) {
                *s += (x as f64) * (x as f64);
            }
        }
        lanes.iter().sum::<f64>() + tail
    })
}

/// Gradient values times `scale` (themselves when it is 1).
fn scaled(g: Cow<'_, [f32]>, scale: f32) -> Cow<'_, [f32]> {
    if scale == 1.0 {
        return g;
    }
    Cow::Owned(with_avx512(|| g.iter().map(|x| x * scale).collect()))
}

/// What clipping to `max_norm` multiplies gradients of global norm `norm` by (torch's
/// `clip_grad_norm_`: `max_norm / (norm + 1e-6)`, applied only when below 1), as f32.
pub fn clip_coefficient(norm: f64, max_norm: f64) -> f32 {
    // 1e-6: torch.nn.utils.clip_grad_norm_'s epsilon.
    let coef = max_norm / (norm + 1e-6);
    if coef < 1.0 { coef as f32 } else { 1.0 }
}

/// Scales all gradients so that their global norm is at most `max_norm` in place (the trainer
/// passes [`clip_coefficient`] to [`Optimizer::step_scaled`] instead: the tests' reference) (torch's
/// `clip_grad_norm_`: coefficient `max_norm / (norm + 1e-6)`, applied only when below 1).
/// Returns the norm before clipping.
#[cfg(test)]
pub(crate) fn clip_global_norm<G: GradientValues>(grads: &mut [Option<G>], max_norm: f64) -> f64 {
    let norm = global_norm(grads);
    let c = clip_coefficient(norm, max_norm);
    if c < 1.0 {
        grads
            .par_iter_mut()
            .flatten()
            .for_each(|g| with_avx512(|| g.stored_mut().iter_mut().for_each(|x| *x *= c)));
    }
    norm
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clipping_is_global_not_per_tensor() {
        let mut g = vec![Some(vec![3.0f32]), None, Some(vec![4.0f32])];
        let norm = clip_global_norm(&mut g, 1.0);
        assert!((norm - 5.0).abs() < 1e-12);
        let a = g[0].as_ref().unwrap()[0];
        let b = g[2].as_ref().unwrap()[0];
        // Both scaled by the same 1/5: direction kept, global norm 1.
        assert!((a - 0.6).abs() < 1e-6 && (b - 0.8).abs() < 1e-6, "{a} {b}");
        let mut small = vec![Some(vec![0.1f32])];
        clip_global_norm(&mut small, 1.0);
        assert_eq!(small[0].as_ref().unwrap()[0], 0.1);
    }
}

#[cfg(test)]
mod step_tests {
    use super::*;

    #[test]
    fn clipping_as_the_optimizer_reads_equals_clipping_in_place() {
        let grads = vec![
            Some(vec![3.0f32, -1.5, 0.25]),
            None,
            Some(vec![4.0f32, 1e-3]),
        ];
        for config in [
            OptimizerConfig::AdamW(AdamWConfig::default()),
            OptimizerConfig::Adafactor(AdafactorConfig::default()),
        ] {
            let shapes = vec![
                shape("a", &[3], false),
                shape("b", &[1], false),
                shape("c", &[2], false),
            ];
            let start = vec![vec![0.5f32, -0.25, 1.0], vec![2.0], vec![-1.0, 0.125]];
            let (mut fused, mut in_place) = (start.clone(), start);
            let mut opt_a = Optimizer::new(config.clone(), shapes.clone(), &[true, false, true]);
            let mut opt_b = Optimizer::new(config, shapes, &[true, false, true]);
            let norm = global_norm(&grads);
            opt_a.step_scaled(&mut fused, &grads, 0.1, clip_coefficient(norm, 1.0));
            let mut clipped = grads.clone();
            assert_eq!(clip_global_norm(&mut clipped, 1.0), norm);
            opt_b.step(&mut in_place, &clipped, 0.1);
            assert_eq!(fused, in_place, "bit for bit");
        }
        assert_eq!(
            clip_coefficient(0.5, 1.0),
            1.0,
            "no clipping below the bound"
        );
    }

    fn shape(name: &str, hf: &[usize], transposed: bool) -> ParamShape {
        let (rows, cols) = match hf {
            [n] => (1, *n),
            [r, c] if transposed => (*c, *r),
            [r, c] => (*r, *c),
            _ => panic!("1-D or 2-D"),
        };
        ParamShape {
            name: name.into(),
            hf_shape: hf.to_vec(),
            transposed,
            dims: [rows, cols],
        }
    }

    #[test]
    fn adamw_single_step_matches_hand_computation() {
        // m = 0.05, v = 0.00025; bias corrections 0.1 and 0.001 → step m̂/√v̂ = 0.05/0.1 / 0.5 = 1.0·0.1;
        // decay 1 - lr·wd = 0.999: w = 0.999 - 0.1 = 0.899.
        let mut opt = Optimizer::new(
            OptimizerConfig::AdamW(AdamWConfig::default()),
            vec![shape("w", &[1], false)],
            &[true],
        );
        let mut w = vec![vec![1.0f32]];
        opt.step(&mut w, &[Some(vec![0.5])], 0.1);
        assert!((w[0][0] - 0.899).abs() < 1e-6, "{}", w[0][0]);
    }

    #[test]
    fn adafactor_relative_step_on_a_vector() {
        // Step 1: β2t = 0 so v = g²; update = g/|g|; RMS(update) = 1 (no clipping);
        // lr = min(1e-2, 1/√1) · max(1e-3, RMS(w)) = 0.01 · √2.5.
        let cfg = AdafactorConfig::default();
        let mut opt = Optimizer::new(
            OptimizerConfig::Adafactor(cfg),
            vec![shape("n", &[2], false)],
            &[true],
        );
        let mut w = vec![vec![1.0f32, 2.0]];
        opt.step(&mut w, &[Some(vec![0.5, -2.0])], 123.0);
        let lr = 0.01 * 2.5f32.sqrt();
        assert!((w[0][0] - (1.0 - lr)).abs() < 1e-6, "{:?}", w[0]);
        assert!((w[0][1] - (2.0 + lr)).abs() < 1e-6, "{:?}", w[0]);
    }

    #[test]
    fn adafactor_factored_external_lr_and_orientation() {
        // g = [[1,2],[3,4]]: row means of g² 2.5, 12.5; column means 5, 10.
        // update[r][c] = rsqrt(row[r]/mean(row)) · rsqrt(col[c]) · g[r][c].
        let expect = [
            3f64.sqrt() / 5f64.sqrt(),
            3f64.sqrt() / 10f64.sqrt() * 2.0,
            0.6f64.sqrt() / 5f64.sqrt() * 3.0,
            0.6f64.sqrt() / 10f64.sqrt() * 4.0,
        ];
        let cfg = AdafactorConfig {
            lr: AdafactorLr::External,
            scale_parameter: false,
            ..Default::default()
        };
        // Plain layout.
        let mut opt = Optimizer::new(
            OptimizerConfig::Adafactor(cfg.clone()),
            vec![shape("m", &[2, 2], false)],
            &[true],
        );
        let mut w = vec![vec![0.0f32; 4]];
        opt.step(&mut w, &[Some(vec![1.0, 2.0, 3.0, 4.0])], 0.1);
        for (got, want) in w[0].iter().zip(expect) {
            assert!((*got as f64 + 0.1 * want).abs() < 1e-6, "{:?}", w[0]);
        }
        // Transposed memory (linear weights): the same update, transposed.
        let mut opt = Optimizer::new(
            OptimizerConfig::Adafactor(cfg),
            vec![shape("m", &[2, 2], true)],
            &[true],
        );
        let mut w = vec![vec![0.0f32; 4]];
        opt.step(&mut w, &[Some(vec![1.0, 3.0, 2.0, 4.0])], 0.1);
        for (got, want) in w[0]
            .iter()
            .zip([expect[0], expect[2], expect[1], expect[3]])
        {
            assert!((*got as f64 + 0.1 * want).abs() < 1e-6, "{:?}", w[0]);
        }
    }

    #[test]
    fn frozen_parameters_have_no_state_and_do_not_move() {
        let shapes = vec![shape("a", &[2], false), shape("b", &[2], false)];
        let mut opt = Optimizer::new(
            OptimizerConfig::AdamW(AdamWConfig::default()),
            shapes,
            &[true, false],
        );
        let mut w = vec![vec![1.0f32, 1.0], vec![1.0, 1.0]];
        opt.step(&mut w, &[Some(vec![1.0, 1.0]), None], 0.1);
        assert_ne!(w[0], vec![1.0, 1.0]);
        assert_eq!(w[1], vec![1.0, 1.0]);
        assert!(opt.states[1].is_none());
    }

    #[test]
    fn state_round_trips_bit_identically() {
        let dir = tempfile::tempdir().unwrap();
        for config in [
            OptimizerConfig::AdamW(AdamWConfig::default()),
            OptimizerConfig::Adafactor(AdafactorConfig::default()),
        ] {
            let shapes = vec![shape("m", &[3, 2], true), shape("n", &[3], false)];
            let mut opt = Optimizer::new(config, shapes, &[true, true]);
            let mut w = vec![vec![0.3f32; 6], vec![0.7f32; 3]];
            let g = [
                Some(vec![0.1, -0.2, 0.3, 0.4, -0.5, 0.6]),
                Some(vec![1e-3, 2.0, -3.0]),
            ];
            opt.step(&mut w, &g, 0.01);
            opt.step(&mut w, &g, 0.01);
            let path = dir.path().join("optimizer.safetensors");
            opt.save(&path).unwrap();
            let mut fresh = Optimizer::new(opt.config.clone(), opt.shapes.clone(), &[true, true]);
            fresh.load(&path).unwrap();
            assert_eq!(fresh, opt);
            // A different optimizer kind is refused with the reason.
            let other = match opt.config {
                OptimizerConfig::AdamW(_) => OptimizerConfig::Adafactor(AdafactorConfig::default()),
                OptimizerConfig::Adafactor(_) => OptimizerConfig::AdamW(AdamWConfig::default()),
            };
            let mut wrong = Optimizer::new(other, opt.shapes.clone(), &[true, true]);
            let err = wrong.load(&path).unwrap_err().to_string();
            assert!(err.contains("optimizer state is for"), "{err}");
        }
    }
}
