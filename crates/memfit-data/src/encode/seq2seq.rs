//! seq2seq and chat rows: source and target encoded without the tokenizer's post-processor, each
//! cut to its maximum and ended with EOS (appended by id).

use super::{EncodeSettings, EncodedRow, RowProblem, RowResult, RowTokens};
use crate::chat::Conversation;
use crate::error::{DataError, Result};
use crate::rows::{Mode, RowTexts};
use crate::store::Task;
use crate::tokenizer::Tokenizer;

pub(super) struct Seq2seqEncoder {
    eos: u32,
    max_len: Option<usize>,
    max_target_len: Option<usize>,
}

/// Cuts `ids` to `max - 1` tokens (room for EOS) and appends EOS; true if it cut.
fn finish_segment(ids: &mut Vec<u32>, max: Option<usize>, eos: u32) -> bool {
    let cut = match max {
        Some(m) if ids.len() > m - 1 => {
            ids.truncate(m - 1);
            true
        }
        _ => false,
    };
    ids.push(eos);
    cut
}

/// Source and target texts of a row (instruction and input joined by a newline, as Alpaca-style
/// prompts do).
fn texts(row: &RowTexts) -> Option<(String, Option<String>)> {
    match row {
        RowTexts::Seq2seq { source, target } => Some((source.clone(), target.clone())),
        RowTexts::Chat(Conversation::Instruction {
            instruction,
            input,
            output,
        }) => {
            let source = if input.trim().is_empty() {
                instruction.clone()
            } else {
                format!("{instruction}\n{input}")
            };
            Some((source, output.clone()))
        }
        _ => None,
    }
}

impl Seq2seqEncoder {
    pub fn new(tokenizer: &Tokenizer, task: Task, settings: &EncodeSettings) -> Result<Self> {
        let max_target_len = settings.max_target_len.or(settings.max_len);
        // Each segment needs room for one token plus EOS.
        for (flag, v) in [
            ("--max-len", settings.max_len),
            ("--max-target-len", max_target_len),
        ] {
            if matches!(v, Some(n) if n < 2) {
                return Err(DataError::Options(format!(
                    "{flag} must be at least 2 for {}",
                    task.name()
                )));
            }
        }
        Ok(Seq2seqEncoder {
            eos: tokenizer.require_eos(task.name())?.id,
            max_len: settings.max_len,
            max_target_len,
        })
    }

    pub fn eos(&self) -> u32 {
        self.eos
    }

    pub fn encode_batch(
        &self,
        tokenizer: &Tokenizer,
        rows: &[RowTexts],
        mode: Mode,
        wrong: impl Fn(&RowTexts) -> RowResult,
    ) -> Result<Vec<RowResult>> {
        let pairs: Vec<Option<(String, Option<String>)>> = rows.iter().map(texts).collect();
        let sources: Vec<String> = pairs.iter().flatten().map(|p| p.0.clone()).collect();
        let targets: Vec<String> = pairs
            .iter()
            .flatten()
            .map(|p| p.1.clone().unwrap_or_default())
            .collect();
        let mut src = tokenizer.encode_batch(sources, false)?.into_iter();
        let mut tgt = match mode {
            Mode::Train => tokenizer.encode_batch(targets, false)?.into_iter(),
            Mode::Predict => Vec::new().into_iter(),
        };
        let mut out = Vec::with_capacity(rows.len());
        for (row, pair) in rows.iter().zip(&pairs) {
            let Some((_, target_text)) = pair else {
                out.push(wrong(row));
                continue;
            };
            let mut source = src.next().ok_or_else(lost)?;
            let mut truncated = finish_segment(&mut source, self.max_len, self.eos);
            let target = match mode {
                Mode::Predict => None,
                Mode::Train => {
                    // Taken even for a row without a target: the encodings follow the rows.
                    let mut t = tgt.next().ok_or_else(lost)?;
                    if target_text.is_none() {
                        out.push(Err(RowProblem::new("no target to train on")));
                        continue;
                    }
                    truncated |= finish_segment(&mut t, self.max_target_len, self.eos);
                    Some(t)
                }
            };
            out.push(Ok(EncodedRow {
                tokens: RowTokens::Seq2seq { source, target },
                truncated,
            }));
        }
        Ok(out)
    }
}

fn lost() -> DataError {
    DataError::Options("internal: an encoding went missing".into())
}

#[cfg(test)]
mod tests {
    use super::finish_segment;

    #[test]
    fn segments_keep_eos_last_within_the_maximum() {
        let mut ids = vec![5, 6, 7, 8];
        assert!(finish_segment(&mut ids, Some(3), 1));
        assert_eq!(ids, vec![5, 6, 1]);
        let mut short = vec![5];
        assert!(!finish_segment(&mut short, Some(3), 1));
        assert_eq!(short, vec![5, 1]);
    }
}
