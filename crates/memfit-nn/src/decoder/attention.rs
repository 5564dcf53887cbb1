//! Causal grouped-query attention: the additive masks (causal, key padding, sliding window), RoPE
//! positions from the padding mask, attention over grouped KV heads without copying them, and the
//! keys and values a generation step keeps.
//!
//! Grouped-query attention (`repeat_kv` in transformers) shares each KV head among `groups`
//! consecutive query heads. Rather than repeating K and V `groups` times (a copy per layer that the
//! backward pass would keep), the query heads of a group are stacked along the query axis:
//! q `[b, h, t, d]` → `[b, kv_heads, groups·t, d]`, which attends over K and V `[b, kv_heads, t, d]`
//! as they are. The mask is stacked the same way, once per forward pass.

use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use std::cell::OnceCell;

use crate::decoder::config::DecoderConfig;
use crate::decoder::rope::RopeTables;
use crate::kernels::dropout::Dropout;
use crate::kernels::{attention_core, device};
use crate::layers::mask::MASKED;

/// Each token's RoPE position: its index among the row's real tokens (0 at the first), as
/// transformers' `generate` derives `position_ids` from the attention mask (padding gets 1). With
/// right padding this is `0, 1, 2, …`, as a forward pass without `position_ids`.
pub fn positions(mask: &[bool], len: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(mask.len());
    for row in mask.chunks(len.max(1)) {
        let mut seen = 0;
        for &real in row {
            out.push(if real { seen } else { 1 });
            seen += real as usize;
        }
    }
    out
}

/// Which keys a query sees: those at or before it, not padding, and within its layer's window.
#[derive(Debug, Clone, Copy)]
pub struct Visibility<'a> {
    /// `[b, keys]`: true on real tokens.
    pub key_mask: &'a [bool],
    pub keys: usize,
    /// Queries are the last `queries` of the keys (all of them in a full pass, one in a step).
    pub queries: usize,
}

impl Visibility<'_> {
    /// The additive mask `[b, 1, groups·queries, keys]` in `dtype`: 0 where query `i` (key index
    /// `keys − queries + i`) sees key `j`, [`MASKED`] elsewhere, repeated for each query head of a
    /// KV group. A window `w` keeps keys with `i − j < w` (transformers' `kv_idx > q_idx − w`).
    pub fn bias(
        &self,
        window: Option<usize>,
        groups: usize,
        device: &Device,
        dtype: DType,
    ) -> Tensor<4> {
        let (tk, tq) = (self.keys, self.queries);
        let batch = self.key_mask.len() / tk.max(1);
        let mut rows = Vec::with_capacity(batch * tq * tk);
        for keys in self.key_mask.chunks(tk.max(1)) {
            let start = rows.len();
            for i in tk - tq..tk {
                rows.extend(keys.iter().enumerate().map(|(j, &real)| {
                    let seen = real && j <= i && window.is_none_or(|w| i - j < w);
                    if seen { 0.0 } else { MASKED }
                }));
            }
            let one_head = rows[start..].to_vec();
            for _ in 1..groups {
                rows.extend_from_slice(&one_head);
            }
        }
        Tensor::from_data(
            TensorData::new(rows, [batch, 1, groups * tq, tk]),
            (device, dtype),
        )
    }

    /// Whether the full mask is plain causal for every row that matters: each query is a key
    /// (a whole pass, no cache) and each row's real tokens come first (right padding, or none).
    /// A real query then sees only real keys under the causal mask alone; a padded one differs,
    /// but nothing reads its output (the loss skips padding and causal attention never looks back
    /// at it from a real row), so its cotangent is zero.
    fn causal_for_real_rows(&self) -> bool {
        let prefix = |row: &[bool]| row.windows(2).all(|w| w[0] || !w[1]);
        self.queries == self.keys && self.key_mask.chunks(self.keys.max(1)).all(prefix)
    }
}

/// What every layer of one forward pass shares: RoPE tables and the masks. The additive masks are
/// built when a layer first asks: a pass whose layers all take the fused causal path
/// ([`attend_causal_or_masked`]) builds none on the host and uploads none, only the causal mask
/// made on the device from indices.
pub struct Context {
    pub rope: RopeTables,
    /// The rows' real tokens `[b, keys]`, the keys and queries, for the masks.
    key_mask: Vec<bool>,
    keys: usize,
    queries: usize,
    groups: usize,
    window: Option<usize>,
    device: Device,
    dtype: DType,
    /// The causal + padding mask of full-attention layers.
    full: OnceCell<Tensor<4>>,
    /// The same with the model's sliding window, when a layer has one.
    sliding: OnceCell<Tensor<4>>,
    /// The causal mask `[1, 1, groups·t, t]` alone, made on the device.
    causal: OnceCell<Tensor<4>>,
    /// [`Visibility::causal_for_real_rows`]: a full-attention layer may take burn's causal flag
    /// for its mask ([`attend_causal_or_masked`]).
    pub causal_rows: bool,
}

