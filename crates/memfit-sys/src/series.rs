//! The time series of a guarded run: JSON Lines (one self-describing record per line, tagged by `type`),
//! and optionally CSV (samples only). docs/guard.md documents every field.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The `schema` value of the header record; bumped when a field changes meaning.
pub const SCHEMA: &str = "memfit-run/1";

/// One sample of the job and the machine. Bytes everywhere; `null` when a source is unavailable.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SampleRecord {
    /// Seconds since `memfit run` started.
    pub t_s: f64,
    pub attempt: u32,
    /// What the guard compares with the limit: Σ over the job's processes of RssAnon + RssShmem + VmSwap.
    pub job_bytes: u64,
    /// The hard limit at this instant: min(budget, job + MemAvailable − keep_free, cgroup headroom).
    pub limit_bytes: u64,
    pub rss_anon_bytes: u64,
    pub rss_file_bytes: u64,
    pub rss_shmem_bytes: u64,
    /// Files created in /dev/shm since the run started (allocated bytes), part of `job_bytes`.
    pub shm_files_bytes: u64,
    pub swap_bytes: u64,
    pub processes: u32,
    pub mem_available_bytes: Option<u64>,
    pub swap_used_bytes: Option<u64>,
    pub psi_some_avg10: Option<f64>,
    pub cgroup_current_bytes: Option<u64>,
    pub cgroup_oom_kills: Option<u64>,
    /// With `--cgroup`: the job's own cgroup, anonymous + shared memory + swap (memory.stat), and its
    /// usage as the kernel counts it (v2 memory.current, v1 memory.usage_in_bytes).
    pub job_cgroup_bytes: Option<u64>,
    pub job_cgroup_current_bytes: Option<u64>,
    pub gpu_bytes: Option<u64>,
    /// normal | warned | stopping | killed
    pub stage: &'static str,
    /// Milliseconds until the next sample.
    pub next_ms: u64,
}

const CSV_HEADER: &str = "t_s,attempt,job_bytes,limit_bytes,rss_anon_bytes,rss_file_bytes,rss_shmem_bytes,shm_files_bytes,swap_bytes,processes,mem_available_bytes,swap_used_bytes,psi_some_avg10,cgroup_current_bytes,cgroup_oom_kills,job_cgroup_bytes,job_cgroup_current_bytes,gpu_bytes,stage,next_ms";

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

impl SampleRecord {
    fn csv_row(&self) -> String {
        format!(
            "{:.3},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            self.t_s,
            self.attempt,
            self.job_bytes,
            self.limit_bytes,
            self.rss_anon_bytes,
            self.rss_file_bytes,
            self.rss_shmem_bytes,
            self.shm_files_bytes,
            self.swap_bytes,
            self.processes,
            opt(self.mem_available_bytes),
            opt(self.swap_used_bytes),
            opt(self.psi_some_avg10),
            opt(self.cgroup_current_bytes),
            opt(self.cgroup_oom_kills),
            opt(self.job_cgroup_bytes),
            opt(self.job_cgroup_current_bytes),
            opt(self.gpu_bytes),
            self.stage,
            self.next_ms
        )
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot write {path}: {source}")]
pub struct SeriesError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// Writes records as they happen (flushed per line, so a crash keeps everything up to it).
pub struct SeriesWriter {
    jsonl: Option<(PathBuf, BufWriter<File>)>,
    csv: Option<(PathBuf, BufWriter<File>)>,
}

fn create(path: &Path) -> Result<BufWriter<File>, SeriesError> {
    File::create(path)
        .map(BufWriter::new)
        .map_err(|source| SeriesError {
            path: path.to_owned(),
            source,
        })
}

impl SeriesWriter {
    pub fn new(jsonl: Option<&Path>, csv: Option<&Path>) -> Result<Self, SeriesError> {
        let jsonl = jsonl
            .map(|p| create(p).map(|w| (p.to_owned(), w)))
            .transpose()?;
        let mut csv = csv
            .map(|p| create(p).map(|w| (p.to_owned(), w)))
            .transpose()?;
        if let Some((path, w)) = &mut csv {
            writeln!(w, "{CSV_HEADER}").map_err(|source| SeriesError {
                path: path.clone(),
                source,
            })?;
        }
        Ok(Self { jsonl, csv })
    }

    /// Appends one JSON record `{"type": kind, ...fields of value}`.
    pub fn record(&mut self, kind: &str, value: &impl serde::Serialize) -> Result<(), SeriesError> {
        let Some((path, w)) = &mut self.jsonl else {
            return Ok(());
        };
        let mut object = match serde_json::to_value(value) {
            Ok(serde_json::Value::Object(m)) => m,
            Ok(other) => {
                let mut m = serde_json::Map::new();
                m.insert("value".into(), other);
                m
            }
            Err(e) => {
                return Err(SeriesError {
                    path: path.clone(),
                    source: std::io::Error::other(e),
                });
            }
        };
        object.insert("type".into(), kind.into());
        let line = serde_json::Value::Object(object).to_string();
        writeln!(w, "{line}")
            .and_then(|()| w.flush())
            .map_err(|source| SeriesError {
                path: path.clone(),
                source,
            })
    }

    pub fn sample(&mut self, s: &SampleRecord) -> Result<(), SeriesError> {
        self.record("sample", s)?;
        if let Some((path, w)) = &mut self.csv {
            writeln!(w, "{}", s.csv_row())
                .and_then(|()| w.flush())
                .map_err(|source| SeriesError {
                    path: path.clone(),
                    source,
                })?;
        }
        Ok(())
    }
}
