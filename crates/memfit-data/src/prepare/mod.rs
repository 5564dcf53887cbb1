//! `memfit data prepare`: sources → token store, streaming one chunk of rows at a time.
//!
//! The store is built in a hidden sibling directory (`.NAME.partial-PID`) with `meta.json` written
//! last, then renamed into place: an interrupted run leaves no directory that looks like a store.
//! A store whose fingerprint (source contents, tokenizer content, content options) matches is
//! reused as is.

mod rows;
mod writer;

pub use rows::{InvalidPolicy, RowTexts, Verdict, column_specs};

use crate::error::{DataError, Result};
use crate::fsutil::write_atomic;
use crate::hash::{sha256_bytes, sha256_file};
use crate::source;
use crate::store::meta::{
    ContentOptions, FORMAT_VERSION, RowCounts, SourceFile, StoreMeta, Task, TokenizerRef,
};
use crate::store::{META_FILE, TokenStore};
use crate::tokenizer::Tokenizer;
use rows::RowRules;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use writer::StoreWriter;

#[derive(Debug, Clone)]
pub struct PrepareOptions {
    pub inputs: Vec<PathBuf>,
    /// A `tokenizer.json` or a directory holding one.
    pub tokenizer: PathBuf,
    pub task: Task,
    /// Column names; `None` takes the task's defaults (see [`column_specs`]).
    pub columns: Option<Vec<String>>,
    /// Maximum tokens of the source (classification: of the text), EOS included.
    pub max_len: Option<usize>,
    /// Maximum tokens of the target, EOS included; defaults to `max_len`.
    pub max_target_len: Option<usize>,
    pub on_invalid: InvalidPolicy,
    pub out: PathBuf,
    /// Rows decoded and tokenized at once (bounds memory).
    pub chunk_rows: usize,
    /// Rebuild even when an up-to-date store exists.
    pub force: bool,
}

impl PrepareOptions {
    pub fn new(inputs: Vec<PathBuf>, tokenizer: PathBuf, task: Task, out: PathBuf) -> Self {
        PrepareOptions {
            inputs,
            tokenizer,
            task,
            columns: None,
            max_len: None,
            max_target_len: None,
            on_invalid: InvalidPolicy::Fail,
            out,
            // 2048 rows of a few hundred tokens: a few MiB of text and ids in flight.
            chunk_rows: 2048,
            force: false,
        }
    }
}

/// Progress of a prepare: rows read so far, and the total when all sources state it (parquet).
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub rows_read: u64,
    pub rows_total: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct PrepareReport {
    pub store: PathBuf,
    /// True when an up-to-date store was found and nothing was rebuilt.
    pub reused: bool,
    pub meta: StoreMeta,
}

/// Removes the temporary build directory unless the build got to renaming it.
struct TempDir(Option<PathBuf>);

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

fn sibling(out: &Path, tag: &str) -> PathBuf {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "store".into());
    out.with_file_name(format!(".{name}.{tag}-{}", std::process::id()))
}

