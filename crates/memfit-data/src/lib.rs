//! memfit-data: data without the memory bill.
//!
//! - `source`    — parquet and JSONL readers, streamed one row group / chunk at a time.
//! - `tokenizer` — load a Hugging Face tokenizer.json, or train one.
//! - `prepare`   — source → memory-mapped token store (`tokens.bin`, `index.bin`, `meta.json`).
//! - `store`     — the memory-mapped store: O(1) random access, RSS independent of its size.
//! - `sampler`   — seeded shuffle, sharding, length-grouped batching, dynamic padding, resumable cursor.
