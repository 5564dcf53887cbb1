//! Character-level BLEU-4 of one generated text against one reference, two ways:
//!
//! - [`bleu4_seed`]: the seed's formula (ChatLM-mini-Chinese `utils/functions.py::get_bleu4_score`):
//!   clipped n-gram precisions for n = 1..4, 0 when any is 0, geometric mean, times
//!   `exp(1 - ref_len / out_len)` — a brevity "penalty" that is *not* capped, so an output longer than
//!   its reference scores above the plain geometric mean (and can exceed 1).
//! - [`bleu4_standard`]: the same precisions with the standard penalty `min(1, exp(1 - r / c))`
//!   (Papineni et al. 2002), i.e. nltk's `sentence_bleu` without smoothing.

use std::collections::HashMap;

const MAX_N: usize = 4;

/// Clipped matches and candidate n-gram counts for n = 1..=4 (index n - 1).
fn clipped_counts(output: &[char], reference: &[char]) -> ([u64; MAX_N], [u64; MAX_N]) {
    let mut clipped = [0u64; MAX_N];
    let mut totals = [0u64; MAX_N];
    for n in 1..=MAX_N {
        let mut ref_counts: HashMap<&[char], u64> = HashMap::new();
        for gram in reference.windows(n) {
            *ref_counts.entry(gram).or_default() += 1;
        }
        let mut out_counts: HashMap<&[char], u64> = HashMap::new();
        for gram in output.windows(n) {
            *out_counts.entry(gram).or_default() += 1;
        }
        totals[n - 1] = out_counts.values().sum();
        clipped[n - 1] = out_counts
            .iter()
            .map(|(gram, c)| (*c).min(ref_counts.get(gram).copied().unwrap_or(0)))
            .sum();
    }
    (clipped, totals)
}

/// Uniformly weighted geometric mean of the four precisions, or `None` when one of them is zero.
fn geometric_mean(output: &[char], reference: &[char]) -> Option<f64> {
    let (clipped, totals) = clipped_counts(output, reference);
    if clipped.contains(&0) {
        return None;
    }
    let log_sum: f64 = (0..MAX_N)
        .map(|i| (clipped[i] as f64 / totals[i] as f64).ln() / MAX_N as f64)
        .sum();
    Some(log_sum.exp())
}

/// The seed's score (uncapped brevity factor).
pub fn bleu4_seed(output: &str, reference: &str) -> f64 {
    let (out, reference): (Vec<char>, Vec<char>) =
        (output.chars().collect(), reference.chars().collect());
    match geometric_mean(&out, &reference) {
        Some(g) => (1.0 - reference.len() as f64 / out.len() as f64).exp() * g,
        None => 0.0,
    }
}

/// Standard sentence BLEU-4 (brevity penalty capped at 1, no smoothing).
pub fn bleu4_standard(output: &str, reference: &str) -> f64 {
    let (out, reference): (Vec<char>, Vec<char>) =
        (output.chars().collect(), reference.chars().collect());
    match geometric_mean(&out, &reference) {
        Some(g) => {
            let ratio = reference.len() as f64 / out.len() as f64;
            let penalty = if ratio > 1.0 {
                (1.0 - ratio).exp()
            } else {
                1.0
            };
            penalty * g
        }
        None => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_texts_score_one_both_ways() {
        assert!((bleu4_seed("一千零一", "一千零一") - 1.0).abs() < 1e-12);
        assert!((bleu4_standard("一千零一", "一千零一") - 1.0).abs() < 1e-12);
    }

    #[test]
    fn shorter_than_four_or_disjoint_scores_zero() {
        assert_eq!(bleu4_seed("abc", "abc"), 0.0);
        assert_eq!(bleu4_standard("abcd", "wxyz"), 0.0);
        assert_eq!(bleu4_seed("", "abcd"), 0.0);
    }

    #[test]
    fn hand_computed_short_output() {
        // out "abcd" vs ref "abcde": every n-gram of out matches → precisions 1, geometric mean 1.
        // seed: exp(1 - 5/4) = exp(-0.25); standard: the same (r > c).
        let e = (-0.25f64).exp();
        assert!((bleu4_seed("abcd", "abcde") - e).abs() < 1e-12);
        assert!((bleu4_standard("abcd", "abcde") - e).abs() < 1e-12);
    }

    #[test]
    fn long_output_shows_the_seed_s_uncapped_penalty() {
        // out "abcdeX" vs ref "abcde": precisions 5/6, 4/5, 3/4, 2/3 → geometric mean
        // (5/6 · 4/5 · 3/4 · 2/3)^(1/4) = (1/3)^(1/4) = 0.759835685651593.
        let g = (1.0f64 / 3.0).powf(0.25);
        assert!((bleu4_standard("abcdeX", "abcde") - g).abs() < 1e-12);
        // seed multiplies by exp(1 - 5/6) = 1.18136041286565 > 1.
        let seed = bleu4_seed("abcdeX", "abcde");
        assert!((seed - g * (1.0f64 / 6.0).exp()).abs() < 1e-12);
        assert!(seed > bleu4_standard("abcdeX", "abcde"));
    }

    #[test]
    fn clipping_counts_repeats_once_per_reference_occurrence() {
        // out "aaaaa" vs ref "aaaab": 1-grams clip 4/5, 2-grams 3/4, 3-grams 2/3, 4-grams 1/2.
        let g = (4.0f64 / 5.0 * 3.0 / 4.0 * 2.0 / 3.0 * 1.0 / 2.0).powf(0.25);
        assert!((bleu4_standard("aaaaa", "aaaab") - g).abs() < 1e-12);
    }
}
