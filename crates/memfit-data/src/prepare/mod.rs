//! `memfit data prepare`: sources → token store, streaming one chunk of rows at a time.
//!
//! Rows are read and encoded by [`EncodedChunks`] and [`RowEncoder`] (the same code
//! `memfit predict` encodes its input with); this module fingerprints, writes and installs.
//! The store is built in a hidden sibling directory (`.NAME.partial-PID`) with `meta.json` written
//! last, then renamed into place: an interrupted run leaves no directory that looks like a store.
//! A store whose fingerprint (source contents, tokenizer content, content options) matches is
//! reused as is.

mod writer;

pub use crate::rows::{InvalidPolicy, RowTexts, Verdict};

use crate::encode::{EncodeSettings, EncodedChunks, RowEncoder};
use crate::error::{DataError, Result};
use crate::fsutil::write_atomic;
use crate::hash::{sha256_bytes, sha256_file};
use crate::rows::{Columns, Mode, RowForm};
use crate::store::meta::{
    ContentOptions, FORMAT_VERSION, LengthStats, RowCounts, SourceFile, StoreMeta, Task,
    TokenizerRef,
};
use crate::store::{INDEX_FILE, LABELS_FILE, META_FILE, TOKENS_FILE, TokenStore};
use crate::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use writer::StoreWriter;

#[derive(Debug, Clone)]
pub struct PrepareOptions {
    pub inputs: Vec<PathBuf>,
    /// A `tokenizer.json` or a directory holding one.
    pub tokenizer: PathBuf,
    pub task: Task,
    /// Column names; `None` takes the task's defaults (see [`crate::rows::Columns`]).
    pub columns: Option<Vec<String>>,
    /// Maximum tokens of the source, EOS included (classification: of the text or pair with its
    /// specials; causal-lm: of prompt + response + EOS).
    pub max_len: Option<usize>,
    /// Maximum tokens of the target, EOS included; defaults to `max_len`.
    pub max_target_len: Option<usize>,
    pub on_invalid: InvalidPolicy,
    /// Classification: label names by id (string labels are looked up in it, integer labels must
    /// be below its length); `None`: ids in order of first appearance.
    pub label_names: Option<Vec<String>>,
    /// Causal-LM: a chat template file to use instead of the tokenizer's own.
    pub chat_template: Option<PathBuf>,
    pub out: PathBuf,
    /// Rows decoded and tokenized at once (bounds memory).
    pub chunk_rows: usize,
    /// A row over this many bytes (a JSONL line; a parquet row's cells) is refused, or left out by
    /// `skip`/`keep`, without being held whole ([`crate::source::ReadLimits`]).
    pub max_row_bytes: u64,
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
            label_names: None,
            chat_template: None,
            out,
            // 2048 rows of a few hundred tokens: a few MiB of text and ids in flight.
            chunk_rows: 2048,
            max_row_bytes: crate::source::DEFAULT_MAX_ROW_BYTES,
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
    prepare_until(opts, progress, &|| None)
}

