//! How much validation one evaluation runs when the config does not say: a small share of the compute
//! of the training between two evaluations, so that evaluating never dominates a run (issue 16: a full
//! validation loss over 1,000 ChatLM rows plus 64 generations took 6–8 minutes per evaluation).

/// Evaluation may cost this share of the training between two evaluations (memfit's choice: small
/// enough not to matter, large enough for a validation loss that moves with the training).
pub const EVAL_SHARE: f64 = 0.05;

/// A forward pass without gradients costs about a third of a training row: forward + backward is
/// ~6N FLOPs per token against ~2N for the forward alone (Kaplan et al. 2020, "Scaling Laws for
/// Neural Language Models", §2.1).
pub const FORWARD_SHARE: f64 = 1.0 / 3.0;

/// The fewest validation rows an automatic evaluation computes the loss on (when the set has them):
/// fewer give a loss that is mostly row-to-row noise, more make a very short run (a few steps of a
/// large model) evaluate far longer than it trains (memfit's choice).
pub const MIN_LOSS_ROWS: usize = 16;

/// How many validation rows one evaluation uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvalSize {
    /// Rows whose loss is computed, spread evenly over the validation set.
    pub loss_rows: usize,
    /// Rows generated and scored (the first ones of the validation set).
    pub generate_rows: usize,
}

/// `loss_rows`: the configured number, or the rows whose forward passes cost [`EVAL_SHARE`] of
/// training `rows_between` rows (at least [`MIN_LOSS_ROWS`]); `generate_rows` as configured. Both
/// at most the `valid_rows` there are.
pub fn eval_size(
    loss_rows: Option<usize>,
    generate_rows: usize,
    valid_rows: usize,
    rows_between: u64,
) -> EvalSize {
    let auto = || {
        let rows = (rows_between as f64 * EVAL_SHARE / FORWARD_SHARE).ceil() as usize;
        rows.max(MIN_LOSS_ROWS)
    };
    let loss_rows = loss_rows.unwrap_or_else(auto).min(valid_rows);
    EvalSize {
        loss_rows,
        generate_rows: generate_rows.min(valid_rows),
    }
}

/// Row `i` of `n` rows spread evenly over `len` rows (`i < n ≤ len`): 0, len/n, 2·len/n, …
pub fn spread(i: usize, n: usize, len: usize) -> usize {
    if n == 0 {
        0
    } else {
        (i as u128 * len as u128 / n as u128) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn automatic_loss_rows_are_a_share_of_the_training_between_evaluations() {
        // 10,000 training rows between evaluations: 5% of their cost is 1,500 forward-only rows.
        assert_eq!(eval_size(None, 8, 100_000, 10_000).loss_rows, 1_500);
        // A short interval still evaluates MIN_LOSS_ROWS rows; a small set all of its rows.
        assert_eq!(eval_size(None, 8, 100_000, 10).loss_rows, MIN_LOSS_ROWS);
        assert_eq!(eval_size(None, 8, 40, 10_000).loss_rows, 40);
        // The README's ChatLM flow: 128 rows per step, 24 steps an epoch, 1,000 validation rows.
        assert_eq!(eval_size(None, 8, 1_000, 128 * 24).loss_rows, 461);
    }

    #[test]
    fn configured_sizes_win_within_the_set() {
        let s = eval_size(Some(10), 4, 1_000, 1_000_000);
        assert_eq!((s.loss_rows, s.generate_rows), (10, 4));
        let s = eval_size(Some(5000), 64, 200, 0);
        assert_eq!((s.loss_rows, s.generate_rows), (200, 64));
        assert_eq!(eval_size(None, 8, 5, 0).generate_rows, 5);
    }

    #[test]
    fn spread_rows_cover_the_set_evenly_and_stay_inside_it() {
        let rows: Vec<usize> = (0..4).map(|i| spread(i, 4, 10)).collect();
        assert_eq!(rows, vec![0, 2, 5, 7]);
        let all: Vec<usize> = (0..10).map(|i| spread(i, 10, 10)).collect();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
    }
}
