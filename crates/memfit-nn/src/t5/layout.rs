//! Every T5 parameter: its transformers name, its shape, its module group (for freezing) and its
//! initial scale. The forward pass refers to parameters by the indices this layout hands out.

use crate::t5::config::T5Config;

/// The module groups `--freeze` names (the seed's SFT mode freezes `embeddings,encoder`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Group {
    Embeddings,
    Encoder,
    Decoder,
    LmHead,
}

impl Group {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "embeddings" => Some(Self::Embeddings),
            "encoder" => Some(Self::Encoder),
            "decoder" => Some(Self::Decoder),
            "lm_head" => Some(Self::LmHead),
            _ => None,
        }
    }
}

pub use crate::layers::params::{Init, Kind};

/// A T5 parameter (transformers' name `encoder.block.0.layer.0.SelfAttention.q.weight`, …).
pub type ParamSpec = crate::layers::params::ParamSpec<Group>;

#[derive(Debug, Clone, Copy)]
pub struct AttnParams {
    pub q: usize,
    pub k: usize,
    pub v: usize,
    pub o: usize,
}

/// `wi` (plain) or `wi_0`, `wi_1` (gated), then `wo`.
#[derive(Debug, Clone, Copy)]
pub struct FfnParams {
    pub wi: usize,
    pub wi_1: Option<usize>,
    pub wo: usize,
}

#[derive(Debug, Clone, Copy)]
pub struct EncoderBlock {
    pub attn_norm: usize,
    pub attn: AttnParams,
    pub ffn_norm: usize,
    pub ffn: FfnParams,
}

#[derive(Debug, Clone, Copy)]
pub struct DecoderBlock {
    pub self_norm: usize,
    pub self_attn: AttnParams,
    pub cross_norm: usize,
    pub cross_attn: AttnParams,
    pub ffn_norm: usize,
    pub ffn: FfnParams,
}

/// Indices of every parameter in [`T5Layout::specs`].
#[derive(Debug, Clone)]
pub struct T5Layout {
    pub specs: Vec<ParamSpec>,
    pub shared: usize,
    pub encoder_rel_bias: usize,
    pub encoder: Vec<EncoderBlock>,
    pub encoder_norm: usize,
    pub decoder_rel_bias: usize,
    pub decoder: Vec<DecoderBlock>,
    pub decoder_norm: usize,
    /// `None` when the LM head is tied to `shared.weight`.
    pub lm_head: Option<usize>,
}

impl T5Layout {
    /// Each encoder (`decoder`) block's parameters, final once that block's backward is done:
    /// block 0's relative attention bias is left out (every block uses it).
    pub fn block_params(&self, decoder: bool) -> Vec<Vec<usize>> {
        let names: Vec<&str> = self.specs.iter().map(|s| s.name.as_str()).collect();
        let (stack, blocks) = match decoder {
            false => ("encoder", self.encoder.len()),
            true => ("decoder", self.decoder.len()),
        };
        let biases = [self.encoder_rel_bias, self.decoder_rel_bias];
        let part = |i| format!("{stack}.block.{i}.");
        crate::layers::grad_sink::block_params(&names, blocks, part, &biases)
    }

    /// The parameters final once the head's backward is done: the decoder's final norm and an
    /// untied LM head.
    pub fn head_params(&self) -> Vec<usize> {
        std::iter::once(self.decoder_norm)
            .chain(self.lm_head)
            .collect()
    }

    /// Whether two layouts hold the same tensors (names and shapes, in order): weights of one fit the
    /// other, whatever their init scales or other hyper-parameters.
    pub fn same_tensors(&self, other: &T5Layout) -> bool {
        crate::layers::params::same_tensors(&self.specs, &other.specs)
    }
}

struct Builder<'a> {
    cfg: &'a T5Config,
    specs: Vec<ParamSpec>,
}

impl Builder<'_> {
    fn push(&mut self, name: String, kind: Kind, group: Group, init: Init) -> usize {
        crate::layers::params::push(&mut self.specs, name, kind, group, init)
    }

    fn factor(&self) -> f64 {
        self.cfg.initializer_factor
    }

    fn norm(&mut self, name: String, group: Group) -> usize {
        let d = self.cfg.d_model;
        self.push(name, Kind::Vector { d }, group, Init::Ones)
    }

    fn attention(&mut self, prefix: &str, group: Group) -> AttnParams {
        let (d, inner, dk, h) = (
            self.cfg.d_model,
            self.cfg.inner_dim(),
            self.cfg.d_kv,
            self.cfg.num_heads,
        );
        let f = self.factor();
        // T5PreTrainedModel._init_weights: q ~ N(0, (d_model·d_kv)^-½) carries the 1/√d_kv attention
        // scaling T5 leaves out of the forward pass; k, v ~ N(0, d_model^-½); o ~ N(0, (heads·d_kv)^-½).
        let q_std = f * ((d * dk) as f64).powf(-0.5);
        let kv_std = f * (d as f64).powf(-0.5);
        let o_std = f * ((h * dk) as f64).powf(-0.5);
        let lin_in = Kind::Linear {
            d_in: d,
            d_out: inner,
        };
        AttnParams {
            q: self.push(
                format!("{prefix}.q.weight"),
                lin_in,
                group,
                Init::Normal { std: q_std },
            ),
            k: self.push(
                format!("{prefix}.k.weight"),
                lin_in,
                group,
                Init::Normal { std: kv_std },
            ),
            v: self.push(
                format!("{prefix}.v.weight"),
                lin_in,
                group,
                Init::Normal { std: kv_std },
            ),
            o: self.push(
                format!("{prefix}.o.weight"),
                Kind::Linear {
                    d_in: inner,
                    d_out: d,
                },
                group,
                Init::Normal { std: o_std },
            ),
        }
    }

    fn rel_bias(&mut self, prefix: &str, group: Group) -> usize {
        let f = self.factor();
        let kind = Kind::Table {
            rows: self.cfg.relative_attention_num_buckets,
            cols: self.cfg.num_heads,
        };
        let std = f * (self.cfg.d_model as f64).powf(-0.5);
        self.push(
            format!("{prefix}.relative_attention_bias.weight"),
            kind,
            group,
            Init::Normal { std },
        )
    }

    fn ffn(&mut self, prefix: &str, group: Group) -> FfnParams {
        let (d, ff) = (self.cfg.d_model, self.cfg.d_ff);
        let f = self.factor();
        let wi_kind = Kind::Linear { d_in: d, d_out: ff };
        let wi_init = Init::Normal {
            std: f * (d as f64).powf(-0.5),
        };
        let (wi, wi_1) = if self.cfg.feed_forward.gated {
            let a = self.push(format!("{prefix}.wi_0.weight"), wi_kind, group, wi_init);
            let b = self.push(format!("{prefix}.wi_1.weight"), wi_kind, group, wi_init);
            (a, Some(b))
        } else {
            (
                self.push(format!("{prefix}.wi.weight"), wi_kind, group, wi_init),
                None,
            )
        };
        let wo = self.push(
            format!("{prefix}.wo.weight"),
            Kind::Linear { d_in: ff, d_out: d },
            group,
            Init::Normal {
                std: f * (ff as f64).powf(-0.5),
            },
        );
        FfnParams { wi, wi_1, wo }
    }
}

