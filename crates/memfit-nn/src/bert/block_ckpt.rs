//! Per-layer gradient checkpointing for the BERT family: the forward pass runs without autodiff and
//! keeps only each encoder layer's input (and the dropout generators' state there); the backward
//! pass re-runs one layer at a time with autodiff from its saved input, pulls the cotangent of its
//! output back through it, and hands the parameter gradients on — as transformers'
//! `gradient_checkpointing_enable()` wraps each `BertLayer` in `torch.utils.checkpoint`. Peak
//! activation memory is one layer's graph plus the saved inputs, for a second forward pass of every
//! layer (the decoder's `block_ckpt` is the same scheme).
//!
//! Segments: the embeddings (word, position and token-type rows, LayerNorm, dropout), the layers,
//! then the head (pooler, classifier, loss). Each recomputed segment replays the dropout masks of
//! the first pass, so loss and gradients equal an unchecked pass's up to rounding.

use burn::prelude::*;

use crate::ModelError;
use crate::bert::BertModel;
use crate::bert::forward::{BertForward, ClsInputs, Dropouts};
use crate::layers::grad_sink::{GradSink, GradTarget, LeafSink};
use crate::layers::loss::masked_cross_entropy;
use crate::layers::segments::{leaf, pull};
use crate::model::Pass;

/// The mean loss of `x` against `labels` (unscaled) after handing every trainable parameter's
/// gradient of `loss · loss_scale` to `target`. `plain` holds the parameters without autodiff,
/// `tracked` the same as leaves (trainable ones requiring gradients).
#[allow(clippy::too_many_arguments)]
pub fn loss(
    model: &BertModel,
    plain: &[Tensor<2>],
    tracked: &[Tensor<2>],
    trainable: &[bool],
    x: &ClsInputs,
    labels: &[u32],
    pass: &Pass,
    target: &mut dyn GradTarget,
) -> Result<Tensor<1>, ModelError> {
    let dtype = pass.precision.dtype();
    let (plain_fwd, tracked_fwd) = (
        BertForward::of(model, plain, dtype),
        BertForward::of(model, tracked, dtype),
    );
    plain_fwd.check(x)?;
    let bias = plain_fwd.attention_bias(x);
    let mut drops = Dropouts::new(&model.config, pass.seed);

    // Forward without autodiff, keeping each layer's input and dropout state.
    let embed_drops = drops.clone();
    let mut h = plain_fwd.embed(x, &mut drops);
    let layers = model.layout.layers.len();
    let mut inputs = Vec::with_capacity(layers);
    for i in 0..layers {
        inputs.push((h.clone(), drops.clone()));
        h = plain_fwd.layer(i, h, &bias, &mut drops);
    }

    // Head: pooler, classifier and loss, tracked from the last layer's output.
    let mut sink = LeafSink {
        leaves: tracked,
        trainable,
        target,
    };
    let last = leaf(&h, true);
    let logits = tracked_fwd.classify(last.clone(), &mut drops);
    let loss = masked_cross_entropy(logits, labels, &vec![true; x.batch]);
    let mut grads = loss.clone().mul_scalar(pass.loss_scale).backward();
    sink.gradients(&mut grads)?;
    sink.finished(&model.layout.head_params())?;
    let mut cotangent = last.grad(&grads);
    let layer_params = model.layout.layer_params();

    // Layers, last first, each recomputed from its saved input.
    for (i, (input, layer_drops)) in inputs.into_iter().enumerate().rev() {
        let Some(cot) = cotangent.take() else { break };
        let x_leaf = leaf(&input, true);
        let out = tracked_fwd.layer(i, x_leaf.clone(), &bias, &mut layer_drops.clone());
        if let Some(mut grads) = pull(out, &cot) {
            sink.gradients(&mut grads)?;
            cotangent = x_leaf.grad(&grads);
        }
        sink.finished(&layer_params[i])?;
    }
    // The embeddings, recomputed with their parameters tracked (the word rows as a leaf).
    if let Some(cot) = cotangent {
        let trains = trainable[model.layout.word];
        let (embed_fwd, words) = BertForward::of(model, tracked, dtype).with_word_leaf(x, trains);
        let out = embed_fwd.embed(x, &mut embed_drops.clone());
        if let Some(mut grads) = pull(out, &cot) {
            words.backward(&mut grads, &mut sink)?;
            sink.gradients(&mut grads)?;
        }
    }
    Ok(loss.inner())
}
