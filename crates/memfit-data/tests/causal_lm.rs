//! Causal-LM stores: chat rows through real chat templates (prompt tokens counted exactly at the
//! boundary), the plain format, plain text, EOS, truncation that keeps the response, and the rows
//! that are refused.

mod common;

use common::special_tokenizers::{ByteTokenizer, llama_tokenizer, qwen_tokenizer};
use memfit_data::{
    CausalRow, InvalidPolicy, PrepareOptions, RowBuf, Task, TokenStore, Tokenizer, prepare,
};
use serde_json::json;
use std::path::{Path, PathBuf};

fn golden_case(template: &str, k: usize) -> (String, String) {
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("golden/chat_templates.json")).unwrap();
    let case = &golden[template]["cases"][k];
    (
        case["prompt"].as_str().unwrap().to_string(),
        case["full"].as_str().unwrap().to_string(),
    )
}

fn golden_messages(template: &str, k: usize) -> serde_json::Value {
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("golden/chat_templates.json")).unwrap();
    golden[template]["cases"][k]["messages"].clone()
}

fn prepare_causal(tok: &Path, input: PathBuf, out: PathBuf) -> PrepareOptions {
    PrepareOptions::new(vec![input], tok.to_path_buf(), Task::CausalLm, out)
}

/// The store prepared from `input` in `dir/s` with the defaults.
fn causal_store(tok: &Path, input: PathBuf, dir: &Path) -> TokenStore {
    let o = prepare_causal(tok, input, dir.join("s"));
    TokenStore::open(&prepare(&o, &mut |_| {}).unwrap().store).unwrap()
}

fn causal(store: &TokenStore, i: usize) -> CausalRow {
    store.causal_row(i, &mut RowBuf::default()).unwrap()
}

fn encode(tok: &Path, text: &str, specials: bool) -> Vec<u32> {
    let t = Tokenizer::load(tok).unwrap();
    t.inner().encode(text, specials).unwrap().get_ids().to_vec()
}

#[test]
fn messages_through_the_qwen_template_mask_exactly_the_prompt() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = qwen_tokenizer(&tmp.path().join("qwen"));
    let rows: Vec<_> = (0..3)
        .map(|k| json!({"messages": golden_messages("qwen2.5-instruct.jinja", k)}))
        .collect();
    let input = common::write_jsonl(&tmp.path().join("chat.jsonl"), &rows);
    let o = prepare_causal(&tok, input, tmp.path().join("s"));
    let report = prepare(&o, &mut |_| {}).unwrap();
    assert_eq!(report.meta.segments, ["prompt", "response"]);
    assert!(
        report
            .meta
            .prompt_format
            .as_deref()
            .unwrap()
            .ends_with("tokenizer_config.json"),
        "{:?}",
        report.meta.prompt_format
    );
    let store = TokenStore::open(&report.store).unwrap();
    for k in 0..3 {
        let (prompt, full) = golden_case("qwen2.5-instruct.jinja", k);
        let row = causal(&store, k);
        // The response ends with <|im_end|>\n: no EOS appended.
        assert_eq!(row.ids, encode(&tok, &full, false), "row {k}");
        assert_eq!(
            row.prompt_len,
            encode(&tok, &prompt, false).len(),
            "row {k}"
        );
    }
    let t = Tokenizer::load(&tok).unwrap();
    let last = causal(&store, 2);
    assert_eq!(
        t.inner()
            .decode(&last.ids[last.prompt_len..], false)
            .unwrap(),
        "你好！ 😀<|im_end|>\n"
    );
    assert_eq!(store.meta().pad_id, Some(t.pad().unwrap().id));
}

#[test]
fn instruction_rows_through_the_llama_template() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = llama_tokenizer(&tmp.path().join("llama"));
    let input = common::write_jsonl(
        &tmp.path().join("alpaca.jsonl"),
        &[json!({"instruction": "What is 2 + 3?", "input": "", "output": "5"})],
    );
    let store = causal_store(&tok, input, tmp.path());
    let (prompt, full) = golden_case("llama-3.2-instruct.jinja", 0);
    let row = causal(&store, 0);
    // The template writes <|begin_of_text|> itself; the text is encoded without the
    // post-processor (which would add a second one), as apply_chat_template(tokenize=True) does.
    assert_eq!(row.ids, encode(&tok, &full, false));
    assert_eq!(row.ids.iter().filter(|&&id| id == row.ids[0]).count(), 1);
    assert_eq!(row.prompt_len, encode(&tok, &prompt, false).len());
    let eot = Tokenizer::load(&tok).unwrap().eos().unwrap().id;
    assert_eq!(
        row.ids.last(),
        Some(&eot),
        "<|eot_id|> closes the response; not doubled"
    );
    // System, user and assistant turns each end with <|eot_id|>.
    assert_eq!(row.ids.iter().filter(|&&id| id == eot).count(), 3);
}

