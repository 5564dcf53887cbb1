//! The T5 forward pass (transformers' `T5ForConditionalGeneration`), over parameters held as a flat
//! list of tensors indexed by [`T5Layout`].
//!
//! Faithful details: RMS layer norm without mean or bias; no 1/√d_kv attention scaling (folded into
//! the init of `q`); relative position bias computed in block 0 of each stack and added in every
//! block; the encoder padding mask and the decoder's causal mask added to the scores; dropout after
//! the embedding, on attention probabilities, inside the FFN, after each sub-layer and after the final
//! norm; the tied LM head rescales the decoder output by d_model^-½.

use burn::prelude::*;
use burn::tensor::{DType, TensorData};

use crate::kernels::dropout::Dropout;
use crate::kernels::gemm_bf16::Products;
use crate::kernels::{attention_core, fused_rms_norm, linear_op};
use crate::layers::mask::MASKED;
pub use crate::layers::mask::padding_mask;
use crate::t5::T5Model;
use crate::t5::bucket::bucket_grid;
use crate::t5::config::{Activation, T5Config};
use crate::t5::layout::{AttnParams, FfnParams, T5Layout};

/// A model: configuration, layout and the current parameter tensors (tracked or not).
pub struct T5Forward<'a> {
    pub cfg: &'a T5Config,
    pub layout: &'a T5Layout,
    /// The parameters, f32 or bf16. Position biases and masks are in their dtype.
    pub params: &'a [Tensor<2>],
    /// Float dtype of the activations (f32, or bf16): the embeddings are cast to it, and every op
    /// after them keeps it. bf16 activations over f32 parameters is bf16 training on flex.
    pub dtype: DType,
}

impl<'a> T5Forward<'a> {
    /// `model`'s forward pass over `params` (its weights on a device, tracked or not) with
    /// activations in `dtype`.
    pub fn of(model: &'a T5Model, params: &'a [Tensor<2>], dtype: DType) -> Self {
        Self {
            cfg: &model.config,
            layout: &model.layout,
            params,
            dtype,
        }
    }

    fn p(&self, i: usize) -> Tensor<2> {
        self.params[i].clone()
    }

    /// How the hand-written ops multiply: bf16 operands for bf16 activations.
    pub fn products(&self) -> Products {
        Products::for_activations(self.dtype)
    }

    /// The dtype of the parameters, in which masks and position biases are built.
    pub fn param_dtype(&self) -> DType {
        self.params[self.layout.shared].dtype()
    }

    fn embed(&self, ids: Tensor<2, Int>) -> Tensor<3> {
        self.look_up(self.p(self.layout.shared), ids)
    }

    /// The embeddings of `ids` `[b, t]` in the activation dtype, looked up without autodiff: a
    /// training step makes them a leaf ([`crate::t5::embedding_leaf`]).
    pub fn embed_untracked(&self, ids: Tensor<2, Int>) -> Tensor<3> {
        self.look_up(self.p(self.layout.shared).inner(), ids)
    }

    fn look_up(&self, table: Tensor<2>, ids: Tensor<2, Int>) -> Tensor<3> {
        let [b, t] = ids.dims();
        table
            .select(0, ids.reshape([b * t]))
            .cast(self.dtype)
            .reshape([b, t, self.cfg.d_model])
    }

    fn rms_norm(&self, x: Tensor<3>, weight: usize) -> Tensor<3> {
        // T5LayerNorm: x / sqrt(mean(x²) + eps) · w — no mean subtraction, no bias.
        let w = self.p(weight).unsqueeze::<3>();
        fused_rms_norm::rms_norm_any_device(x, w, self.cfg.layer_norm_epsilon, self.dtype)
    }

    fn linear(&self, x: Tensor<3>, weight: usize) -> Tensor<3> {
        let [b, t, d] = x.dims();
        let w = self.p(weight);
        let out = w.dims()[1];
        linear_op::layer(x.reshape([b * t, d]), w, self.products()).reshape([b, t, out])
    }

    fn heads(&self, x: Tensor<3>) -> Tensor<4> {
        let [b, t, _] = x.dims();
        x.reshape([b, t, self.cfg.num_heads, self.cfg.d_kv])
            .swap_dims(1, 2)
    }

