//! Classification rows: the text, or the sentence pair, encoded as the tokenizer encodes it for a
//! model (`tokenizer(text, text_pair)` in transformers): its post-processor adds the specials and
//! the token type ids (BERT: `[CLS] a [SEP] b [SEP]`, types 0…0 1…1; RoBERTa:
//! `<s> a </s></s> b </s>`, all type 0). Rows longer than `max_len` are encoded again with the
//! tokenizer's truncation, longest-first (transformers' `truncation=True` for pairs), which keeps
//! the specials.
//!
//! A tokenizer whose post-processor adds no classification specials is refused: a classifier
//! reads its pooled `[CLS]`/`<s>` position, which would then be the text's first word.

use super::{EncodeSettings, EncodedRow, RowProblem, RowResult, RowTokens};
use crate::error::{DataError, Result};
use crate::rows::RowTexts;
use crate::tokenizer::Tokenizer;
use tokenizers::{EncodeInput, Encoding, TruncationParams, TruncationStrategy};

const TASK: &str = "classification";

pub(super) struct ClassificationEncoder {
    max_len: Option<usize>,
    /// A copy of the tokenizer with truncation to `max_len`, for the rows that are too long.
    truncating: Option<tokenizers::Tokenizer>,
}

/// The tokens of an encoding, for messages (`nothing` when empty).
fn shown(encoding: &Encoding) -> String {
    let tokens = encoding.get_tokens();
    if tokens.is_empty() {
        "nothing".into()
    } else {
        tokens.join(" ")
    }
}

/// Checks that the tokenizer has CLS and SEP tokens and that its post-processor puts them
/// around a text and a pair.
fn check_specials(tokenizer: &Tokenizer) -> Result<()> {
    let cls = tokenizer.require_cls(TASK)?;
    let sep = tokenizer.require_sep(TASK)?;
    let probes = [
        ("text", EncodeInput::Single("".into())),
        ("pair", EncodeInput::Dual("".into(), "".into())),
    ];
    for (what, input) in probes {
        let encoding = tokenizer
            .inner()
            .encode(input, true)
            .map_err(|e| tokenizer.encode_error(e))?;
        let ids = encoding.get_ids();
        if ids.first() != Some(&cls.id) || ids.last() != Some(&sep.id) {
            return Err(DataError::Tokenizer {
                path: tokenizer.path().to_path_buf(),
                reason: format!(
                    "its post-processor does not add the classification specials: an empty \
                     {what} encodes as {} where {} … {} was expected (BERT's [CLS] … [SEP], \
                     RoBERTa's <s> … </s>); classification needs a tokenizer.json whose \
                     \"post_processor\" adds them",
                    shown(&encoding),
                    cls.token,
                    sep.token
                ),
            });
        }
    }
    Ok(())
}

impl ClassificationEncoder {
    pub fn new(tokenizer: &Tokenizer, settings: &EncodeSettings) -> Result<Self> {
        check_specials(tokenizer)?;
        let Some(max) = settings.max_len else {
            return Ok(ClassificationEncoder {
                max_len: None,
                truncating: None,
            });
        };
        let added = tokenizer
            .inner()
            .get_post_processor()
            .map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, false));
        // A text needs its specials plus one token of its own.
        if max <= added {
            return Err(DataError::Options(format!(
                "--max-len {max} leaves no room for text: the tokenizer adds {added} special \
                 tokens to a text (at least {} for classification)",
                added + 1
            )));
        }
        let mut truncating = tokenizer.inner().clone();
        truncating
            .with_truncation(Some(TruncationParams {
                max_length: max,
                strategy: TruncationStrategy::LongestFirst,
                ..Default::default()
            }))
            .map_err(|e| DataError::Options(format!("--max-len {max}: {e}")))?;
        Ok(ClassificationEncoder {
            max_len: Some(max),
            truncating: Some(truncating),
        })
    }

    pub fn encode_batch(
        &self,
        tokenizer: &Tokenizer,
        rows: &[RowTexts],
        wrong: impl Fn(&RowTexts) -> RowResult,
    ) -> Result<Vec<RowResult>> {
        let input = |row: &RowTexts| match row {
            RowTexts::Classification {
                text, text_pair, ..
            } => Some(match text_pair {
                Some(pair) => EncodeInput::Dual(text.clone().into(), pair.clone().into()),
                None => EncodeInput::Single(text.clone().into()),
            }),
            _ => None,
        };
        let inputs: Vec<EncodeInput> = rows.iter().filter_map(input).collect();
        let encodings = tokenizer
            .inner()
            .encode_batch(inputs, true)
            .map_err(|e| tokenizer.encode_error(e))?;
        let mut encodings = encodings.into_iter();
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let RowTexts::Classification {
                text_pair, label, ..
            } = row
            else {
                out.push(wrong(row));
                continue;
            };
            let encoding = encodings
                .next()
                .ok_or_else(|| DataError::Options("internal: an encoding went missing".into()))?;
            out.push(Ok(self.finish(
                tokenizer,
                row,
                encoding,
                text_pair.is_some(),
                *label,
            )?));
        }
        Ok(out)
    }

    /// The row's tokens, encoded again with truncation when it is too long.
    fn finish(
        &self,
        tokenizer: &Tokenizer,
        row: &RowTexts,
        mut encoding: Encoding,
        pair: bool,
        label: Option<u32>,
    ) -> Result<EncodedRow> {
        let mut truncated = false;
        if let (Some(max), Some(t)) = (self.max_len, &self.truncating)
            && encoding.len() > max
        {
            let RowTexts::Classification {
                text, text_pair, ..
            } = row
            else {
                return Err(DataError::Row(RowProblem::new("not a classification row")));
            };
            let input = match text_pair {
                Some(p) => EncodeInput::Dual(text.as_str().into(), p.as_str().into()),
                None => EncodeInput::Single(text.as_str().into()),
            };
            encoding = t
                .encode(input, true)
                .map_err(|e| tokenizer.encode_error(e))?;
            truncated = true;
        }
        let ids = encoding.get_ids().to_vec();
        let second = encoding
            .get_type_ids()
            .iter()
            .position(|&t| t != 0)
            .unwrap_or(ids.len());
        Ok(EncodedRow {
            tokens: RowTokens::Classification {
                ids,
                second,
                pair,
                label,
            },
            truncated,
        })
    }
}