impl Context {
    /// The RoPE tables of `positions` (the queries') and the masks of `visibility`.
    pub fn new(
        cfg: &DecoderConfig,
        positions: &[usize],
        visibility: Visibility,
        device: &Device,
        dtype: DType,
    ) -> Self {
        let batch = visibility.key_mask.len() / visibility.keys.max(1);
        Self {
            rope: cfg.rope.tables(positions, batch, device, dtype),
            key_mask: visibility.key_mask.to_vec(),
            keys: visibility.keys,
            queries: visibility.queries,
            groups: cfg.kv_groups(),
            window: cfg.sliding_windows.iter().flatten().next().copied(),
            device: device.clone(),
            dtype,
            full: OnceCell::new(),
            sliding: OnceCell::new(),
            causal: OnceCell::new(),
            causal_rows: visibility.causal_for_real_rows(),
        }
    }

    fn visibility(&self) -> Visibility<'_> {
        Visibility {
            key_mask: &self.key_mask,
            keys: self.keys,
            queries: self.queries,
        }
    }

    /// The mask of a layer with `window`, built (on the host) the first time it is asked for.
    pub fn mask(&self, window: Option<usize>) -> &Tensor<4> {
        let bias = |w| {
            self.visibility()
                .bias(w, self.groups, &self.device, self.dtype)
        };
        match (window, self.window) {
            (Some(_), Some(w)) => self.sliding.get_or_init(|| bias(Some(w))),
            _ => self.full.get_or_init(|| bias(None)),
        }
    }

    /// Whether a mask was built on the host in this pass (the fused causal path builds none).
    #[cfg(test)]
    fn built_on_host(&self) -> bool {
        self.full.get().is_some() || self.sliding.get().is_some()
    }

    /// The causal mask `[1, 1, groups·t, t]` of a whole pass, stacked as [`Visibility::bias`] lays
    /// it out, made on the device: what the fused attention's backward reads where
    /// [`Context::causal_rows`] holds (the padding then changes no row that matters).
    fn causal(&self) -> &Tensor<4> {
        self.causal.get_or_init(|| {
            let (t, g) = (self.keys, self.groups);
            let hidden = Tensor::<2, Bool>::tril_mask([t, t], 0, &self.device).repeat_dim(0, g);
            Tensor::zeros([g * t, t], (&self.device, self.dtype))
                .mask_fill(hidden, MASKED)
                .reshape([1, 1, g * t, t])
        })
    }
}

/// Layer attention over a whole pass (no cache) with `window`: on the GPU's code path without
/// attention dropout, where the mask is causal for every row that matters, burn's fused causal
/// attention ([`device::attention`], no `q × k` matrix kept); elsewhere [`grouped_attention`].
/// Returns the heads concatenated, `[b, t, h·d]`.
pub fn attend_causal_or_masked(
    (q, k, v): (Tensor<4>, Tensor<4>, Tensor<4>),
    ctx: &Context,
    window: Option<usize>,
    drop: &mut Dropout,
) -> Tensor<3> {
    let [b, h, t, d] = q.dims();
    // where the rows are causal, every key is a query: t keys
    let unwindowed = window.is_none_or(|w| w >= t);
    if ctx.causal_rows && unwindowed && drop.p() == 0.0 && device::runs_on(&q) {
        // the attention stream advances as the composite path's draw would
        drop.next_seed();
        let out = device::attention::causal_attention(q, k, v, ctx.causal());
        return out.swap_dims(1, 2).reshape([b, t, h * d]);
    }
    grouped_attention(q, k, v, ctx.mask(window), drop)
}

/// `softmax(q·kᵀ·scale + mask)·v` for q `[b, h, tq, d]` and k, v `[b, kv_heads, tk, d]`, the
/// query heads of each KV group stacked on the query axis (see the module doc); returns the heads
/// concatenated, `[b, tq, h·d]`.
pub fn grouped_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    mask: &Tensor<4>,
    drop: &mut Dropout,
) -> Tensor<3> {
    let [b, h, tq, d] = q.dims();
    let kv_heads = k.dims()[1];
    let groups = h / kv_heads;
    // transformers scales the scores by d^-½; scaling q first is the same product.
    let q = (q * (d as f64).powf(-0.5)).reshape([b, kv_heads, groups * tq, d]);
    let out = attention_core::attend(q, k, v, mask, drop);
    out.reshape([b, h, tq, d])
        .swap_dims(1, 2)
        .reshape([b, tq, h * d])
}

