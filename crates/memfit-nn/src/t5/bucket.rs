//! T5's relative position buckets (`T5Attention._relative_position_bucket` in transformers).
//!
//! Half the buckets (all of them when causal) hold exact distances `0..max_exact`; the rest cover
//! `max_exact..max_distance` logarithmically; farther distances share the last bucket. Computed in f32
//! exactly as the PyTorch code does, so the bucket edges match transformers.

/// Bucket of `relative_position = key_position - query_position`.
pub fn relative_position_bucket(
    relative_position: i64,
    bidirectional: bool,
    num_buckets: usize,
    max_distance: usize,
) -> usize {
    let mut num_buckets = num_buckets as i64;
    let mut bucket = 0i64;
    let n = if bidirectional {
        num_buckets /= 2;
        if relative_position > 0 {
            bucket += num_buckets;
        }
        relative_position.abs()
    } else {
        // Causal: only keys at or before the query (relative_position <= 0) are distinguished.
        (-relative_position).max(0)
    };
    let max_exact = num_buckets / 2;
    if n < max_exact {
        bucket += n;
    } else {
        // torch: log(n.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact),
        // in float32, truncated towards zero by `.to(torch.long)`.
        let ratio = (n as f32 / max_exact as f32).ln();
        let denom = (max_distance as f64 / max_exact as f64).ln() as f32;
        let large = max_exact + (ratio / denom * (num_buckets - max_exact) as f32) as i64;
        bucket += large.min(num_buckets - 1);
    }
    bucket as usize
}

/// Bucket ids for a `[query_len, key_len]` grid, row-major; queries start at `query_offset`
/// (the decoding step when generating one token at a time).
pub fn bucket_grid(
    query_len: usize,
    key_len: usize,
    query_offset: usize,
    bidirectional: bool,
    num_buckets: usize,
    max_distance: usize,
) -> Vec<i64> {
    let mut out = Vec::with_capacity(query_len * key_len);
    for q in 0..query_len {
        for k in 0..key_len {
            let rel = k as i64 - (q + query_offset) as i64;
            out.push(
                relative_position_bucket(rel, bidirectional, num_buckets, max_distance) as i64,
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::relative_position_bucket as b;

    /// Values worked by hand from the formula with 32 buckets, max distance 128.
    /// Bidirectional: 16 buckets per direction, exact below 8; log range 8..128 over buckets 8..15:
    /// n=8 → 8 + ⌊ln(1)/ln(16)·8⌋ = 8; n=12 → 8 + ⌊ln(1.5)/ln(16)·8⌋ = 8 + ⌊1.17⌋ = 9;
    /// n=20 → 8 + ⌊ln(2.5)/ln(16)·8⌋ = 8 + ⌊2.64⌋ = 10; n=100 → 8 + ⌊ln(12.5)/ln(16)·8⌋ = 8 + ⌊7.29⌋ = 15;
    /// n=1000 → clamped to 15. Positive positions (keys after the query) add 16.
    #[test]
    fn bidirectional_matches_hand_values() {
        let cases = [
            (0, 0),
            (-1, 1),
            (-7, 7),
            (-8, 8),
            (-12, 9),
            (-20, 10),
            (-100, 15),
            (-1000, 15),
            (1, 17),
            (7, 23),
            (12, 25),
            (100, 31),
            (1000, 31),
        ];
        for (rel, want) in cases {
            assert_eq!(b(rel, true, 32, 128), want, "relative position {rel}");
        }
    }

    /// Causal: 32 buckets, exact below 16; log range 16..128 over buckets 16..31:
    /// n=16 → 16; n=24 → 16 + ⌊ln(1.5)/ln(8)·16⌋ = 16 + ⌊3.12⌋ = 19; n=64 → 16 + ⌊ln(4)/ln(8)·16⌋ =
    /// 16 + ⌊10.67⌋ = 26; n=127 → 16 + ⌊15.94⌋ = 31; keys after the query all fall in bucket 0.
    #[test]
    fn causal_matches_hand_values() {
        let cases = [
            (0, 0),
            (5, 0),
            (-1, 1),
            (-15, 15),
            (-16, 16),
            (-24, 19),
            (-64, 26),
            (-127, 31),
            (-500, 31),
        ];
        for (rel, want) in cases {
            assert_eq!(b(rel, false, 32, 128), want, "relative position {rel}");
        }
    }
}
