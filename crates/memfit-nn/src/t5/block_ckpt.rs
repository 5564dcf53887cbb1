//! Per-block gradient checkpointing: the loss and its gradients of one micro-batch while keeping only
//! each block's input alive between the forward and the backward pass (as `torch.utils.checkpoint`
//! around each transformer block does in transformers' `gradient_checkpointing_enable()`).
//!
//! The forward pass runs without autodiff, saving the input of every block (and the dropout
//! generator's state there). The backward pass walks the segments in reverse: it re-runs one segment
//! with autodiff from its saved input, back-propagates the cotangent of its output through it
//! (`sum(out ⊙ cotangent)`), hands the parameter gradients to the caller and carries the input's
//! gradient to the segment before. Peak activation memory is one block's graph plus the saved
//! boundaries, for the price of a second forward pass of every block.
//!
//! Segments, in forward order: encoder embedding (an [`EmbeddingLeaf`]), encoder bias (position
//! bias + padding mask, shared by every encoder block), encoder blocks, encoder final norm; decoder
//! embedding, decoder bias, decoder blocks (each also attending to the encoder output), then the
//! head (final norm, then LM head and loss in row chunks, [`crate::t5::chunked_head`]). Tensors
//! used by several blocks (the biases, the encoder output) collect their cotangents over those
//! blocks before their own segment is back-propagated.
//!
//! Dropout draws the same masks as an unchecked pass: each segment's recompute starts from a copy of
//! the generator taken when the forward pass reached it, so loss and gradients equal an unchecked
//! pass's up to rounding (summation order; tracked and untracked kernels).

use burn::prelude::*;
use burn::tensor::Gradients;

use crate::kernels::dropout::Dropout;
use crate::layers::grad_sink::GradSink;
use crate::layers::segments::{leaf, pull};
use crate::t5::chunked_head::{HeadInputs, loss_through_head, training_chunk_logits};
use crate::t5::embedding_leaf::EmbeddingLeaf;
use crate::t5::forward::T5Forward;

/// One micro-batch's inputs, on the device without autodiff.
pub struct MicroBatch<'a> {
    pub input_ids: Tensor<2, Int>,
    /// `input_ids` as the host made them (the embedding's gradient rows).
    pub input_host: &'a [u32],
    /// Additive key-padding mask of the source `[b, 1, 1, s]` (self- and cross-attention).
    pub mask: Tensor<4>,
    pub decoder_ids: Tensor<2, Int>,
    pub decoder_host: &'a [u32],
    pub labels: &'a [u32],
    pub label_mask: &'a [bool],
}

/// Which inputs of the graph can carry a gradient back to a trainable parameter.
#[derive(Debug, Clone, Copy)]
pub struct Trainable {
    /// The shared embedding (also the tied LM head).
    pub shared: bool,
    /// Any encoder parameter (blocks, relative bias table, final norm).
    pub encoder: bool,
    pub encoder_rel_bias: bool,
    pub decoder_rel_bias: bool,
}

/// Adds the gradient of `leaf` in `grads` (if any) into `acc`.
fn collect<const D: usize>(acc: &mut Option<Tensor<D>>, leaf: &Tensor<D>, grads: &Gradients) {
    if let Some(g) = leaf.grad(grads) {
        *acc = Some(match acc.take() {
            Some(a) => a + g,
            None => g,
        });
    }
}

