//! A tokenizer's own chat template, rendered with minijinja as transformers renders it with Jinja2
//! (`transformers.utils.chat_template_utils`):
//!
//! - found as transformers finds it: the `chat_template.jinja` file beside `tokenizer.json`
//!   (transformers 5 writes it), else `chat_template` in `tokenizer_config.json` (a string, or a
//!   list of `{name, template}` of which the one named `default` is used);
//! - environment: `trim_blocks` and `lstrip_blocks` on, trailing newline of the template dropped,
//!   the loop controls extension (`break`/`continue`), no auto-escaping; Python string methods
//!   (`.strip()`, `.startswith()`, `.split()`, …) through minijinja-contrib's pycompat;
//! - variables: `messages`, `add_generation_prompt`, `tools` and `documents` (none), and the
//!   special tokens map (`bos_token`, `eos_token`, `unk_token`, `pad_token`, `sep_token`,
//!   `cls_token`, `mask_token`, `additional_special_tokens`) as the config files name them;
//! - functions and filters: `raise_exception(msg)` (fails the row with the message), `tojson`
//!   as transformers defines it ([`super::pyjson`]).
//!
//! `strftime_now` is deliberately not defined: a store must be a function of its inputs, and a
//! template that prints today's date (Llama 3.x writes "Today Date: …") would make the tokens
//! change from day to day. Templates test `strftime_now is defined` and fall back to a fixed date
//! (Llama 3.2: "26 Jul 2024"); one that calls it unconditionally fails to render, naming it.

use crate::error::{DataError, Result};
use crate::hash::sha256_bytes;
use crate::source::Message;
use crate::tokenizer::Tokenizer;
use minijinja::syntax::SyntaxConfig;
use minijinja::value::Serde;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The file transformers 5 writes the template to, beside `tokenizer.json`.
pub const TEMPLATE_FILE: &str = "chat_template.jinja";
const CONFIG_FILE: &str = "tokenizer_config.json";
/// The name the template is compiled under (shown in minijinja's error locations).
const NAME: &str = "chat_template";

/// A compiled chat template and the special tokens it is rendered with.
pub struct ChatTemplate {
    path: PathBuf,
    sha256: String,
    env: Environment<'static>,
    /// `bos_token`, `eos_token`, … as template variables.
    tokens: BTreeMap<String, Value>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("path", &self.path)
            .field("sha256", &self.sha256)
            .finish()
    }
}

fn fails(path: &Path, reason: impl Into<String>) -> DataError {
    DataError::ChatTemplate {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

impl ChatTemplate {
    /// The template of `tokenizer` (see the module doc for where it is looked for), `None` when
    /// it has none.
    pub fn find(tokenizer: &Tokenizer) -> Result<Option<Self>> {
        let jinja = tokenizer.dir().join(TEMPLATE_FILE);
        if jinja.is_file() {
            return Self::from_file(&jinja, tokenizer).map(Some);
        }
        let config = tokenizer.dir().join(CONFIG_FILE);
        let Ok(text) = std::fs::read_to_string(&config) else {
            return Ok(None);
        };
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| fails(&config, format!("does not parse: {e}")))?;
        let source = match json.get("chat_template") {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(named)) => named
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str())
                .map(str::to_string)
                .ok_or_else(|| fails(&config, "chat_template lists no template named `default`"))?,
            Some(_) => return Err(fails(&config, "chat_template is not a string")),
        };
        Self::compile(&config, source, tokenizer).map(Some)
    }

    /// A template file given explicitly (a `.jinja` file), rendered with `tokenizer`'s tokens.
    pub fn from_file(path: &Path, tokenizer: &Tokenizer) -> Result<Self> {
        let source = std::fs::read_to_string(path).map_err(|e| DataError::read(path, e))?;
        Self::compile(path, source, tokenizer)
    }

    fn compile(path: &Path, source: String, tokenizer: &Tokenizer) -> Result<Self> {
        let tokens = tokenizer.template_tokens();
        let key = serde_json::json!({"template": source, "tokens": tokens});
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| fails(path, e.to_string()))?;
        env.set_syntax(syntax);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", super::pyjson::tojson);
        env.add_template_owned(NAME, source)
            .map_err(|e| fails(path, format!("does not compile: {e}")))?;
        Ok(ChatTemplate {
            path: path.to_path_buf(),
            sha256: sha256_bytes(key.to_string().as_bytes()),
            env,
            tokens: tokens
                .iter()
                .map(|(k, v)| (k.clone(), Value::from(Serde(v))))
                .collect(),
        })
    }

    /// The file the template came from (`chat_template.jinja`, `tokenizer_config.json` or the
    /// file given).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// SHA-256 over the template and the special tokens it is rendered with.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The template applied to `messages`, as `tokenizer.apply_chat_template(messages,
    /// tokenize=False, add_generation_prompt=…)` returns it.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> std::result::Result<String, Error> {
        let template = self.env.get_template(NAME)?;
        let mut context = self.tokens.clone();
        context.insert("messages".into(), Value::from(Serde(messages)));
        context.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        context.insert("tools".into(), Value::from(()));
        context.insert("documents".into(), Value::from(()));
        template.render(Value::from(context))
    }
}

/// `raise_exception(message)`: the template refuses the conversation.
fn raise_exception(message: String) -> std::result::Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}
