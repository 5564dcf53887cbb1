//! Per-layer gradient checkpointing for the decoder: the forward pass runs without autodiff and
//! keeps only each layer's input (and the dropout generators' state there); the backward pass
//! re-runs one layer at a time with autodiff from its saved input, pulls the cotangent of its output
//! back through it, and hands the parameter gradients on — as `gradient_checkpointing_enable()`
//! wraps each decoder layer in `torch.utils.checkpoint`. Peak activation memory is one layer's
//! graph plus the saved inputs, for a second forward pass of every layer.
//!
//! Segments: the embedding (its gradient goes to the table as rows), the layers, then the head (the
//! final norm, then the LM head and loss in chunks). The RoPE tables and masks are constants
//! shared by every layer. Each recomputed layer replays the dropout masks of the first pass, so
//! loss and gradients equal an unchecked pass's up to rounding.

use burn::prelude::*;

use crate::ModelError;
use crate::batch::CausalLmBatch;
use crate::decoder::DecoderModel;
use crate::decoder::train::next_token_targets;
use crate::layers::chunked_head::{HeadInputs, loss_through_head, training_chunk_logits};
use crate::layers::embedding_leaf::EmbeddingTable;
use crate::layers::grad_sink::{GradSink, GradTarget, LeafSink};
use crate::layers::segments::{leaf, pull};
use crate::model::Pass;

/// The mean loss of `b` (unscaled) after handing every trainable parameter's gradient of
/// `loss · loss_scale` to `target`. `plain` holds the parameters without autodiff, `tracked` the
/// same as leaves (trainable ones requiring gradients).
pub fn loss(
    model: &DecoderModel,
    plain: &[Tensor<2>],
    tracked: &[Tensor<2>],
    trainable: &[bool],
    b: &CausalLmBatch,
    pass: &Pass,
    target: &mut dyn GradTarget,
) -> Result<Tensor<1>, ModelError> {
    let dtype = pass.precision.dtype();
    let (plain_fwd, tracked_fwd) = (model.forward(plain, dtype), model.forward(tracked, dtype));
    let (ids, ctx, mut drops) = model.pass_start(b, pass, &plain_fwd.device());
    let embed_trains = model.embedding_trains(trainable);
    let rows = &b.input;

    // Forward without autodiff, keeping each layer's input and dropout state.
    let mut x = plain_fwd.embed_untracked(ids);
    let mut inputs = Vec::with_capacity(model.layout.layers.len());
    for i in 0..model.layout.layers.len() {
        inputs.push((x.clone(), drops.clone()));
        x = plain_fwd.layer(i, x, &ctx, None, &mut drops);
    }

    // Head: the final norm, then the LM head and the loss in chunks.
    let mut sink = LeafSink {
        leaves: tracked,
        trainable,
        target,
    };
    let last = leaf(&x, true);
    let (labels, label_mask) = next_token_targets(b);
    let head = HeadInputs {
        labels: &labels,
        label_mask: &label_mask,
        loss_scale: pass.loss_scale,
        chunk_logits: training_chunk_logits(&x.device()),
    };
    let out = tracked_fwd.final_norm(last.clone());
    let (loss, grads) = loss_through_head(&tracked_fwd.lm_head(), out, head, &mut sink)?;
    sink.finished(&model.head_params())?;
    let mut cotangent = grads.and_then(|g| last.grad(&g));
    let layer_params = model.layer_params();

    // Layers, last first, each recomputed from its saved input.
    for (i, (input, layer_drops)) in inputs.into_iter().enumerate().rev() {
        let Some(cot) = cotangent.take() else { break };
        let x_leaf = leaf(&input, i > 0 || embed_trains);
        let out = tracked_fwd.layer(i, x_leaf.clone(), &ctx, None, &mut layer_drops.clone());
        if let Some(mut grads) = pull(out, &cot) {
            sink.gradients(&mut grads)?;
            cotangent = x_leaf.grad(&grads);
        }
        sink.finished(&layer_params[i])?;
    }
    if let Some(cot) = cotangent.filter(|_| embed_trains) {
        let [bt, d] = [rows.batch * rows.len, model.config.hidden_size];
        let ids: Vec<usize> = rows.ids.iter().map(|&id| id as usize).collect();
        sink.rows(tracked_fwd.table_index(), &ids, cot.reshape([bt, d]))?;
    }
    Ok(loss)
}