/// The mean token loss of `batch` (unscaled, without autodiff), after handing every parameter
/// gradient of `loss · loss_scale` to `sink` — possibly in several parts per parameter, which add up;
/// `sink` may remove what it takes (freeing it early).
///
/// `plain` holds the parameters without autodiff, `tracked` the same parameters as autodiff leaves
/// (trainable ones retaining gradients); `sink` reads the gradients of `tracked`'s leaves.
pub fn loss_and_grads<E>(
    plain: &T5Forward,
    tracked: &T5Forward,
    trainable: Trainable,
    batch: MicroBatch,
    drop: &mut Dropout,
    loss_scale: f64,
    sink: &mut dyn GradSink<Error = E>,
) -> Result<Tensor<1>, E> {
    let layout = plain.layout;
    let [_, s] = batch.input_ids.dims();
    let [_, t] = batch.decoder_ids.dims();
    let device = batch.mask.device();

    // Forward without autodiff, keeping each segment's input and dropout state.
    let enc_embed_drop = drop.clone();
    let enc_bias = plain.encoder_bias(s, &batch.mask);
    let mut x = plain.embed_input(batch.input_ids.clone(), drop);
    let mut enc_inputs = Vec::with_capacity(layout.encoder.len() + 1);
    for i in 0..layout.encoder.len() {
        enc_inputs.push((x.clone(), drop.clone()));
        x = plain.encoder_block(i, x, &enc_bias, drop);
    }
    enc_inputs.push((x.clone(), drop.clone()));
    let encoded = plain.final_norm(x, layout.encoder_norm, drop);

    let dec_embed_drop = drop.clone();
    let dec_bias = plain.decoder_bias(t, &device);
    let mut y = plain.embed_input(batch.decoder_ids.clone(), drop);
    let mut dec_inputs = Vec::with_capacity(layout.decoder.len());
    for i in 0..layout.decoder.len() {
        dec_inputs.push((y.clone(), drop.clone()));
        y = plain.decoder_block(i, y, &encoded, &dec_bias, &batch.mask, drop);
    }

    // Head: final norm, then the LM head and the loss in chunks.
    let y_leaf = leaf(&y, true);
    let out = tracked.final_norm(y_leaf.clone(), layout.decoder_norm, drop);
    let head = HeadInputs {
        labels: batch.labels,
        label_mask: batch.label_mask,
        loss_scale,
        chunk_logits: training_chunk_logits(&device),
    };
    let (loss, grads) = loss_through_head(tracked, out, head, sink)?;
    sink.finished(&layout.head_params())?;
    let mut cotangent = grads.and_then(|g| y_leaf.grad(&g));
    let (dec_params, enc_params) = (layout.block_params(true), layout.block_params(false));

    // Decoder blocks, last first; the encoder output and the bias gather their cotangents.
    let encoded_leaf = leaf(&encoded, trainable.encoder || trainable.shared);
    let dec_bias_leaf = leaf(&dec_bias, trainable.decoder_rel_bias);
    let (mut encoded_cot, mut dec_bias_cot) = (None, None);
    for (i, (input, block_drop)) in dec_inputs.into_iter().enumerate().rev() {
        let Some(cot) = cotangent.take() else { break };
        let x_leaf = leaf(&input, i > 0 || trainable.shared);
        let out = tracked.decoder_block(
            i,
            x_leaf.clone(),
            &encoded_leaf,
            &dec_bias_leaf,
            &batch.mask,
            &mut block_drop.clone(),
        );
        if let Some(mut grads) = pull(out, &cot) {
            sink.gradients(&mut grads)?;
            cotangent = x_leaf.grad(&grads);
            collect(&mut encoded_cot, &encoded_leaf, &grads);
            collect(&mut dec_bias_cot, &dec_bias_leaf, &grads);
        }
        sink.finished(&dec_params[i])?;
    }
    if let Some(cot) = dec_bias_cot
        && let Some(mut grads) = pull(tracked.decoder_bias(t, &device), &cot)
    {
        sink.gradients(&mut grads)?;
    }
    sink.finished(&[layout.decoder_rel_bias])?;
    if let Some(cot) = cotangent {
        let ids = (batch.decoder_ids, batch.decoder_host);
        embedding_backward(tracked, ids, dec_embed_drop, &cot, sink)?;
    }

    // Encoder: final norm, blocks last first, bias, embedding.
    let mut cotangent = None;
    if let Some(cot) = encoded_cot {
        let (input, norm_drop) = enc_inputs
            .pop()
            .expect("the encoder's last output is saved");
        let x_leaf = leaf(&input, true);
        let out = tracked.final_norm(x_leaf.clone(), layout.encoder_norm, &mut norm_drop.clone());
        if let Some(mut grads) = pull(out, &cot) {
            sink.gradients(&mut grads)?;
            cotangent = x_leaf.grad(&grads);
        }
    }
    sink.finished(&[layout.encoder_norm])?;
    let enc_bias_leaf = leaf(&enc_bias, trainable.encoder_rel_bias);
    let mut enc_bias_cot = None;
    for (i, (input, block_drop)) in enc_inputs.into_iter().enumerate().rev() {
        let Some(cot) = cotangent.take() else { break };
        let x_leaf = leaf(&input, i > 0 || trainable.shared);
        let out = tracked.encoder_block(i, x_leaf.clone(), &enc_bias_leaf, &mut block_drop.clone());
        if let Some(mut grads) = pull(out, &cot) {
            sink.gradients(&mut grads)?;
            cotangent = x_leaf.grad(&grads);
            collect(&mut enc_bias_cot, &enc_bias_leaf, &grads);
        }
        sink.finished(&enc_params[i])?;
    }
    if let Some(cot) = enc_bias_cot
        && let Some(mut grads) = pull(tracked.encoder_bias(s, &batch.mask), &cot)
    {
        sink.gradients(&mut grads)?;
    }
    sink.finished(&[layout.encoder_rel_bias])?;
    if let Some(cot) = cotangent {
        embedding_backward(
            tracked,
            (batch.input_ids, batch.input_host),
            enc_embed_drop,
            &cot,
            sink,
        )?;
    }
    Ok(loss)
}

/// The embedding segment of `ids` (on the device, and as the host made them; lookup, then dropout
/// with `drop`) back-propagated from the cotangent of its output: the table's gradient rows go to
/// `sink`.
fn embedding_backward<E>(
    tracked: &T5Forward,
    (ids, host_ids): (Tensor<2, Int>, &[u32]),
    mut drop: Dropout,
    cotangent: &Tensor<3>,
    sink: &mut dyn GradSink<Error = E>,
) -> Result<(), E> {
    let embedded = EmbeddingLeaf::new(tracked, ids, host_ids, true);
    match pull(drop.apply(embedded.input.clone()), cotangent) {
        Some(mut grads) => embedded.backward(&mut grads, sink),
        None => Ok(()),
    }
}
