//! The BERT-family forward pass (transformers' `BertForSequenceClassification` and
//! `RobertaForSequenceClassification`), over parameters held as a flat list of tensors indexed by
//! [`BertLayout`].
//!
//! Faithful details: embeddings are word + token type + absolute position (RoBERTa's positions
//! count non-padding tokens from `pad_token_id + 1`, `create_position_ids_from_input_ids`), then
//! LayerNorm and dropout; post-LN layers (`LayerNorm(x + dropout(sublayer(x)))`); scores scaled by
//! head_dim^-½ with the padding mask added; LayerNorm with mean and bias, computed in f32 as
//! PyTorch's autocast does (the fused kernel on flex); the head reads the first token ([CLS] / <s>).

use crate::layers::activation::gelu_exact;
use burn::prelude::*;
use burn::tensor::{DType, TensorData};

use crate::ModelError;
use crate::bert::BertModel;
use crate::bert::config::{BertConfig, Family};
use crate::bert::layout::{BertLayout, Dense, EncoderLayer, Norm};
use crate::kernels::dense_op::{self, Input};
use crate::kernels::dropout::{Dropout, SplitMix64};
use crate::kernels::gemm_bf16::Products;
use crate::kernels::{attention_core, device, fused_layer_norm, linear_op};
use crate::layers::activation::Activation;
use crate::layers::embedding_leaf::{EmbeddingLeaf, EmbeddingTable};
use crate::layers::loss::masked_cross_entropy;
use crate::layers::mask::padding_mask;

/// A batch of token sequences, row-major `[batch, len]`, as a tokenizer pads them.
#[derive(Debug, Clone, Copy)]
pub struct ClsInputs<'a> {
    pub ids: &'a [u32],
    /// `attention_mask`: true for real tokens, false for padding.
    pub mask: &'a [bool],
    /// Segment ids (0 / 1 for sentence pairs); `None` is all 0, as transformers defaults them.
    pub token_types: Option<&'a [u32]>,
    pub batch: usize,
    pub len: usize,
}

/// The three dropouts of the family, each with its probability and its own seeded stream.
#[derive(Debug, Clone)]
pub struct Dropouts {
    /// After the embeddings and each sub-layer (`hidden_dropout_prob`).
    pub hidden: Dropout,
    /// On the attention probabilities (`attention_probs_dropout_prob`).
    pub attention: Dropout,
    /// In the head (`classifier_dropout`, else `hidden_dropout_prob`).
    pub classifier: Dropout,
}

impl Dropouts {
    /// Training: the config's probabilities, masks drawn from `seed`.
    pub fn new(cfg: &BertConfig, seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed);
        Self {
            hidden: Dropout::new(rng.next_u64(), cfg.hidden_dropout_prob),
            attention: Dropout::new(rng.next_u64(), cfg.attention_probs_dropout_prob),
            classifier: Dropout::new(rng.next_u64(), cfg.classifier_dropout_prob()),
        }
    }

    /// Evaluation: every dropout is the identity.
    pub fn disabled() -> Self {
        Self {
            hidden: Dropout::disabled(),
            attention: Dropout::disabled(),
            classifier: Dropout::disabled(),
        }
    }
}

/// A model: configuration, layout and the current parameter tensors (tracked or not).
pub struct BertForward<'a> {
    pub cfg: &'a BertConfig,
    pub layout: &'a BertLayout,
    /// The parameters, f32 or bf16.
    pub params: &'a [Tensor<2>],
    /// Float dtype of the activations (f32, or bf16: bf16 activations over f32 parameters is bf16
    /// training on flex). LayerNorm computes in f32 either way.
    pub dtype: DType,
    /// The word embeddings of the batch `[b, t, d]` when a training step looked them up as a leaf
    /// ([`crate::layers::embedding_leaf`]); `None`: looked up here.
    word_rows: Option<Tensor<3>>,
}

impl<'a> BertForward<'a> {
    /// `model`'s forward pass over `params` (its weights on a device, tracked or not) with
    /// activations in `dtype`.
    pub fn of(model: &'a BertModel, params: &'a [Tensor<2>], dtype: DType) -> Self {
        Self {
            cfg: &model.config,
            layout: &model.layout,
            params,
            dtype,
            word_rows: None,
        }
    }

