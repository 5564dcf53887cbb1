//! Real chat templates (Qwen2.5-Instruct's ChatML, Llama 3.2-Instruct's) rendered by memfit's
//! minijinja set-up, against what Jinja2 renders with transformers' set-up
//! (golden/chat_templates.json, written by scripts/gen_chat_template_golden.py).

mod common;

use common::special_tokenizers::{llama_tokenizer, qwen_tokenizer};
use memfit_data::Tokenizer;
use memfit_data::chat::{ChatTemplate, Conversation, PromptFormat};
use memfit_data::source::Message;
use std::path::Path;

fn golden() -> serde_json::Value {
    let text = include_str!("golden/chat_templates.json");
    serde_json::from_str(text).unwrap()
}

fn messages(case: &serde_json::Value) -> Vec<Message> {
    case["messages"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(k, m)| Message::from_json(k, m).unwrap())
        .collect()
}

fn check(name: &str, tokenizer_dir: &Path, expected_file: &str) {
    let tokenizer = Tokenizer::load(tokenizer_dir).unwrap();
    let template = ChatTemplate::find(&tokenizer).unwrap().expect("a template");
    assert!(
        template.path().ends_with(expected_file),
        "{}",
        template.path().display()
    );
    let format = PromptFormat::Template(Box::new(template));
    let golden = golden();
    let cases = golden[name]["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 3);
    for case in cases {
        let m = messages(case);
        let PromptFormat::Template(t) = &format else {
            unreachable!()
        };
        let (prompt, full) = (
            case["prompt"].as_str().unwrap(),
            case["full"].as_str().unwrap(),
        );
        assert_eq!(t.render(&m[..m.len() - 1], true).unwrap(), prompt);
        assert_eq!(t.render(&m, false).unwrap(), full);
        let rendered = format
            .render_with_response(&Conversation::Messages(m.clone()))
            .unwrap();
        assert_eq!(
            (rendered.prompt.as_str(), rendered.full.as_str()),
            (prompt, full)
        );
    }
}

#[test]
fn qwen_chatml_template_renders_as_transformers_does() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = qwen_tokenizer(&tmp.path().join("qwen"));
    check("qwen2.5-instruct.jinja", &dir, "tokenizer_config.json");
}

#[test]
fn llama3_template_renders_as_transformers_does() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = llama_tokenizer(&tmp.path().join("llama"));
    check("llama-3.2-instruct.jinja", &dir, "chat_template.jinja");
    // No strftime_now: the date is the template's fixed fallback, so stores are reproducible.
    let full = golden()["llama-3.2-instruct.jinja"]["cases"][0]["full"].clone();
    assert!(full.as_str().unwrap().contains("Today Date: 26 Jul 2024"));
}

#[test]
fn raise_exception_tojson_and_python_methods_work() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = qwen_tokenizer(&tmp.path().join("qwen"));
    let file = tmp.path().join("t.jinja");
    std::fs::write(
        &file,
        "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}\
         {{ raise_exception('Unknown role: ' + m.role) }}{% endif %}\
         {{ m.content.strip().upper() }}|{{ m | tojson }}\n{% endfor %}{{ eos_token }}",
    )
    .unwrap();
    let tokenizer = Tokenizer::load(&dir).unwrap();
    let t = ChatTemplate::from_file(&file, &tokenizer).unwrap();
    let ok = t
        .render(&[Message::new("user", " hé <b> ")], false)
        .unwrap();
    assert_eq!(
        ok,
        "HÉ <B>|{\"content\": \" hé <b> \", \"role\": \"user\"}\n<|im_end|>"
    );
    let e = t.render(&[Message::new("tool", "x")], false).unwrap_err();
    assert!(e.to_string().contains("Unknown role: tool"), "{e}");
    std::fs::write(&file, "{% for m in messages %}").unwrap();
    let e = ChatTemplate::from_file(&file, &tokenizer).unwrap_err();
    assert!(
        e.is_bad_input() && e.to_string().contains("t.jinja: does not compile"),
        "{e}"
    );
}
