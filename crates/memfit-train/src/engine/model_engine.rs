//! [`ModelEngine`]: any memfit-nn family ([`TrainModel`]) with its optimizer and accumulated
//! gradients behind the [`Engine`] trait the loop drives.
//!
//! The parameters live on the host as f32 master copies (the model's), the gradients of a step are
//! accumulated on the host, and the optimizer updates the master copies in place. On the flex (CPU)
//! backend a micro-batch runs on the master copies' own buffers, lent to the device tensors without a
//! copy; elsewhere the weights are uploaded once per optimizer step.

use std::path::Path;
use std::sync::Mutex;

use burn::prelude::*;
use burn::tensor::{DType, TensorData};

use super::{
    Classify, Continue, Engine, EngineOptions, Generate, GenerateConfig, ParamCounts, StepStats,
    TokenRows,
};
use crate::engine::gradient::Gradient;
use crate::engine::options::Backend;
use crate::optim::{GradientValues, Optimizer, clip_coefficient, global_norm};
use memfit_nn::ModelError;
use memfit_nn::layers::grad_sink::GradTarget;
use memfit_nn::model::{
    CausalGenerate, ParamShape, Pass, Seq2SeqGenerate, SequenceClassifier, TrainModel,
};

pub struct ModelEngine<M: TrainModel> {
    model: M,
    options: EngineOptions,
    trainable: Vec<bool>,
    /// The model's parameter shapes (fixed for its life).
    shapes: Vec<ParamShape>,
    optimizer: Optimizer,
    /// Accumulated gradients (host, f32), `None` for frozen parameters and before the first
    /// micro-batch.
    grads: Vec<Option<Gradient>>,
    device: Device,
    /// Device copies of the weights, rebuilt after each optimizer step or load.
    uploaded: Mutex<Option<Vec<Tensor<2>>>>,
}

impl<M: TrainModel> ModelEngine<M> {
    pub fn new(model: M, options: EngineOptions) -> Result<Self, ModelError> {
        let device = options.backend.device();
        let dtype = options.precision.dtype();
        if !device.supports_dtype(dtype) {
            return Err(ModelError::Input(format!(
                "precision {}: the {:?} backend does not support {dtype:?}",
                options.precision.name(),
                options.backend
            )));
        }
        let trainable = model.trainable(&options.freeze)?;
        let shapes = model.param_shapes();
        let optimizer = Optimizer::new(options.optimizer.clone(), shapes.clone(), &trainable);
        Ok(Self {
            grads: std::iter::repeat_with(|| None)
                .take(trainable.len())
                .collect(),
            model,
            options,
            trainable,
            shapes,
            optimizer,
            device,
            uploaded: Mutex::new(None),
        })
    }

    /// An engine that only runs the model (`memfit predict`): nothing trains, so no optimizer
    /// state exists.
    pub fn for_inference(model: M, precision: super::Precision) -> Result<Self, ModelError> {
        let options = EngineOptions {
            precision,
            ..EngineOptions::default()
        };
        let mut engine = Self::new(model, options)?;
        engine.trainable.iter_mut().for_each(|t| *t = false);
        engine.optimizer = Optimizer::new(
            engine.options.optimizer.clone(),
            engine.shapes.clone(),
            &engine.trainable,
        );
        engine.grads.iter_mut().for_each(|g| *g = None);
        Ok(engine)
    }

    pub fn model(&self) -> &M {
        &self.model
    }

    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// Optimizer steps taken (restored by `load` with the optimizer).
    pub fn optimizer_step(&self) -> u64 {
        self.optimizer.step
    }

    /// The gradients accumulated so far, as dense copies (host f32, memfit layout; `None`: frozen
    /// or none yet).
    pub fn accumulated_gradients(&self) -> Vec<Option<Vec<f32>>> {
        self.grads
            .iter()
            .zip(&self.shapes)
            .map(|(g, shape)| g.as_ref().map(|g| g.to_dense(shape.numel())))
            .collect()
    }

    /// Global norm of the gradients accumulated so far (0 before the first micro-batch).
    pub fn accumulated_grad_norm(&self) -> f64 {
        global_norm(&self.grads)
    }