    /// Multi-head attention of `xq` over `xkv`; `bias` (`[b|1, h|1, tq, tk]`) carries the position
    /// bias and the masks.
    fn attention(
        &self,
        xq: Tensor<3>,
        xkv: Tensor<3>,
        a: &AttnParams,
        bias: &Tensor<4>,
        drop: &mut Dropout,
    ) -> Tensor<3> {
        let (k, v) = self.keys_values(xkv, a);
        self.attend(self.heads(self.linear(xq, a.q)), k, v, a, bias, drop)
    }

    /// Keys and values `[b, h, tk, d_kv]` of `xkv` under attention `a`.
    fn keys_values(&self, xkv: Tensor<3>, a: &AttnParams) -> (Tensor<4>, Tensor<4>) {
        (
            self.heads(self.linear(xkv.clone(), a.k)),
            self.heads(self.linear(xkv, a.v)),
        )
    }

    /// Queries `q` `[b, h, tq, d_kv]` attending over keys `k` and values `v`, through the output
    /// projection of `a`.
    fn attend(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        a: &AttnParams,
        bias: &Tensor<4>,
        drop: &mut Dropout,
    ) -> Tensor<3> {
        let [b, _, tq, _] = q.dims();
        let ctx = attention_core::attend(q, k, v, bias, drop);
        let ctx = ctx.swap_dims(1, 2).reshape([b, tq, self.cfg.inner_dim()]);
        self.linear(ctx, a.o)
    }

    fn ffn(&self, x: Tensor<3>, f: &FfnParams, drop: &mut Dropout) -> Tensor<3> {
        let act = |h: Tensor<3>| self.cfg.feed_forward.activation.apply(h);
        let h = match (f.wi_1, self.cfg.feed_forward.activation) {
            // Gated (T5 v1.1): act(x·wi_0) ⊙ (x·wi_1).
            (Some(wi_1), _) => drop.apply(act(self.linear(x.clone(), f.wi)) * self.linear(x, wi_1)),
            // T5 v1.0 / ChatLM: ReLU and dropout fused into one mask (less kept for backward).
            (None, Activation::Relu) => drop.apply_after_relu(self.linear(x, f.wi)),
            (None, _) => drop.apply(act(self.linear(x, f.wi))),
        };
        self.linear(h, f.wo)
    }

    /// `[1, heads, q, k]` relative position bias from the table at `table`.
    fn position_bias(
        &self,
        table: usize,
        q: usize,
        k: usize,
        q_offset: usize,
        bidirectional: bool,
        device: &Device,
    ) -> Tensor<4> {
        let ids = bucket_grid(
            q,
            k,
            q_offset,
            bidirectional,
            self.cfg.relative_attention_num_buckets,
            self.cfg.relative_attention_max_distance,
        );
        let ids = Tensor::<1, Int>::from_data(TensorData::new(ids, [q * k]), device);
        let h = self.cfg.num_heads;
        self.p(table)
            .select(0, ids)
            .reshape([q, k, h])
            .permute([2, 0, 1])
            .reshape([1, h, q, k])
    }

    /// The embedding of `ids` `[b, t]` after dropout: the input of the first block of a stack.
    pub fn embed_input(&self, ids: Tensor<2, Int>, drop: &mut Dropout) -> Tensor<3> {
        drop.apply(self.embed(ids))
    }

    /// The encoder's attention bias `[b, h, s, s]`: its relative position bias plus the key-padding
    /// `mask`. Computed once and added in every encoder block.
    pub fn encoder_bias(&self, s: usize, mask: &Tensor<4>) -> Tensor<4> {
        self.position_bias(self.layout.encoder_rel_bias, s, s, 0, true, &mask.device())
            + mask.clone()
    }

    /// The decoder's self-attention bias `[1, h, t, t]`: relative position bias plus the causal mask.
    pub fn decoder_bias(&self, t: usize, device: &Device) -> Tensor<4> {
        self.position_bias(self.layout.decoder_rel_bias, t, t, 0, false, device)
            + causal_mask(t, device, self.param_dtype())
    }

    /// Encoder block `i` applied to `x` `[b, s, d]`.
    pub fn encoder_block(
        &self,
        i: usize,
        x: Tensor<3>,
        bias: &Tensor<4>,
        drop: &mut Dropout,
    ) -> Tensor<3> {
        let blk = &self.layout.encoder[i];
        let h = self.rms_norm(x.clone(), blk.attn_norm);
        let h = self.attention(h.clone(), h, &blk.attn, bias, drop);
        let x = x + drop.apply(h);
        let h = self.rms_norm(x.clone(), blk.ffn_norm);
        let h = self.ffn(h, &blk.ffn, drop);
        x + drop.apply(h)
    }

