//! The token store on disk and its memory-mapped reader.
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
//! `index.bin` once through a small buffer, then maps the files. The maps are advised
//! `MADV_RANDOM` (no read-ahead), and [`TokenStore::release_pages`] drops the pages a process has
//! touched so far — they are clean, file-backed pages, re-read from the page cache on the next
//! access — which is how a trainer sweeping a store larger than RAM keeps its RSS flat.

pub mod meta;

use crate::error::{DataError, Result};
use memmap2::{Advice, Mmap, UncheckedAdvice};
pub use meta::{StoreMeta, Task};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

pub const TOKENS_FILE: &str = "tokens.bin";
pub const INDEX_FILE: &str = "index.bin";
pub const LABELS_FILE: &str = "labels.bin";
pub const META_FILE: &str = "meta.json";

/// The token ids of one segment, borrowed from the map (decoded on access: no alignment or
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

/// One row: its segments (seq2seq/chat: source, target; classification: the text) and label.
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

    /// The second segment (seq2seq/chat target, ending in EOS); `None` for classification.
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

/// A prepared token store, memory-mapped. `Send + Sync`: share one across loader threads.
#[derive(Debug)]
pub struct TokenStore {
    dir: PathBuf,
    meta: StoreMeta,
    tokens: Mmap,
    index: Mmap,
    labels: Option<Mmap>,
    segments: usize,
    width: usize,
}

fn map(path: &Path) -> Result<(File, Mmap)> {
    let file = File::open(path).map_err(|e| DataError::read(path, e))?;
    // SAFETY: a store's files are never modified after `prepare` renames the directory into place
    // (a rebuild writes a new directory), so the mapped bytes cannot change under us.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| DataError::read(path, e))?;
    // Random access is the common pattern: read-ahead would only inflate RSS.
    let _ = map.advise(Advice::Random);
    Ok((file, map))
}