/// Leftovers of killed runs: `.NAME.partial-PID` / `.NAME.old-PID` whose process is gone.
fn remove_stale_siblings(out: &Path) {
    let (Some(parent), Some(name)) = (out.parent(), out.file_name()) else {
        return;
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let name = name.to_string_lossy();
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        for tag in ["partial", "old"] {
            let prefix = format!(".{name}.{tag}-");
            if let Some(pid) = file.strip_prefix(&prefix) {
                let alive = Path::new("/proc").join(pid).exists();
                if !alive {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
    }
}

/// Prepares (or reuses) the store at `opts.out`. `progress` is called after every chunk.
pub fn prepare(opts: &PrepareOptions, progress: &mut dyn FnMut(Progress)) -> Result<PrepareReport> {
    if opts.inputs.is_empty() {
        return Err(DataError::Options("no --input files given".into()));
    }
    let columns = column_specs(opts.task, opts.columns.as_deref())?;
    let format = opts.task.name();
    let max_target_len = opts.max_target_len.or(opts.max_len);
    // Room for at least one token plus EOS.
    for (flag, v) in [("--max-len", opts.max_len), ("--max-target-len", max_target_len)] {
        if matches!(v, Some(n) if n < 2) {
            return Err(DataError::Options(format!("{flag} must be at least 2 (one token and EOS)")));
        }
    }
    let tokenizer = Tokenizer::load(&opts.tokenizer)?;
    let pad = tokenizer.require_pad(format)?.clone();
    let eos = match opts.task {
        Task::Seq2seq | Task::Chat => Some(tokenizer.require_eos(format)?.clone()),
        Task::Classification => tokenizer.eos().cloned(),
    };

    let mut sources = Vec::with_capacity(opts.inputs.len());
    for path in &opts.inputs {
        let bytes = std::fs::metadata(path)
            .map_err(|e| DataError::read(path, e))?
            .len();
        sources.push(SourceFile {
            path: path.display().to_string(),
            bytes,
            sha256: sha256_file(path)?,
        });
    }
    let content = ContentOptions {
        task: opts.task,
        columns: columns.iter().map(|c| c.name.clone()).collect(),
        max_len: opts.max_len,
        max_target_len: if opts.task == Task::Classification {
            None
        } else {
            max_target_len
        },
        on_invalid: opts.on_invalid.name().to_string(),
    };
    let fingerprint = {
        let hashes: Vec<&str> = sources.iter().map(|s| s.sha256.as_str()).collect();
        let key = serde_json::json!({
            "format_version": FORMAT_VERSION,
            "sources": hashes,
            "tokenizer": tokenizer.sha256(),
            "options": content,
        });
        sha256_bytes(key.to_string().as_bytes())
    };

    if !opts.force {
        if let Ok(existing) = TokenStore::open(&opts.out) {
            if existing.meta().fingerprint == fingerprint {
                tracing::info!(store = %opts.out.display(), "store is up to date; reusing it");
                return Ok(PrepareReport {
                    store: opts.out.clone(),
                    reused: true,
                    meta: existing.meta().clone(),
                });
            }
        }
    }
    if opts.out.exists() && !opts.out.join(META_FILE).exists() {
        let empty = std::fs::read_dir(&opts.out)
            .map(|mut d| d.next().is_none())
            .unwrap_or(false);
        if !empty {
            return Err(DataError::Options(format!(
                "{} exists and is not a token store: refusing to replace it",
                opts.out.display()
            )));
        }
    }

    remove_stale_siblings(&opts.out);
    let tmp_path = sibling(&opts.out, "partial");
    std::fs::create_dir_all(&tmp_path).map_err(|e| DataError::write(&tmp_path, e))?;
    let tmp = TempDir(Some(tmp_path.clone()));

    let width = if tokenizer.max_id() <= u16::MAX as u32 { 2 } else { 4 };
    let mut writer = StoreWriter::create(
        &tmp_path,
        width,
        opts.task.segments(),
        opts.task == Task::Classification,
    )?;
    let mut rules = RowRules {
        task: opts.task,
        columns: &columns,
        policy: opts.on_invalid,
        label_ids: HashMap::new(),
        label_names: Vec::new(),
        saw_int_labels: false,
    };
    let mut counts = RowCounts::default();
    let classifier = match (opts.task, opts.max_len) {
        // Classification keeps the tokenizer's own specials ([CLS] … [SEP]); its truncation keeps
        // them when cutting.
        (Task::Classification, Some(n)) => {
            let mut t = tokenizer.inner().clone();
            t.with_truncation(Some(tokenizers::TruncationParams {
                max_length: n,
                ..Default::default()
            }))
            .map_err(|e| DataError::Options(format!("--max-len {n}: {e}")))?;
            Some(t)
        }
        (Task::Classification, None) => Some(tokenizer.inner().clone()),
        _ => None,
    };

    // Open every source first: a missing column in the last file fails before any work.
    let mut readers = Vec::with_capacity(opts.inputs.len());
    let mut rows_total = Some(0u64);
    for path in &opts.inputs {
        let r = source::open(path, &columns, opts.chunk_rows)?;
        rows_total = match (rows_total, r.total_rows()) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        readers.push((path, r));
    }

    for (path, mut reader) in readers {
        let mut file_rows = 0u64;
        while let Some(chunk) = reader.next_chunk()? {
            file_rows += chunk.len() as u64;
            counts.read += chunk.len() as u64;
            let mut kept: Vec<RowTexts> = Vec::with_capacity(chunk.len());
            for rec in chunk {
                let (row, verdict) = rules.apply(path, rec)?;
                match verdict {
                    Verdict::Clean => {}
                    Verdict::Empty => counts.empty += 1,
                    Verdict::Invalid => counts.invalid += 1,
                }
                match row {
                    Some(r) => kept.push(r),
                    None => counts.skipped += 1,
                }
            }
            write_chunk(
                &tokenizer,
                classifier.as_ref(),
                kept,
                opts.max_len,
                max_target_len,
                eos.as_ref().map(|e| e.id),
                &mut writer,
                &mut counts,
            )?;
            progress(Progress {
                rows_read: counts.read,
                rows_total,
            });
        }
        if file_rows == 0 {
            return Err(DataError::EmptySource { path: path.clone() });
        }
    }
    if writer.rows == 0 {
        return Err(DataError::Options(format!(
            "no usable rows: {} read, {} empty, {} invalid (all skipped)",
            counts.read, counts.empty, counts.invalid
        )));
    }
    counts.written = writer.rows;
    let lengths = writer.tallies.iter().map(|t| t.stats()).collect();
    let tokens = writer.tokens();
    writer.finish()?;

    let meta = StoreMeta {
        format_version: FORMAT_VERSION,
        created_by: format!("memfit-data {}", env!("CARGO_PKG_VERSION")),
        fingerprint,
        task: opts.task,
        segments: match opts.task {
            Task::Classification => vec!["text".into()],
            _ => vec!["source".into(), "target".into()],
        },
        token_width: width as u8,
        rows: counts.written,
        tokens,
        eos_id: eos.as_ref().map(|e| e.id),
        pad_id: Some(pad.id),
        sources,
        tokenizer: TokenizerRef {
            path: tokenizer.path().display().to_string(),
            sha256: tokenizer.sha256().to_string(),
            vocab_size: tokenizer.vocab_size(),
            eos_token: eos.as_ref().map(|e| e.token.clone()),
            pad_token: Some(pad.token.clone()),
        },
        options: content,
        counts,
        lengths,
        label_names: rules.label_names,
    };
    let json = serde_json::to_string_pretty(&meta)
        .map_err(|e| DataError::Options(format!("meta.json: {e}")))?;
    write_atomic(&tmp_path.join(META_FILE), json.as_bytes())?;
    install(&tmp_path, &opts.out)?;
    std::mem::forget(tmp);
    tracing::info!(store = %opts.out.display(), rows = meta.rows, tokens = meta.tokens, "store written");
    Ok(PrepareReport {
        store: opts.out.clone(),
        reused: false,
        meta,
    })
}

/// Moves the finished temporary store to `out`, replacing an outdated store there.
fn install(tmp: &Path, out: &Path) -> Result<()> {
    if out.exists() {
        let old = sibling(out, "old");
        std::fs::rename(out, &old).map_err(|e| DataError::write(out, e))?;
        if let Err(e) = std::fs::rename(tmp, out) {
            // Put the previous store back: nothing lost.
            let _ = std::fs::rename(&old, out);
            return Err(DataError::write(out, e));
        }
        let _ = std::fs::remove_dir_all(&old);
    } else {
        std::fs::rename(tmp, out).map_err(|e| DataError::write(out, e))?;
    }
    Ok(())
}

/// Cuts `ids` to `max - 1` tokens (room for EOS) and appends EOS; true if it cut.
fn finish_segment(ids: &mut Vec<u32>, max: Option<usize>, eos: u32) -> bool {
    let cut = match max {
        Some(m) if ids.len() > m - 1 => {
            ids.truncate(m - 1);
            true
        }
        _ => false,
    };
    ids.push(eos);
    cut
}

#[allow(clippy::too_many_arguments)]
fn write_chunk(
    tokenizer: &Tokenizer,
    classifier: Option<&tokenizers::Tokenizer>,
    rows: Vec<RowTexts>,
    max_len: Option<usize>,
    max_target_len: Option<usize>,
    eos: Option<u32>,
    writer: &mut StoreWriter,
    counts: &mut RowCounts,
) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut labels = Vec::with_capacity(rows.len());
    let mut sources = Vec::with_capacity(rows.len());
    let mut targets = Vec::with_capacity(rows.len());
    for r in rows {
        labels.push(r.label);
        sources.push(r.source);
        if let Some(t) = r.target {
            targets.push(t);
        }
    }
    if let Some(cls) = classifier {
        let encs = cls.encode_batch(sources, true).map_err(|e| DataError::Tokenizer {
            path: tokenizer.path().to_path_buf(),
            reason: format!("encoding failed: {e}"),
        })?;
        for (enc, label) in encs.iter().zip(labels) {
            if !enc.get_overflowing().is_empty() {
                counts.truncated += 1;
            }
            writer.push(&[enc.get_ids()], label)?;
        }
        return Ok(());
    }
    let eos = eos.ok_or_else(|| DataError::Options("no EOS id".into()))?;
    let src = tokenizer.encode_batch(sources, false)?;
    let tgt = tokenizer.encode_batch(targets, false)?;
    for (mut s, mut t) in src.into_iter().zip(tgt) {
        let cut_s = finish_segment(&mut s, max_len, eos);
        let cut_t = finish_segment(&mut t, max_target_len, eos);
        if cut_s || cut_t {
            counts.truncated += 1;
        }
        writer.push(&[&s, &t], None)?;
    }
    Ok(())
}
