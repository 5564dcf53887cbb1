//! The training state placed in host RAM ([`Placement::Host`](super::Placement::Host)): the model's
//! own f32 masters, gradients accumulated on the host and the optimizer on host slices. On the flex
//! (CPU) backend a micro-batch runs on the masters' own buffers, lent to the device tensors without
//! a copy; elsewhere the weights are uploaded once per optimizer step (on a GPU this is optimizer
//! offload).

use std::sync::Mutex;

use burn::prelude::*;
use burn::tensor::{DType, TensorData};

use crate::engine::gradient::Gradient;
use crate::optim::{GradientValues, Optimizer, clip_coefficient, global_norm};
use memfit_nn::ModelError;
use memfit_nn::layers::grad_sink::GradTarget;
use memfit_nn::layers::host::{float_tensor, to_f32_vec};
use memfit_nn::model::ParamShape;

pub(super) struct HostState {
    pub(super) optimizer: Optimizer,
    /// Accumulated gradients (host, f32), `None` for frozen parameters and before the first
    /// micro-batch.
    grads: Vec<Option<Gradient>>,
    /// Device copies of the weights, rebuilt after each optimizer step or load.
    uploaded: Mutex<Option<Vec<Tensor<2>>>>,
}

impl HostState {
    pub(super) fn new(optimizer: Optimizer) -> Self {
        let n = optimizer.param_count();
        Self {
            optimizer,
            grads: std::iter::repeat_with(|| None).take(n).collect(),
            uploaded: Mutex::new(None),
        }
    }

    /// The weights on the device, uploaded once per optimizer step.
    pub(super) fn weights(
        &self,
        params: &[Vec<f32>],
        shapes: &[ParamShape],
        (device, dtype): (&Device, DType),
    ) -> Vec<Tensor<2>> {
        let mut guard = self.uploaded.lock().unwrap_or_else(|p| p.into_inner());
        guard
            .get_or_insert_with(|| {
                (params.iter().zip(shapes))
                    .map(|(w, s)| float_tensor(w, s.dims, device, dtype))
                    .collect()
            })
            .clone()
    }

    pub(super) fn invalidate(&mut self) {
        *self.uploaded.get_mut().unwrap_or_else(|p| p.into_inner()) = None;
    }

    pub(super) fn accumulators<'a>(
        &'a mut self,
        shapes: &'a [ParamShape],
        device: &'a Device,
    ) -> HostAccumulators<'a> {
        HostAccumulators {
            acc: &mut self.grads,
            shapes,
            device,
        }
    }

    pub(super) fn grad_norm(&self) -> f64 {
        global_norm(&self.grads)
    }

    pub(super) fn gradients_on_host(&self, shapes: &[ParamShape]) -> Vec<Option<Vec<f32>>> {
        (self.grads.iter().zip(shapes))
            .map(|(g, shape)| g.as_ref().map(|g| g.to_dense(shape.numel())))
            .collect()
    }

    /// Clips, updates `params` in place, clears the gradients. Returns the norm before clipping.
    pub(super) fn step(
        &mut self,
        params: &mut [Vec<f32>],
        trainable: &[bool],
        lr: f64,
        max_grad_norm: Option<f64>,
    ) -> f64 {
        // Parameters that received no gradient this step (unused) take a zero gradient.
        for (g, &t) in self.grads.iter_mut().zip(trainable) {
            if t && g.is_none() {
                *g = Some(Gradient::zero());
            }
        }
        let grad_norm = self.grad_norm();
        // clipping scales the gradients as the optimizer reads them
        let scale = max_grad_norm.map_or(1.0, |max| clip_coefficient(grad_norm, max));
        self.optimizer.step_scaled(params, &self.grads, lr, scale);
        self.clear_gradients();
        self.invalidate();
        grad_norm
    }

    pub(super) fn clear_gradients(&mut self) {
        self.grads.iter_mut().for_each(|g| *g = None);
    }

    /// The accumulated gradients taken out as dense f32 tensors on `device` (a trained parameter
    /// without one yet: zeros; frozen: `None`), for a collective between ranks.
    pub(super) fn take_gradients(
        &mut self,
        shapes: &[ParamShape],
        trainable: &[bool],
        device: &Device,
    ) -> Vec<Option<Tensor<2>>> {
        (self.grads.iter_mut().zip(shapes).zip(trainable))
            .map(|((g, s), &t)| t.then(|| dense_tensor(g.take(), s, device)))
            .collect()
    }

    /// `grads` (what [`HostState::take_gradients`] took, reduced) as the accumulated gradients.
    pub(super) fn put_gradients(
        &mut self,
        grads: Vec<Option<Tensor<2>>>,
    ) -> Result<(), ModelError> {
        for (slot, g) in self.grads.iter_mut().zip(grads) {
            *slot = g.map(Gradient::take).transpose()?;
        }
        Ok(())
    }
}

