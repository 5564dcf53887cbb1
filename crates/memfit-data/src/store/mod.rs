//! The token store on disk and its reader.
//!
//! A store is a directory:
//! - `tokens.bin` — every token id of every row, little-endian, `token_width` bytes each (u16 when
//!   the tokenizer's ids all fit, else u32);
//! - `index.bin`  — `rows × segments + 1` little-endian u64 token offsets into `tokens.bin`: segment
//!   `s` of row `i` is `offsets[i·S + s] .. offsets[i·S + s + 1]`, so a row is found in O(1);
//! - `labels.bin` — classification only: one little-endian u32 label per row;
//! - `meta.json`  — [`StoreMeta`], written last.
//!
//! [`TokenStore::open`] checks the files against `meta.json` (sizes, offsets in order) by reading
//! `index.bin` once through a small buffer. Rows are then read with positioned reads (`pread`) into
//! a caller's [`RowBuf`]: one read of the row's offsets, one of its tokens.
//!
//! Why not a memory map: measured on Linux 6.18/ext4 with a 534 MB store, random row reads through
//! a map raised RSS by ~1.2 MB per row read (a fault maps the whole large folio of the page cache,
//! not one 4 KiB page) — 10,000 random rows gave 280 MB of RSS, which grows with the store. Positioned
//! reads use the same page cache with no mapping, so RSS stays at the size of the buffers, and a
//! read of a cached row still takes about a microsecond (benchmarks in the README).

pub mod meta;
mod rows;

use crate::error::{DataError, Result};
pub use meta::{StoreMeta, Task};
pub use rows::{CausalRow, ClassificationRow, token_types};
use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub const TOKENS_FILE: &str = "tokens.bin";
pub const INDEX_FILE: &str = "index.bin";
pub const LABELS_FILE: &str = "labels.bin";
pub const META_FILE: &str = "meta.json";

/// The token ids of one segment, borrowed from a [`RowBuf`] (decoded on access: no alignment or
/// endianness assumptions).
#[derive(Debug, Clone, Copy)]
pub struct Tokens<'a> {
    bytes: &'a [u8],
    width: usize,
}

impl<'a> Tokens<'a> {
    pub fn len(&self) -> usize {
        self.bytes.len() / self.width
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn get(&self, k: usize) -> Option<u32> {
        let b = self.bytes.get(k * self.width..(k + 1) * self.width)?;
        Some(decode(b))
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = u32> + 'a {
        self.bytes.chunks_exact(self.width).map(decode)
    }

    /// Appends the ids to `out` (reuse one buffer across rows to avoid allocations).
    pub fn extend_into(&self, out: &mut Vec<u32>) {
        out.extend(self.iter());
    }

    pub fn to_vec(&self) -> Vec<u32> {
        self.iter().collect()
    }
}

#[inline]
fn decode(b: &[u8]) -> u32 {
    match *b {
        [a, b] => u16::from_le_bytes([a, b]) as u32,
        [a, b, c, d] => u32::from_le_bytes([a, b, c, d]),
        _ => 0,
    }
}

/// One row: its segments (seq2seq/chat: source, target; classification: the text, or the pair's two
/// parts; causal-lm: prompt, response) and label.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    segments: [Tokens<'a>; 2],
    count: usize,
    label: Option<u32>,
}

impl<'a> Row<'a> {
    pub fn segments(&self) -> &[Tokens<'a>] {
        &self.segments[..self.count]
    }

    /// The first segment: the source of seq2seq/chat, the text of classification.
    pub fn source(&self) -> Tokens<'a> {
        self.segments[0]
    }

    /// The second segment (seq2seq/chat target, ending in EOS; a pair's second part; causal-lm
    /// response); `None` for single-text classification.
    pub fn target(&self) -> Option<Tokens<'a>> {
        (self.count > 1).then_some(self.segments[1])
    }

    /// Classification label id.
    pub fn label(&self) -> Option<u32> {
        self.label
    }

    /// Tokens over all segments.
    pub fn total_tokens(&self) -> usize {
        self.segments().iter().map(Tokens::len).sum()
    }
}

/// Reusable scratch space for row reads (one per loader thread): reading rows into it does not
/// allocate once it has grown to the largest batch.
#[derive(Debug, Default)]
pub struct RowBuf {
    bytes: Vec<u8>,
    spans: Vec<RowSpan>,
}

#[derive(Debug, Clone, Copy)]
struct RowSpan {
    /// Byte ranges of the segments inside `RowBuf::bytes`.
    ends: [usize; 3],
    label: Option<u32>,
}

