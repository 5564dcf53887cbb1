//! The seed's start-up policies as data: a table of available-memory thresholds, each setting a few
//! knobs once before training (`memfit train --policy NAME`). `auto` (the planner) is not a table.
//!
//! A policy is read top to bottom: the first row whose threshold is above the available memory
//! applies; when none does, the configured values stay. "Available" is what the seed read,
//! `psutil.virtual_memory().available` in GiB (it divided by 1024³ and called it GB).
//!
//! Where the tables come from: the seed's `model/trainer_low_mem.py` (ylan2009/ChatLM-mini-Chinese),
//! which chose these knobs differently from one revision to the next; `chatlm-vN` is its N-th
//! revision. Its evaluation batch (v3: 2, or min(2 × batch, 4)) has no counterpart here: memfit
//! evaluates at the training micro-batch.

use serde::Serialize;

const GIB: u64 = 1 << 30;

/// How a row sets a numeric knob, given the configured value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Knob {
    /// This value.
    Set(u64),
    /// The configured value, raised to at least this.
    AtLeast(u64),
    /// The configured value, lowered to at most this.
    AtMost(u64),
}

impl Knob {
    /// The knob's value for a run configured with `configured`.
    pub fn apply(self, configured: u64) -> u64 {
        match self {
            Knob::Set(v) => v,
            Knob::AtLeast(v) => configured.max(v),
            Knob::AtMost(v) => configured.min(v),
        }
    }

    fn describe(self, what: &str) -> String {
        match self {
            Knob::Set(v) => format!("{what} {v}"),
            Knob::AtLeast(v) => format!("{what} at least {v}"),
            Knob::AtMost(v) => format!("{what} at most {v}"),
        }
    }
}

/// What one row sets (`None`: left as configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Settings {
    /// Rows per micro-batch (the seed's `batch_size_per_gpu`).
    pub micro_batch: Option<Knob>,
    /// Gradient accumulation steps.
    pub accum: Option<Knob>,
    /// Data-loader worker processes.
    pub workers: Option<u64>,
    /// The seed's "ultra-low-memory" loading: rows read on demand instead of a table in RAM.
    pub low_memory_loading: Option<bool>,
    /// Page-locked (pinned) host buffers for batches.
    pub pin_memory: Option<bool>,
}

/// One row: applies when the available memory is below `below_available_bytes` (`u64::MAX`: the
/// catch-all row above every threshold).
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
    pub rules: &'static [Rule],
}