    /// The weights on the device (uploaded once per optimizer step), for inference and checks.
    pub fn weights_on_device(&self) -> Vec<Tensor<2>> {
        let mut guard = self.uploaded.lock().unwrap_or_else(|p| p.into_inner());
        guard
            .get_or_insert_with(|| self.upload(self.options.precision.dtype()))
            .clone()
    }

    fn upload(&self, dtype: DType) -> Vec<Tensor<2>> {
        self.model
            .params()
            .iter()
            .zip(&self.shapes)
            .map(|(w, shape)| {
                Tensor::from_data(
                    TensorData::new(w.clone(), shape.dims),
                    (&self.device, dtype),
                )
            })
            .collect()
    }

    fn invalidate(&mut self) {
        *self.uploaded.get_mut().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Whether a micro-batch runs on the master weights' own buffers: on the flex (CPU) backend a
    /// device tensor can take a host `Vec<f32>` without copying it, so the weights exist once
    /// instead of twice while the step's activations are alive. In bf16 the hand-written ops take
    /// these f32 weights beside bf16 activations.
    fn lends_weights(&self) -> bool {
        self.options.backend == Backend::Flex
    }

    /// Moves the master weights into device tensors (no copy); [`Self::reclaim_weights`] moves
    /// them back. In between, the model's parameters are empty vectors.
    fn lend_weights(&mut self) -> Vec<Tensor<2>> {
        self.model
            .params_mut()
            .iter_mut()
            .zip(&self.shapes)
            .map(|(w, shape)| {
                Tensor::from_data(
                    TensorData::new(std::mem::take(w), shape.dims),
                    (&self.device, DType::F32),
                )
            })
            .collect()
    }

    /// Moves lent weights back (no copy when nothing else holds them, a copy otherwise).
    fn reclaim_weights(&mut self, tensors: Vec<Tensor<2>>) -> Result<(), ModelError> {
        for (w, t) in self.model.params_mut().iter_mut().zip(tensors) {
            *w = to_f32_vec(t)?;
        }
        Ok(())
    }

    /// Forward + backward of one micro-batch on the untracked weights `plain`.
    fn accumulate_with(
        &mut self,
        plain: &[Tensor<2>],
        batch: &M::Batch,
        pass: &Pass,
    ) -> Result<f32, ModelError> {
        let mut target = Accumulators {
            acc: &mut self.grads,
            shapes: &self.shapes,
        };
        self.model
            .accumulate(plain, &self.trainable, batch, pass, &mut target)
    }

    fn pass(&self, loss_scale: f32, seed: u64) -> Pass {
        Pass {
            seed,
            loss_scale: f64::from(loss_scale),
            precision: self.options.precision,
            grad_ckpt: self.options.grad_ckpt,
        }
    }
}

/// Runs `work` on a thread of rayon's pool (the caller waits): the many parallel sections inside
/// a micro-batch then run as nested work in the pool, not as hand-offs from an outside thread that
/// sleeps and is woken for each (thousands of context switches per step with one thread).
fn in_pool<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    let mut out = None;
    rayon::scope(|_| out = Some(work()));
    out.expect("the scope ran its work")
}

fn to_f32_vec<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>, ModelError> {
    memfit_nn::layers::host::to_f32_vec(t)
}

/// The host accumulators a micro-batch's gradients are added to, one per parameter (`None`: frozen,
/// or nothing yet).
struct Accumulators<'a> {
    acc: &'a mut [Option<Gradient>],
    shapes: &'a [ParamShape],
}

impl GradTarget for Accumulators<'_> {
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
        let rows = self.shapes[index].numel() / width.max(1);
        if let Some(&id) = ids.iter().find(|&&id| id >= rows) {
            return Err(ModelError::Input(format!(
                "embedding row {id} is outside the table ({rows} rows)"
            )));
        }
        let g = Gradient::take(grad)?;
        self.acc[index]
            .get_or_insert_with(|| Gradient::rows(width))
            .add_rows(ids, width, g.stored());
        Ok(())
    }
}