impl T5Layout {
    pub fn new(cfg: &T5Config) -> Self {
        let mut b = Builder {
            cfg,
            specs: Vec::new(),
        };
        let f = cfg.initializer_factor;
        let shared = b.push(
            "shared.weight".into(),
            Kind::Table {
                rows: cfg.vocab_size,
                cols: cfg.d_model,
            },
            Group::Embeddings,
            Init::Normal { std: f },
        );
        // transformers names the FFN `DenseReluDense` for the gated variants too.
        let ff_name = "DenseReluDense";
        let mut encoder = Vec::new();
        let mut encoder_rel_bias = 0;
        for i in 0..cfg.num_layers {
            let p = format!("encoder.block.{i}");
            let attn = b.attention(&format!("{p}.layer.0.SelfAttention"), Group::Encoder);
            if i == 0 {
                // The bias lives in block 0 and is shared by every block of the stack.
                encoder_rel_bias =
                    b.rel_bias(&format!("{p}.layer.0.SelfAttention"), Group::Encoder);
            }
            let attn_norm = b.norm(format!("{p}.layer.0.layer_norm.weight"), Group::Encoder);
            let ffn = b.ffn(&format!("{p}.layer.1.{ff_name}"), Group::Encoder);
            let ffn_norm = b.norm(format!("{p}.layer.1.layer_norm.weight"), Group::Encoder);
            encoder.push(EncoderBlock {
                attn_norm,
                attn,
                ffn_norm,
                ffn,
            });
        }
        let encoder_norm = b.norm("encoder.final_layer_norm.weight".into(), Group::Encoder);
        let mut decoder = Vec::new();
        let mut decoder_rel_bias = 0;
        for i in 0..cfg.num_decoder_layers {
            let p = format!("decoder.block.{i}");
            let self_attn = b.attention(&format!("{p}.layer.0.SelfAttention"), Group::Decoder);
            if i == 0 {
                decoder_rel_bias =
                    b.rel_bias(&format!("{p}.layer.0.SelfAttention"), Group::Decoder);
            }
            let self_norm = b.norm(format!("{p}.layer.0.layer_norm.weight"), Group::Decoder);
            let cross_attn = b.attention(&format!("{p}.layer.1.EncDecAttention"), Group::Decoder);
            let cross_norm = b.norm(format!("{p}.layer.1.layer_norm.weight"), Group::Decoder);
            let ffn = b.ffn(&format!("{p}.layer.2.{ff_name}"), Group::Decoder);
            let ffn_norm = b.norm(format!("{p}.layer.2.layer_norm.weight"), Group::Decoder);
            decoder.push(DecoderBlock {
                self_norm,
                self_attn,
                cross_norm,
                cross_attn,
                ffn_norm,
                ffn,
            });
        }
        let decoder_norm = b.norm("decoder.final_layer_norm.weight".into(), Group::Decoder);
        let lm_head = (!cfg.tie_word_embeddings).then(|| {
            b.push(
                "lm_head.weight".into(),
                Kind::Linear {
                    d_in: cfg.d_model,
                    d_out: cfg.vocab_size,
                },
                Group::LmHead,
                Init::Normal { std: f },
            )
        });
        Self {
            specs: b.specs,
            shared,
            encoder_rel_bias,
            encoder,
            encoder_norm,
            decoder_rel_bias,
            decoder,
            decoder_norm,
            lm_head,
        }
    }

    /// Whether parameter `i` trains when `frozen` groups are frozen. The tied embedding is also the
    /// LM head: it trains only if neither `embeddings` nor `lm_head` is frozen.
    pub fn trainable(&self, i: usize, frozen: &[Group]) -> bool {
        if i == self.shared && self.lm_head.is_none() {
            return !frozen.contains(&Group::Embeddings) && !frozen.contains(&Group::LmHead);
        }
        !frozen.contains(&self.specs[i].group)
    }

    /// Total and trainable parameter counts (the tied embedding counted once).
    pub fn param_counts(&self, frozen: &[Group]) -> (u64, u64) {
        crate::layers::params::counts(&self.specs, |i| self.trainable(i, frozen))
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.specs.iter().position(|s| s.name == name)
    }
}