    /// This pass with `x`'s word embeddings looked up as a leaf ([`EmbeddingLeaf`]; requiring a
    /// gradient when `trains`), and that leaf: a training step hands its gradient to the table row
    /// by row, never as a dense `[vocab, d]` tensor beside the table's accumulated one.
    pub fn with_word_leaf(self, x: &ClsInputs, trains: bool) -> (Self, EmbeddingLeaf) {
        let ids = TensorData::new(x.ids.iter().map(|&i| i as i64).collect(), [x.batch, x.len]);
        let ids = Tensor::<2, Int>::from_data(ids, &self.device());
        let words = EmbeddingLeaf::new(&self, ids, x.ids, trains);
        let fwd = Self {
            word_rows: Some(words.input.clone()),
            ..self
        };
        (fwd, words)
    }

    fn p(&self, i: usize) -> Tensor<2> {
        self.params[i].clone()
    }

    /// How the hand-written ops multiply: bf16 operands for bf16 activations.
    pub fn products(&self) -> Products {
        Products::for_activations(self.dtype)
    }

    fn device(&self) -> Device {
        self.params[self.layout.word].device()
    }

    /// Checks shapes and ranges: ids in the vocabulary, token types below `type_vocab_size`, the
    /// length within the position table.
    pub fn check(&self, x: &ClsInputs) -> Result<(), ModelError> {
        let n = x.batch * x.len;
        if n == 0 {
            let (b, t) = (x.batch, x.len);
            return Err(ModelError::Input(format!(
                "empty batch (batch {b}, len {t})"
            )));
        }
        let lengths = [("ids", Some(x.ids.len())), ("mask", Some(x.mask.len()))];
        let types = ("token_types", x.token_types.map(<[u32]>::len));
        for (name, got) in lengths.into_iter().chain([types]) {
            if let Some(got) = got.filter(|g| *g != n) {
                return Err(ModelError::Input(format!(
                    "{name}: {got} values for batch {} × len {}",
                    x.batch, x.len
                )));
            }
        }
        if x.len > self.cfg.max_len() {
            return Err(ModelError::Input(format!(
                "sequence length {}: longer than the {} positions of max_position_embeddings {}",
                x.len,
                self.cfg.max_len(),
                self.cfg.max_position_embeddings
            )));
        }
        let out_of = |values: &[u32], limit: usize, what: &str| {
            values
                .iter()
                .find(|v| **v as usize >= limit)
                .map(|v| ModelError::Input(format!("{what} {v}: outside 0..{limit}")))
        };
        if let Some(e) = out_of(x.ids, self.cfg.vocab_size, "token id") {
            return Err(e);
        }
        match x
            .token_types
            .and_then(|t| out_of(t, self.cfg.type_vocab_size, "token type"))
        {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Position ids `[batch · len]`: 0, 1, … for BERT; for RoBERTa, the running count of
    /// non-padding tokens plus `pad_token_id` (padding keeps `pad_token_id`).
    pub fn position_ids(&self, x: &ClsInputs) -> Vec<i64> {
        match (self.cfg.family, self.cfg.pad_token_id) {
            (Family::Roberta, Some(pad)) => x
                .ids
                .chunks(x.len)
                .flat_map(|row| {
                    let mut count = 0i64;
                    row.iter()
                        .map(move |&id| {
                            let real = id != pad;
                            count += real as i64;
                            if real { count + pad as i64 } else { pad as i64 }
                        })
                        .collect::<Vec<_>>()
                })
                .collect(),
            _ => (0..x.batch).flat_map(|_| 0..x.len as i64).collect(),
        }
    }

    fn rows(&self, table: usize, ids: Vec<i64>) -> Tensor<2> {
        let n = ids.len();
        let ids = Tensor::<1, Int>::from_data(TensorData::new(ids, [n]), &self.device());
        self.p(table).select(0, ids)
    }

    /// The embeddings `[b, t, d]` after LayerNorm and dropout: the first layer's input.
    pub fn embed(&self, x: &ClsInputs, drop: &mut Dropouts) -> Tensor<3> {
        let l = self.layout;
        let types = match x.token_types {
            Some(t) => t.iter().map(|&i| i as i64).collect(),
            None => vec![0; x.ids.len()],
        };
        let words = match &self.word_rows {
            Some(rows) => rows.clone().reshape([x.ids.len(), self.cfg.hidden_size]),
            None => self.rows(l.word, x.ids.iter().map(|&i| i as i64).collect()),
        };
        let sum =
            words + self.rows(l.token_type, types) + self.rows(l.position, self.position_ids(x));
        let sum = sum.reshape([x.batch, x.len, self.cfg.hidden_size]);
        drop.hidden.apply(self.layer_norm(sum, &l.embed_norm))
    }

    /// `(x − mean) / sqrt(var + eps) · γ + β` over the last dimension, in f32, returned in the
    /// activation dtype: the fused op on flex, the device op on the GPU's code path, burn's ops
    /// elsewhere.
    fn layer_norm(&self, x: Tensor<3>, n: &Norm) -> Tensor<3> {
        let eps = self.cfg.layer_norm_eps;
        let (gamma, beta) = (
            self.p(n.weight).unsqueeze::<3>(),
            self.p(n.bias).unsqueeze::<3>(),
        );
        if fused_layer_norm::supported(&x) {
            return fused_layer_norm::layer_norm(x, gamma, beta, eps).cast(self.dtype);
        }
        if device::runs_on(&x) {
            return device::norm::layer_norm(x, gamma, beta, eps).cast(self.dtype);
        }
        let x = x.cast(DType::F32);
        let centered = x.clone() - x.mean_dim(2);
        let var = centered.clone().square().mean_dim(2);
        let (gamma, beta) = (gamma.cast(DType::F32), beta.cast(DType::F32));
        let normed = centered * (var + eps).sqrt().recip();
        (normed * gamma + beta).cast(self.dtype)
    }

    /// `act(x) · W + b` for `x` `[m, in]`: the fused op on flex (the bias added in place, GELU
    /// recomputed in backward instead of kept), burn's ops elsewhere.
    fn dense_rows_of(&self, x: Tensor<2>, d: &Dense, input: Input) -> Tensor<2> {
        let (w, bias) = (self.p(d.weight), self.p(d.bias));
        if dense_op::supported(&x) {
            return dense_op::dense(x, w, bias, input, self.products());
        }
        let x = match input {
            Input::Plain => x,
            Input::Gelu => gelu_exact(x),
        };
        linear_op::layer(x, w, self.products()) + bias.cast(self.dtype)
    }

    /// `x · W + b` for `x` `[m, in]`.
    fn dense_rows(&self, x: Tensor<2>, d: &Dense) -> Tensor<2> {
        self.dense_rows_of(x, d, Input::Plain)
    }

    /// `act(x) · W + b` for `x` `[b, t, in]`.
    fn dense_of(&self, x: Tensor<3>, d: &Dense, input: Input) -> Tensor<3> {
        let [b, t, k] = x.dims();
        let out = self.dense_rows_of(x.reshape([b * t, k]), d, input);
        let n = out.dims()[1];
        out.reshape([b, t, n])
    }

    fn dense(&self, x: Tensor<3>, d: &Dense) -> Tensor<3> {
        self.dense_of(x, d, Input::Plain)
    }

    fn heads(&self, x: Tensor<3>) -> Tensor<4> {
        let [b, t, _] = x.dims();
        let (h, dh) = (self.cfg.num_attention_heads, self.cfg.head_dim());
        x.reshape([b, t, h, dh]).swap_dims(1, 2)
    }

    /// Self-attention of `x` `[b, t, d]` through the output projection, for the queries of the
    /// first `rows` positions (`[b, rows, d]`); `bias` `[b, 1, 1, t]` is the padding mask.
    fn attention(
        &self,
        x: Tensor<3>,
        rows: usize,
        l: &EncoderLayer,
        bias: &Tensor<4>,
        drop: &mut Dropout,
    ) -> Tensor<3> {
        let [b, _, d] = x.dims();
        // BertSelfAttention: scores · head_dim^-½, applied to q (a power of two for the usual sizes).
        let scale = (self.cfg.head_dim() as f64).powf(-0.5);
        let q = self.heads(self.dense(first_rows(x.clone(), rows), &l.query)) * scale;
        let k = self.heads(self.dense(x.clone(), &l.key));
        let v = self.heads(self.dense(x, &l.value));
        let ctx = attention_core::attend(q, k, v, bias, drop);
        self.dense(ctx.swap_dims(1, 2).reshape([b, rows, d]), &l.attn_out)
    }

    /// How many positions of its input encoder layer `i` computes outputs for: every one, but in
    /// the last layer only the first, the one token the head reads. A position's output depends
    /// on the other positions only through keys and values, so the logits are those of the whole
    /// layer, which then costs per token only its key and value products (2 of its 12 `d²`).
    pub fn rows_out(&self, i: usize, len: usize) -> usize {
        if i + 1 == self.layout.layers.len() {
            1
        } else {
            len
        }
    }

    /// Encoder layer `i` applied to `x` `[b, t, d]`: its output `[b, rows_out, d]`.
    pub fn layer(
        &self,
        i: usize,
        x: Tensor<3>,
        bias: &Tensor<4>,
        drop: &mut Dropouts,
    ) -> Tensor<3> {
        let l = &self.layout.layers[i];
        let rows = self.rows_out(i, x.dims()[1]);
        let a = self.attention(x.clone(), rows, l, bias, &mut drop.attention);
        let h = self.layer_norm(first_rows(x, rows) + drop.hidden.apply(a), &l.attn_norm);
        let pre = self.dense(h.clone(), &l.intermediate);
        // exact GELU (BERT's "gelu") is fused into the output layer; other activations apply alone
        let f = match self.cfg.hidden_act {
            Activation::Gelu => self.dense_of(pre, &l.output, Input::Gelu),
            act => self.dense(act.apply(pre), &l.output),
        };
        self.layer_norm(h + drop.hidden.apply(f), &l.output_norm)
    }

    /// The additive attention bias every layer takes: 0 on real tokens, a large negative value on
    /// padding.
    pub fn attention_bias(&self, x: &ClsInputs) -> Tensor<4> {
        padding_mask(x.mask, x.batch, x.len, &self.device(), self.dtype)
    }

    /// The last layer's output at the first position `[b, 1, d]` (`last_hidden_state[:, :1]`: all
    /// the head reads, see [`Self::rows_out`]).
    pub fn encode(&self, x: &ClsInputs, drop: &mut Dropouts) -> Result<Tensor<3>, ModelError> {
        self.check(x)?;
        let bias = self.attention_bias(x);
        let mut h = self.embed(x, drop);
        for i in 0..self.layout.layers.len() {
            h = self.layer(i, h, &bias, drop);
        }
        Ok(h)
    }

    /// The head over the first token of `hidden` `[b, t, d]` (any `t` ≥ 1): logits
    /// `[b, num_labels]`.
    pub fn classify(&self, hidden: Tensor<3>, drop: &mut Dropouts) -> Tensor<2> {
        let [b, _, d] = hidden.dims();
        let first = hidden.narrow(1, 0, 1).reshape([b, d]);
        let head = &self.layout.head;
        let pooled = match self.cfg.family {
            // BertPooler: tanh(dense(first)), then the classifier's dropout.
            Family::Bert => self.dense_rows(first, &head.dense).tanh(),
            // RobertaClassificationHead: dropout, dense, tanh, then dropout again.
            Family::Roberta => {
                let first = drop.classifier.apply(first);
                self.dense_rows(first, &head.dense).tanh()
            }
        };
        self.dense_rows(drop.classifier.apply(pooled), &head.out)
    }

    /// Logits `[b, num_labels]` in the activation dtype.
    pub fn logits(&self, x: &ClsInputs, drop: &mut Dropouts) -> Result<Tensor<2>, ModelError> {
        let hidden = self.encode(x, drop)?;
        Ok(self.classify(hidden, drop))
    }

    /// Single-label cross-entropy (mean over rows, in f32) of `labels` (one per row), and the
    /// logits.
    pub fn loss(
        &self,
        x: &ClsInputs,
        labels: &[u32],
        drop: &mut Dropouts,
    ) -> Result<(Tensor<1>, Tensor<2>), ModelError> {
        let n = self.cfg.num_labels();
        if labels.len() != x.batch {
            let got = labels.len();
            return Err(ModelError::Input(format!(
                "labels: {got} for batch {}",
                x.batch
            )));
        }
        if let Some(l) = labels.iter().find(|l| **l as usize >= n) {
            return Err(ModelError::Input(format!(
                "label {l}: outside 0..{n} (num_labels)"
            )));
        }
        let logits = self.logits(x, drop)?;
        let loss = masked_cross_entropy(logits.clone(), labels, &vec![true; x.batch]);
        Ok((loss, logits))
    }
}

/// `x` `[b, t, d]` narrowed to its first `rows` positions (`x` itself when that is all of them).
fn first_rows(x: Tensor<3>, rows: usize) -> Tensor<3> {
    if rows == x.dims()[1] {
        x
    } else {
        x.narrow(1, 0, rows)
    }
}

impl EmbeddingTable for BertForward<'_> {
    fn embed_untracked(&self, ids: Tensor<2, Int>) -> Tensor<3> {
        let [b, t] = ids.dims();
        let table = self.p(self.layout.word).inner();
        let rows = table.select(0, ids.reshape([b * t]));
        rows.reshape([b, t, self.cfg.hidden_size])
    }

    fn table_index(&self) -> usize {
        self.layout.word
    }
}
