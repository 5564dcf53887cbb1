//! `memfit bench data`: time random row reads from a store and report the process's peak RSS.

use crate::error::Result;
use crate::rng::SplitMix64;
use crate::store::{RowBuf, TokenStore};
use std::path::Path;
use std::time::Instant;

/// The JSON that `memfit bench data --json` prints (docs/architecture.md §3).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RandomAccessReport {
    pub rows: usize,
    pub ns_per_row_median: f64,
    pub peak_rss_bytes: u64,
}

/// Opens the store and reads `rows` uniformly random rows (seeded), decoding every segment's ids
/// into a reused `Vec<u32>` as a loader would. Each read is timed on its own; the median is
/// reported.
pub fn random_access(store_dir: &Path, rows: usize, seed: u64) -> Result<RandomAccessReport> {
    let store = TokenStore::open(store_dir)?;
    let mut rng = SplitMix64::new(seed);
    let picks: Vec<usize> = (0..rows).map(|_| rng.below(store.len())).collect();
    let mut times = Vec::with_capacity(rows);
    let mut ids: Vec<u32> = Vec::with_capacity(4096);
    let mut row_buf = RowBuf::default();
    let mut checksum = 0u64;
    for &i in &picks {
        let t = Instant::now();
        ids.clear();
        let row = store.read_row(i, &mut row_buf)?;
        for seg in row.segments() {
            seg.extend_into(&mut ids);
        }
        checksum = checksum.wrapping_add(ids.iter().map(|&x| x as u64).sum::<u64>());
        times.push(t.elapsed().as_nanos() as u64);
    }
    std::hint::black_box(checksum);
    times.sort_unstable();
    let median = match times.len() {
        0 => 0.0,
        n if n % 2 == 1 => times[n / 2] as f64,
        n => (times[n / 2 - 1] + times[n / 2]) as f64 / 2.0,
    };
    Ok(RandomAccessReport {
        rows,
        ns_per_row_median: median,
        peak_rss_bytes: peak_rss_bytes().unwrap_or(0),
    })
}

/// The process's peak resident set (`VmHWM` in /proc/self/status), in bytes; `None` off Linux.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
