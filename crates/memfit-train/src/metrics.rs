//! What one optimizer step reports (`metrics.jsonl`, docs/architecture.md §4) and this process's memory.

use serde::{Deserialize, Serialize};

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// Optimizer steps completed, counting this one (1-based).
    pub step: u64,
    pub epoch: u64,
    /// Rows per micro-batch in this step: the configured batch, or less after a memory-guard downgrade.
    pub micro_batch: u64,
    /// Micro-batches accumulated into this step (⌈effective batch / micro_batch⌉, less at an epoch's end).
    pub accum: u64,
    /// Mean token loss of the step (micro-batch losses weighted by their target tokens).
    pub loss: f64,
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Source + target tokens of this step, padding excluded.
    pub tokens: u64,
    pub tokens_per_s: f64,
    pub step_s: f64,
    /// Seconds of this step spent waiting for its micro-batches (read and collated on a helper
    /// thread during the previous step; a wait means the data fell behind the device).
    #[serde(default)]
    pub input_wait_s: f64,
    /// With data-parallel ranks: each rank's wait for its own micro-batches (read on a helper of
    /// its own), rank 0 first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_input_wait_s: Option<Vec<f64>>,
    pub rss_bytes: u64,
    pub peak_rss_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_bytes: Option<u64>,
}

/// Resident and peak resident set size of this process (`VmRSS`, `VmHWM` of /proc/self/status).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rss {
    pub current: u64,
    pub peak: u64,
}

/// Reads this process's RSS; zeros where /proc is unavailable (never fails a run).
pub fn rss() -> Rss {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| parse_status(&s))
        .unwrap_or_default()
}

fn parse_status(status: &str) -> Rss {
    let kib = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map_or(0, |k| k * 1024)
    };
    Rss {
        current: kib("VmRSS:"),
        peak: kib("VmHWM:"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_status() {
        let r = parse_status("Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n");
        assert_eq!(
            r,
            Rss {
                current: 1 << 20,
                peak: 2 << 20
            }
        );
    }

    #[test]
    fn own_rss_is_positive_on_linux() {
        let r = rss();
        assert!(r.current > 0 && r.peak >= r.current);
    }
}