/// A prepared token store. `Send + Sync`: share one across loader threads, each with its own
/// [`RowBuf`].
#[derive(Debug)]
pub struct TokenStore {
    dir: PathBuf,
    meta: StoreMeta,
    tokens: File,
    index: File,
    labels: Option<File>,
    segments: usize,
    width: usize,
}

fn open_file(path: &Path) -> Result<(File, u64)> {
    let file = File::open(path).map_err(|e| DataError::read(path, e))?;
    let len = file.metadata().map_err(|e| DataError::read(path, e))?.len();
    Ok((file, len))
}

impl TokenStore {
    /// Opens the store in `dir`, checking its files against `meta.json`.
    pub fn open(dir: &Path) -> Result<Self> {
        let meta_path = dir.join(META_FILE);
        let text = std::fs::read_to_string(&meta_path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                DataError::store(
                    dir,
                    "no meta.json: not a token store (or an unfinished one)",
                )
            } else {
                DataError::read(&meta_path, e)
            }
        })?;
        let meta: StoreMeta = serde_json::from_str(&text)
            .map_err(|e| DataError::store(dir, format!("meta.json does not parse: {e}")))?;
        if meta.format_version != meta::FORMAT_VERSION {
            return Err(DataError::store(
                dir,
                format!(
                    "format version {} (this memfit reads {}): prepare it again",
                    meta.format_version,
                    meta::FORMAT_VERSION
                ),
            ));
        }
        let width = usize::from(meta.token_width);
        if width != 2 && width != 4 {
            return Err(DataError::store(
                dir,
                format!("token width {width} (expected 2 or 4)"),
            ));
        }
        let names: Vec<&str> = meta.segments.iter().map(String::as_str).collect();
        let known = [false, true].map(|pair| meta.task.segment_names(pair));
        if !known.contains(&names.as_slice()) {
            return Err(DataError::store(
                dir,
                format!(
                    "segments {names:?} do not match the task {}",
                    meta.task.name()
                ),
            ));
        }
        let segments = names.len();
        let rows =
            usize::try_from(meta.rows).map_err(|_| DataError::store(dir, "too many rows"))?;
        let entries = rows
            .checked_mul(segments)
            .and_then(|n| n.checked_add(1))
            .ok_or_else(|| DataError::store(dir, "row count overflows"))?;

        let (tokens, tokens_len) = open_file(&dir.join(TOKENS_FILE))?;
        let expect_tokens = meta.tokens.checked_mul(width as u64);
        if Some(tokens_len) != expect_tokens {
            return Err(DataError::store(
                dir,
                format!(
                    "tokens.bin has {} bytes, meta.json says {} tokens of {width} bytes",
                    tokens_len, meta.tokens
                ),
            ));
        }
        let index_path = dir.join(INDEX_FILE);
        let (index, index_len) = open_file(&index_path)?;
        if index_len != entries as u64 * 8 {
            return Err(DataError::store(
                dir,
                format!(
                    "index.bin has {} bytes, expected {} for {rows} rows",
                    index_len,
                    entries * 8
                ),
            ));
        }
        check_offsets(&index, &index_path, entries, meta.tokens)?;
        let labels = if meta.task == Task::Classification {
            let (labels, labels_len) = open_file(&dir.join(LABELS_FILE))?;
            if labels_len != rows as u64 * 4 {
                return Err(DataError::store(
                    dir,
                    format!("labels.bin has {labels_len} bytes, expected {}", rows * 4),
                ));
            }
            Some(labels)
        } else {
            None
        };
        Ok(TokenStore {
            dir: dir.to_path_buf(),
            meta,
            tokens,
            index,
            labels,
            segments,
            width,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn meta(&self) -> &StoreMeta {
        &self.meta
    }

    pub fn task(&self) -> Task {
        self.meta.task
    }

    pub fn len(&self) -> usize {
        self.meta.rows as usize
    }

    pub fn is_empty(&self) -> bool {
        self.meta.rows == 0
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.meta.eos_id
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.meta.pad_id
    }

    /// Reads rows `indices` into `buf` (replacing what it held) and returns views of them, in order.
    pub fn read_rows<'b>(&self, indices: &[usize], buf: &'b mut RowBuf) -> Result<Vec<Row<'b>>> {
        buf.bytes.clear();
        buf.spans.clear();
        let s = self.segments;
        let mut offsets = [0u8; 8 * 3];
        for &i in indices {
            if i >= self.len() {
                return Err(DataError::store(
                    &self.dir,
                    format!("row {i} is past the end ({} rows)", self.len()),
                ));
            }
            let raw = &mut offsets[..8 * (s + 1)];
            self.index
                .read_exact_at(raw, (i * s * 8) as u64)
                .map_err(|e| DataError::read(&self.dir.join(INDEX_FILE), e))?;
            let mut off = [0u64; 3];
            for (k, o) in off.iter_mut().enumerate().take(s + 1) {
                let mut a = [0u8; 8];
                a.copy_from_slice(&raw[k * 8..k * 8 + 8]);
                *o = u64::from_le_bytes(a);
            }
            // Checked again here: the files could have changed since `open`.
            if off[..=s].windows(2).any(|w| w[0] > w[1]) || off[s] > self.meta.tokens {
                return Err(DataError::store(
                    &self.dir,
                    format!("row {i}: offsets out of order"),
                ));
            }
            let start = buf.bytes.len();
            let n = ((off[s] - off[0]) as usize) * self.width;
            buf.bytes.resize(start + n, 0);
            self.tokens
                .read_exact_at(&mut buf.bytes[start..], off[0] * self.width as u64)
                .map_err(|e| DataError::read(&self.dir.join(TOKENS_FILE), e))?;
            let mut ends = [start + n; 3];
            for k in 0..s {
                ends[k] = start + ((off[k + 1] - off[0]) as usize) * self.width;
            }
            let label = match &self.labels {
                Some(f) => {
                    let mut b = [0u8; 4];
                    f.read_exact_at(&mut b, (i * 4) as u64)
                        .map_err(|e| DataError::read(&self.dir.join(LABELS_FILE), e))?;
                    Some(u32::from_le_bytes(b))
                }
                None => None,
            };
            buf.spans.push(RowSpan { ends, label });
        }
        let bytes = &buf.bytes;
        let width = self.width;
        let mut start = 0;
        Ok(buf
            .spans
            .iter()
            .map(|span| {
                let mut segments = [Tokens { bytes: &[], width }; 2];
                let mut from = start;
                for (k, seg) in segments.iter_mut().enumerate().take(s) {
                    *seg = Tokens {
                        bytes: &bytes[from..span.ends[k]],
                        width,
                    };
                    from = span.ends[k];
                }
                start = span.ends[s - 1];
                Row {
                    segments,
                    count: s,
                    label: span.label,
                }
            })
            .collect())
    }

    /// Row `i` in O(1): two positioned reads (offsets, tokens) into `buf`.
    pub fn read_row<'b>(&self, i: usize, buf: &'b mut RowBuf) -> Result<Row<'b>> {
        let mut rows = self.read_rows(&[i], buf)?;
        rows.pop()
            .ok_or_else(|| DataError::store(&self.dir, format!("row {i} could not be read")))
    }

    /// Tokens per row over all segments, read from `index.bin` through a buffer (not the map, so
    /// it does not add the index to RSS). For samplers: length grouping and token budgets.
    pub fn row_lengths(&self) -> Result<Vec<u32>> {
        let path = self.dir.join(INDEX_FILE);
        let file = File::open(&path).map_err(|e| DataError::read(&path, e))?;
        let mut reader = BufReader::with_capacity(1 << 16, file);
        let mut lengths = Vec::with_capacity(self.len());
        let mut buf = [0u8; 8];
        reader
            .read_exact(&mut buf)
            .map_err(|e| DataError::read(&path, e))?;
        let mut row_start = u64::from_le_bytes(buf);
        for _ in 0..self.len() {
            let mut end = row_start;
            for _ in 0..self.segments {
                reader
                    .read_exact(&mut buf)
                    .map_err(|e| DataError::read(&path, e))?;
                end = u64::from_le_bytes(buf);
            }
            lengths.push(u32::try_from(end - row_start).unwrap_or(u32::MAX));
            row_start = end;
        }
        Ok(lengths)
    }
}

/// Offsets start at 0, never decrease, and end at the token count: after this, no row can
/// reach outside `tokens.bin`.
fn check_offsets(file: &File, path: &Path, entries: usize, tokens: u64) -> Result<()> {
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let mut buf = [0u8; 8];
    let mut prev = 0u64;
    for k in 0..entries {
        reader
            .read_exact(&mut buf)
            .map_err(|e| DataError::read(path, e))?;
        let off = u64::from_le_bytes(buf);
        if (k == 0 && off != 0) || off < prev || off > tokens {
            return Err(DataError::store(
                path,
                format!(
                    "offset {k} is {off} (previous {prev}, tokens {tokens}): the index is corrupt"
                ),
            ));
        }
        prev = off;
    }
    if prev != tokens {
        return Err(DataError::store(
            path,
            format!("the last offset is {prev}, meta.json says {tokens} tokens"),
        ));
    }
    Ok(())
}
