//! An LM head and its token loss in row chunks, forward and backward by hand: only one chunk's
//! logits exist at a time, instead of `[tokens, vocab]` several times over while every activation
//! of the model is still alive (a 151k vocabulary × 1024 tokens is 620 MB of f32 logits per copy).
//!
//! The model's output is cut from the graph: each chunk yields the head weight's gradient and the
//! chunk rows' cotangent; [`loss_through_head`] pushes the assembled cotangent back through the
//! model (`sum(out ⊙ cotangent)`), as per-block checkpointing does for every block.

use burn::prelude::*;
use burn::tensor::Gradients;
use burn::tensor::{DType, FloatDType, TensorData};

use crate::kernels::gemm_bf16::Products;
use crate::kernels::linear_op::product;
use crate::kernels::xent::{nll_and_grad_in_place, nll_and_grad_on_device};
use crate::kernels::{device, hand_written_on};
use crate::layers::grad_sink::GradSink;
use crate::layers::segments::pull;

/// Logit elements per chunk on the CPU: 8 Mi f32 = 32 MiB (a 32k vocabulary gives 256 rows); small
/// enough to be negligible beside activations, large enough that the head's GEMM stays efficient.
/// The planner's host model uses the same figure (`memfit_host::HEAD_CHUNK_LOGITS`; a test checks).
pub const CHUNK_LOGITS: usize = 8 << 20;

/// Logit elements per chunk on the GPU's code path: 32 Mi f32 = 128 MiB a copy. Each chunk is about
/// ten launches (its rows' cast, three products, the loss, the sums) and its rows are the products'
/// M: Qwen2.5-0.5B at b8 s512 (151,936 words) runs 19 chunks of 220 rows, where the CPU's size ran
/// 75 of 55 — skinny products whose rows' gradient contracts the whole vocabulary. The planner's GPU
/// model uses the same figure (`memfit_device::HEAD_CHUNK_LOGITS_GPU`; a test checks).
pub const DEVICE_CHUNK_LOGITS: usize = 32 << 20;

/// Logits per chunk in training and evaluation on `device`: [`CHUNK_LOGITS`] where the CPU's
/// hand-written ops run, [`DEVICE_CHUNK_LOGITS`] on the GPU's code path.
pub fn training_chunk_logits(device: &Device) -> usize {
    if hand_written_on(device) {
        CHUNK_LOGITS
    } else {
        DEVICE_CHUNK_LOGITS
    }
}

/// The targets of a micro-batch and how to run the head over them.
#[derive(Clone, Copy)]
pub struct HeadInputs<'a> {
    /// `[rows]` target ids, row-major like the model output.
    pub labels: &'a [u32],
    pub label_mask: &'a [bool],
    /// The micro-batch's share of the step (multiplies the loss before backward).
    pub loss_scale: f64,
    /// Logits per chunk ([`training_chunk_logits`] in training).
    pub chunk_logits: usize,
}

/// The head's weight as the loss sees it.
#[derive(Clone)]
pub struct LmHead {
    /// `[vocab, d]` when `tied` (an embedding table), `[d, vocab]` otherwise (a linear layer in
    /// memfit's layout); tracked when its gradient is wanted.
    pub weight: Tensor<2>,
    /// The weight's index among the parameters (where its gradient goes).
    pub index: usize,
    pub tied: bool,
    /// Multiplies the rows before the projection (T5's tied head rescales by d_model^-½).
    pub input_scale: f64,
    pub products: Products,
}

impl LmHead {
    fn vocab(&self) -> usize {
        let [a, b] = self.weight.dims();
        if self.tied { a } else { b }
    }
}

/// What one sweep over the chunks gives back.
struct Swept {
    /// The summed NLL: on the host (flex's fused sweep), and on the device (elsewhere: nothing is
    /// read back per chunk).
    nll: f64,
    nll_on_device: Option<Tensor<1>>,
    count: usize,
    /// Per chunk, the rows' cotangent (when gradients were wanted).
    cotangent: Vec<Tensor<2>>,
}

