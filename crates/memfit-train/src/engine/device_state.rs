//! The training state placed on the device ([`Placement::Device`](super::Placement::Device)): f32
//! master weights of the trained parameters, their accumulated gradients and the optimizer state
//! are tensors on the engine's device; the weights a pass computes with are cast from the masters
//! once per optimizer step. Per step only a few scalars leave the device (the loss, the gradient
//! norm); the host copies of the weights are refreshed only when a checkpoint is written.

use burn::prelude::*;
use burn::tensor::{DType, FloatDType, IndexingUpdateOp, TensorData};

use crate::optim::{DeviceOptimizer, Flat, FlatLayout, Optimizer};
use memfit_nn::ModelError;
use memfit_nn::kernels::device::staged_sum;
use memfit_nn::layers::grad_sink::GradTarget;
use memfit_nn::layers::host::{float_tensor, scalar, to_f32_vec};
use memfit_nn::model::ParamShape;

pub(super) struct DeviceState {
    device: Device,
    /// The dtype a pass computes with (bf16 weights off flex under `--precision bf16`).
    compute_dtype: DType,
    /// Where each trained parameter sits in `masters` (and in a step's flat gradients).
    layout: FlatLayout,
    /// f32 masters of the trained parameters, end to end in chunks (none: nothing is trained).
    masters: Flat,
    /// The frozen weights, uploaded once at `compute_dtype` (no f32 copy of a frozen base).
    frozen: Vec<Option<Tensor<2>>>,
    /// The weights a pass reads: views of the masters cast to `compute_dtype` (one cast), and the
    /// frozen ones.
    compute: Vec<Tensor<2>>,
    /// Accumulated f32 gradients (`None`: frozen, or none yet this step).
    grads: Vec<Option<Tensor<2>>>,
    optimizer: DeviceOptimizer,
    /// The host's weights lag the masters (an optimizer step since the last download).
    host_stale: bool,
}

impl DeviceState {
    /// Uploads `params` (host masters) and the optimizer's state to `device`.
    pub(super) fn new(
        params: &[Vec<f32>],
        shapes: &[ParamShape],
        trainable: &[bool],
        optimizer: &Optimizer,
        (device, compute_dtype): (Device, DType),
    ) -> Self {
        let layout = FlatLayout::new(
            shapes
                .iter()
                .zip(trainable)
                .map(|(s, &t)| t.then_some(s.dims)),
        );
        let masters = layout.join_host(|i| &params[i], &device);
        let frozen = params
            .iter()
            .zip(shapes)
            .zip(trainable)
            .map(|((w, s), &t)| (!t).then(|| float_tensor(w, s.dims, &device, compute_dtype)))
            .collect();
        let mut state = Self {
            optimizer: DeviceOptimizer::from_host(optimizer, &device),
            grads: vec![None; params.len()],
            device,
            compute_dtype,
            layout,
            masters,
            frozen,
            compute: Vec::new(),
            host_stale: false,
        };
        state.recast();
        state
    }

    pub(super) fn weights(&self) -> Vec<Tensor<2>> {
        self.compute.clone()
    }

    pub(super) fn optimizer_step(&self) -> u64 {
        self.optimizer.step
    }