/// Moves the master weights into flex tensors (no copy); [`reclaim_weights`] moves them back. In
/// between, the model's parameters are empty vectors.
pub(super) fn lend_weights(
    params: &mut [Vec<f32>],
    shapes: &[ParamShape],
    device: &Device,
) -> Vec<Tensor<2>> {
    (params.iter_mut().zip(shapes))
        .map(|(w, s)| {
            Tensor::from_data(
                TensorData::new(std::mem::take(w), s.dims),
                (device, DType::F32),
            )
        })
        .collect()
}

/// Moves lent weights back (no copy when nothing else holds them, a copy otherwise).
pub(super) fn reclaim_weights(
    params: &mut [Vec<f32>],
    tensors: Vec<Tensor<2>>,
) -> Result<(), ModelError> {
    for (w, t) in params.iter_mut().zip(tensors) {
        *w = to_f32_vec(t)?;
    }
    Ok(())
}

/// The host accumulators a micro-batch's gradients are added to, one per parameter (`None`: frozen,
/// or nothing yet).
pub(super) struct HostAccumulators<'a> {
    acc: &'a mut [Option<Gradient>],
    shapes: &'a [ParamShape],
    device: &'a Device,
}

/// An accumulated gradient (zeros if none) as a dense f32 tensor on `device`.
fn dense_tensor(g: Option<Gradient>, shape: &ParamShape, device: &Device) -> Tensor<2> {
    let dense = g.map_or_else(|| vec![0.0; shape.numel()], |g| g.to_dense(shape.numel()));
    Tensor::from_data(TensorData::new(dense, shape.dims), (device, DType::F32))
}

impl super::sending::TakeGradient for HostAccumulators<'_> {
    fn take_dense(&mut self, index: usize) -> Tensor<2> {
        dense_tensor(self.acc[index].take(), &self.shapes[index], self.device)
    }
}

impl GradTarget for HostAccumulators<'_> {
    fn parameter(&mut self, index: usize, grad: Tensor<2>) -> Result<(), ModelError> {
        let g = Gradient::take(grad)?;
        match &mut self.acc[index] {
            // A later part of the same gradient is added without any temporary beyond its own.
            Some(a) => a.add_dense(g),
            slot @ None => *slot = Some(g),
        }
        Ok(())
    }

    fn rows(&mut self, index: usize, ids: &[usize], grad: Tensor<2>) -> Result<(), ModelError> {
        let [_, width] = grad.dims();
        super::check_row_ids(ids, self.shapes[index].numel() / width.max(1))?;
        let g = Gradient::take(grad)?;
        self.acc[index]
            .get_or_insert_with(|| Gradient::rows(width))
            .add_rows(ids, width, g.stored());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lent_weights_come_back_without_a_copy() {
        // The point of lending: a Vec<f32> moved into a flex tensor and back keeps its buffer.
        let w: Vec<f32> = (0..4096).map(|i| i as f32).collect();
        let ptr = w.as_ptr();
        let t = Tensor::<2>::from_data(TensorData::new(w, [64, 64]), (&Device::flex(), DType::F32));
        let back = to_f32_vec(t).unwrap();
        assert_eq!(back.as_ptr(), ptr, "the buffer was copied");
        assert_eq!(back[4095], 4095.0);
    }
}