/// A byte-level tokenizer without a chat template, adding BOS like Llama's, with one merge "\nH"
/// that crosses the prompt/response boundary of the plain format.
fn plain_tokenizer(dir: &Path) -> PathBuf {
    ByteTokenizer {
        specials: &["<|begin_of_text|>", "<|end_of_text|>"],
        merges: &[("Ċ", "H")],
        bos_processor: Some("<|begin_of_text|>"),
        use_regex: false,
        config: json!({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}),
    }
    .write(dir)
}

#[test]
fn plain_format_counts_a_token_across_the_boundary_as_response() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = plain_tokenizer(&tmp.path().join("plain"));
    let input = common::write_jsonl(
        &tmp.path().join("rows.jsonl"),
        &[
            json!({"instruction": "Say hi.", "output": "Hi"}),
            json!({"instruction": "Say hi.", "output": "hi"}),
        ],
    );
    let report = prepare(
        &prepare_causal(&tok, input, tmp.path().join("s")),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(report.meta.prompt_format.as_deref(), Some("plain (Alpaca)"));
    assert_eq!(report.meta.options.columns, ["instruction", "output"]);
    let store = TokenStore::open(&report.store).unwrap();
    let t = Tokenizer::load(&tok).unwrap();
    let (bos, eos) = (t.bos().unwrap().id, t.eos().unwrap().id);
    let merged = t.inner().token_to_id("ĊH").unwrap();
    let prompt = "Below is an instruction that describes a task. Write a response that \
                  appropriately completes the request.\n\n### Instruction:\nSay hi.\n\n### Response:\n";
    let row = causal(&store, 0);
    assert_eq!(row.ids[0], bos, "the post-processor's BOS");
    assert_eq!(
        row.ids,
        [encode(&tok, &format!("{prompt}Hi"), true), vec![eos]].concat()
    );
    // "\nH" is one token holding response text: trained, so the prompt ends before it.
    assert_eq!(row.ids[row.prompt_len], merged);
    assert_eq!(row.prompt_len, encode(&tok, prompt, true).len() - 1);
    let other = causal(&store, 1);
    assert_eq!(
        other.prompt_len,
        encode(&tok, prompt, true).len(),
        "no merge: exact boundary"
    );
}

#[test]
fn plain_text_rows_train_every_token() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = plain_tokenizer(&tmp.path().join("plain"));
    let input = common::write_jsonl(
        &tmp.path().join("text.jsonl"),
        &[
            json!({"text": "Once upon a time"}),
            json!({"text": "The end.<|end_of_text|>"}),
        ],
    );
    let store = causal_store(&tok, input, tmp.path());
    let eos = Tokenizer::load(&tok).unwrap().eos().unwrap().id;
    let row = causal(&store, 0);
    assert_eq!(row.prompt_len, 0);
    assert_eq!(
        row.ids,
        [encode(&tok, "Once upon a time", true), vec![eos]].concat()
    );
    let ended = causal(&store, 1);
    assert_eq!(
        ended.ids,
        encode(&tok, "The end.<|end_of_text|>", true),
        "EOS not doubled"
    );
}

#[test]
fn truncation_cuts_the_prompt_from_its_start_and_keeps_the_response() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = plain_tokenizer(&tmp.path().join("plain"));
    let input = common::write_jsonl(
        &tmp.path().join("rows.jsonl"),
        &[
            json!({"instruction": "Tell a long story about dragons.", "output": "No."}),
            json!({"instruction": "Short.", "output": "x".repeat(300)}),
        ],
    );
    let mut o = prepare_causal(&tok, input, tmp.path().join("s"));
    o.max_len = Some(100);
    let meta = prepare(&o, &mut |_| {}).unwrap().meta;
    assert_eq!(meta.counts.truncated, 2);
    assert_eq!(meta.options.max_len, Some(100));
    let store = TokenStore::open(&o.out).unwrap();
    let t = Tokenizer::load(&tok).unwrap();
    let (bos, eos) = (t.bos().unwrap().id, t.eos().unwrap().id);
    let row = causal(&store, 0);
    assert_eq!(row.ids.len(), 100);
    assert_eq!(row.ids[0], bos, "BOS kept first");
    let response = [encode(&tok, "No.", false), vec![eos]].concat();
    assert_eq!(
        row.ids[row.prompt_len..],
        response[..],
        "the whole response"
    );
    let prompt_end = t
        .inner()
        .decode(&row.ids[1..row.prompt_len], false)
        .unwrap();
    assert!(
        prompt_end.ends_with("dragons.\n\n### Response:\n"),
        "{prompt_end}"
    );
    // A response longer than max_len alone: the prompt is gone (BOS aside), the response cut.
    let long = causal(&store, 1);
    assert_eq!(
        (long.ids.len(), long.prompt_len, long.ids[0]),
        (100, 1, bos)
    );
    assert!(
        long.ids[1..].iter().all(|&id| id != eos),
        "a cut response has no EOS"
    );
}

