//! Causal-LM rows: one token sequence per row and the length of its prompt, which the loss skips.
//!
//! - Chat rows are rendered by [`PromptFormat`] into a prompt and the whole text; the whole text
//!   is tokenized once with byte offsets, and the prompt's tokens are the leading tokens that lie
//!   inside the prompt's bytes. A token that straddles the boundary holds response text, so it is
//!   trained. Tokenizing the whole text (not prompt and response apart) gives exactly the tokens a
//!   model sees for that text, and the mask follows the characters.
//! - Plain-text rows: no prompt, every token trained (the tokenizer's post-processor adds what it
//!   adds, e.g. Llama's BOS).
//! - EOS is appended after the response unless the response already ends with it (a template
//!   that closes turns with the EOS token, as Llama 3's `<|eot_id|>` or Qwen's `<|im_end|>`, then
//!   followed only by whitespace).
//! - Truncation to `max_len` ([`fit`]): prompt tokens go first, from the start of the prompt (a
//!   BOS first token is kept): the end of the prompt is the latest turn and the generation header
//!   the response follows, which is what the response depends on and what a model sees when it
//!   generates. Only a response longer than `max_len` on its own is cut, at its end (no EOS then:
//!   the answer did not end there).
//! - Prediction: the prompt alone (with the generation prompt), without the zero-width tokens a
//!   post-processor appends (an EOS of a `$A </s>` template would end the prompt), cut the same
//!   way.

use super::{EncodeSettings, EncodedRow, RowProblem, RowResult, RowTokens};
use crate::chat::PromptFormat;
use crate::error::{DataError, Result};
use crate::rows::{Mode, RowTexts};
use crate::store::CausalRow;
use crate::tokenizer::{SpecialToken, Tokenizer};
use tokenizers::Encoding;

const TASK: &str = "causal-lm";

pub(super) struct CausalEncoder {
    format: PromptFormat,
    eos: SpecialToken,
    bos: Option<u32>,
    max_len: Option<usize>,
}

/// A row's text and where its prompt ends.
struct Rendered {
    text: String,
    /// Bytes of the prompt (`None`: a plain text, no prompt); in prediction the whole text.
    prompt_bytes: Option<usize>,
    /// The text is encoded with the tokenizer's post-processor.
    add_special_tokens: bool,
    /// The response already ends with the EOS token (trailing whitespace aside).
    ends_with_eos: bool,
}

impl CausalEncoder {
    pub fn new(tokenizer: &Tokenizer, settings: &EncodeSettings) -> Result<Self> {
        if matches!(settings.max_len, Some(n) if n < 2) {
            return Err(DataError::Options(format!(
                "--max-len must be at least 2 for {TASK}"
            )));
        }
        Ok(CausalEncoder {
            format: PromptFormat::for_tokenizer(tokenizer, settings.chat_template.as_deref())?,
            eos: tokenizer.require_eos(TASK)?.clone(),
            bos: tokenizer.bos().map(|b| b.id),
            max_len: settings.max_len,
        })
    }

    pub fn format(&self) -> &PromptFormat {
        &self.format
    }

    pub fn eos(&self) -> u32 {
        self.eos.id
    }

    fn render(&self, row: &RowTexts, mode: Mode) -> Option<std::result::Result<Rendered, String>> {
        let ends_with_eos = |s: &str| s.trim_end().ends_with(&self.eos.token);
        Some(match (row, mode) {
            (RowTexts::Text(text), _) => Ok(Rendered {
                ends_with_eos: ends_with_eos(text),
                prompt_bytes: (mode == Mode::Predict).then_some(text.len()),
                text: text.clone(),
                add_special_tokens: true,
            }),
            (RowTexts::Chat(c), Mode::Train) => {
                self.format.render_with_response(c).map(|r| Rendered {
                    ends_with_eos: ends_with_eos(r.response()),
                    prompt_bytes: Some(r.prompt.len()),
                    text: r.full,
                    add_special_tokens: self.format.add_special_tokens(),
                })
            }
            (RowTexts::Chat(c), Mode::Predict) => self.format.render_prompt(c).map(|p| Rendered {
                ends_with_eos: false,
                prompt_bytes: Some(p.len()),
                text: p,
                add_special_tokens: self.format.add_special_tokens(),
            }),
            _ => return None,
        })
    }

    pub fn encode_batch(
        &self,
        tokenizer: &Tokenizer,
        rows: &[RowTexts],
        mode: Mode,
        wrong: impl Fn(&RowTexts) -> RowResult,
    ) -> Result<Vec<RowResult>> {
        let rendered: Vec<_> = rows.iter().map(|r| self.render(r, mode)).collect();
        // Texts with and without the post-processor, each tokenized as one parallel batch.
        let batch = |special: bool| -> Result<std::vec::IntoIter<Encoding>> {
            let texts: Vec<String> = rendered
                .iter()
                .filter_map(|r| match r {
                    Some(Ok(r)) if r.add_special_tokens == special => Some(r.text.clone()),
                    _ => None,
                })
                .collect();
            let encodings = tokenizer.inner().encode_batch(texts, special);
            Ok(encodings
                .map_err(|e| tokenizer.encode_error(e))?
                .into_iter())
        };
        let (mut with_specials, mut without) = (batch(true)?, batch(false)?);
        let mut out = Vec::with_capacity(rows.len());
        for (row, r) in rows.iter().zip(rendered) {
            let r = match r {
                None => {
                    out.push(wrong(row));
                    continue;
                }
                Some(Err(reason)) => {
                    out.push(Err(RowProblem::new(reason)));
                    continue;
                }
                Some(Ok(r)) => r,
            };
            let batch = if r.add_special_tokens {
                &mut with_specials
            } else {
                &mut without
            };
            let encoding = batch
                .next()
                .ok_or_else(|| DataError::Options("internal: an encoding went missing".into()))?;
            out.push(Ok(match mode {
                Mode::Train => self.finish_training(&r, &encoding),
                Mode::Predict => self.finish_prompt(&encoding),
            }));
        }
        Ok(out)
    }

