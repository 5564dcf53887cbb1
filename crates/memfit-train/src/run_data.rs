//! The data of a run: the tokenizer and the training/validation token stores. A parquet or JSONL file
//! is prepared into a store inside the run directory (`data/<name>.store`, reused on resume when up to
//! date); a store directory is opened as is.

use crate::config::{TaskKind, TrainConfig};
use crate::task::{RowSource, StoreRows};
use memfit_data::{DataError, PrepareOptions, Task, TokenStore, Tokenizer};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum RunDataError {
    #[error("{0} is required (the training data and its tokenizer)")]
    Missing(&'static str),
    #[error("{path}: a {task} store, but this run's task is {wanted}")]
    WrongTask {
        path: String,
        task: String,
        wanted: &'static str,
    },
    #[error(
        "{path}: the store was tokenized with vocabulary {store} but the tokenizer has {tokenizer}"
    )]
    OtherTokenizer {
        path: String,
        store: usize,
        tokenizer: usize,
    },
    #[error(transparent)]
    Data(#[from] DataError),
}

impl RunDataError {
    pub fn is_bad_input(&self) -> bool {
        match self {
            RunDataError::Data(e) => e.is_bad_input(),
            _ => true,
        }
    }
}

pub struct RunData {
    pub tokenizer: Tokenizer,
    pub train: StoreRows,
    pub valid: Option<StoreRows>,
}

impl RunData {
    pub fn valid_source<R>(&self) -> Option<&dyn RowSource<R>>
    where
        StoreRows: RowSource<R>,
    {
        self.valid.as_ref().map(|v| v as &dyn RowSource<R>)
    }
}

/// A line of progress while a source is prepared: (which, rows read, rows total if known).
pub type PrepareProgress<'a> = &'a mut dyn FnMut(&str, u64, Option<u64>);

/// Loads the tokenizer and opens (preparing if needed) the stores the config names.
pub fn open(
    config: &TrainConfig,
    run_root: &Path,
    progress: PrepareProgress<'_>,
) -> Result<RunData, RunDataError> {
    let data = config
        .data
        .as_deref()
        .ok_or(RunDataError::Missing("--data"))?;
    let tokenizer_path = config
        .tokenizer
        .as_deref()
        .ok_or(RunDataError::Missing("--tokenizer"))?;
    let tokenizer = Tokenizer::load(Path::new(tokenizer_path))?;
    let train = store(
        config,
        Path::new(data),
        "train",
        run_root,
        &tokenizer,
        progress,
    )?;
    let valid = match &config.valid {
        Some(v) => Some(store(
            config,
            Path::new(v),
            "valid",
            run_root,
            &tokenizer,
            progress,
        )?),
        None => None,
    };
    Ok(RunData {
        tokenizer,
        train: StoreRows(train),
        valid: valid.map(StoreRows),
    })
}

/// Whether `path` is a token store as it is (trained from as given) rather than data this run
/// prepares into one.
pub fn is_store(path: &Path) -> bool {
    path.join("meta.json").is_file()
}

/// The token store a task trains from.
fn store_task(task: TaskKind) -> Task {
    match task {
        TaskKind::Seq2seq => Task::Seq2seq,
        TaskKind::Classification => Task::Classification,
        TaskKind::CausalLm => Task::CausalLm,
    }
}

fn store(
    config: &TrainConfig,
    path: &Path,
    name: &str,
    run_root: &Path,
    tokenizer: &Tokenizer,
    progress: PrepareProgress<'_>,
) -> Result<TokenStore, RunDataError> {
    let store_dir: PathBuf = if is_store(path) {
        path.to_path_buf()
    } else {
        let out = run_root.join("data").join(format!("{name}.store"));
        let mut opts = PrepareOptions::new(
            vec![path.to_path_buf()],
            tokenizer.path().to_path_buf(),
            store_task(config.task),
            out.clone(),
        );
        opts.max_len = Some(config.seq);
        opts.max_target_len = Some(config.tgt_seq);
        memfit_data::prepare(&opts, &mut |p| progress(name, p.rows_read, p.rows_total))?;
        out
    };
    let store = TokenStore::open(&store_dir)?;
    if store.task() != store_task(config.task) {
        return Err(RunDataError::WrongTask {
            path: store_dir.display().to_string(),
            task: store.task().name().to_string(),
            wanted: config.task.name(),
        });
    }
    let store_vocab = store.meta().tokenizer.vocab_size;
    if store_vocab != tokenizer.vocab_size() {
        return Err(RunDataError::OtherTokenizer {
            path: store_dir.display().to_string(),
            store: store_vocab,
            tokenizer: tokenizer.vocab_size(),
        });
    }
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_jsonl_is_prepared_into_the_run_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let files = crate::demo::seq2seq::write(&dir.path().join("demo"), 5).unwrap();
        let config = TrainConfig {
            data: Some(files.train.display().to_string()),
            valid: Some(files.valid.display().to_string()),
            tokenizer: Some(files.tokenizer_dir.display().to_string()),
            ..TrainConfig::default()
        };
        let mut seen = Vec::new();
        let data = open(&config, dir.path(), &mut |name, rows, _| {
            seen.push((name.to_string(), rows))
        })
        .unwrap();
        assert_eq!(data.train.len(), crate::demo::seq2seq::TRAIN_ROWS);
        assert_eq!(
            data.valid.as_ref().unwrap().len(),
            crate::demo::seq2seq::VALID_ROWS
        );
        assert!(seen.iter().any(|(n, _)| n == "train"));
        let (src, tgt): (Vec<u32>, Vec<u32>) = data.train.row(0).unwrap();
        assert_eq!(
            (src.last(), tgt.last()),
            (Some(&1), Some(&1)),
            "rows end in EOS"
        );
        // A second open reuses the stores.
        open(&config, dir.path(), &mut |_, _, _| {}).unwrap();
        assert!(dir.path().join("data/train.store/meta.json").is_file());
    }

    #[test]
    fn missing_data_or_tokenizer_is_named() {
        let err = open(&TrainConfig::default(), Path::new("."), &mut |_, _, _| {})
            .err()
            .unwrap();
        assert!(err.to_string().contains("--data"));
    }
}