    /// Decoder block `i` applied to `x` `[b, t, d]`, attending to `encoded` `[b, s, d]`.
    pub fn decoder_block(
        &self,
        i: usize,
        x: Tensor<3>,
        encoded: &Tensor<3>,
        self_bias: &Tensor<4>,
        cross_mask: &Tensor<4>,
        drop: &mut Dropout,
    ) -> Tensor<3> {
        let blk = &self.layout.decoder[i];
        let h = self.rms_norm(x.clone(), blk.self_norm);
        let h = self.attention(h.clone(), h, &blk.self_attn, self_bias, drop);
        let x = x + drop.apply(h);
        let h = self.rms_norm(x.clone(), blk.cross_norm);
        // Cross-attention has no position bias in T5, only the encoder padding mask.
        let h = self.attention(h, encoded.clone(), &blk.cross_attn, cross_mask, drop);
        let x = x + drop.apply(h);
        let h = self.rms_norm(x.clone(), blk.ffn_norm);
        let h = self.ffn(h, &blk.ffn, drop);
        x + drop.apply(h)
    }

    /// A stack's final RMS norm (parameter `norm`) and dropout.
    pub fn final_norm(&self, x: Tensor<3>, norm: usize, drop: &mut Dropout) -> Tensor<3> {
        drop.apply(self.rms_norm(x, norm))
    }

    /// Encoder output `[b, s, d]` (after the final norm and dropout).
    pub fn encode(&self, ids: Tensor<2, Int>, mask: &Tensor<4>, drop: &mut Dropout) -> Tensor<3> {
        self.encode_embedded(self.embed(ids), mask, drop)
    }

    /// [`Self::encode`] from the source's embeddings `[b, s, d]` (before dropout).
    pub fn encode_embedded(
        &self,
        embedded: Tensor<3>,
        mask: &Tensor<4>,
        drop: &mut Dropout,
    ) -> Tensor<3> {
        let [_, s, _] = embedded.dims();
        let bias = self.encoder_bias(s, mask);
        let mut x = drop.apply(embedded);
        for i in 0..self.layout.encoder.len() {
            x = self.encoder_block(i, x, &bias, drop);
        }
        self.final_norm(x, self.layout.encoder_norm, drop)
    }

    /// Decoder output `[b, t, d]` for decoder inputs `ids` (after the final norm and dropout).
    pub fn decode(
        &self,
        ids: Tensor<2, Int>,
        encoded: &Tensor<3>,
        cross_mask: &Tensor<4>,
        drop: &mut Dropout,
    ) -> Tensor<3> {
        self.decode_embedded(self.embed(ids), encoded, cross_mask, drop)
    }

    /// [`Self::decode`] from the decoder inputs' embeddings `[b, t, d]` (before dropout).
    pub fn decode_embedded(
        &self,
        embedded: Tensor<3>,
        encoded: &Tensor<3>,
        cross_mask: &Tensor<4>,
        drop: &mut Dropout,
    ) -> Tensor<3> {
        let [_, t, _] = embedded.dims();
        let bias = self.decoder_bias(t, &embedded.device());
        let mut x = drop.apply(embedded);
        for i in 0..self.layout.decoder.len() {
            x = self.decoder_block(i, x, encoded, &bias, cross_mask, drop);
        }
        self.final_norm(x, self.layout.decoder_norm, drop)
    }

    /// A decoding cache for `encoded` `[b, s, d]`: every decoder block's cross-attention keys and
    /// values, computed once, and empty self-attention caches.
    pub fn decoder_cache(&self, encoded: &Tensor<3>) -> DecoderCache {
        let blocks = self
            .layout
            .decoder
            .iter()
            .map(|blk| {
                let (cross_k, cross_v) = self.keys_values(encoded.clone(), &blk.cross_attn);
                BlockCache {
                    self_kv: None,
                    cross_k,
                    cross_v,
                }
            })
            .collect();
        DecoderCache { blocks, len: 0 }
    }