    pub(super) fn accumulators<'a>(
        &'a mut self,
        shapes: &'a [ParamShape],
    ) -> DeviceAccumulators<'a> {
        DeviceAccumulators {
            acc: &mut self.grads,
            shapes,
            device: &self.device,
        }
    }

    /// Global L2 norm of the accumulated gradients: one scalar read back.
    pub(super) fn grad_norm(&self) -> Result<f64, ModelError> {
        norm(self.grads.iter().flatten(), &self.device)
    }

    /// The accumulated gradients taken out (a trained parameter without one yet: zeros; frozen:
    /// `None`), for a collective between ranks.
    pub(super) fn take_gradients(&mut self, shapes: &[ParamShape]) -> Vec<Option<Tensor<2>>> {
        (self.grads.iter_mut().zip(shapes).enumerate())
            .map(|(i, (g, s))| {
                self.layout.contains(i).then(|| {
                    g.take()
                        .unwrap_or_else(|| Tensor::zeros(s.dims, (&self.device, DType::F32)))
                })
            })
            .collect()
    }

    /// `grads` (what [`DeviceState::take_gradients`] took, reduced) as the accumulated gradients.
    pub(super) fn put_gradients(&mut self, grads: Vec<Option<Tensor<2>>>) {
        self.grads = grads;
    }

    /// The masters of `owned` parameters, zeros for the other trained ones (`None`: frozen): what a
    /// sum over the ranks turns into every owner's masters (ZeRO-1's gather).
    pub(super) fn masters_for_gather(&self, owned: &[bool]) -> Vec<Option<Tensor<2>>> {
        (0..owned.len())
            .map(|i| {
                let m = self.layout.view(&self.masters, i)?;
                Some(if owned[i] { m } else { m.zeros_like() })
            })
            .collect()
    }

    /// `masters` (the gathered ones) as the masters; the compute weights recast from them.
    pub(super) fn put_masters(&mut self, mut masters: Vec<Option<Tensor<2>>>) {
        self.compute.clear();
        self.masters.clear();
        let gathered = |i: usize| masters[i].take().map(|m| m.cast(FloatDType::F32));
        self.masters = self.layout.flatten(gathered, &self.device);
        self.recast();
        self.host_stale = true;
    }

    pub(super) fn keep_optimizer_states(&mut self, keep: &[bool]) {
        self.optimizer.keep_only(keep);
    }

    /// Clips, updates the masters, clears the gradients and recasts the compute weights: one
    /// launch per op for every parameter (the gradients are laid out as the masters first; a
    /// trained parameter that received no gradient this step takes zeros).
    pub(super) fn step(&mut self, lr: f64, max_grad_norm: Option<f64>) -> Result<f64, ModelError> {
        let grads = &mut self.grads;
        let g = self.layout.flatten(|i| grads[i].take(), &self.device);
        // The norm and clipping's coefficient stay on the device until the update is done: a step
        // reads nothing back before it (what a replayed graph needs), the norm once after.
        let squares = squares_on_device(&g, &self.device);
        let scale = max_grad_norm.map(|max| clip_coefficient_on_device(squares.clone(), max));
        // The old compute copies go first, so that fp32's (views of the masters themselves) do
        // not pin the old masters while the update writes the new ones.
        self.compute.clear();
        let masters = std::mem::take(&mut self.masters);
        self.masters = self
            .optimizer
            .step_flat(masters, &self.layout, g, (lr, scale));
        self.clear_gradients();
        self.recast();
        self.host_stale = true;
        Ok(f64::from(scalar(squares)?).sqrt())
    }

    /// The compute weights: views of the masters cast once, and the frozen weights.
    fn recast(&mut self) {
        let cast: Flat = (self.masters.iter())
            .map(|m| m.clone().cast(self.compute_dtype))
            .collect();
        self.compute = (self.frozen.iter().enumerate())
            .map(|(i, f)| match f {
                Some(f) => f.clone(),
                None => self
                    .layout
                    .view(&cast, i)
                    .expect("a parameter is trained or frozen"),
            })
            .collect();
    }

    /// Copies the masters into the host's weights, if an optimizer step moved them since the last
    /// time (one download).
    pub(super) fn sync_host(&mut self, params: &mut [Vec<f32>]) -> Result<(), ModelError> {
        if !self.host_stale {
            return Ok(());
        }
        let host = self.layout.to_host(&self.masters)?;
        for (w, m) in params.iter_mut().zip(host) {
            if let Some(m) = m {
                *w = m;
            }
        }
        self.host_stale = false;
        Ok(())
    }

    pub(super) fn optimizer_to_host(&self) -> Result<Optimizer, ModelError> {
        self.optimizer.to_host()
    }

    pub(super) fn clear_gradients(&mut self) {
        self.grads.iter_mut().for_each(|g| *g = None);
    }

    /// The gradients accumulated so far, on the host (for checks).
    pub(super) fn gradients_on_host(&self) -> Vec<Option<Vec<f32>>> {
        (self.grads.iter())
            .map(|g| g.as_ref().and_then(|g| to_f32_vec(g.clone()).ok()))
            .collect()
    }
}

