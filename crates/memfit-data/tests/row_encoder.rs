//! The row encoder outside prepare (what `memfit predict` calls): a file read chunk by chunk in
//! prediction mode gives each row's model input exactly as the store holds it.

mod common;

use common::special_tokenizers::{
    Processor, classification_tokenizer, llama_tokenizer, qwen_tokenizer,
};
use memfit_data::chat::Conversation;
use memfit_data::rows::{InvalidPolicy, Mode};
use memfit_data::{
    Columns, EncodeSettings, EncodedChunks, EncodedRow, Location, PrepareOptions, RowBuf,
    RowEncoder, RowTexts, Task, TokenStore, Tokenizer, prepare,
};
use serde_json::json;
use std::path::{Path, PathBuf};

/// Every row of `input` encoded for prediction, 2 rows per chunk.
fn predict_rows(
    tok: &Path,
    task: Task,
    input: &Path,
    max_len: Option<usize>,
) -> Vec<(Location, EncodedRow)> {
    let mut settings = EncodeSettings::new(Mode::Predict);
    settings.max_len = max_len;
    let encoder = RowEncoder::new(Tokenizer::load(tok).unwrap(), task, settings).unwrap();
    let columns = Columns::resolve(task, Mode::Predict, None, Some(input)).unwrap();
    let inputs = [input.to_path_buf()];
    let limits = memfit_data::source::ReadLimits::rows(2);
    let mut chunks = EncodedChunks::open(
        &encoder,
        &inputs,
        columns,
        InvalidPolicy::Fail,
        None,
        limits,
    )
    .unwrap();
    let mut out = Vec::new();
    while let Some(rows) = chunks.next_chunk().unwrap() {
        assert!(rows.len() <= 2, "one chunk at a time");
        out.extend(rows);
    }
    out
}

fn store(tok: &Path, task: Task, input: PathBuf, out: PathBuf) -> TokenStore {
    let o = PrepareOptions::new(vec![input], tok.to_path_buf(), task, out);
    TokenStore::open(&prepare(&o, &mut |_| {}).unwrap().store).unwrap()
}

#[test]
fn seq2seq_sources_match_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = common::tokenizer(tmp.path());
    let input = common::seq2seq_jsonl(&tmp.path().join("d.jsonl"), 5);
    let s = store(&tok, Task::Seq2seq, input.clone(), tmp.path().join("s"));
    let rows = predict_rows(&tok, Task::Seq2seq, &input, None);
    assert_eq!(rows.len(), 5);
    assert_eq!(rows[4].0, Location::Line(5));
    for (i, (_, row)) in rows.iter().enumerate() {
        assert_eq!(row.segments(), [common::row(&s, i).source().as_slice()]);
    }
}

#[test]
fn classification_pairs_match_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = classification_tokenizer(&tmp.path().join("tok"), 50, Processor::Bert);
    let input = common::write_jsonl(
        &tmp.path().join("p.jsonl"),
        &[
            json!({"text": "w1 w2", "text_pair": "w3", "label": "yes"}),
            json!({"text": "w4", "text_pair": "w5 w6", "label": "no"}),
            json!({"text": "w7", "text_pair": "w8", "label": "no"}),
        ],
    );
    let s = store(
        &tok,
        Task::Classification,
        input.clone(),
        tmp.path().join("s"),
    );
    for (i, (_, row)) in predict_rows(&tok, Task::Classification, &input, None)
        .iter()
        .enumerate()
    {
        let stored = s.classification_row(i, &mut RowBuf::default()).unwrap();
        let (ids, types) = row.classification_input().unwrap();
        assert_eq!((ids.to_vec(), types), (stored.ids, stored.token_types));
        assert_eq!(row.label(), None, "no label read for prediction");
    }
}

#[test]
fn causal_prompts_match_the_stores_prompt_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, tok) in [
        ("qwen", qwen_tokenizer(&tmp.path().join("qwen"))),
        ("llama", llama_tokenizer(&tmp.path().join("llama"))),
    ] {
        let input = common::write_jsonl(
            &tmp.path().join(format!("{name}.jsonl")),
            &[
                json!({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}),
                json!({"messages": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "2+3?"},
                                    {"role": "assistant", "content": "5"}]}),
            ],
        );
        let s = store(
            &tok,
            Task::CausalLm,
            input.clone(),
            tmp.path().join(format!("{name}.store")),
        );
        for (i, (_, row)) in predict_rows(&tok, Task::CausalLm, &input, None)
            .iter()
            .enumerate()
        {
            let stored = s.causal_row(i, &mut RowBuf::default()).unwrap();
            let prompt = row.causal().unwrap();
            assert_eq!(
                prompt.ids,
                stored.ids[..stored.prompt_len],
                "{name} row {i}"
            );
            assert_eq!(prompt.prompt_len, prompt.ids.len());
        }
    }
}

#[test]
fn prediction_prompts_are_cut_from_the_start_keeping_bos() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = llama_tokenizer(&tmp.path().join("llama"));
    let encoder = |max| {
        let mut settings = EncodeSettings::new(Mode::Predict);
        settings.max_len = max;
        RowEncoder::new(Tokenizer::load(&tok).unwrap(), Task::CausalLm, settings).unwrap()
    };
    let row = RowTexts::Chat(Conversation::Instruction {
        instruction: "Summarise the story of the three little pigs.".into(),
        input: String::new(),
        output: None,
    });
    let whole = encoder(None).encode(&row).unwrap().causal().unwrap();
    let cut = encoder(Some(40)).encode(&row).unwrap();
    let ids = cut.causal().unwrap().ids;
    assert!(cut.truncated);
    assert_eq!(ids.len(), 40);
    assert_eq!(ids[0], whole.ids[0], "BOS kept");
    assert_eq!(
        ids[1..],
        whole.ids[whole.ids.len() - 39..],
        "the prompt's end kept"
    );
    // A row of another task is refused, naming both.
    let e = encoder(None)
        .encode(&RowTexts::Seq2seq {
            source: "a".into(),
            target: None,
        })
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("a seq2seq row cannot be encoded for causal-lm"),
        "{e}"
    );
}