/// The seed's policies.
pub const POLICIES: &[Policy] = &[
    Policy {
        name: "chatlm-v8",
        source: "the seed's default start-up policy (issue 6): model/trainer_low_mem.py, 8th \
                 revision (ylan2009/ChatLM-mini-Chinese 71e3107, 2026-02-11): with less than 10 GiB \
                 available, accumulation 4, no loader workers, ultra-low-memory loading, no pinned \
                 memory; otherwise the configured values",
        rules: &[Rule {
            below_available_bytes: 10 * GIB,
            set: Settings {
                micro_batch: None,
                accum: Some(Knob::Set(4)),
                workers: Some(0),
                low_memory_loading: Some(true),
                pin_memory: Some(false),
            },
        }],
    },
    Policy {
        name: "chatlm-v3",
        source: "seed 000's table: model/trainer_low_mem.py, 3rd revision \
                 (ylan2009/ChatLM-mini-Chinese 5d716e6, 2026-02-09): with less than 13 GiB \
                 available, micro-batch 1 and accumulation 8, ultra-low-memory loading; otherwise \
                 micro-batch at most 2 and accumulation at least 16; never loader workers or \
                 pinned memory",
        rules: &[
            Rule {
                below_available_bytes: 13 * GIB,
                set: Settings {
                    micro_batch: Some(Knob::Set(1)),
                    accum: Some(Knob::Set(8)),
                    workers: Some(0),
                    low_memory_loading: Some(true),
                    pin_memory: Some(false),
                },
            },
            Rule {
                below_available_bytes: u64::MAX,
                set: Settings {
                    micro_batch: Some(Knob::AtMost(2)),
                    accum: Some(Knob::AtLeast(16)),
                    workers: Some(0),
                    low_memory_loading: Some(false),
                    pin_memory: Some(false),
                },
            },
        ],
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
    /// One line for people: "chatlm-v8: 6.00 GiB available < 10.00 GiB → accumulation 4, …".
    pub fn describe(&self) -> String {
        let gib = |b: u64| format!("{:.2} GiB", b as f64 / GIB as f64);
        let available = gib(self.available_bytes);
        let Some(r) = &self.rule else {
            return format!(
                "{}: {available} available — no row applies, the configured values stay",
                self.policy
            );
        };
        let s = &r.set;
        let mut parts = Vec::new();
        if let Some(k) = s.micro_batch {
            parts.push(k.describe("micro-batch"));
        }
        if let Some(k) = s.accum {
            parts.push(k.describe("accumulation"));
        }
        if let Some(w) = s.workers {
            parts.push(format!("{w} loader workers"));
        }
        match s.low_memory_loading {
            Some(true) => parts.push("ultra-low-memory loading".into()),
            Some(false) => parts.push("regular loading".into()),
            None => {}
        }
        if s.pin_memory == Some(false) {
            parts.push("no pinned memory".into());
        }
        let condition = if r.below_available_bytes == u64::MAX {
            format!("{available} available, above every threshold")
        } else {
            format!("{available} available < {}", gib(r.below_available_bytes))
        };
        format!("{}: {condition} → {}", self.policy, parts.join(", "))
    }
}

/// Applies `policy` to a machine with `available_bytes`.
pub fn decide(policy: &'static Policy, available_bytes: u64) -> Decision {
    Decision {
        policy: policy.name,
        available_bytes,
        rule: policy
            .rules
            .iter()
            .find(|r| available_bytes < r.below_available_bytes)
            .copied(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatlm_v8_switches_at_10_gib() {
        let v8 = find("chatlm-v8").unwrap();
        let low = decide(v8, 6 * GIB);
        let set = low.rule.unwrap().set;
        assert_eq!(set.accum, Some(Knob::Set(4)));
        assert_eq!(set.micro_batch, None);
        assert_eq!(set.workers, Some(0));
        assert_eq!(set.low_memory_loading, Some(true));
        assert_eq!(set.pin_memory, Some(false));
        assert!(
            low.describe().contains("accumulation 4"),
            "{}",
            low.describe()
        );
        assert_eq!(decide(v8, 10 * GIB).rule, None);
        assert_eq!(decide(v8, 64 * GIB).rule, None);
    }

    #[test]
    fn chatlm_v3_switches_at_13_gib_and_bounds_the_knobs_above() {
        let v3 = find("chatlm-v3").unwrap();
        let low = decide(v3, 12 * GIB).rule.unwrap().set;
        assert_eq!(
            (low.micro_batch, low.accum),
            (Some(Knob::Set(1)), Some(Knob::Set(8)))
        );
        assert_eq!(low.low_memory_loading, Some(true));
        let high = decide(v3, 13 * GIB);
        let set = high.rule.unwrap().set;
        assert_eq!(set.low_memory_loading, Some(false));
        // configured 16 × 2: at most 2 rows, at least 16 accumulation steps
        assert_eq!(set.micro_batch.unwrap().apply(16), 2);
        assert_eq!(set.accum.unwrap().apply(2), 16);
        // configured 1 × 32 stays
        assert_eq!(set.micro_batch.unwrap().apply(1), 1);
        assert_eq!(set.accum.unwrap().apply(32), 32);
        assert!(
            high.describe().contains("above every threshold"),
            "{}",
            high.describe()
        );
        assert!(find("auto").is_none());
        assert_eq!(names(), "auto, chatlm-v8, chatlm-v3");
    }
}
