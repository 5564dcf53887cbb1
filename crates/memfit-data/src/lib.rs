//! memfit-data: data without the memory bill.
//!
//! Data flows through the modules in this order:
//!
//! - [`source`]    — parquet and JSONL readers, one chunk of rows at a time (bounded memory).
//! - [`tokenizer`] — load a Hugging Face `tokenizer.json` ([`Tokenizer::load`]) or train one
//!   ([`tokenizer::train::train`]).
//! - [`chat`]      — chat templates rendered with minijinja as transformers renders them, or
//!   Alpaca's plain format; prompt/response splitting of chat rows.
//! - [`rows`]      — a task's columns, the per-row rules and the `--on-invalid` policy: records →
//!   [`rows::RowTexts`].
//! - [`encode`]    — [`RowEncoder`]: row texts → tokens for every task (EOS by id, truncation by
//!   tokens, classification specials and pairs, causal-LM prompt lengths), and [`EncodedChunks`]:
//!   source files → encoded rows, a chunk at a time (used by `prepare` and `memfit predict`).
//! - [`prepare`]   — source → token store ([`prepare::prepare`]): encoded rows written in a
//!   temporary directory and renamed into place, reused when up to date.
//! - [`store`]     — the token store ([`TokenStore`]): O(1) [`TokenStore::read_row`] by positioned
//!   reads through the page cache; RSS independent of the store's size (why not mmap: see
//!   [`store`]).
//! - [`sampler`]   — seeded shuffle per epoch, sharding by (rank, world) with equal steps,
//!   length-grouped batches by rows or by token budget, and the resumable [`Cursor`].
//! - [`batch`]     — dynamic padding into [`PaddedSeq2Seq`] / [`PaddedClassification`]; typed
//!   rows for a trainer: [`TokenStore::classification_row`] ([`ClassificationRow`]: ids, token
//!   types, label; [`TokenStore::label_names`], [`TokenStore::num_labels`]) and
//!   [`TokenStore::causal_row`] ([`CausalRow`]: ids and prompt length).
//! - [`bench`]     — the random-access measurement behind `memfit bench data`.
//!
//! # What a trainer calls
//!
//! ```no_run
//! use memfit_data::{Batching, Cursor, Sampler, SamplerConfig, TokenStore};
//! # fn main() -> Result<(), memfit_data::DataError> {
//! let store = TokenStore::open("data/train.store".as_ref())?;
//! let mut config = SamplerConfig::new(42, Batching::Tokens(8192)); // or Batching::Samples(16)
//! config.group_window = Some(50);              // sort by length inside 50-batch windows
//! (config.rank, config.world) = (0, 1);        // this process's shard
//! let mut sampler = Sampler::new(config.clone(), store.row_lengths()?)?;
//! // …or, from a checkpoint: Sampler::resume(config, store.row_lengths()?, saved_cursor)?
//! loop {
//!     let rows = sampler.next_batch();         // row indices
//!     let batch = store.seq2seq_batch(&rows)?; // PaddedSeq2Seq: input_ids/input_mask/labels/label_mask
//!     let cursor: Cursor = sampler.cursor();   // serde: save it in trainer_state.json
//!     # let _ = (batch, cursor); break;
//! }
//! # Ok(()) }
//! ```
//!
//! Errors are [`DataError`]; [`DataError::is_bad_input`] tells a user's mistake (exit 2) from a
//! run-time failure.

pub mod batch;
pub mod bench;
pub mod chat;
pub mod encode;
pub mod error;
mod fsutil;
pub mod hash;
pub mod prepare;
mod rng;
pub mod rows;
pub mod sampler;
pub mod source;
pub mod store;
pub mod tokenizer;

pub use batch::{
    PaddedClassification, PaddedSeq2Seq, pad_classification, pad_seq2seq, pad_token_pairs,
};
pub use encode::{EncodeSettings, EncodedChunks, EncodedRow, RowEncoder, RowTokens};
pub use error::{DataError, Location};
pub use prepare::{InvalidPolicy, PrepareOptions, PrepareReport, prepare, prepare_until};
pub use rows::{Columns, MAX_LABELS, Mode, RowTexts};
pub use sampler::{Batching, Cursor, Sampler, SamplerConfig};
pub use store::{CausalRow, ClassificationRow, Row, RowBuf, StoreMeta, Task, TokenStore, Tokens};
pub use tokenizer::Tokenizer;