/// The sum of the squares of all the values of `tensors` (a gradient per parameter, or the chunks
/// of laid-out gradients) as a `[1]` tensor on `device` (0 for none).
fn squares_on_device<'a, const D: usize>(
    tensors: impl IntoIterator<Item = &'a Tensor<D>>,
    device: &Device,
) -> Tensor<1> {
    let squares: Vec<Tensor<1>> = (tensors.into_iter())
        .map(|t| staged_sum(t.clone() * t.clone()))
        .collect();
    if squares.is_empty() {
        return Tensor::zeros([1], (device, DType::F32));
    }
    Tensor::cat(squares, 0).sum()
}

/// The L2 norm of all the values of `tensors`: one scalar read back.
fn norm<'a, const D: usize>(
    tensors: impl IntoIterator<Item = &'a Tensor<D>>,
    device: &Device,
) -> Result<f64, ModelError> {
    Ok(f64::from(scalar(squares_on_device(tensors, device))?).sqrt())
}

/// `torch.nn.utils.clip_grad_norm_`'s coefficient, `max_norm / (norm + 1e-6)` at most 1, from the
/// sum of squares, computed on the device: in f64 where the device has it, as the host's
/// [`crate::optim::clip_coefficient`] (a coefficient an ulp apart moves a bf16 run's weights
/// apart within 20 steps), else in f32 (wgpu).
fn clip_coefficient_on_device(squares: Tensor<1>, max_norm: f64) -> Tensor<1> {
    let device = squares.device();
    let wide = if device.supports_dtype(FloatDType::F64) {
        FloatDType::F64
    } else {
        FloatDType::F32
    };
    let norm = squares.cast(wide).sqrt();
    let max = Tensor::full([1], max_norm, (&device, DType::from(wide)));
    (max / norm.add_scalar(1e-6))
        .clamp_max(1.0)
        .cast(FloatDType::F32)
}

impl super::sending::TakeGradient for DeviceAccumulators<'_> {
    fn take_dense(&mut self, index: usize) -> Tensor<2> {
        let dims = self.shapes[index].dims;
        (self.acc[index].take()).unwrap_or_else(|| Tensor::zeros(dims, (self.device, DType::F32)))
    }
}

/// The device accumulators a micro-batch's gradients are added to, one per parameter.
pub(super) struct DeviceAccumulators<'a> {
    acc: &'a mut [Option<Tensor<2>>],
    shapes: &'a [ParamShape],
    device: &'a Device,
}

impl GradTarget for DeviceAccumulators<'_> {
    fn parameter(&mut self, index: usize, grad: Tensor<2>) -> Result<(), ModelError> {
        let dims = self.shapes[index].dims;
        if grad.dims() != dims {
            return Err(ModelError::Input(format!(
                "gradient of {} has shape {:?}, the parameter {dims:?}",
                self.shapes[index].name,
                grad.dims()
            )));
        }
        let g = grad.cast(FloatDType::F32);
        let slot = &mut self.acc[index];
        *slot = Some(match slot.take() {
            Some(a) => a + g,
            None => g,
        });
        Ok(())
    }

    fn rows(&mut self, index: usize, ids: &[usize], grad: Tensor<2>) -> Result<(), ModelError> {
        let [rows, width] = self.shapes[index].dims;
        super::check_row_ids(ids, rows)?;
        let ids: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
        let n = ids.len();
        let ids = Tensor::<1, Int>::from_data(TensorData::new(ids, [n]), self.device);
        let g = grad.cast(FloatDType::F32).reshape([n, width]);
        let slot = &mut self.acc[index];
        let table = slot
            .take()
            .unwrap_or_else(|| Tensor::zeros([rows, width], (self.device, DType::F32)));
        *slot = Some(table.select_assign(0, ids, g, IndexingUpdateOp::Add));
        Ok(())
    }
}
