//! The run directory (docs/architecture.md §4): `config.toml`, `plan.json`, `metrics.jsonl`, `events.jsonl`,
//! `train.log`, `checkpoints/`, `best/`. Whole files are written atomically (temp file + rename);
//! the JSONL logs are appended line by line and cut back to the checkpoint on resume. An open run holds
//! the directory's lock ([`crate::run_lock`]) as long as it lives.

use crate::metrics::StepMetrics;
use crate::run_lock::{LockError, RunLock};
use serde::Serialize;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "{path} already holds a run (config.toml); continue it with --resume {path} or choose another --out"
    )]
    AlreadyARun { path: String },
    #[error("{path} is not a run directory: {reason}")]
    NotARun { path: String, reason: String },
    #[error(transparent)]
    Locked(#[from] LockError),
}

impl RunDirError {
    /// `root` is no run: why, from the error reading its `config.toml`.
    pub fn not_a_run(root: &Path, err: &std::io::Error) -> Self {
        let reason = match err.kind() {
            std::io::ErrorKind::NotFound if !root.exists() => "it does not exist".to_string(),
            std::io::ErrorKind::NotFound => "it has no config.toml".to_string(),
            _ => format!("reading its config.toml: {err}"),
        };
        RunDirError::NotARun {
            path: root.display().to_string(),
            reason,
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> RunDirError + '_ {
    move |source| RunDirError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory, fsynced, then renamed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), RunDirError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map_or("file".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(io_err(path))
}

/// Seconds since the Unix epoch, for event timestamps.
pub fn unix_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// An open run directory.
#[derive(Debug)]
pub struct RunDir {
    root: PathBuf,
    metrics: File,
    events: File,
    log: File,
    _lock: RunLock,
}

impl RunDir {
    pub const CONFIG: &'static str = "config.toml";
    pub const PLAN: &'static str = "plan.json";
    pub const METRICS: &'static str = "metrics.jsonl";
    pub const EVENTS: &'static str = "events.jsonl";
    pub const LOG: &'static str = "train.log";
    pub const CHECKPOINTS: &'static str = "checkpoints";
    pub const BEST: &'static str = "best";

    /// Creates a new run at `root` (which may exist, but must not hold a run) and writes its config.
    pub fn create(root: &Path, config_toml: &str) -> Result<Self, RunDirError> {
        fs::create_dir_all(root).map_err(io_err(root))?;
        let lock = RunLock::acquire(root)?;
        if root.join(Self::CONFIG).exists() {
            return Err(RunDirError::AlreadyARun {
                path: root.display().to_string(),
            });
        }
        fs::create_dir_all(root.join(Self::CHECKPOINTS)).map_err(io_err(root))?;
        write_atomic(&root.join(Self::CONFIG), config_toml.as_bytes())?;
        Self::open_logs(root, lock)
    }

    /// Opens an existing run to continue it.
    pub fn open(root: &Path) -> Result<Self, RunDirError> {
        if let Err(e) = fs::metadata(root.join(Self::CONFIG)) {
            return Err(RunDirError::not_a_run(root, &e));
        }
        let lock = RunLock::acquire(root)?;
        fs::create_dir_all(root.join(Self::CHECKPOINTS)).map_err(io_err(root))?;
        Self::open_logs(root, lock)
    }

    fn open_logs(root: &Path, lock: RunLock) -> Result<Self, RunDirError> {
        let append = |name: &str| {
            let path = root.join(name);
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|source| RunDirError::Io {
                    path: path.display().to_string(),
                    source,
                })
        };
        Ok(Self {
            root: root.to_path_buf(),
            metrics: append(Self::METRICS)?,
            events: append(Self::EVENTS)?,
            log: append(Self::LOG)?,
            _lock: lock,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn checkpoints(&self) -> PathBuf {
        self.root.join(Self::CHECKPOINTS)
    }

    pub fn best(&self) -> PathBuf {
        self.root.join(Self::BEST)
    }

    /// Replaces `config.toml` (a resume with `--allow-config-change`).
    pub fn write_config(&self, config_toml: &str) -> Result<(), RunDirError> {
        write_atomic(&self.root.join(Self::CONFIG), config_toml.as_bytes())
    }

    pub fn write_plan(&self, plan: &serde_json::Value) -> Result<(), RunDirError> {
        let text = serde_json::to_string_pretty(plan).unwrap_or_default();
        write_atomic(&self.root.join(Self::PLAN), text.as_bytes())
    }

    pub fn append_metrics(&mut self, m: &StepMetrics) -> Result<(), RunDirError> {
        let line = serde_json::to_string(m).unwrap_or_default();
        writeln!(self.metrics, "{line}").map_err(io_err(&self.root.join(Self::METRICS)))
    }

    /// Appends `{"time", "step", "kind", ...fields}` to `events.jsonl` and a line to `train.log`.
    pub fn event(
        &mut self,
        step: u64,
        kind: &str,
        fields: impl Serialize,
    ) -> Result<(), RunDirError> {
        let mut obj = serde_json::Map::new();
        obj.insert("time".into(), unix_time().into());
        obj.insert("step".into(), step.into());
        obj.insert("kind".into(), kind.into());
        if let Ok(serde_json::Value::Object(extra)) = serde_json::to_value(fields) {
            obj.extend(extra);
        }
        let line = serde_json::Value::Object(obj).to_string();
        writeln!(self.events, "{line}").map_err(io_err(&self.root.join(Self::EVENTS)))?;
        self.log(&format!("event {line}"))
    }

    /// One line of `train.log`, prefixed with the Unix time.
    pub fn log(&mut self, message: &str) -> Result<(), RunDirError> {
        writeln!(self.log, "[{:.3}] {message}", unix_time())
            .map_err(io_err(&self.root.join(Self::LOG)))
    }

    /// Drops `metrics.jsonl` and `events.jsonl` lines after `step` (written by an interrupted run past
    /// its last checkpoint), so the logs of a resumed run read as one uninterrupted run.
    pub fn cut_logs_after(&mut self, step: u64) -> Result<(), RunDirError> {
        self.keep_log_lines(|v| {
            v.get("step")
                .and_then(|s| s.as_u64())
                .is_some_and(|s| s <= step)
        })
    }

    /// A run started over from step 0 (stopped before its first checkpoint) evaluates before its
    /// first step again: the evaluations of the attempt before go, so each is in the log once.
    pub fn forget_evaluations_at_start(&mut self) -> Result<(), RunDirError> {
        self.keep_log_lines(|v| !(v["kind"] == "eval" && v["step"] == 0))
    }

    /// Rewrites `metrics.jsonl` and `events.jsonl` with the lines `keep` takes, atomically.
    fn keep_log_lines(
        &mut self,
        keep: impl Fn(&serde_json::Value) -> bool,
    ) -> Result<(), RunDirError> {
        for name in [Self::METRICS, Self::EVENTS] {
            let path = self.root.join(name);
            let text = fs::read_to_string(&path).map_err(io_err(&path))?;
            let kept: String = text
                .lines()
                .filter(|line| {
                    serde_json::from_str::<serde_json::Value>(line)
                        .ok()
                        .is_some_and(|v| keep(&v))
                })
                .map(|l| format!("{l}\n"))
                .collect();
            write_atomic(&path, kept.as_bytes())?;
        }
        *self = Self::open_logs(&self.root, self._lock.clone())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_to_create_over_a_run_and_cuts_logs_on_resume() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("run");
        let mut run = RunDir::create(&root, "model = \"demo\"\n").unwrap();
        assert!(matches!(
            RunDir::create(&root, "x").unwrap_err(),
            RunDirError::AlreadyARun { .. }
        ));
        for step in 1..=4 {
            run.event(step, "test", serde_json::json!({"n": step}))
                .unwrap();
        }
        run.cut_logs_after(2).unwrap();
        run.event(3, "again", serde_json::json!({})).unwrap();
        let events = fs::read_to_string(root.join(RunDir::EVENTS)).unwrap();
        let steps: Vec<u64> = events
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(steps, vec![1, 2, 3]);
        assert!(
            fs::read_to_string(root.join(RunDir::LOG))
                .unwrap()
                .contains("again")
        );
    }

    #[test]
    fn a_run_started_over_keeps_each_evaluation_once() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("run");
        let mut run = RunDir::create(&root, "model = \"demo\"\n").unwrap();
        // Killed after its evaluation before the first step, before its first checkpoint.
        for (step, kind) in [(0, "start"), (0, "eval"), (0, "downgrade"), (1, "eval")] {
            run.event(step, kind, serde_json::json!({})).unwrap();
        }
        run.cut_logs_after(0).unwrap();
        run.forget_evaluations_at_start().unwrap();
        run.event(0, "resume", serde_json::json!({})).unwrap();
        run.event(0, "eval", serde_json::json!({})).unwrap();
        let kinds: Vec<String> = fs::read_to_string(root.join(RunDir::EVENTS))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["kind"].to_string())
            .collect();
        assert_eq!(
            kinds,
            ["\"start\"", "\"downgrade\"", "\"resume\"", "\"eval\""]
        );
    }

    #[test]
    fn open_requires_a_run() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            RunDir::open(dir.path()).unwrap_err(),
            RunDirError::NotARun { .. }
        ));
    }
}
