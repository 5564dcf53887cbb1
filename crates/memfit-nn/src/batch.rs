//! The micro-batches families read, one per task: padded, row-major `[batch, len]`, with masks that
//! are true on real tokens. Tasks (in the trainer) build them; families consume them.

/// Padded token rows and their padding mask: an encoder's input, or prompts to generate from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TokenRows {
    pub batch: usize,
    pub len: usize,
    /// `[batch, len]` ids, padded with the pad id.
    pub ids: Vec<u32>,
    /// `[batch, len]`, true on real tokens.
    pub mask: Vec<bool>,
}

impl TokenRows {
    /// Checks that the vectors hold `batch × len` values and the batch is not empty.
    pub fn check_shape(&self, what: &str) -> Result<(), crate::ModelError> {
        let n = self.batch * self.len;
        if n == 0 || self.ids.len() != n || self.mask.len() != n {
            return Err(crate::ModelError::Input(format!(
                "{what}: {} ids / {} mask values for batch {} × len {}",
                self.ids.len(),
                self.mask.len(),
                self.batch,
                self.len
            )));
        }
        Ok(())
    }

    /// Tokens that are not padding.
    pub fn real_tokens(&self) -> usize {
        self.mask.iter().filter(|m| **m).count()
    }
}

/// A seq2seq micro-batch: the source, and the target as labels (ending in EOS). The family builds
/// the decoder input itself (labels shifted right after the decoder start token).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Seq2SeqBatch {
    pub source: TokenRows,
    /// `[batch, tgt_len]` target ids, padded.
    pub labels: Vec<u32>,
    /// `[batch, tgt_len]`, true on the target tokens that count in the loss.
    pub label_mask: Vec<bool>,
    pub tgt_len: usize,
}

impl Seq2SeqBatch {
    /// Target tokens that count in the loss.
    pub fn target_tokens(&self) -> usize {
        self.label_mask.iter().filter(|m| **m).count()
    }
}

/// A sequence-classification micro-batch: one label per row.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClassificationBatch {
    pub input: TokenRows,
    /// `[batch, len]` segment ids (0 / 1 for sentence pairs); `None`: all 0.
    pub token_types: Option<Vec<u32>>,
    /// One label id per row.
    pub labels: Vec<u32>,
}

/// A causal-LM micro-batch: each row is one sequence; token `t` is trained (predicted from the
/// tokens before it) where `target_mask[t]` is true — prompt tokens and padding are not.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CausalLmBatch {
    pub input: TokenRows,
    /// `[batch, len]`: true where the token is a training target. Never true at position 0 (it
    /// has no prefix) or on padding.
    pub target_mask: Vec<bool>,
}

impl CausalLmBatch {
    /// Tokens that count in the loss.
    pub fn target_tokens(&self) -> usize {
        self.target_mask.iter().filter(|m| **m).count()
    }
}
