//! Greedy generation over a KV cache: the prompts, left-padded to one length, run through the model
//! once (the prefill), then each new token is one position through every layer, attending to the
//! cached keys and values — n new tokens cost one prefill and n single-position passes, not n full
//! forward passes. Positions count each row's real tokens, so a shorter (left-padded) prompt is
//! continued exactly as it would be alone.

use burn::prelude::*;

use crate::ModelError;
use crate::decoder::DecoderModel;
use crate::decoder::attention::{Context, LayerCache, Visibility, positions};
use crate::decoder::forward::DecoderForward;
use crate::decoding::GenerateConfig;
use crate::layers::host::{int_tensor, to_f32_vec};
use crate::model::{CausalGenerate, Precision};

/// Left-pads `prompts` to their longest: ids (`pad` in the padding) and the mask.
pub fn left_pad(prompts: &[Vec<u32>], pad: u32) -> (Vec<u32>, Vec<bool>, usize) {
    let len = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(prompts.len() * len);
    let mut mask = Vec::with_capacity(prompts.len() * len);
    for p in prompts {
        let padding = len - p.len();
        ids.extend(std::iter::repeat_n(pad, padding).chain(p.iter().copied()));
        mask.extend(std::iter::repeat_n(false, padding).chain(std::iter::repeat_n(true, p.len())));
    }
    (ids, mask, len)
}

/// The rows' state between steps: the cache, what each row has seen, what it produced.
struct Decoding<'a> {
    fwd: DecoderForward<'a>,
    caches: Vec<LayerCache>,
    /// `[b, keys so far]`, row-major: true on real tokens.
    key_mask: Vec<bool>,
    keys: usize,
    /// Each row's next position.
    next_position: Vec<usize>,
}

impl Decoding<'_> {
    /// Logits `[b, vocab]` after feeding `ids` `[b, new]` (`new_mask` `[b, new]`) at `positions`.
    fn feed(
        &mut self,
        ids: &[u32],
        new_mask: &[bool],
        positions: &[usize],
    ) -> Result<Vec<f32>, ModelError> {
        let batch = self.next_position.len();
        let new = ids.len() / batch;
        let mut key_mask = Vec::with_capacity(batch * (self.keys + new));
        for row in 0..batch {
            key_mask.extend_from_slice(&self.key_mask[row * self.keys..(row + 1) * self.keys]);
            key_mask.extend_from_slice(&new_mask[row * new..(row + 1) * new]);
        }
        self.keys += new;
        self.key_mask = key_mask;
        let device = self.fwd.device();
        let visibility = Visibility {
            key_mask: &self.key_mask,
            keys: self.keys,
            queries: new,
        };
        let ctx = Context::new(self.fwd.cfg, positions, visibility, &device, self.fwd.dtype);
        let x = self.fwd.embed(int_tensor(ids, batch, new, &device));
        let hidden = self.fwd.hidden_cached(x, &ctx, &mut self.caches);
        let last = hidden.narrow(1, new - 1, 1);
        to_f32_vec(self.fwd.logits(last))
    }
}

impl DecoderModel {
    /// The next token of each row from `logits` `[b, vocab]`; rows already done get `pad`.
    fn pick(
        &self,
        logits: &[f32],
        seqs: &mut [Vec<u32>],
        done: &mut [bool],
        config: &GenerateConfig,
    ) -> Vec<u32> {
        let vocab = self.config.vocab_size;
        let pad = self.config.pad_token_id.unwrap_or(config.eos_id);
        seqs.iter_mut()
            .enumerate()
            .map(|(row, seq)| {
                if done[row] {
                    return pad;
                }
                let mut scores = logits[row * vocab..(row + 1) * vocab].to_vec();
                let next = config.next_token(&mut scores, seq);
                seq.push(next);
                done[row] = next == config.eos_id;
                next
            })
            .collect()
    }
}

impl CausalGenerate for DecoderModel {
    /// Greedy continuations of `prompts` (each at least one token); each is cut at (and without)
    /// EOS. The logits processors see the prompt and what was generated, as transformers' do.
    fn generate(
        &self,
        params: &[Tensor<2>],
        prompts: &[Vec<u32>],
        config: &GenerateConfig,
        precision: Precision,
    ) -> Result<Vec<Vec<u32>>, ModelError> {
        if let Some(i) = prompts.iter().position(Vec::is_empty) {
            return Err(ModelError::Input(format!(
                "prompt {i} is empty: generation continues at least one token"
            )));
        }
        if prompts.is_empty() || config.max_new_tokens == 0 {
            return Ok(vec![Vec::new(); prompts.len()]);
        }
        let pad = self.config.pad_token_id.unwrap_or(0);
        let (ids, mask, len) = left_pad(prompts, pad);
        self.check_ids(&ids)?;
        let batch = prompts.len();
        let mut state = Decoding {
            fwd: self.forward(params, precision.dtype()),
            caches: vec![LayerCache::default(); self.layout.layers.len()],
            key_mask: Vec::new(),
            keys: 0,
            next_position: prompts.iter().map(Vec::len).collect(),
        };
        let mut logits = state.feed(&ids, &mask, &positions(&mask, len))?;
        let mut seqs: Vec<Vec<u32>> = prompts.to_vec();
        let mut done = vec![false; batch];
        for step in 0..config.max_new_tokens {
            let next = self.pick(&logits, &mut seqs, &mut done, config);
            let last = step + 1 == config.max_new_tokens;
            if last || done.iter().all(|d| *d) || config.stop_requested() {
                break;
            }
            let positions = state.next_position.clone();
            state.next_position.iter_mut().for_each(|p| *p += 1);
            logits = state.feed(&next, &vec![true; batch], &positions)?;
        }
        Ok(seqs
            .into_iter()
            .zip(prompts)
            .map(|(seq, prompt)| {
                seq.into_iter()
                    .skip(prompt.len())
                    .take_while(|&id| id != config.eos_id)
                    .collect()
            })
            .collect())
    }
}