#[test]
fn rows_without_a_response_or_with_bad_messages_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = qwen_tokenizer(&tmp.path().join("qwen"));
    let good = json!({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey"}]});
    let cases = [
        (
            json!({"messages": [{"role": "user", "content": "Hi"}]}),
            "line 2, column `messages`: the last message is a `user` message: no assistant response to train on",
        ),
        (
            json!({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant"}]}),
            "line 2, column `messages`: message 1 has no `content`",
        ),
        (
            json!({"messages": [{"content": "Hi"}]}),
            "line 2, column `messages`: message 0 has no `role`",
        ),
        (
            json!({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " "}]}),
            "line 2, column `messages`: the response (last assistant message) is empty",
        ),
    ];
    for (k, (bad, expected)) in cases.into_iter().enumerate() {
        let input = common::write_jsonl(
            &tmp.path().join(format!("bad{k}.jsonl")),
            &[good.clone(), bad],
        );
        let mut o = prepare_causal(&tok, input, tmp.path().join(format!("s{k}")));
        let e = prepare(&o, &mut |_| {}).unwrap_err();
        assert!(e.is_bad_input(), "{e}");
        assert!(
            e.to_string().contains(&format!("bad{k}.jsonl: {expected}")),
            "{e}"
        );
        assert!(!o.out.exists());
        for policy in [InvalidPolicy::Skip, InvalidPolicy::Keep] {
            // `keep` cannot keep a row without a response either; each is counted once.
            o.on_invalid = policy;
            o.force = true;
            let c = prepare(&o, &mut |_| {}).unwrap().meta.counts;
            assert_eq!(
                (c.written, c.skipped, c.empty + c.invalid),
                (1, 1, 1),
                "case {k}"
            );
        }
    }
}

#[test]
fn template_failures_name_the_template_and_minijinjas_message() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = qwen_tokenizer(&tmp.path().join("qwen"));
    let input = common::write_jsonl(
        &tmp.path().join("rows.jsonl"),
        &[
            json!({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"},
                             {"role": "assistant", "content": "Hey"}]}),
        ],
    );
    let strict = tmp.path().join("strict.jinja");
    std::fs::write(
        &strict,
        "{% for m in messages %}{% if m.role == 'system' %}\
         {{ raise_exception('System role not supported') }}{% endif %}\
         {{ m.content }}{% endfor %}",
    )
    .unwrap();
    let mut o = prepare_causal(&tok, input.clone(), tmp.path().join("s"));
    o.chat_template = Some(strict.clone());
    let e = prepare(&o, &mut |_| {}).unwrap_err().to_string();
    assert!(
        e.contains("rows.jsonl: line 1, column `messages`: chat template")
            && e.contains("strict.jinja failed to render")
            && e.contains("System role not supported"),
        "{e}"
    );
    // A generation prompt the whole rendering does not start with.
    std::fs::write(
        &strict,
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}\
         {% if add_generation_prompt %}<bot>{% endif %}",
    )
    .unwrap();
    let e = prepare(&o, &mut |_| {}).unwrap_err().to_string();
    assert!(
        e.contains("strict.jinja: the whole conversation does not start with its prompt"),
        "{e}"
    );
}

#[test]
fn parquet_conversations_are_lists_of_structs() {
    use arrow_array::builder::{ListBuilder, StringBuilder, StructBuilder};
    use arrow_schema::{DataType, Field};
    let tmp = tempfile::tempdir().unwrap();
    let tok = qwen_tokenizer(&tmp.path().join("qwen"));
    let fields = vec![
        Field::new("role", DataType::Utf8, true),
        Field::new("content", DataType::Utf8, true),
    ];
    let mut list = ListBuilder::new(StructBuilder::from_fields(fields, 2));
    for (role, content) in [("user", "What is 2 + 3?"), ("assistant", "5")] {
        let s = list.values();
        s.field_builder::<StringBuilder>(0)
            .unwrap()
            .append_value(role);
        s.field_builder::<StringBuilder>(1)
            .unwrap()
            .append_value(content);
        s.append(true);
    }
    list.append(true);
    let pq = common::write_parquet(
        &tmp.path().join("chat.parquet"),
        vec![(
            "messages",
            std::sync::Arc::new(list.finish()) as arrow_array::ArrayRef,
        )],
        10,
    );
    let store = causal_store(&tok, pq, tmp.path());
    let (prompt, full) = golden_case("qwen2.5-instruct.jinja", 0);
    let row = causal(&store, 0);
    assert_eq!(
        (row.ids.clone(), row.prompt_len),
        (
            encode(&tok, &full, false),
            encode(&tok, &prompt, false).len()
        )
    );
}