impl TokenStore {
    /// Opens the store in `dir`, checking its files against `meta.json`.
    pub fn open(dir: &Path) -> Result<Self> {
        let meta_path = dir.join(META_FILE);
        let text = std::fs::read_to_string(&meta_path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                DataError::store(dir, "no meta.json: not a token store (or an unfinished one)")
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
            return Err(DataError::store(dir, format!("token width {width} (expected 2 or 4)")));
        }
        let segments = meta.task.segments();
        if meta.segments.len() != segments {
            return Err(DataError::store(dir, "segment names do not match the task"));
        }
        let rows = usize::try_from(meta.rows).map_err(|_| DataError::store(dir, "too many rows"))?;
        let entries = rows
            .checked_mul(segments)
            .and_then(|n| n.checked_add(1))
            .ok_or_else(|| DataError::store(dir, "row count overflows"))?;

        let (_, tokens) = map(&dir.join(TOKENS_FILE))?;
        let expect_tokens = meta.tokens.checked_mul(width as u64);
        if Some(tokens.len() as u64) != expect_tokens {
            return Err(DataError::store(
                dir,
                format!(
                    "tokens.bin has {} bytes, meta.json says {} tokens of {width} bytes",
                    tokens.len(),
                    meta.tokens
                ),
            ));
        }
        let index_path = dir.join(INDEX_FILE);
        let (index_file, index) = map(&index_path)?;
        if index.len() as u64 != entries as u64 * 8 {
            return Err(DataError::store(
                dir,
                format!(
                    "index.bin has {} bytes, expected {} for {rows} rows",
                    index.len(),
                    entries * 8
                ),
            ));
        }
        check_offsets(&index_file, &index_path, entries, meta.tokens)?;
        let labels = if meta.task == Task::Classification {
            let (_, labels) = map(&dir.join(LABELS_FILE))?;
            if labels.len() != rows * 4 {
                return Err(DataError::store(
                    dir,
                    format!("labels.bin has {} bytes, expected {}", labels.len(), rows * 4),
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

    #[inline]
    fn offset(&self, k: usize) -> usize {
        match self.index.get(k * 8..k * 8 + 8) {
            Some(b) => {
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                u64::from_le_bytes(a) as usize
            }
            None => 0,
        }
    }

    #[inline]
    fn tokens_between(&self, start: usize, end: usize) -> Tokens<'_> {
        let bytes = self
            .tokens
            .get(start * self.width..end * self.width)
            .unwrap_or(&[]);
        Tokens {
            bytes,
            width: self.width,
        }
    }

    /// Row `i` in O(1), or `None` past the end.
    pub fn get(&self, i: usize) -> Option<Row<'_>> {
        if i >= self.len() {
            return None;
        }
        let base = i * self.segments;
        let empty = Tokens {
            bytes: &[],
            width: self.width,
        };
        let mut segments = [empty, empty];
        let mut start = self.offset(base);
        for (s, seg) in segments.iter_mut().enumerate().take(self.segments) {
            let end = self.offset(base + s + 1);
            *seg = self.tokens_between(start, end);
            start = end;
        }
        let label = self.labels.as_ref().and_then(|l| {
            let b = l.get(i * 4..i * 4 + 4)?;
            Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        });
        Some(Row {
            segments,
            count: self.segments,
            label,
        })
    }

    /// Row `i` in O(1).
    ///
    /// # Panics
    /// If `i >= self.len()` (like slice indexing; use [`TokenStore::get`] for a checked read).
    pub fn row(&self, i: usize) -> Row<'_> {
        match self.get(i) {
            Some(r) => r,
            None => panic!("row {i} out of range for a store of {} rows", self.len()),
        }
    }

    /// Tokens per row over all segments, read from `index.bin` through a buffer (not the map, so
    /// it does not add the index to RSS). For samplers: length grouping and token budgets.
    pub fn row_lengths(&self) -> Result<Vec<u32>> {
        let path = self.dir.join(INDEX_FILE);
        let file = File::open(&path).map_err(|e| DataError::read(&path, e))?;
        let mut reader = BufReader::with_capacity(1 << 16, file);
        let mut lengths = Vec::with_capacity(self.len());
        let mut buf = [0u8; 8];
        reader.read_exact(&mut buf).map_err(|e| DataError::read(&path, e))?;
        let mut row_start = u64::from_le_bytes(buf);
        for _ in 0..self.len() {
            let mut end = row_start;
            for _ in 0..self.segments {
                reader.read_exact(&mut buf).map_err(|e| DataError::read(&path, e))?;
                end = u64::from_le_bytes(buf);
            }
            lengths.push(u32::try_from(end - row_start).unwrap_or(u32::MAX));
            row_start = end;
        }
        Ok(lengths)
    }

    /// Drops this process's mapped pages of the store. Clean file pages: nothing is lost, the next
    /// access faults them back from the page cache. Call it every few thousand rows when streaming
    /// a large store, to keep RSS flat.
    pub fn release_pages(&self) {
        for m in [Some(&self.tokens), Some(&self.index), self.labels.as_ref()]
            .into_iter()
            .flatten()
        {
            // SAFETY: the maps are read-only and file-backed (shared); MADV_DONTNEED on them only
            // drops page-table entries, and later reads return the same file contents.
            let _ = unsafe { m.unchecked_advise(UncheckedAdvice::DontNeed) };
        }
    }
}

/// Offsets start at 0, never decrease, and end at the token count: after this, no row can
/// reach outside `tokens.bin`.
fn check_offsets(file: &File, path: &Path, entries: usize, tokens: u64) -> Result<()> {
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let mut buf = [0u8; 8];
    let mut prev = 0u64;
    for k in 0..entries {
        reader.read_exact(&mut buf).map_err(|e| DataError::read(path, e))?;
        let off = u64::from_le_bytes(buf);
        if (k == 0 && off != 0) || off < prev || off > tokens {
            return Err(DataError::store(
                path,
                format!("offset {k} is {off} (previous {prev}, tokens {tokens}): the index is corrupt"),
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
