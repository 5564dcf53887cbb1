//! [`ModelEngine`]: any memfit-nn family ([`TrainModel`]) with its optimizer and accumulated
//! gradients behind the [`Engine`] trait the loop drives.
//!
//! Where the training state lives is the engine's [`Placement`]: in host RAM ([`HostState`], the
//! model's own f32 masters, lent to flex without a copy) or on the device ([`DeviceState`]:
//! masters, gradients and optimizer states as device tensors). The model code, the loop and the
//! checkpoints are the same for both.

use std::path::Path;

use burn::prelude::*;
use burn::tensor::{DType, StreamId};

use super::device_state::DeviceState;
use super::host_state::{self, HostState};
use super::out_of_memory;
use super::sending::{SendBucket, TakeGradient, accumulate_into};
use super::{
    Classify, Continue, Engine, EngineOptions, Generate, GenerateConfig, ParamCounts, Placement,
    Replica, StepStats, TokenRows,
};
use crate::optim::Optimizer;
use memfit_nn::ModelError;
use memfit_nn::kernels::hand_written_on;
use memfit_nn::layers::host::{float_tensor, to_f32_vec};
use memfit_nn::model::{
    CausalGenerate, ParamShape, Pass, Seq2SeqGenerate, SequenceClassifier, TrainModel,
};

pub struct ModelEngine<M: TrainModel> {
    model: M,
    options: EngineOptions,
    trainable: Vec<bool>,
    /// The model's parameter shapes (fixed for its life).
    shapes: Vec<ParamShape>,
    state: TrainingState,
    device: Device,
}

/// Where the masters, gradients and optimizer state live.
enum TrainingState {
    Host(HostState),
    /// Boxed: the device's tensors and layouts outweigh the host state's few fields.
    Device(Box<DeviceState>),
}

/// The model's f32 masters and which of them train.
struct Masters<'a> {
    params: &'a [Vec<f32>],
    shapes: &'a [ParamShape],
    trainable: &'a [bool],
}

impl TrainingState {
    /// `masters` and `optimizer` where `options.placement` puts them (the host state holds the
    /// model's own masters, so it takes only the optimizer).
    fn place(
        options: &EngineOptions,
        device: &Device,
        masters: Masters<'_>,
        optimizer: Optimizer,
    ) -> Self {
        match options.placement {
            Placement::Host => Self::Host(HostState::new(optimizer)),
            Placement::Device => Self::Device(Box::new(DeviceState::new(
                masters.params,
                masters.shapes,
                masters.trainable,
                &optimizer,
                (device.clone(), compute_dtype(options)),
            ))),
        }
    }
}

