//! The hash that decides whether a resume continues the same run.

use std::collections::BTreeMap;

use super::TrainConfig;

impl TrainConfig {
    /// The settings that decide the trajectory of the weights, as name → value. Bookkeeping
    /// (save/eval cadence, retention, threads, budget) may change across a resume.
    fn trajectory(&self) -> BTreeMap<String, serde_json::Value> {
        const BOOKKEEPING: [&str; 14] = [
            "threads",
            "save_steps",
            "keep",
            "eval_steps",
            "eval_rows",
            "eval_loss_rows",
            "eval_batch",
            "eval_at_start",
            "gen_max_tokens",
            "best_metric",
            "memory_budget_bytes",
            "gpu_memory_budget_bytes",
            "guard_soft_fraction",
            "guard_hard_fraction",
        ];
        let value = serde_json::to_value(self).unwrap_or_default();
        let mut map = BTreeMap::new();
        if let serde_json::Value::Object(fields) = value {
            for (k, v) in fields {
                if !BOOKKEEPING.contains(&k.as_str()) {
                    map.insert(k, v);
                }
            }
        }
        map
    }

    /// FNV-1a 64 over the canonical JSON of the trajectory settings, as 16 hex digits.
    pub fn hash(&self) -> String {
        let canonical = serde_json::to_string(&self.trajectory()).unwrap_or_default();
        format!("{:016x}", fnv1a64(canonical.as_bytes()))
    }

    /// The trajectory settings that differ: `(name, old, new)`.
    pub fn changes_from(&self, old: &TrainConfig) -> Vec<(String, String, String)> {
        let (a, b) = (old.trajectory(), self.trajectory());
        a.iter()
            .filter_map(|(k, va)| {
                let vb = b.get(k).cloned().unwrap_or(serde_json::Value::Null);
                (va != &vb).then(|| (k.clone(), va.to_string(), vb.to_string()))
            })
            .collect()
    }
}

/// FNV-1a, 64-bit (offset basis 0xcbf29ce484222325, prime 0x100000001b3: the published FNV constants).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_ignores_bookkeeping_but_not_the_trajectory() {
        let a = TrainConfig::default();
        let b = TrainConfig {
            keep: 9,
            threads: 1,
            save_steps: Some(5),
            eval_loss_rows: Some(10),
            eval_at_start: true,
            ..a.clone()
        };
        assert_eq!(a.hash(), b.hash());
        let c = TrainConfig {
            lr: 1.0,
            ..a.clone()
        };
        assert_ne!(a.hash(), c.hash());
        let changes = c.changes_from(&a);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].0, "lr");
    }

    #[test]
    fn fnv_matches_published_test_vector() {
        // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c (Fowler/Noll/Vo test vectors).
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