    fn keep_head(&self, ids: &[u32]) -> usize {
        usize::from(self.bos.is_some() && ids.first() == self.bos.as_ref())
    }

    fn finish_training(&self, r: &Rendered, encoding: &Encoding) -> EncodedRow {
        let mut ids = encoding.get_ids().to_vec();
        let prompt_len = match r.prompt_bytes {
            None => 0,
            Some(b) => prompt_tokens(encoding.get_offsets(), b),
        };
        if !r.ends_with_eos && ids.last() != Some(&self.eos.id) {
            ids.push(self.eos.id);
        }
        self.fitted(ids, prompt_len)
    }

    fn finish_prompt(&self, encoding: &Encoding) -> EncodedRow {
        let offsets = encoding.get_offsets();
        let text_end = offsets
            .iter()
            .rposition(|(s, e)| e > s)
            .map_or(offsets.len(), |k| k + 1);
        let ids = encoding.get_ids()[..text_end].to_vec();
        let prompt_len = ids.len();
        self.fitted(ids, prompt_len)
    }

    /// The row cut to `max_len` by [`fit`].
    fn fitted(&self, mut ids: Vec<u32>, mut prompt_len: usize) -> EncodedRow {
        let keep = self.keep_head(&ids);
        let truncated = self
            .max_len
            .is_some_and(|max| fit(&mut ids, &mut prompt_len, keep, max));
        EncodedRow {
            tokens: RowTokens::CausalLm(CausalRow { ids, prompt_len }),
            truncated,
        }
    }
}

/// The number of leading tokens that lie inside the first `prompt_bytes` bytes of the text (a
/// post-processor's zero-width BOS included).
fn prompt_tokens(offsets: &[(usize, usize)], prompt_bytes: usize) -> usize {
    offsets
        .iter()
        .take_while(|(_, end)| *end <= prompt_bytes)
        .count()
}

/// Cuts `ids`, whose first `prompt_len` tokens are the prompt, to `max` tokens: prompt tokens
/// first, from the start of the prompt after its first `keep_head` tokens; then, only when no
/// such prompt token is left, the end of the response. True if it cut.
pub(crate) fn fit(
    ids: &mut Vec<u32>,
    prompt_len: &mut usize,
    keep_head: usize,
    max: usize,
) -> bool {
    if ids.len() <= max {
        return false;
    }
    let excess = ids.len() - max;
    let keep_head = keep_head.min(*prompt_len);
    let from_prompt = excess.min(*prompt_len - keep_head);
    ids.drain(keep_head..keep_head + from_prompt);
    *prompt_len -= from_prompt;
    ids.truncate(max);
    *prompt_len = (*prompt_len).min(ids.len());
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn prompt_tokens_end_where_a_token_reaches_into_the_response() {
        // "ab|cd": tokens (0,0) BOS, (0,2) "ab", (2,3) "c", (3,4) "d"; prompt = 2 bytes.
        assert_eq!(prompt_tokens(&[(0, 0), (0, 2), (2, 3), (3, 4)], 2), 2);
        // A token straddling the boundary ("bc") is the response's.
        assert_eq!(prompt_tokens(&[(0, 1), (1, 3), (3, 4)], 2), 1);
    }

    #[test]
    fn the_prompt_is_cut_from_its_start_keeping_the_head() {
        let mut ids = vec![100, 1, 2, 3, 4, 50, 51, 9];
        let mut prompt = 5;
        assert!(fit(&mut ids, &mut prompt, 1, 6));
        assert_eq!((ids, prompt), (vec![100, 3, 4, 50, 51, 9], 3));
        let mut ids = vec![100, 1, 50, 51, 52, 9];
        let mut prompt = 2;
        assert!(fit(&mut ids, &mut prompt, 1, 3));
        assert_eq!(
            (ids, prompt),
            (vec![100, 50, 51], 1),
            "response cut at its end"
        );
    }

    proptest! {
        /// No response token is dropped while a removable prompt token remains; the kept prompt
        /// is the head plus a suffix of the prompt, the kept response a prefix of the response.
        #[test]
        fn truncation_keeps_the_response_while_prompt_tokens_remain(
            prompt_len in 0usize..40,
            response_len in 0usize..40,
            head in 0usize..2,
            max in 2usize..60,
        ) {
            let prompt: Vec<u32> = (0..prompt_len as u32).collect();
            let response: Vec<u32> = (1000..1000 + response_len as u32).collect();
            let mut ids = [prompt.clone(), response.clone()].concat();
            let mut p = prompt_len;
            let cut = fit(&mut ids, &mut p, head, max);
            let n = prompt_len + response_len;
            prop_assert_eq!(cut, n > max);
            prop_assert_eq!(ids.len(), n.min(max));
            let (kept_prompt, kept_response) = ids.split_at(p);
            prop_assert!(response.starts_with(kept_response));
            let head = head.min(prompt_len);
            prop_assert_eq!(&kept_prompt[..head.min(kept_prompt.len())], &prompt[..head.min(kept_prompt.len())]);
            prop_assert!(prompt[head..].ends_with(&kept_prompt[head.min(kept_prompt.len())..]));
            if kept_response.len() < response_len {
                prop_assert!(p <= head, "a response token was dropped while prompt tokens remained");
            }
        }
    }
}