impl<M: TrainModel> Engine for ModelEngine<M> {
    type Batch = M::Batch;
    type Error = ModelError;

    fn accumulate(
        &mut self,
        batch: &M::Batch,
        loss_scale: f32,
        seed: u64,
    ) -> Result<f32, ModelError> {
        self.model.check_batch(batch)?;
        let pass = self.pass(loss_scale, seed);
        if !self.lends_weights() {
            let plain = self.weights_on_device();
            return in_pool(|| self.accumulate_with(&plain, batch, &pass));
        }
        self.invalidate();
        let plain = self.lend_weights();
        let loss = in_pool(|| self.accumulate_with(&plain, batch, &pass));
        self.reclaim_weights(plain)?;
        loss
    }

    fn step(&mut self, lr: f64, max_grad_norm: Option<f64>) -> Result<StepStats, ModelError> {
        // Parameters that received no gradient this step (unused) take a zero gradient.
        for (i, g) in self.grads.iter_mut().enumerate() {
            if self.trainable[i] && g.is_none() {
                *g = Some(Gradient::zero());
            }
        }
        let grad_norm = global_norm(&self.grads);
        // clipping scales the gradients as the optimizer reads them
        let scale = max_grad_norm.map_or(1.0, |max| clip_coefficient(grad_norm, max));
        self.optimizer
            .step_scaled(self.model.params_mut(), &self.grads, lr, scale);
        self.grads.iter_mut().for_each(|g| *g = None);
        self.invalidate();
        Ok(StepStats { grad_norm })
    }

    fn eval_loss(&self, batch: &M::Batch) -> Result<f32, ModelError> {
        self.model.check_batch(batch)?;
        let params = self.weights_on_device();
        in_pool(|| self.model.eval_loss(&params, batch, self.options.precision))
    }

    fn param_counts(&self) -> ParamCounts {
        let trainable = self
            .shapes
            .iter()
            .zip(&self.trainable)
            .filter(|(_, t)| **t)
            .map(|(s, _)| s.numel() as u64)
            .sum();
        ParamCounts {
            total: self.model.total_params(),
            trainable,
        }
    }

    fn save(&self, dir: &Path) -> Result<(), ModelError> {
        self.model.save(dir)?;
        self.optimizer.save(&dir.join("optimizer.safetensors"))
    }

    fn load(&mut self, dir: &Path, with_optimizer: bool) -> Result<(), ModelError> {
        let mut optimizer = self.optimizer.clone();
        if with_optimizer {
            optimizer.load(&dir.join("optimizer.safetensors"))?;
        }
        // The model replaces its weights only once all have loaded; the optimizer after it.
        self.model.load(dir)?;
        self.optimizer = optimizer;
        self.grads.iter_mut().for_each(|g| *g = None);
        self.invalidate();
        Ok(())
    }
}

impl<M: Seq2SeqGenerate> Generate for ModelEngine<M> {
    fn generate(
        &self,
        sources: &TokenRows,
        config: &GenerateConfig,
    ) -> Result<Vec<Vec<u32>>, ModelError> {
        let params = self.weights_on_device();
        in_pool(|| {
            self.model
                .generate(&params, sources, config, self.options.precision)
        })
    }
}

impl<M: SequenceClassifier> Classify for ModelEngine<M> {
    fn labels(&self) -> Vec<String> {
        self.model.labels()
    }

    fn logits(&self, batch: &M::Batch) -> Result<Vec<f32>, ModelError> {
        self.model.check_batch(batch)?;
        let params = self.weights_on_device();
        in_pool(|| self.model.logits(&params, batch, self.options.precision))
    }
}

impl<M: CausalGenerate> Continue for ModelEngine<M> {
    fn continue_prompts(
        &self,
        prompts: &[Vec<u32>],
        config: &GenerateConfig,
    ) -> Result<Vec<Vec<u32>>, ModelError> {
        let params = self.weights_on_device();
        in_pool(|| {
            self.model
                .generate(&params, prompts, config, self.options.precision)
        })
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