    /// The decoder output `[b, 1, d]` (after the final norm) at the next position for its input ids
    /// `[b, 1]`, attending to the positions already in `cache` (which it extends by one). Equals
    /// position `cache.len` of [`decode`](Self::decode) over the whole prefix, without dropout.
    pub fn decode_step(
        &self,
        ids: Tensor<2, Int>,
        cache: &mut DecoderCache,
        cross_mask: &Tensor<4>,
    ) -> Tensor<3> {
        let pos = cache.len;
        let device = ids.device();
        let mut drop = Dropout::disabled();
        // The new query at `pos` sees keys 0..=pos: no causal mask needed.
        let bias = self.position_bias(
            self.layout.decoder_rel_bias,
            1,
            pos + 1,
            pos,
            false,
            &device,
        );
        let mut x = self.embed(ids);
        for (blk, c) in self.layout.decoder.iter().zip(&mut cache.blocks) {
            let h = self.rms_norm(x.clone(), blk.self_norm);
            let (k, v) = self.keys_values(h.clone(), &blk.self_attn);
            let (k, v) = match c.self_kv.take() {
                Some((pk, pv)) => (Tensor::cat(vec![pk, k], 2), Tensor::cat(vec![pv, v], 2)),
                None => (k, v),
            };
            c.self_kv = Some((k.clone(), v.clone()));
            let q = self.heads(self.linear(h, blk.self_attn.q));
            x = x + self.attend(q, k, v, &blk.self_attn, &bias, &mut drop);
            let h = self.rms_norm(x.clone(), blk.cross_norm);
            let q = self.heads(self.linear(h, blk.cross_attn.q));
            x = x + self.attend(
                q,
                c.cross_k.clone(),
                c.cross_v.clone(),
                &blk.cross_attn,
                cross_mask,
                &mut drop,
            );
            let h = self.rms_norm(x.clone(), blk.ffn_norm);
            x = x + self.ffn(h, &blk.ffn, &mut drop);
        }
        cache.len += 1;
        self.rms_norm(x, self.layout.decoder_norm)
    }

    /// Teacher-forced decoder output `[b, t, d]` (after the final norm and dropout): the encoder over
    /// `input_ids` with its padding `mask`, then the decoder over `decoder_ids`.
    pub fn encode_decode(
        &self,
        input_ids: Tensor<2, Int>,
        mask: &Tensor<4>,
        decoder_ids: Tensor<2, Int>,
        drop: &mut Dropout,
    ) -> Tensor<3> {
        self.encode_decode_embedded(self.embed(input_ids), mask, self.embed(decoder_ids), drop)
    }

    /// [`Self::encode_decode`] from the embeddings of the source and of the decoder inputs.
    pub fn encode_decode_embedded(
        &self,
        source: Tensor<3>,
        mask: &Tensor<4>,
        decoder_inputs: Tensor<3>,
        drop: &mut Dropout,
    ) -> Tensor<3> {
        let encoded = self.encode_embedded(source, mask, drop);
        self.decode_embedded(decoder_inputs, &encoded, mask, drop)
    }

    /// Logits `[b·t, vocab]` from decoder output.
    pub fn lm_logits(&self, hidden: Tensor<3>) -> Tensor<2> {
        let [b, t, d] = hidden.dims();
        let h = hidden.reshape([b * t, d]);
        match self.layout.lm_head {
            Some(head) => linear_op::product(h, self.p(head), self.products()),
            // Tied: transformers rescales by d_model^-½ before projecting onto the embedding.
            None => linear_op::product(
                h * (d as f64).powf(-0.5),
                self.p(self.layout.shared).transpose(),
                self.products(),
            ),
        }
    }
}

/// Keys and values one decoder block has seen: `[b, h, t, d_kv]` each.
pub struct BlockCache {
    /// Self-attention over the positions decoded so far (`None` before the first).
    self_kv: Option<(Tensor<4>, Tensor<4>)>,
    cross_k: Tensor<4>,
    cross_v: Tensor<4>,
}

/// Incremental decoding state (a "KV cache"): per block, the keys and values of past positions.
pub struct DecoderCache {
    blocks: Vec<BlockCache>,
    /// Positions decoded so far.
    len: usize,
}

/// Additive causal mask `[1, 1, t, t]`: queries see keys at or before themselves.
pub fn causal_mask(t: usize, device: &Device, dtype: DType) -> Tensor<4> {
    let mut data = vec![0.0f32; t * t];
    for q in 0..t {
        for k in q + 1..t {
            data[q * t + k] = MASKED;
        }
    }
    Tensor::from_data(TensorData::new(data, [1, 1, t, t]), (device, dtype))
}