/// [`prepare`], asking `stop` after every chunk whether to stop (a memory guard's verdict): a reason
/// ends the prepare with [`DataError::Stopped`], the partial store removed.
pub fn prepare_until(
    opts: &PrepareOptions,
    progress: &mut dyn FnMut(Progress),
    stop: &dyn Fn() -> Option<String>,
) -> Result<PrepareReport> {
    if opts.inputs.is_empty() {
        return Err(DataError::Options("no --input files given".into()));
    }
    let first = opts.inputs.first().map(PathBuf::as_path);
    let columns = Columns::resolve(opts.task, Mode::Train, opts.columns.as_deref(), first)?;
    let tokenizer = Tokenizer::load(&opts.tokenizer)?;
    let pad = pad_token(&tokenizer, opts.task)?;
    let settings = EncodeSettings {
        mode: Mode::Train,
        max_len: opts.max_len,
        max_target_len: opts.max_target_len,
        chat_template: opts.chat_template.clone(),
    };
    let encoder = RowEncoder::new(tokenizer, opts.task, settings)?;
    let sources = source_files(&opts.inputs)?;
    let content = content_options(opts, &columns, &encoder);
    let fingerprint = fingerprint(&sources, encoder.tokenizer(), &content);
    if !opts.force
        && let Ok(existing) = TokenStore::open(&opts.out)
        && existing.meta().fingerprint == fingerprint
    {
        tracing::info!(store = %opts.out.display(), "store is up to date; reusing it");
        return Ok(PrepareReport {
            store: opts.out.clone(),
            reused: true,
            meta: existing.meta().clone(),
        });
    }
    check_replaceable(&opts.out)?;
    remove_stale_siblings(&opts.out);
    let tmp_path = sibling(&opts.out, "partial");
    std::fs::create_dir_all(&tmp_path).map_err(|e| DataError::write(&tmp_path, e))?;
    let tmp = TempDir(Some(tmp_path.clone()));

    let tokenizer = encoder.tokenizer();
    let pair = matches!(columns.form, RowForm::Classification { pair: true });
    let segments = opts.task.segment_names(pair);
    let written = write_rows(
        opts,
        &encoder,
        columns,
        segments.len(),
        &tmp_path,
        progress,
        stop,
    )?;
    let classification = opts.task == Task::Classification;
    let eos = encoder.eos_id().and_then(|id| {
        let token = tokenizer.inner().id_to_token(id)?;
        Some(crate::tokenizer::SpecialToken { token, id })
    });
    let meta = StoreMeta {
        format_version: FORMAT_VERSION,
        created_by: format!("memfit-data {}", env!("CARGO_PKG_VERSION")),
        fingerprint,
        task: opts.task,
        segments: segments.iter().map(|s| s.to_string()).collect(),
        token_width: written.width as u8,
        rows: written.counts.written,
        tokens: written.tokens,
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
        counts: written.counts,
        lengths: written.lengths,
        label_names: written.label_names,
        num_labels: written.num_labels.filter(|_| classification),
        prompt_format: encoder.prompt_format().map(|f| f.describe()),
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

/// What [`write_rows`] wrote.
struct Written {
    counts: RowCounts,
    lengths: Vec<LengthStats>,
    tokens: u64,
    width: usize,
    label_names: Vec<String>,
    num_labels: Option<u32>,
}

/// Streams the encoded rows of every input into the store files in `dir`.
fn write_rows(
    opts: &PrepareOptions,
    encoder: &RowEncoder,
    columns: Columns,
    segments: usize,
    dir: &Path,
    progress: &mut dyn FnMut(Progress),
    stop: &dyn Fn() -> Option<String>,
) -> Result<Written> {
    let width = if encoder.tokenizer().max_id() <= u16::MAX as u32 {
        2
    } else {
        4
    };
    let labels = opts.task == Task::Classification;
    let mut writer = StoreWriter::create(dir, width, segments, labels)?;
    let mut chunks = EncodedChunks::open(
        encoder,
        &opts.inputs,
        columns,
        opts.on_invalid,
        opts.label_names.clone(),
        crate::source::ReadLimits {
            chunk_rows: opts.chunk_rows,
            max_row_bytes: opts.max_row_bytes,
        },
    )?;
    while let Some(rows) = chunks.next_chunk()? {
        for (_, row) in rows {
            writer.push(&row.segments(), row.label())?;
        }
        progress(Progress {
            rows_read: chunks.counts().read,
            rows_total: chunks.rows_total(),
        });
        if let Some(reason) = stop() {
            return Err(DataError::Stopped(reason));
        }
    }
    let mut counts = chunks.counts().clone();
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
    Ok(Written {
        counts,
        lengths,
        tokens,
        width,
        label_names: chunks.rules().label_names().to_vec(),
        num_labels: chunks.rules().num_labels(),
    })
}

/// The token batches are padded with: the tokenizer's PAD; for causal-lm, EOS when it has none
/// (padding is masked out; Llama 3's tokenizer has no PAD and its users pad with EOS).
fn pad_token(tokenizer: &Tokenizer, task: Task) -> Result<crate::tokenizer::SpecialToken> {
    match (tokenizer.require_pad(task.name()), task) {
        (Ok(pad), _) => Ok(pad.clone()),
        (Err(_), Task::CausalLm) => Ok(tokenizer.require_eos(task.name())?.clone()),
        (Err(e), _) => Err(e),
    }
}

fn source_files(inputs: &[PathBuf]) -> Result<Vec<SourceFile>> {
    inputs
        .iter()
        .map(|path| {
            let bytes = std::fs::metadata(path)
                .map_err(|e| DataError::read(path, e))?
                .len();
            Ok(SourceFile {
                path: path.display().to_string(),
                bytes,
                sha256: sha256_file(path)?,
            })
        })
        .collect()
}

/// The options that shape the store's content. Fields a task does not use stay out of the JSON,
/// so stores written before they existed keep their fingerprints.
fn content_options(
    opts: &PrepareOptions,
    columns: &Columns,
    encoder: &RowEncoder,
) -> ContentOptions {
    let seq2seq = matches!(opts.task, Task::Seq2seq | Task::Chat);
    ContentOptions {
        task: opts.task,
        columns: columns.names(),
        max_len: opts.max_len,
        max_target_len: opts.max_target_len.or(opts.max_len).filter(|_| seq2seq),
        on_invalid: opts.on_invalid.name().to_string(),
        label_names: opts.label_names.clone(),
        chat_template_sha256: encoder
            .prompt_format()
            .and_then(|f| f.sha256())
            .map(str::to_string),
        max_row_bytes: (opts.on_invalid != InvalidPolicy::Fail).then_some(opts.max_row_bytes),
    }
}

fn fingerprint(sources: &[SourceFile], tokenizer: &Tokenizer, content: &ContentOptions) -> String {
    let hashes: Vec<&str> = sources.iter().map(|s| s.sha256.as_str()).collect();
    let key = serde_json::json!({
        "format_version": FORMAT_VERSION,
        "sources": hashes,
        "tokenizer": tokenizer.sha256(),
        "options": content,
    });
    sha256_bytes(key.to_string().as_bytes())
}

/// Refuses to replace a directory that is not a store (or an unfinished one).
fn check_replaceable(out: &Path) -> Result<()> {
    if !out.exists() || out.join(META_FILE).exists() {
        return Ok(());
    }
    let store_files = [TOKENS_FILE, INDEX_FILE, LABELS_FILE];
    let replaceable = std::fs::read_dir(out)
        .map(|d| {
            d.flatten()
                .all(|e| store_files.iter().any(|f| e.file_name() == *f))
        })
        .unwrap_or(false);
    if replaceable {
        return Ok(());
    }
    Err(DataError::Options(format!(
        "{} exists and is not a token store: refusing to replace it",
        out.display()
    )))
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
