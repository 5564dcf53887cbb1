//! Source files read as encoded rows, one chunk at a time: what `prepare` writes into a store and
//! what `memfit predict` feeds a model, through the same row rules and the same encoder. Memory
//! is bounded by the chunk, never the file, and a chunk's rows are tokenized a few MiB of text at a
//! time ([`ENCODE_BATCH_BYTES`]).

use super::{EncodedRow, RowEncoder};
use crate::error::{DataError, Location, Result};
use crate::rows::{Columns, InvalidPolicy, RowRules, RowTexts, Verdict};
use crate::source::{self, ReadLimits, RecordReader};
use crate::store::meta::RowCounts;
use std::path::PathBuf;

/// Rows are tokenized in batches of at most this many bytes of text (or one row, when larger):
/// tokenizing costs a multiple of the text (issue 29 measured up to ~180× on one line), so these
/// batches, not the chunk, set the peak.
pub const ENCODE_BATCH_BYTES: u64 = 4 << 20;

/// The most memory tokenizing one byte of text is taken to cost, to bound the row limit by a
/// budget: issue 29 measured up to ~180× on one line, a 50 MB row reached 6 GiB (123×), a 4 MiB
/// Chinese row with the ChatLM tokenizer 78× and a 16 MB word-level row 85× (2026-12-07).
pub const TOKENIZE_BYTES_PER_TEXT_BYTE: u64 = 192;

/// The rows of a list of source files, encoded, chunk by chunk, in file order.
pub struct EncodedChunks<'a> {
    encoder: &'a RowEncoder,
    rules: RowRules,
    readers: std::vec::IntoIter<(PathBuf, Box<dyn RecordReader>)>,
    current: Option<(PathBuf, Box<dyn RecordReader>, u64)>,
    counts: RowCounts,
    rows_total: Option<u64>,
}

impl<'a> EncodedChunks<'a> {
    /// Opens every input first (a missing column in the last file fails before any work).
    /// `label_names` fixes classification label ids (see [`RowRules::new`]); `limits` bound the
    /// rows of a chunk and each row's size.
    pub fn open(
        encoder: &'a RowEncoder,
        inputs: &[PathBuf],
        columns: Columns,
        policy: InvalidPolicy,
        label_names: Option<Vec<String>>,
        limits: ReadLimits,
    ) -> Result<Self> {
        if inputs.is_empty() {
            return Err(DataError::Options("no input files given".into()));
        }
        if let Some(n) = label_names.as_ref().map(Vec::len)
            && n > crate::rows::MAX_LABELS as usize
        {
            return Err(DataError::Options(format!(
                "--label-names: {n} names, past the {} labels memfit takes",
                crate::rows::MAX_LABELS
            )));
        }
        let mut readers = Vec::with_capacity(inputs.len());
        let mut rows_total = Some(0u64);
        for path in inputs {
            let r = source::open(path, &columns.specs, limits)?;
            rows_total = rows_total.zip(r.total_rows()).map(|(a, b)| a + b);
            readers.push((path.clone(), r));
        }
        Ok(EncodedChunks {
            encoder,
            rules: RowRules::new(columns, policy, label_names),
            readers: readers.into_iter(),
            current: None,
            counts: RowCounts::default(),
            rows_total,
        })
    }

    /// Rows read and what happened to them so far (`written` is left to the caller).
    pub fn counts(&self) -> &RowCounts {
        &self.counts
    }

    /// Rows in all inputs when every format states it (parquet does, JSONL does not).
    pub fn rows_total(&self) -> Option<u64> {
        self.rows_total
    }

    /// The row rules: columns, label names and `num_labels` so far.
    pub fn rules(&self) -> &RowRules {
        &self.rules
    }

