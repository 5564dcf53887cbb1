//! Greedy decoding settings and transformers' logits processors (`RepetitionPenaltyLogitsProcessor`,
//! `NoRepeatNGramLogitsProcessor`), applied to one row of scores given the sequence so far.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Greedy decoding settings.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateConfig {
    pub max_new_tokens: usize,
    /// Ban tokens that would repeat an n-gram of this size (0: off).
    pub no_repeat_ngram: usize,
    /// 1.0: off.
    pub repetition_penalty: f32,
    pub eos_id: u32,
    /// Polled between tokens: once any is set, generation ends early and returns what it has (the
    /// caller, which set it to stop, discards the rows). A stop request, the memory guard's hard limit.
    pub stop: Vec<StopSignal>,
}

impl GenerateConfig {
    /// Whether generation should end before its next token.
    pub fn stop_requested(&self) -> bool {
        self.stop.iter().any(StopSignal::is_set)
    }

    /// The next token of one row: the processors applied to `scores`, then the argmax.
    pub fn next_token(&self, scores: &mut [f32], seq: &[u32]) -> u32 {
        apply_repetition_penalty(scores, seq, self.repetition_penalty);
        ban_repeated_ngrams(scores, seq, self.no_repeat_ngram);
        argmax(scores)
    }
}

/// A shared flag a stop request sets (the trainer's SIGINT/SIGTERM flag, the memory guard's hard
/// limit).
#[derive(Debug, Clone, Default)]
pub struct StopSignal(pub Arc<AtomicBool>);

impl PartialEq for StopSignal {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl StopSignal {
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Divides positive (multiplies negative) scores of tokens already in `seq` by `penalty`.
pub fn apply_repetition_penalty(scores: &mut [f32], seq: &[u32], penalty: f32) {
    if penalty == 1.0 {
        return;
    }
    let seen: HashSet<u32> = seq.iter().copied().collect();
    for id in seen {
        if let Some(s) = scores.get_mut(id as usize) {
            *s = if *s < 0.0 { *s * penalty } else { *s / penalty };
        }
    }
}

/// Bans every token that would complete an `n`-gram already present in `seq`.
pub fn ban_repeated_ngrams(scores: &mut [f32], seq: &[u32], n: usize) {
    if n == 0 || seq.len() + 1 < n {
        return;
    }
    let prefix = &seq[seq.len() + 1 - n..];
    for w in seq.windows(n) {
        if &w[..n - 1] == prefix
            && let Some(s) = scores.get_mut(w[n - 1] as usize)
        {
            *s = f32::NEG_INFINITY;
        }
    }
}

/// Index of the largest score (the first on ties, as `torch.argmax`).
pub fn argmax(scores: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &s) in scores.iter().enumerate() {
        if s > scores[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_repeat_ngram_bans_the_completing_token() {
        let mut s = vec![0.0; 6];
        // seq ends in (2, 3); the 3-gram (2, 3, 4) occurred: 4 is banned, nothing else.
        ban_repeated_ngrams(&mut s, &[0, 2, 3, 4, 1, 2, 3], 3);
        assert_eq!(s[4], f32::NEG_INFINITY);
        assert_eq!(s.iter().filter(|x| x.is_infinite()).count(), 1);
    }

    #[test]
    fn repetition_penalty_follows_sign() {
        let mut s = vec![2.0, -2.0, 2.0];
        apply_repetition_penalty(&mut s, &[0, 1], 2.0);
        assert_eq!(s, vec![1.0, -4.0, 2.0]);
        assert_eq!(argmax(&s), 2);
    }

    #[test]
    fn stop_signal_is_shared_by_clones() {
        let flag = StopSignal::default();
        let config = GenerateConfig {
            max_new_tokens: 4,
            no_repeat_ngram: 0,
            repetition_penalty: 1.0,
            eos_id: 1,
            stop: vec![flag.clone()],
        };
        assert!(!config.stop_requested());
        flag.0.store(true, Ordering::SeqCst);
        assert!(config.stop_requested());
    }
}