/// One layer's keys (after RoPE) and values so far, `[b, kv_heads, t, d]` each.
#[derive(Default, Clone)]
pub struct LayerCache {
    kv: Option<(Tensor<4>, Tensor<4>)>,
}

impl LayerCache {
    /// Appends this step's keys and values; returns all of them.
    pub fn extend(&mut self, k: Tensor<4>, v: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let (k, v) = match self.kv.take() {
            Some((pk, pv)) => (Tensor::cat(vec![pk, k], 2), Tensor::cat(vec![pv, v], 2)),
            None => (k, v),
        };
        self.kv = Some((k.clone(), v.clone()));
        (k, v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_count_real_tokens() {
        let mask = [false, false, true, true, true, true, false];
        assert_eq!(positions(&mask[..], 7), [1, 1, 0, 1, 2, 3, 1]);
        assert_eq!(positions(&[true; 3], 3), [0, 1, 2]);
    }

    /// The causal mask made on the device is the host's stacked mask of a row without padding,
    /// and asking for it builds nothing on the host.
    #[test]
    fn the_device_causal_mask_is_the_hosts_without_padding() {
        let cfg = DecoderConfig::from_json(&serde_json::json!({"model_type": "llama",
            "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_hidden_layers": 1, "vocab_size": 10}))
        .unwrap();
        let t = 5;
        let key_mask = [[true; 5], [true, true, true, false, false]].concat();
        let vis = Visibility {
            key_mask: &key_mask,
            keys: t,
            queries: t,
        };
        let device = Device::flex();
        let ctx = Context::new(&cfg, &positions(&key_mask, t), vis, &device, DType::F32);
        assert!(ctx.causal_rows);
        let causal = ctx.causal().clone();
        assert_eq!(causal.dims(), [1, 1, 2 * t, t]);
        assert!(!ctx.built_on_host(), "the fused path builds no host mask");
        let host = Visibility {
            key_mask: &key_mask[..t],
            keys: t,
            queries: t,
        }
        .bias(None, 2, &device, DType::F32);
        let values = |x: Tensor<4>| crate::layers::host::to_f32_vec(x).unwrap();
        assert_eq!(values(causal), values(host));
        let _ = ctx.mask(None);
        assert!(ctx.built_on_host());
    }

    /// Right padding (or none) over a whole pass takes burn's causal flag; left padding, or a
    /// generation step's queries after cached keys, keep the additive mask.
    #[test]
    fn only_prefix_rows_over_a_whole_pass_are_causal_for_real_rows() {
        let vis = |key_mask: &'static [bool], queries| Visibility {
            key_mask,
            keys: 4,
            queries,
        };
        assert!(vis(&[true, true, false, false, true, true, true, true], 4).causal_for_real_rows());
        assert!(!vis(&[false, true, true, true], 4).causal_for_real_rows());
        assert!(!vis(&[true, false, true, true], 4).causal_for_real_rows());
        assert!(!vis(&[true, true, true, true], 1).causal_for_real_rows());
    }

    #[test]
    fn masks_are_causal_padded_windowed_and_stacked() {
        let key_mask = [false, true, true, true];
        let vis = Visibility {
            key_mask: &key_mask,
            keys: 4,
            queries: 4,
        };
        let seen = |window, groups| -> Vec<bool> {
            let t = vis.bias(window, groups, &Device::flex(), DType::F32);
            let v: Vec<f32> = t.into_data().try_to_vec().unwrap();
            v.into_iter().map(|x| x == 0.0).collect()
        };
        let full = seen(None, 1);
        #[rustfmt::skip]
        let want = [
            false, false, false, false,
            false, true, false, false,
            false, true, true, false,
            false, true, true, true,
        ];
        assert_eq!(full, want);
        let windowed = seen(Some(2), 1);
        assert!(!windowed[3 * 4 + 1] && windowed[3 * 4 + 2] && windowed[3 * 4 + 3]);
        assert_eq!(
            seen(None, 2),
            [want, want].concat(),
            "one copy per query head of a group"
        );
        // One step: the last query only.
        let step = Visibility { queries: 1, ..vis };
        let t = step.bias(None, 1, &Device::flex(), DType::F32);
        assert_eq!(t.dims(), [1, 1, 1, 4]);
    }
}
