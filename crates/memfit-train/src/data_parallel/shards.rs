//! ZeRO-1: which rank owns (keeps the optimizer state of, and steps) each trained parameter.

/// The owner of each parameter of `sizes` (`None`: frozen, nobody), the largest first to the
/// least-loaded rank, so that every rank holds about 1/ranks of the state.
pub fn owners(sizes: &[Option<usize>], ranks: usize) -> Vec<Option<usize>> {
    let mut order: Vec<usize> = (0..sizes.len()).filter(|&i| sizes[i].is_some()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(sizes[i].unwrap_or(0)));
    let mut load = vec![0usize; ranks.max(1)];
    let mut owner = vec![None; sizes.len()];
    for i in order {
        let (rank, _) = (load.iter().enumerate())
            .min_by_key(|(r, l)| (**l, *r))
            .expect("at least one rank");
        load[rank] += sizes[i].unwrap_or(0);
        owner[i] = Some(rank);
    }
    owner
}

/// Each rank's mask of the parameters it owns.
pub fn masks(owners: &[Option<usize>], ranks: usize) -> Vec<Vec<bool>> {
    (0..ranks)
        .map(|r| owners.iter().map(|o| *o == Some(r)).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_trained_parameter_has_one_owner_and_the_loads_are_even() {
        let sizes = [
            Some(100),
            None,
            Some(60),
            Some(50),
            Some(40),
            Some(10),
            None,
        ];
        let owner = owners(&sizes, 2);
        assert_eq!(owner[1], None);
        assert_eq!(owner[6], None);
        let masks = masks(&owner, 2);
        for (i, s) in sizes.iter().enumerate() {
            let holders = masks.iter().filter(|m| m[i]).count();
            assert_eq!(holders, usize::from(s.is_some()), "parameter {i}");
        }
        let load = |r: usize| -> usize {
            (sizes.iter().zip(&masks[r]))
                .filter(|(_, m)| **m)
                .map(|(s, _)| s.unwrap())
                .sum()
        };
        // 100 | 60+50 → 100+40 | 110+10: 140 and 120 of 260
        assert_eq!((load(0), load(1)), (140, 120));
    }
}