    /// The next chunk's encoded rows with their places in the file (possibly none, when every row
    /// of the chunk was left out), `None` after the last file.
    pub fn next_chunk(&mut self) -> Result<Option<Vec<(Location, EncodedRow)>>> {
        loop {
            let Some((path, reader, rows)) = &mut self.current else {
                match self.readers.next() {
                    Some((path, reader)) => self.current = Some((path, reader, 0)),
                    None => return Ok(None),
                }
                continue;
            };
            let Some(chunk) = reader.next_chunk()? else {
                if *rows == 0 {
                    return Err(DataError::EmptySource { path: path.clone() });
                }
                self.current = None;
                continue;
            };
            *rows += chunk.len() as u64;
            let path = path.clone();
            return self.encode_chunk(&path, chunk).map(Some);
        }
    }

    fn encode_chunk(
        &mut self,
        path: &std::path::Path,
        chunk: Vec<source::Record>,
    ) -> Result<Vec<(Location, EncodedRow)>> {
        self.counts.read += chunk.len() as u64;
        let mut texts: Vec<RowTexts> = Vec::with_capacity(chunk.len());
        let mut sizes = Vec::with_capacity(chunk.len());
        let mut kept = Vec::with_capacity(chunk.len());
        for rec in chunk {
            let (location, bytes) = (rec.location, rec.bytes);
            let (row, verdict) = self.rules.apply(path, rec)?;
            self.count(verdict);
            match row {
                Some(r) => {
                    texts.push(r);
                    sizes.push(bytes);
                    kept.push((location, verdict));
                }
                None => self.counts.skipped += 1,
            }
        }
        let mut encoded = Vec::with_capacity(texts.len());
        for range in byte_batches(&sizes, ENCODE_BATCH_BYTES) {
            encoded.extend(self.encoder.encode_batch(&texts[range])?);
        }
        let mut out = Vec::with_capacity(encoded.len());
        for ((location, verdict), row) in kept.into_iter().zip(encoded) {
            match row {
                Ok(r) => {
                    self.counts.truncated += u64::from(r.truncated);
                    out.push((location, r));
                }
                // A row the encoder refuses cannot be kept whatever the policy: counted as
                // invalid and left out, or an error naming it.
                Err(problem) => match self.rules.policy() {
                    InvalidPolicy::Fail => {
                        return Err(DataError::InvalidRow {
                            path: path.to_path_buf(),
                            location,
                            // The row's columns: `messages`, or `instruction,input,output`.
                            column: self.rules.columns().joined(),
                            reason: problem.reason,
                        });
                    }
                    InvalidPolicy::Skip | InvalidPolicy::Keep => {
                        // A row kept as empty or invalid was counted so already.
                        if verdict == Verdict::Clean {
                            self.counts.invalid += 1;
                        }
                        self.counts.skipped += 1;
                    }
                },
            }
        }
        Ok(out)
    }

    fn count(&mut self, verdict: Verdict) {
        match verdict {
            Verdict::Clean => {}
            Verdict::Empty => self.counts.empty += 1,
            Verdict::Invalid => self.counts.invalid += 1,
        }
    }
}

/// `sizes` cut into consecutive ranges of at most `max` bytes each (a larger row alone).
fn byte_batches(sizes: &[u64], max: u64) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut held) = (0, 0u64);
    for (i, &size) in sizes.iter().enumerate() {
        if i > start && held + size > max {
            out.push(start..i);
            (start, held) = (i, 0);
        }
        held += size;
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::byte_batches;

    #[test]
    fn batches_stay_under_the_bytes_and_cover_every_row_once() {
        assert_eq!(byte_batches(&[], 10), Vec::<std::ops::Range<usize>>::new());
        assert_eq!(byte_batches(&[3, 3, 3, 3], 6), vec![0..2, 2..4]);
        // a row larger than the batch goes alone
        assert_eq!(byte_batches(&[2, 50, 2, 2], 6), vec![0..1, 1..2, 2..4]);
        assert_eq!(byte_batches(&[1; 5], 100), vec![0..5]);
    }
}
