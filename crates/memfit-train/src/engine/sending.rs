//! A micro-batch whose gradients leave as soon as they are final: the model declares, as its
//! backward moves from block to block, which parameters receive nothing more
//! ([`GradTarget::finished`]); their accumulated gradients are taken out then and handed to a
//! data-parallel reduction, which runs while the backward goes on (DDP's bucketed all-reduce).
//! What the model never declares leaves at the end, in parameter order.

use burn::prelude::*;
use memfit_nn::ModelError;
use memfit_nn::layers::grad_sink::GradTarget;
use memfit_nn::model::ParamShape;

/// Parameters' accumulated gradients, by parameter index.
pub type GradBucket = Vec<(usize, Tensor<2>)>;

/// Where a rank's finished gradients go (a reduction's queue); `Err`: it stopped, with why.
pub type SendBucket<'a> = dyn FnMut(GradBucket) -> Result<(), String> + Send + 'a;

/// Accumulators a finished parameter's gradient can be taken out of.
pub(super) trait TakeGradient: GradTarget {
    /// Trained parameter `index`'s accumulated gradient, dense f32 on the device (zeros if it has
    /// none yet), removed from the accumulators.
    fn take_dense(&mut self, index: usize) -> Tensor<2>;
}

/// [`TakeGradient`] accumulators that send each finished trained parameter's gradient out.
struct Sending<'a, 's, A> {
    inner: A,
    trainable: &'a [bool],
    shapes: &'a [ParamShape],
    sent: Vec<bool>,
    send: &'a mut SendBucket<'s>,
}

impl<A: TakeGradient> Sending<'_, '_, A> {
    /// The trained parameters not sent yet, sent (after the backward: the last bucket).
    fn send_the_rest(&mut self) -> Result<(), ModelError> {
        let all: Vec<usize> = (0..self.sent.len()).collect();
        self.finished(&all)
    }

    fn not_sent(&self, index: usize) -> Result<(), ModelError> {
        match self.sent[index] {
            false => Ok(()),
            true => Err(ModelError::Reduction(format!(
                "a gradient of {} arrived after the model declared it final",
                self.shapes[index].name
            ))),
        }
    }
}

impl<A: TakeGradient> GradTarget for Sending<'_, '_, A> {
    fn parameter(&mut self, index: usize, grad: Tensor<2>) -> Result<(), ModelError> {
        self.not_sent(index)?;
        self.inner.parameter(index, grad)
    }

    fn rows(&mut self, index: usize, ids: &[usize], grad: Tensor<2>) -> Result<(), ModelError> {
        self.not_sent(index)?;
        self.inner.rows(index, ids, grad)
    }

    fn finished(&mut self, params: &[usize]) -> Result<(), ModelError> {
        let mut bucket = Vec::new();
        for &i in params {
            if self.trainable[i] && !self.sent[i] {
                self.sent[i] = true;
                bucket.push((i, self.inner.take_dense(i)));
            }
        }
        if bucket.is_empty() {
            return Ok(());
        }
        (self.send)(bucket).map_err(ModelError::Reduction)
    }
}

/// `run` over `acc`, or, with `send`, over `acc` sending finished gradients out, the rest after.
pub(super) fn accumulate_into<A: TakeGradient>(
    mut acc: A,
    send: Option<&mut SendBucket<'_>>,
    (trainable, shapes): (&[bool], &[ParamShape]),
    run: impl FnOnce(&mut dyn GradTarget) -> Result<f32, ModelError>,
) -> Result<f32, ModelError> {
    let Some(send) = send else {
        return run(&mut acc);
    };
    let mut sending = Sending {
        inner: acc,
        trainable,
        shapes,
        sent: vec![false; trainable.len()],
        send,
    };
    let loss = run(&mut sending)?;
    sending.send_the_rest()?;
    Ok(loss)
}
