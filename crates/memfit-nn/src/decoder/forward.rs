//! The decoder's forward pass (transformers' `LlamaForCausalLM` and its Qwen2/Mistral/Qwen3
//! variants) over weights held as a flat list of tensors indexed by [`DecoderLayout`], with LoRA
//! adapters beside the frozen projections they adapt.
//!
//! Faithful details: pre-norm blocks (`x + attn(norm(x))`, then `+ mlp(norm(·))`); RMSNorm in
//! f32 with the weight applied after; RoPE on q and k after their projections (and after Qwen3's
//! per-head norms); scores scaled by head_dim^-½; SwiGLU `down(silu(gate(x)) ⊙ up(x))`; no
//! dropout but attention's (`attention_dropout`) and LoRA's.

use burn::prelude::*;
use burn::tensor::DType;

use crate::decoder::attention::{Context, LayerCache, attend_causal_or_masked, grouped_attention};
use crate::decoder::config::DecoderConfig;
use crate::decoder::layout::{DecoderLayout, Proj};
use crate::decoder::lora::LoraLayout;
use crate::kernels::dropout::{Dropout, SplitMix64};
use crate::kernels::fused_rms_norm;
use crate::kernels::gemm_bf16::Products;
use crate::kernels::{device, swiglu_op};
use crate::layers::activation::Activation;
use crate::layers::chunked_head::LmHead;
use crate::layers::embedding_leaf::EmbeddingTable;
use crate::layers::lora::{Adapter, frozen_plus_adapter};

/// The adapters' parameters on a device, and their layout.
#[derive(Clone, Copy)]
pub struct LoraTensors<'a> {
    pub layout: &'a LoraLayout,
    /// A and B of every adapter, in [`LoraLayout::specs`] order (tracked when they train).
    pub params: &'a [Tensor<2>],
}

/// The random draws of a pass: attention's dropout and LoRA's, from separate streams.
#[derive(Debug, Clone)]
pub struct Dropouts {
    pub attention: Dropout,
    pub lora: Dropout,
}

impl Dropouts {
    /// Training: attention's and LoRA's probabilities, each stream seeded from `seed`.
    pub fn new(seed: u64, attention: f64, lora: f64) -> Self {
        let mut rng = SplitMix64::new(seed);
        Self {
            attention: Dropout::new(rng.next_u64(), attention),
            lora: Dropout::new(rng.next_u64(), lora),
        }
    }

    pub fn disabled() -> Self {
        Self {
            attention: Dropout::disabled(),
            lora: Dropout::disabled(),
        }
    }
}

/// A model: configuration, layout, its weights and adapters as tensors (tracked or not).
pub struct DecoderForward<'a> {
    pub cfg: &'a DecoderConfig,
    pub layout: &'a DecoderLayout,
    /// The weights, f32 or bf16, by layout index: the trained parameters under full training,
    /// the frozen base under LoRA.
    pub base: &'a [Tensor<2>],
    pub lora: Option<LoraTensors<'a>>,
    /// Float dtype of the activations (f32 or bf16).
    pub dtype: DType,
}

impl<'a> DecoderForward<'a> {
    fn p(&self, i: usize) -> Tensor<2> {
        self.base[i].clone()
    }

    pub fn device(&self) -> Device {
        self.base[self.layout.embed].device()
    }

    /// How the activations multiply: bf16 operands for bf16 activations.
    pub fn products(&self) -> Products {
        Products::for_activations(self.dtype)
    }

    /// The embeddings of `ids` `[b, t]` in the activation dtype (tracked when the table is).
    pub fn embed(&self, ids: Tensor<2, Int>) -> Tensor<3> {
        self.look_up(self.p(self.layout.embed), ids)
    }

    fn look_up(&self, table: Tensor<2>, ids: Tensor<2, Int>) -> Tensor<3> {
        let [b, t] = ids.dims();
        table
            .select(0, ids.reshape([b * t]))
            .cast(self.dtype)
            .reshape([b, t, self.cfg.hidden_size])
    }

    /// `x · rsqrt(mean(x²) + ε) · w` over the last dimension, in f32 (`LlamaRMSNorm`).
    fn rms_norm(&self, x: Tensor<3>, weight: usize) -> Tensor<3> {
        let w = self.p(weight).unsqueeze::<3>();
        fused_rms_norm::rms_norm_any_device(x, w, self.cfg.rms_norm_eps, self.dtype)
    }

    fn adapter(&self, layer: usize, p: Proj) -> Option<Adapter> {
        let lora = self.lora?;
        let pair = lora.layout.pair(layer, p)?;
        Some(Adapter {
            a: lora.params[pair.a].clone(),
            b: lora.params[pair.b].clone(),
            scale: lora.layout.settings.scale(),
        })
    }

    /// Projection `p` of layer `layer` on `x` `[b, t, in]`: weight, bias, adapter.
    fn linear(&self, x: Tensor<3>, layer: usize, p: Proj, drop: &mut Dropout) -> Tensor<3> {
        let [b, t, k] = x.dims();
        let lin = self.layout.layers[layer].proj(p);
        let adapter = self.adapter(layer, p);
        let weight = self.p(lin.weight);
        let mut out = frozen_plus_adapter(
            x.reshape([b * t, k]),
            weight,
            adapter.as_ref(),
            drop,
            self.products(),
        );
        if let Some(bias) = lin.bias {
            out = out + self.p(bias).cast(self.dtype);
        }
        let n = out.dims()[1];
        out.reshape([b, t, n])
    }

