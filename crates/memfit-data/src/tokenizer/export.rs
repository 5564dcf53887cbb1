//! Saving a tokenizer so that Hugging Face transformers encodes text as memfit trained on it.
//!
//! memfit encodes a seq2seq/chat segment without the tokenizer's post-processor and appends EOS by id
//! ([`crate::prepare`]). transformers' `AutoTokenizer` calls the `tokenizer.json` post-processor instead
//! (`add_special_tokens=True` is its default), and the ChatLM tokenizer has none: a checkpoint holding
//! the training tokenizer unchanged encodes prompts without their EOS. The copy saved beside a
//! checkpoint therefore carries a `TemplateProcessing` post-processor that appends EOS to each sequence
//! (single `$A EOS`, pair `$A EOS $B EOS`), as T5's own tokenizer does with `</s>`.

use super::Tokenizer;
use crate::error::{DataError, Result};
use serde_json::json;
use tokenizers::processors::template::TemplateProcessing;

impl Tokenizer {
    /// This tokenizer's `tokenizer.json` with a post-processor that appends the token `eos_id` to each
    /// sequence, replacing the post-processor it had. Everything else (model, normalizer,
    /// pre-tokenizer, added tokens, decoder) is unchanged.
    pub fn json_appending_eos(&self, eos_id: u32) -> Result<String> {
        let error = |reason: String| DataError::Tokenizer {
            path: self.path().to_path_buf(),
            reason,
        };
        let eos = self
            .inner()
            .id_to_token(eos_id)
            .ok_or_else(|| error(format!("no token has the EOS id {eos_id}")))?;
        let piece_a = json!({"Sequence": {"id": "A", "type_id": 0}});
        let piece_b = json!({"Sequence": {"id": "B", "type_id": 1}});
        let eos_piece = |type_id: u32| json!({"SpecialToken": {"id": eos, "type_id": type_id}});
        // Built from its serialized form: a token such as `a:b` cannot be mistaken for a type id.
        let processor: TemplateProcessing = serde_json::from_value(json!({
            "type": "TemplateProcessing",
            "single": [piece_a, eos_piece(0)],
            "pair": [piece_a, eos_piece(0), piece_b, eos_piece(1)],
            "special_tokens": {eos.as_str(): {"id": eos, "ids": [eos_id], "tokens": [eos]}},
        }))
        .map_err(|e| error(format!("EOS post-processor for {eos:?}: {e}")))?;
        let mut inner = self.inner().clone();
        inner.with_post_processor(Some(processor));
        inner
            .to_string(true)
            .map_err(|e| error(format!("writing tokenizer.json: {e}")))
    }

    /// A `tokenizer_config.json` for a tokenizer that came without one: transformers'
    /// `PreTrainedTokenizerFast` (which runs `tokenizer.json` as it is) with the EOS and PAD tokens.
    /// Without it `AutoTokenizer` picks the class from the model's `config.json` (T5's expects a
    /// Unigram model and fails on any other).
    pub fn transformers_config(&self) -> String {
        let mut config = json!({"tokenizer_class": "PreTrainedTokenizerFast"});
        if let Some(eos) = self.eos() {
            config["eos_token"] = json!(eos.token);
        }
        if let Some(pad) = self.pad() {
            config["pad_token"] = json!(pad.token);
        }
        serde_json::to_string_pretty(&config).unwrap_or_default() + "\n"
    }
}