/// Runs the head over `flat` `[n, d]` (untracked) in chunks: the NLL of the masked targets and,
/// when `grads`, the weight's gradient (to `sink`) and the rows' cotangent for `loss · loss_scale`.
///
/// Per chunk: the logits (one GEMM), the loss and its logit gradient ([`loss_and_logit_grad`]), then the weight's and the rows' gradients (two GEMMs). The weight
/// gradient is produced in the weight's own layout, so a tied head's `[vocab, d]` gradient is not
/// a transposed view to copy.
fn sweep<E>(
    head: &LmHead,
    flat: Tensor<2>,
    inputs: HeadInputs,
    grads: bool,
    sink: &mut dyn GradSink<Error = E>,
) -> Result<Swept, E> {
    let [n, d] = flat.dims();
    let vocab = head.vocab();
    let count = inputs.label_mask.iter().filter(|m| **m).count();
    let weight_grad_wanted = grads && head.weight.is_require_grad();
    let products = head.products;
    // The products read the weight in their dtype: convert it once, not in every chunk.
    let weight = match products {
        Products::Bf16 => head.weight.clone().inner().cast(DType::BF16),
        Products::F32 => head.weight.clone().inner().cast(DType::F32),
    };
    let rows_per_chunk = (inputs.chunk_logits / vocab.max(1)).clamp(1, n.max(1));
    let mut out = Swept {
        nll: 0.0,
        nll_on_device: None,
        count,
        cotangent: Vec::with_capacity(n.div_ceil(rows_per_chunk)),
    };
    for start in (0..n).step_by(rows_per_chunk) {
        let end = (start + rows_per_chunk).min(n);
        // f32 rows (exact from bf16), so the logits come out f32 (an op's output takes its first
        // operand's dtype); bf16 products still round them, as autocast's head does.
        let rows = flat.clone().slice([start..end, 0..d]).cast(DType::F32);
        if !inputs.label_mask[start..end].iter().any(|m| *m) {
            // No target here: no loss, no gradient.
            if grads {
                out.cotangent.push(rows.zeros_like());
            }
            continue;
        }
        let x = if head.input_scale != 1.0 {
            rows * head.input_scale
        } else {
            rows
        };
        let logits = if head.tied {
            product(x.clone(), weight.clone().transpose(), products)
        } else {
            product(x.clone(), weight.clone(), products)
        };
        let Some(grad_logits) = loss_and_logit_grad(logits, &mut out, inputs, start..end, grads)
        else {
            continue;
        };
        if weight_grad_wanted {
            let grad_weight = if head.tied {
                product(grad_logits.clone().transpose(), x, products)
            } else {
                product(x.transpose(), grad_logits.clone(), products)
            };
            sink.parameter(head.index, grad_weight)?;
        }
        let rows_grad = if head.tied {
            product(grad_logits, weight.clone(), products)
        } else {
            product(grad_logits, weight.clone().transpose(), products)
        };
        out.cotangent.push(if head.input_scale != 1.0 {
            rows_grad * head.input_scale
        } else {
            rows_grad
        });
    }
    Ok(out)
}

/// Adds a chunk's NLL to `out` and returns the gradient of its logits (`None` when no gradient is
/// wanted). On flex, one fused sweep over the logits' own buffer ([`nll_and_grad_in_place`]); on
/// the GPU's code path the device op (one launch); elsewhere burn's ops ([`nll_and_grad_on_device`]).
fn loss_and_logit_grad(
    logits: Tensor<2>,
    out: &mut Swept,
    inputs: HeadInputs,
    rows: std::ops::Range<usize>,
    grads: bool,
) -> Option<Tensor<2>> {
    let (dtype, device) = (logits.dtype(), logits.device());
    let vocab = logits.dims()[1];
    let grad_scale = (inputs.loss_scale / out.count.max(1) as f64) as f32;
    let (labels, mask) = (&inputs.labels[rows.clone()], &inputs.label_mask[rows]);
    if !hand_written_on(&device) {
        let (nll, grad) = if device::runs_on(&logits) {
            device::xent::nll_and_grad(logits, labels, mask, grad_scale)
        } else {
            nll_and_grad_on_device(logits.cast(DType::F32), labels, mask, grad_scale)
        };
        out.nll_on_device = Some(match out.nll_on_device.take() {
            Some(sum) => sum + nll,
            None => nll,
        });
        return grads.then(|| grad.cast(dtype));
    }
    // Worked on in the tensor's own buffer: no copy out and back.
    let mut values = logits.cast(FloatDType::F32).into_data();
    let slice = values.as_mut_slice().expect("f32 logits");
    out.nll += nll_and_grad_in_place(slice, vocab, labels, mask, grad_scale);
    grads.then(|| Tensor::<2>::from_data(values, (&device, dtype)))
}

