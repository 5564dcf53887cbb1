//! How much validation one evaluation runs: the whole validation set unless the config caps it
//! (`--eval-loss-rows`, then spread evenly over the set), so that a held-out score is a score of the
//! whole held-out set (issue 28). A cap is what keeps a large set's evaluation cheap (issue 16: 1,000
//! ChatLM rows took minutes); the evaluation's cost line says when one applies.

/// How many validation rows one evaluation uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvalSize {
    /// Rows whose loss is computed, spread evenly over the validation set.
    pub loss_rows: usize,
    /// Rows generated and scored (the first ones of the validation set).
    pub generate_rows: usize,
}

/// `loss_rows`: the configured cap, else every row; `generate_rows` as configured. Both at most the
/// `valid_rows` there are.
pub fn eval_size(loss_rows: Option<usize>, generate_rows: usize, valid_rows: usize) -> EvalSize {
    EvalSize {
        loss_rows: loss_rows.unwrap_or(valid_rows).min(valid_rows),
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
    fn without_a_cap_every_row_is_evaluated() {
        assert_eq!(eval_size(None, 8, 400).loss_rows, 400);
        assert_eq!(eval_size(None, 8, 100_000).loss_rows, 100_000);
    }

    #[test]
    fn configured_sizes_win_within_the_set() {
        let s = eval_size(Some(10), 4, 1_000);
        assert_eq!((s.loss_rows, s.generate_rows), (10, 4));
        let s = eval_size(Some(5000), 64, 200);
        assert_eq!((s.loss_rows, s.generate_rows), (200, 64));
        assert_eq!(eval_size(None, 8, 5).generate_rows, 5);
    }

    #[test]
    fn spread_rows_cover_the_set_evenly_and_stay_inside_it() {
        let rows: Vec<usize> = (0..4).map(|i| spread(i, 4, 10)).collect();
        assert_eq!(rows, vec![0, 2, 5, 7]);
        let all: Vec<usize> = (0..10).map(|i| spread(i, 10, 10)).collect();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
    }
}