/// The dtype of the weights a pass reads: on flex the f32 masters themselves (the hand-written
/// bf16 ops take f32 weights beside bf16 activations), elsewhere the precision's.
fn compute_dtype(options: &EngineOptions) -> DType {
    if hand_written_on(&options.backend.device()) {
        DType::F32
    } else {
        options.precision.dtype()
    }
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
        let masters = Masters {
            params: model.params(),
            shapes: &shapes,
            trainable: &trainable,
        };
        let state = TrainingState::place(&options, &device, masters, optimizer);
        Ok(Self {
            state,
            model,
            options,
            trainable,
            shapes,
            device,
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
        engine.state = TrainingState::Host(HostState::new(engine.fresh_optimizer()));
        Ok(engine)
    }

    /// An optimizer with no steps taken, over the trained parameters.
    fn fresh_optimizer(&self) -> Optimizer {
        Optimizer::new(
            self.options.optimizer.clone(),
            self.shapes.clone(),
            &self.trainable,
        )
    }

    /// The training state of the model's masters and `optimizer`, where the placement puts it.
    fn placed(&self, optimizer: Optimizer) -> TrainingState {
        let masters = Masters {
            params: self.model.params(),
            shapes: &self.shapes,
            trainable: &self.trainable,
        };
        TrainingState::place(&self.options, &self.device, masters, optimizer)
    }

    pub fn model(&self) -> &M {
        &self.model
    }

    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// Optimizer steps taken (restored by `load` with the optimizer).
    pub fn optimizer_step(&self) -> u64 {
        match &self.state {
            TrainingState::Host(h) => h.optimizer.step,
            TrainingState::Device(d) => d.optimizer_step(),
        }
    }

    /// The gradients accumulated so far, as dense host copies (f32, memfit layout; `None`: frozen
    /// or none yet).
    pub fn accumulated_gradients(&self) -> Vec<Option<Vec<f32>>> {
        match &self.state {
            TrainingState::Host(h) => h.gradients_on_host(&self.shapes),
            TrainingState::Device(d) => d.gradients_on_host(),
        }
    }

    /// Global norm of the gradients accumulated so far (0 before the first micro-batch).
    pub fn accumulated_grad_norm(&self) -> f64 {
        match &self.state {
            TrainingState::Host(h) => h.grad_norm(),
            TrainingState::Device(d) => d.grad_norm().unwrap_or(f64::NAN),
        }
    }

    /// The weights a pass computes with, on the device.
    pub fn weights_on_device(&self) -> Vec<Tensor<2>> {
        match &self.state {
            TrainingState::Host(h) => h.weights(
                self.model.params(),
                &self.shapes,
                (&self.device, self.options.precision.dtype()),
            ),
            TrainingState::Device(d) => d.weights(),
        }
    }

    /// Whether a micro-batch runs on the host masters' own buffers: on flex a device tensor can take
    /// a host `Vec<f32>` without copying it, so the weights exist once instead of twice while the
    /// step's activations are alive.
    fn lends_weights(&self) -> bool {
        hand_written_on(&self.device)
    }

    fn pass(&self, loss_scale: f32, seed: u64) -> Pass {
        Pass {
            seed,
            loss_scale: f64::from(loss_scale),
            precision: self.options.precision,
            grad_ckpt: self.options.grad_ckpt,
        }
    }

    /// A micro-batch with the state in host RAM.
    fn accumulate_host(
        &mut self,
        batch: &M::Batch,
        pass: &Pass,
        send: Option<&mut SendBucket<'_>>,
    ) -> Result<f32, ModelError> {
        let lends = self.lends_weights();
        let TrainingState::Host(host) = &mut self.state else {
            unreachable!("called for the host placement")
        };
        let train = (self.trainable.as_slice(), self.shapes.as_slice());
        if !lends {
            let dtype = self.options.precision.dtype();
            let plain = host.weights(self.model.params(), &self.shapes, (&self.device, dtype));
            let acc = host.accumulators(&self.shapes, &self.device);
            return run_pass(&self.model, &plain, (acc, send), train, (batch, pass));
        }
        host.invalidate();
        let plain = host_state::lend_weights(self.model.params_mut(), &self.shapes, &self.device);
        let acc = host.accumulators(&self.shapes, &self.device);
        let loss = run_pass(&self.model, &plain, (acc, send), train, (batch, pass));
        host_state::reclaim_weights(self.model.params_mut(), plain)?;
        loss
    }

    /// A micro-batch with the state on the device.
    fn accumulate_device(
        &mut self,
        batch: &M::Batch,
        pass: &Pass,
        send: Option<&mut SendBucket<'_>>,
    ) -> Result<f32, ModelError> {
        let TrainingState::Device(dev) = &mut self.state else {
            unreachable!("called for the device placement")
        };
        let plain = dev.weights();
        let acc = dev.accumulators(&self.shapes);
        let train = (self.trainable.as_slice(), self.shapes.as_slice());
        run_pass(&self.model, &plain, (acc, send), train, (batch, pass))
    }

    /// `work` over the weights on the device, without autodiff (evaluation, prediction), in
    /// rayon's pool; the device running out of memory is an error, not a panic.
    fn on_device<T: Send>(
        &self,
        work: impl FnOnce(&[Tensor<2>]) -> Result<T, ModelError> + Send,
    ) -> Result<T, ModelError> {
        out_of_memory::caught(&self.device, || {
            let params = self.weights_on_device();
            in_pool(|| work(&params))
        })
    }

    /// [`Engine::accumulate`], sending finished gradients to `send` when given.
    fn accumulate_sending(
        &mut self,
        batch: &M::Batch,
        (loss_scale, seed): (f32, u64),
        send: Option<&mut SendBucket<'_>>,
    ) -> Result<f32, ModelError> {
        self.model.check_batch(batch)?;
        let pass = self.pass(loss_scale, seed);
        match self.state {
            TrainingState::Host(_) => self.accumulate_host(batch, &pass, send),
            TrainingState::Device(_) => {
                // burn's tensor ops panic where an allocation fails on the device; that one
                // failure becomes an error the loop can act on (any other panic goes on up).
                let device = self.device.clone();
                out_of_memory::caught(&device, || self.accumulate_device(batch, &pass, send))
            }
        }
    }
}

/// One forward + backward of `model` over `plain` in rayon's pool, its gradients into `acc` (and
/// out to `send` as they are final, when given).
fn run_pass<M: TrainModel, A: TakeGradient + Send>(
    model: &M,
    plain: &[Tensor<2>],
    (acc, send): (A, Option<&mut SendBucket<'_>>),
    (trainable, shapes): (&[bool], &[ParamShape]),
    (batch, pass): (&M::Batch, &Pass),
) -> Result<f32, ModelError> {
    in_pool(|| {
        accumulate_into(acc, send, (trainable, shapes), |target| {
            model.accumulate(plain, trainable, batch, pass, target)
        })
    })
}

/// Runs `work` on a thread of rayon's pool (the caller waits): the many parallel sections inside
/// a micro-batch then run as nested work in the pool, not as hand-offs from an outside thread that
/// sleeps and is woken for each (thousands of context switches per step with one thread).
///
/// On the caller's cubecl stream, whichever worker runs it: cubecl queues each thread's work on a
/// stream of its own, with a memory pool of its own, so passes run by the workers rayon happened to
/// pick would spread a GPU run's tensors over a pool per worker and make each step wait on the
/// others' streams (a suspect for NVML's peak at twice the pool's on an H100, docs/gpu.md).
fn in_pool<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    let stream = StreamId::current();
    let mut out = None;
    rayon::scope(|_| out = Some(stream.executes(work)));
    out.expect("the scope ran its work")
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
        self.accumulate_sending(batch, (loss_scale, seed), None)
    }

    fn discard_gradients(&mut self) {
        match &mut self.state {
            TrainingState::Host(h) => h.clear_gradients(),
            TrainingState::Device(d) => d.clear_gradients(),
        }
    }

    fn is_out_of_memory(error: &ModelError) -> bool {
        matches!(error, ModelError::OutOfMemory(_))
    }

    fn step(&mut self, lr: f64, max_grad_norm: Option<f64>) -> Result<StepStats, ModelError> {
        let grad_norm = match &mut self.state {
            TrainingState::Host(h) => {
                h.step(self.model.params_mut(), &self.trainable, lr, max_grad_norm)
            }
            TrainingState::Device(d) => d.step(lr, max_grad_norm)?,
        };
        Ok(StepStats { grad_norm })
    }

    fn eval_loss(&self, batch: &M::Batch) -> Result<f32, ModelError> {
        self.model.check_batch(batch)?;
        self.on_device(|params| self.model.eval_loss(params, batch, self.options.precision))
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

    fn save(&mut self, dir: &Path) -> Result<(), ModelError> {
        if let TrainingState::Device(d) = &mut self.state {
            d.sync_host(self.model.params_mut())?;
        }
        self.model.save(dir)?;
        let path = dir.join("optimizer.safetensors");
        match &self.state {
            TrainingState::Host(h) => h.optimizer.save(&path),
            TrainingState::Device(d) => d.optimizer_to_host()?.save(&path),
        }
    }

    fn load(&mut self, dir: &Path, with_optimizer: bool) -> Result<(), ModelError> {
        let optimizer = if with_optimizer {
            let mut loaded = self.fresh_optimizer();
            loaded.load(&dir.join("optimizer.safetensors"))?;
            loaded
        } else {
            // without the file's state, the run keeps its own (as before a load)
            match &self.state {
                TrainingState::Host(h) => h.optimizer.clone(),
                TrainingState::Device(d) => d.optimizer_to_host()?,
            }
        };
        // The model replaces its weights only once all have loaded; the optimizer after it.
        self.model.load(dir)?;
        self.state = self.placed(optimizer);
        Ok(())
    }
}

impl<M: TrainModel + Send> Replica for ModelEngine<M> {
    fn device(&self) -> Device {
        self.device.clone()
    }

    fn accumulate_and_send(
        &mut self,
        batch: &M::Batch,
        (loss_scale, seed): (f32, u64),
        send: &mut SendBucket<'_>,
    ) -> Result<f32, ModelError> {
        self.accumulate_sending(batch, (loss_scale, seed), Some(send))
    }

    fn take_gradients(&mut self) -> Result<Vec<Option<Tensor<2>>>, ModelError> {
        Ok(match &mut self.state {
            TrainingState::Host(h) => h.take_gradients(&self.shapes, &self.trainable, &self.device),
            TrainingState::Device(d) => d.take_gradients(&self.shapes),
        })
    }

    fn trained_sizes(&self) -> Vec<Option<usize>> {
        (self.shapes.iter().zip(&self.trainable))
            .map(|(s, &t)| t.then(|| s.numel()))
            .collect()
    }

    fn keep_optimizer_states(&mut self, keep: &[bool]) -> Result<(), ModelError> {
        match &mut self.state {
            TrainingState::Host(h) => h.optimizer.keep_only(keep),
            TrainingState::Device(d) => d.keep_optimizer_states(keep),
        }
        Ok(())
    }

    fn optimizer_state(&self) -> Result<Optimizer, ModelError> {
        match &self.state {
            TrainingState::Host(h) => Ok(h.optimizer.clone()),
            TrainingState::Device(d) => d.optimizer_to_host(),
        }
    }

    fn masters_for_gather(&self, owned: &[bool]) -> Result<Vec<Option<Tensor<2>>>, ModelError> {
        Ok(match &self.state {
            TrainingState::Host(_) => (self.model.params().iter())
                .zip(&self.shapes)
                .zip(self.trainable.iter().zip(owned))
                .map(|((w, s), (&t, &own))| {
                    let zeros;
                    let values = if own {
                        w.as_slice()
                    } else {
                        zeros = vec![0.0; s.numel()];
                        &zeros
                    };
                    t.then(|| float_tensor(values, s.dims, &self.device, DType::F32))
                })
                .collect(),
            TrainingState::Device(d) => d.masters_for_gather(owned),
        })
    }

    fn put_masters(&mut self, masters: Vec<Option<Tensor<2>>>) -> Result<(), ModelError> {
        match &mut self.state {
            TrainingState::Host(h) => {
                h.invalidate();
                for (w, m) in self.model.params_mut().iter_mut().zip(masters) {
                    if let Some(m) = m {
                        *w = to_f32_vec(m)?;
                    }
                }
            }
            TrainingState::Device(d) => d.put_masters(masters),
        }
        Ok(())
    }

    fn put_gradients(&mut self, grads: Vec<Option<Tensor<2>>>) -> Result<(), ModelError> {
        match &mut self.state {
            TrainingState::Host(h) => h.put_gradients(grads),
            TrainingState::Device(d) => {
                d.put_gradients(grads);
                Ok(())
            }
        }
    }
}

impl<M: Seq2SeqGenerate> Generate for ModelEngine<M> {
    fn generate(
        &self,
        sources: &TokenRows,
        config: &GenerateConfig,
    ) -> Result<Vec<Vec<u32>>, ModelError> {
        self.on_device(|params| {
            (self.model).generate(params, sources, config, self.options.precision)
        })
    }
}

impl<M: SequenceClassifier> Classify for ModelEngine<M> {
    fn labels(&self) -> Vec<String> {
        self.model.labels()
    }

    fn logits(&self, batch: &M::Batch) -> Result<Vec<f32>, ModelError> {
        self.model.check_batch(batch)?;
        self.on_device(|params| self.model.logits(params, batch, self.options.precision))
    }
}

impl<M: CausalGenerate> Continue for ModelEngine<M> {
    fn continue_prompts(
        &self,
        prompts: &[Vec<u32>],
        config: &GenerateConfig,
    ) -> Result<Vec<Vec<u32>>, ModelError> {
        self.on_device(|params| {
            (self.model).generate(params, prompts, config, self.options.precision)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_work_runs_on_the_callers_stream() {
        let caller = StreamId::current();
        for _ in 0..16 {
            assert_eq!(in_pool(StreamId::current), caller);
        }
        // a data-parallel rank's thread queues on its own stream: so does its pool work
        let rank = StreamId::allocate();
        assert_eq!(rank.executes(|| in_pool(StreamId::current)), rank);
    }
}