/// The mean loss as a one-element tensor on `device`.
fn mean_loss(swept: &Swept, device: &Device) -> Tensor<1> {
    let n = swept.count.max(1) as f64;
    let host = Tensor::from_data(TensorData::new(vec![(swept.nll / n) as f32], [1]), device);
    match &swept.nll_on_device {
        Some(sum) => host + sum.clone().div_scalar(n as f32),
        None => host,
    }
}

/// The loss over model output `hidden` `[b, t, d]` (values only; untracked) and the cotangent of
/// `hidden` for `loss · loss_scale`; the head weight's gradient goes to `sink` chunk by chunk, of
/// at most `chunk_logits` logits each.
pub fn head_loss_and_cotangent<E>(
    head: &LmHead,
    hidden: Tensor<3>,
    inputs: HeadInputs,
    sink: &mut dyn GradSink<Error = E>,
) -> Result<(Tensor<1>, Tensor<3>), E> {
    let [b, t, d] = hidden.dims();
    let (dtype, device) = (hidden.dtype(), hidden.device());
    let swept = sweep(head, hidden.reshape([b * t, d]), inputs, true, sink)?;
    let loss = mean_loss(&swept, &device);
    let cotangent = Tensor::cat(swept.cotangent, 0)
        .reshape([b, t, d])
        .cast(dtype);
    Ok((loss, cotangent))
}

/// The mean loss of the masked targets over model output `hidden` `[b, t, d]`, without gradients,
/// the logits in chunks as in training (evaluation of a large vocabulary).
pub fn head_loss(head: &LmHead, hidden: Tensor<3>, inputs: HeadInputs) -> Tensor<1> {
    struct Nowhere;
    impl GradSink for Nowhere {
        type Error = std::convert::Infallible;
        fn gradients(&mut self, _: &mut Gradients) -> Result<(), Self::Error> {
            Ok(())
        }
        fn parameter(&mut self, _: usize, _: Tensor<2>) -> Result<(), Self::Error> {
            Ok(())
        }
        fn rows(&mut self, _: usize, _: &[usize], _: Tensor<2>) -> Result<(), Self::Error> {
            Ok(())
        }
    }
    let [b, t, d] = hidden.dims();
    let device = hidden.device();
    let flat = hidden.inner().reshape([b * t, d]);
    let Ok(swept) = sweep(head, flat, inputs, false, &mut Nowhere);
    mean_loss(&swept, &device)
}

/// The loss of the targets over the tracked model output `out` `[b, t, d]`, back-propagated
/// through the head in chunks and then through `out`'s graph: every parameter gradient of
/// `loss · loss_scale` goes to `sink`. Returns the loss and the gradients of the last backward
/// (after `sink`), where the caller finds the gradients of its own leaves under `out`.
pub fn loss_through_head<E>(
    head: &LmHead,
    out: Tensor<3>,
    inputs: HeadInputs,
    sink: &mut dyn GradSink<Error = E>,
) -> Result<(Tensor<1>, Option<Gradients>), E> {
    let (loss, cotangent) = head_loss_and_cotangent(head, out.clone().inner(), inputs, sink)?;
    let grads = match pull(out, &cotangent) {
        Some(mut grads) => {
            sink.gradients(&mut grads)?;
            Some(grads)
        }
        None => None,
    };
    Ok((loss, grads))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPU's hand-written ops keep the CPU's chunk; the GPU's code path (any device that is not
    /// flex with them on: ndarray here, as cubecl's) takes the larger one.
    #[test]
    #[allow(deprecated)] // ndarray: a device that is not flex, as cubecl's are
    fn the_gpu_code_path_takes_the_larger_chunk() {
        if hand_written_on(&Device::flex()) {
            assert_eq!(training_chunk_logits(&Device::flex()), CHUNK_LOGITS);
        }
        assert_eq!(
            training_chunk_logits(&Device::ndarray()),
            DEVICE_CHUNK_LOGITS
        );
        // Qwen2.5-0.5B's vocabulary: 220 rows a chunk on the GPU, 55 on the CPU
        assert_eq!(DEVICE_CHUNK_LOGITS / 151_936, 220);
        assert_eq!(CHUNK_LOGITS / 151_936, 55);
    }
}