    /// `[b, t, heads·d]` → `[b, heads, t, d]`, through the per-head RMSNorm `norm` (Qwen3).
    fn heads(&self, x: Tensor<3>, heads: usize, norm: Option<usize>) -> Tensor<4> {
        let [b, t, _] = x.dims();
        let d = self.cfg.head_dim;
        let x = match norm {
            Some(w) => self
                .rms_norm(x.reshape([b, t * heads, d]), w)
                .reshape([b, t, heads, d]),
            None => x.reshape([b, t, heads, d]),
        };
        x.swap_dims(1, 2)
    }

    /// Self-attention of layer `i` over `x` `[b, t, d]` (normed), through o_proj; with `cache`,
    /// `x` holds the newest positions and attends to the cached ones too.
    fn attention(
        &self,
        i: usize,
        x: Tensor<3>,
        ctx: &Context,
        cache: Option<&mut LayerCache>,
        drops: &mut Dropouts,
    ) -> Tensor<3> {
        let layer = &self.layout.layers[i];
        let cfg = self.cfg;
        let q = self.linear(x.clone(), i, Proj::Q, &mut drops.lora);
        let k = self.linear(x.clone(), i, Proj::K, &mut drops.lora);
        let v = self.linear(x, i, Proj::V, &mut drops.lora);
        let q = ctx
            .rope
            .apply(self.heads(q, cfg.num_attention_heads, layer.q_norm));
        let k = ctx
            .rope
            .apply(self.heads(k, cfg.num_key_value_heads, layer.k_norm));
        let v = self.heads(v, cfg.num_key_value_heads, None);
        let window = cfg.sliding_windows[i];
        let out = match cache {
            Some(cache) => {
                let (k, v) = cache.extend(k, v);
                grouped_attention(q, k, v, ctx.mask(window), &mut drops.attention)
            }
            None => attend_causal_or_masked((q, k, v), ctx, window, &mut drops.attention),
        };
        self.linear(out, i, Proj::O, &mut drops.lora)
    }

    /// SwiGLU: `down(silu(gate(x)) ⊙ up(x))`; the gating as one op where it runs, which keeps
    /// gate and up only ([`swiglu_op`]).
    fn mlp(&self, i: usize, x: Tensor<3>, drop: &mut Dropout) -> Tensor<3> {
        let gate = self.linear(x.clone(), i, Proj::Gate, drop);
        let up = self.linear(x, i, Proj::Up, drop);
        let gated = if swiglu_op::supported(&gate, &up) {
            swiglu_op::swiglu(gate, up)
        } else if device::runs_on(&gate) && gate.dtype() == up.dtype() {
            device::activation::swiglu(gate, up)
        } else {
            Activation::Silu.apply(gate) * up
        };
        self.linear(gated, i, Proj::Down, drop)
    }

    /// Decoder layer `i` applied to `x` `[b, t, d]`.
    pub fn layer(
        &self,
        i: usize,
        x: Tensor<3>,
        ctx: &Context,
        cache: Option<&mut LayerCache>,
        drops: &mut Dropouts,
    ) -> Tensor<3> {
        let layer = &self.layout.layers[i];
        let h = self.rms_norm(x.clone(), layer.input_norm);
        let x = x + self.attention(i, h, ctx, cache, drops);
        let h = self.rms_norm(x.clone(), layer.post_attention_norm);
        x + self.mlp(i, h, &mut drops.lora)
    }

    /// The final norm (`model.norm`).
    pub fn final_norm(&self, x: Tensor<3>) -> Tensor<3> {
        self.rms_norm(x, self.layout.norm)
    }

    /// Every layer and the final norm over the embeddings `x` `[b, t, d]`: `last_hidden_state`.
    pub fn hidden(&self, mut x: Tensor<3>, ctx: &Context, drops: &mut Dropouts) -> Tensor<3> {
        for i in 0..self.layout.layers.len() {
            x = self.layer(i, x, ctx, None, drops);
        }
        self.final_norm(x)
    }

    /// [`Self::hidden`] over new positions, attending to (and extending) `caches`, one per layer.
    pub fn hidden_cached(
        &self,
        mut x: Tensor<3>,
        ctx: &Context,
        caches: &mut [LayerCache],
    ) -> Tensor<3> {
        let mut drops = Dropouts::disabled();
        for (i, cache) in caches.iter_mut().enumerate() {
            x = self.layer(i, x, ctx, Some(cache), &mut drops);
        }
        self.final_norm(x)
    }

    /// The LM head over these weights: `lm_head` `[d, vocab]`, or the embedding `[vocab, d]`.
    pub fn lm_head(&self) -> LmHead {
        let index = self.layout.head();
        let weight = self.p(index);
        let products = match weight.dtype() {
            DType::BF16 => Products::Bf16,
            _ => self.products(),
        };
        LmHead {
            weight,
            index,
            tied: self.layout.lm_head.is_none(),
            input_scale: 1.0,
            products,
        }
    }

    /// Logits `[b·t, vocab]` (f32) of `hidden` `[b, t, d]`, all at once: for the last positions in
    /// generation and for checks; training and evaluation go through the chunked head.
    pub fn logits(&self, hidden: Tensor<3>) -> Tensor<2> {
        let [b, t, d] = hidden.dims();
        let head = self.lm_head();
        let rows = hidden.reshape([b * t, d]).cast(DType::F32);
        let weight = match head.products {
            Products::Bf16 => head.weight.cast(DType::BF16),
            Products::F32 => head.weight.cast(DType::F32),
        };
        let weight = if head.tied {
            weight.transpose()
        } else {
            weight
        };
        crate::kernels::linear_op::product(rows, weight, head.products)
    }
}

impl EmbeddingTable for DecoderForward<'_> {
    fn embed_untracked(&self, ids: Tensor<2, Int>) -> Tensor<3> {
        self.look_up(self.p(self.layout.embed).inner(), ids)
    }

    fn table_index(&self) -> usize {
        self.layout.embed
    }
}
