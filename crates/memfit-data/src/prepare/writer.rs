//! Appends rows to the store files in a (temporary) directory and keeps the length statistics.

use crate::error::{DataError, Result};
use crate::store::meta::{HistogramBucket, LengthStats};
use crate::store::{INDEX_FILE, LABELS_FILE, TOKENS_FILE};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Length statistics of one segment; the histogram has power-of-two buckets (≤ 8, ≤ 16, …).
#[derive(Debug, Default)]
pub struct LengthTally {
    min: u64,
    max: u64,
    sum: u64,
    rows: u64,
    /// `buckets[k]` counts lengths in (2^(k+2), 2^(k+3)], bucket 0 counts ≤ 8.
    buckets: Vec<u64>,
}

impl LengthTally {
    pub fn add(&mut self, len: u64) {
        self.min = if self.rows == 0 { len } else { self.min.min(len) };
        self.max = self.max.max(len);
        self.sum += len;
        self.rows += 1;
        let k = if len <= 8 {
            0
        } else {
            (64 - (len - 1).leading_zeros()) as usize - 3
        };
        if self.buckets.len() <= k {
            self.buckets.resize(k + 1, 0);
        }
        self.buckets[k] += 1;
    }

    pub fn stats(&self) -> LengthStats {
        LengthStats {
            min: self.min,
            max: self.max,
            mean: if self.rows == 0 {
                0.0
            } else {
                self.sum as f64 / self.rows as f64
            },
            histogram: self
                .buckets
                .iter()
                .enumerate()
                .map(|(k, &rows)| HistogramBucket {
                    le: 8u64 << k,
                    rows,
                })
                .collect(),
        }
    }
}

pub struct StoreWriter {
    dir: PathBuf,
    tokens: BufWriter<File>,
    index: BufWriter<File>,
    labels: Option<BufWriter<File>>,
    width: usize,
    offset: u64,
    pub rows: u64,
    pub tallies: Vec<LengthTally>,
}

fn create(dir: &Path, name: &str) -> Result<BufWriter<File>> {
    let path = dir.join(name);
    let f = File::create(&path).map_err(|e| DataError::write(&path, e))?;
    Ok(BufWriter::with_capacity(1 << 20, f))
}

impl StoreWriter {
    pub fn create(dir: &Path, width: usize, segments: usize, with_labels: bool) -> Result<Self> {
        let mut w = StoreWriter {
            dir: dir.to_path_buf(),
            tokens: create(dir, TOKENS_FILE)?,
            index: create(dir, INDEX_FILE)?,
            labels: if with_labels {
                Some(create(dir, LABELS_FILE)?)
            } else {
                None
            },
            width,
            offset: 0,
            rows: 0,
            tallies: (0..segments).map(|_| LengthTally::default()).collect(),
        };
        w.write_index(0)?;
        Ok(w)
    }

    fn write_index(&mut self, off: u64) -> Result<()> {
        let path = self.dir.join(INDEX_FILE);
        self.index
            .write_all(&off.to_le_bytes())
            .map_err(|e| DataError::write(&path, e))
    }

    /// Appends one row: its segments in order, and its label for classification.
    pub fn push(&mut self, segments: &[&[u32]], label: Option<u32>) -> Result<()> {
        let tokens_path = self.dir.join(TOKENS_FILE);
        for (k, seg) in segments.iter().enumerate() {
            for &id in *seg {
                let r = if self.width == 2 {
                    // Width 2 is chosen only when every id of the tokenizer fits in u16.
                    self.tokens.write_all(&(id as u16).to_le_bytes())
                } else {
                    self.tokens.write_all(&id.to_le_bytes())
                };
                r.map_err(|e| DataError::write(&tokens_path, e))?;
            }
            self.offset += seg.len() as u64;
            self.write_index(self.offset)?;
            if let Some(t) = self.tallies.get_mut(k) {
                t.add(seg.len() as u64);
            }
        }
        if let Some(labels) = self.labels.as_mut() {
            let path = self.dir.join(LABELS_FILE);
            labels
                .write_all(&label.unwrap_or(0).to_le_bytes())
                .map_err(|e| DataError::write(&path, e))?;
        }
        self.rows += 1;
        Ok(())
    }

    pub fn tokens(&self) -> u64 {
        self.offset
    }

    /// Flushes and syncs the data files (meta.json is written after, by the caller).
    pub fn finish(self) -> Result<()> {
        let StoreWriter {
            dir,
            tokens,
            index,
            labels,
            ..
        } = self;
        for (name, w) in [(TOKENS_FILE, Some(tokens)), (INDEX_FILE, Some(index)), (LABELS_FILE, labels)] {
            if let Some(w) = w {
                let path = dir.join(name);
                let f = w
                    .into_inner()
                    .map_err(|e| DataError::write(&path, e.into_error()))?;
                f.sync_all().map_err(|e| DataError::write(&path, e))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_powers_of_two() {
        let mut t = LengthTally::default();
        for len in [0, 8, 9, 16, 17, 100] {
            t.add(len);
        }
        let s = t.stats();
        let pairs: Vec<(u64, u64)> = s.histogram.iter().map(|b| (b.le, b.rows)).collect();
        assert_eq!(pairs, vec![(8, 2), (16, 2), (32, 1), (64, 0), (128, 1)]);
        assert_eq!((s.min, s.max), (0, 100));
    }
}
