//! The seed's start-up policies as data: a table of available-memory thresholds, each setting a few
//! knobs once before training (`memfit train --policy NAME`). `auto` (the planner) is not a table.
//!
//! A policy is read top to bottom: the first row whose threshold is above the available memory
//! applies; when none does, the configured values stay.

use serde::Serialize;

const GIB: u64 = 1 << 30;

/// What one row sets (`None`: left as configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Settings {
    /// Gradient accumulation steps (the micro-batch stays as configured).
    pub accum: Option<u64>,
    /// Data-loader worker processes.
    pub workers: Option<u64>,
    /// The seed's "ultra-low-memory" loading: rows read on demand instead of a table in RAM.
    pub low_memory_loading: Option<bool>,
    /// Page-locked (pinned) host buffers for batches.
    pub pin_memory: Option<bool>,
}

/// One row: applies when the available memory is below `below_available_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Rule {
    pub below_available_bytes: u64,
    pub set: Settings,
}

/// A named policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Policy {
    pub name: &'static str,
    /// Where the table comes from.
    pub source: &'static str,
    /// The rows; `None` when the table is not available to this project.
    pub rules: Option<&'static [Rule]>,
}

/// The seed's policies.
pub const POLICIES: &[Policy] = &[
    Policy {
        name: "chatlm-v8",
        source: "the seed's default start-up policy (issue 6): with less than 10 GiB available, \
                 accumulation 4, no loader workers, ultra-low-memory loading, no pinned memory; \
                 otherwise the configured values",
        rules: Some(&[Rule {
            below_available_bytes: 10 * GIB,
            set: Settings {
                accum: Some(4),
                workers: Some(0),
                low_memory_loading: Some(true),
                pin_memory: Some(false),
            },
        }]),
    },
    Policy {
        name: "chatlm-v3",
        source: "seed 000's free-RAM threshold table: its values are not in this project's \
                 sources (DESIGN.md, the shared bench/, fixtures/ and validation/ hold no copy)",
        rules: None,
    },
];

/// The policy names `--policy` takes, `auto` first.
pub fn names() -> String {
    std::iter::once("auto")
        .chain(POLICIES.iter().map(|p| p.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The policy called `name` (not `auto`).
pub fn find(name: &str) -> Option<&'static Policy> {
    POLICIES.iter().find(|p| p.name == name)
}

/// What a policy decided for a machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub policy: &'static str,
    pub available_bytes: u64,
    /// The row that applied (its threshold), `None`: the configured values stay.
    pub rule: Option<Rule>,
}

impl Decision {
    /// One line for people: "chatlm-v8: 6.00 GiB available < 10.00 GiB → accum 4, …".
    pub fn describe(&self) -> String {
        let gib = |b: u64| format!("{:.2} GiB", b as f64 / GIB as f64);
        match &self.rule {
            None => format!(
                "{}: {} available — no row applies, the configured values stay",
                self.policy,
                gib(self.available_bytes)
            ),
            Some(r) => {
                let s = &r.set;
                let mut parts = Vec::new();
                if let Some(a) = s.accum {
                    parts.push(format!("accumulation {a}"));
                }
                if let Some(w) = s.workers {
                    parts.push(format!("{w} loader workers"));
                }
                if s.low_memory_loading == Some(true) {
                    parts.push("ultra-low-memory loading".into());
                }
                if s.pin_memory == Some(false) {
                    parts.push("no pinned memory".into());
                }
                format!(
                    "{}: {} available < {} → {}",
                    self.policy,
                    gib(self.available_bytes),
                    gib(r.below_available_bytes),
                    parts.join(", ")
                )
            }
        }
    }
}

/// Applies `policy` to a machine with `available_bytes`; an error when its table is not available.
pub fn decide(policy: &'static Policy, available_bytes: u64) -> Result<Decision, String> {
    let rules = policy.rules.ok_or_else(|| {
        format!(
            "--policy {}: {}; use --policy auto or chatlm-v8",
            policy.name, policy.source
        )
    })?;
    Ok(Decision {
        policy: policy.name,
        available_bytes,
        rule: rules
            .iter()
            .find(|r| available_bytes < r.below_available_bytes)
            .copied(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatlm_v8_switches_at_10_gib() {
        let v8 = find("chatlm-v8").unwrap();
        let low = decide(v8, 6 * GIB).unwrap();
        let set = low.rule.unwrap().set;
        assert_eq!(set.accum, Some(4));
        assert_eq!(set.workers, Some(0));
        assert_eq!(set.low_memory_loading, Some(true));
        assert_eq!(set.pin_memory, Some(false));
        assert!(
            low.describe().contains("accumulation 4"),
            "{}",
            low.describe()
        );
        assert_eq!(decide(v8, 10 * GIB).unwrap().rule, None);
        assert_eq!(decide(v8, 64 * GIB).unwrap().rule, None);
    }

    #[test]
    fn a_table_we_do_not_have_is_an_error_not_a_guess() {
        let v3 = find("chatlm-v3").unwrap();
        let err = decide(v3, GIB).unwrap_err();
        assert!(err.contains("chatlm-v3") && err.contains("not in"), "{err}");
        assert!(find("auto").is_none());
        assert!(names().starts_with("auto, chatlm-v8"));
    }
}
