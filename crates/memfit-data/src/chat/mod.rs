//! Chat prompts for causal-LM rows: the tokenizer's own chat template ([`ChatTemplate`]), or, for a
//! tokenizer without one, a plain format ([`PromptFormat::Plain`], Alpaca's).
//!
//! A training row is split into a prompt and a response by rendering twice, as transformers users
//! do for prompt masking: the prompt turns with `add_generation_prompt=True`, then the whole
//! conversation; the response is what the whole rendering adds after the prompt. A template whose
//! whole rendering does not start with the prompt rendering is refused for that row (its prompt
//! tokens could not be told from its response tokens).

mod pyjson;
mod template;

pub use template::{ChatTemplate, TEMPLATE_FILE};

use crate::error::Result;
use crate::source::Message;
use crate::tokenizer::Tokenizer;
use std::path::Path;

/// Alpaca's preambles and section headers (tatsu-lab/stanford_alpaca, `PROMPT_DICT`).
const ALPACA_PREAMBLE: &str = "Below is an instruction that describes a task. \
Write a response that appropriately completes the request.\n\n";
const ALPACA_PREAMBLE_WITH_INPUT: &str = "Below is an instruction that describes a task, \
paired with an input that provides further context. \
Write a response that appropriately completes the request.\n\n";
const RESPONSE_HEADER: &str = "### Response:\n";

/// The turns of a chat row.
#[derive(Debug, Clone, PartialEq)]
pub enum Conversation {
    /// `instruction,input,output` columns (`input` may be empty; `output` is `None` when
    /// encoding a prompt for prediction).
    Instruction {
        instruction: String,
        input: String,
        output: Option<String>,
    },
    /// A `messages` list. For training the last message is the assistant's response; for
    /// prediction a final assistant message, if any, is left out of the prompt.
    Messages(Vec<Message>),
}

impl Conversation {
    /// As messages for a chat template: the instruction (and input, on the next line, as memfit's
    /// seq2seq chat rows join them) as the user's turn, the output as the assistant's.
    fn messages(&self) -> Vec<Message> {
        match self {
            Conversation::Messages(m) => m.clone(),
            Conversation::Instruction {
                instruction,
                input,
                output,
            } => {
                let user = if input.trim().is_empty() {
                    instruction.clone()
                } else {
                    format!("{instruction}\n{input}")
                };
                let mut m = vec![Message::new("user", &user)];
                if let Some(o) = output {
                    m.push(Message::new("assistant", o));
                }
                m
            }
        }
    }
}

/// A training row's texts: `full` starts with `prompt`; the response is the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedChat {
    pub prompt: String,
    pub full: String,
}

impl RenderedChat {
    pub fn response(&self) -> &str {
        &self.full[self.prompt.len()..]
    }
}

/// How chat rows become text.
#[derive(Debug)]
pub enum PromptFormat {
    /// The tokenizer's chat template; its text carries its own special tokens, so it is encoded
    /// without the tokenizer's post-processor (as `apply_chat_template(tokenize=True)` does).
    Template(Box<ChatTemplate>),
    /// No template: Alpaca's format (module doc of [`crate::chat`]); encoded with the tokenizer's
    /// post-processor, so a BOS it adds (Llama) is there.
    Plain,
}

impl PromptFormat {
    /// `template_file` when given, else the tokenizer's own template, else [`PromptFormat::Plain`].
    pub fn for_tokenizer(tokenizer: &Tokenizer, template_file: Option<&Path>) -> Result<Self> {
        Ok(match template_file {
            Some(f) => PromptFormat::Template(Box::new(ChatTemplate::from_file(f, tokenizer)?)),
            None => match ChatTemplate::find(tokenizer)? {
                Some(t) => PromptFormat::Template(Box::new(t)),
                None => PromptFormat::Plain,
            },
        })
    }

    /// "chat template FILE" or "plain (Alpaca)", for meta.json and messages.
    pub fn describe(&self) -> String {
        match self {
            PromptFormat::Template(t) => format!("chat template {}", t.path().display()),
            PromptFormat::Plain => "plain (Alpaca)".into(),
        }
    }

    /// SHA-256 of the template and its tokens (`None` for the plain format).
    pub fn sha256(&self) -> Option<&str> {
        match self {
            PromptFormat::Template(t) => Some(t.sha256()),
            PromptFormat::Plain => None,
        }
    }

    /// Whether the rendered text is encoded with the tokenizer's post-processor.
    pub fn add_special_tokens(&self) -> bool {
        matches!(self, PromptFormat::Plain)
    }

    /// A training row: prompt and full text. The error says what is wrong with the row.
    pub fn render_with_response(
        &self,
        conversation: &Conversation,
    ) -> std::result::Result<RenderedChat, String> {
        let messages = conversation.messages();
        let Some((last, turns)) = messages.split_last() else {
            return Err("no messages".into());
        };
        if last.role() != "assistant" {
            return Err(format!(
                "the last message is a `{}` message: no assistant response to train on",
                last.role()
            ));
        }
        if last.content().trim().is_empty() {
            return Err("the response (last assistant message) is empty".into());
        }
        let rendered = match self {
            PromptFormat::Plain => RenderedChat {
                prompt: plain_prompt(conversation, turns),
                full: format!("{}{}", plain_prompt(conversation, turns), last.content()),
            },
            PromptFormat::Template(t) => {
                let prompt = render(t, turns, true)?;
                let full = render(t, &messages, false)?;
                check_prefix(t, &prompt, &full)?;
                RenderedChat { prompt, full }
            }
        };
        if rendered.response().trim().is_empty() {
            return Err(format!("{} renders the response empty", self.describe()));
        }
        Ok(rendered)
    }

    /// A prompt for prediction: the prompt turns followed by the generation prompt.
    pub fn render_prompt(
        &self,
        conversation: &Conversation,
    ) -> std::result::Result<String, String> {
        let mut messages = conversation.messages();
        if messages.last().is_some_and(|m| m.role() == "assistant") {
            messages.pop();
        }
        match self {
            PromptFormat::Plain => Ok(plain_prompt(conversation, &messages)),
            PromptFormat::Template(t) => render(t, &messages, true),
        }
    }
}

fn render(
    template: &ChatTemplate,
    messages: &[Message],
    add_generation_prompt: bool,
) -> std::result::Result<String, String> {
    template
        .render(messages, add_generation_prompt)
        .map_err(|e| {
            format!(
                "chat template {} failed to render: {e}",
                template.path().display()
            )
        })
}

fn check_prefix(
    template: &ChatTemplate,
    prompt: &str,
    full: &str,
) -> std::result::Result<(), String> {
    if full.starts_with(prompt) {
        return Ok(());
    }
    let at = prompt
        .char_indices()
        .zip(full.chars())
        .find(|((_, a), b)| a != b)
        .map_or(prompt.len().min(full.len()), |((i, _), _)| i);
    Err(format!(
        "chat template {}: the whole conversation does not start with its prompt rendered with \
         add_generation_prompt=True (they differ from byte {at} on), so the prompt's tokens \
         cannot be told from the response's",
        template.path().display()
    ))
}

/// Alpaca's prompt for instruction rows; for messages, the system message (else Alpaca's
/// preamble), then `### Instruction:` for user turns and `### Response:` for assistant turns,
/// ending with the `### Response:` header the response follows.
fn plain_prompt(conversation: &Conversation, turns: &[Message]) -> String {
    if let Conversation::Instruction {
        instruction, input, ..
    } = conversation
    {
        return if input.trim().is_empty() {
            format!("{ALPACA_PREAMBLE}### Instruction:\n{instruction}\n\n{RESPONSE_HEADER}")
        } else {
            format!(
                "{ALPACA_PREAMBLE_WITH_INPUT}### Instruction:\n{instruction}\n\n\
                 ### Input:\n{input}\n\n{RESPONSE_HEADER}"
            )
        };
    }
    let mut out = String::new();
    let mut turns = turns;
    match turns.first() {
        Some(m) if m.role() == "system" => {
            out.push_str(m.content());
            out.push_str("\n\n");
            turns = &turns[1..];
        }
        _ => out.push_str(ALPACA_PREAMBLE),
    }
    for m in turns {
        let header = match m.role() {
            "user" => "Instruction".to_string(),
            "assistant" => "Response".to_string(),
            other => capitalized(other),
        };
        out.push_str(&format!("### {header}:\n{}\n\n", m.content()));
    }
    out.push_str(RESPONSE_HEADER);
    out
}

fn capitalized(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instruction(input: &str, output: Option<&str>) -> Conversation {
        Conversation::Instruction {
            instruction: "Add 2 and 3.".into(),
            input: input.into(),
            output: output.map(str::to_string),
        }
    }

    #[test]
    fn plain_format_is_alpaca() {
        let r = PromptFormat::Plain
            .render_with_response(&instruction("", Some("5")))
            .unwrap();
        assert_eq!(
            r.prompt,
            "Below is an instruction that describes a task. Write a response that appropriately \
             completes the request.\n\n### Instruction:\nAdd 2 and 3.\n\n### Response:\n"
        );
        assert_eq!(r.response(), "5");
        let with_input = PromptFormat::Plain
            .render_prompt(&instruction("numbers", None))
            .unwrap();
        assert!(
            with_input.starts_with("Below is an instruction that describes a task, paired with")
                && with_input.ends_with(
                    "### Instruction:\nAdd 2 and 3.\n\n### Input:\nnumbers\n\n### Response:\n"
                ),
            "{with_input}"
        );
    }

    #[test]
    fn plain_format_for_messages() {
        let conversation = Conversation::Messages(vec![
            Message::new("system", "Be brief."),
            Message::new("user", "Hi"),
            Message::new("assistant", "Hello"),
            Message::new("user", "Bye"),
            Message::new("assistant", "Bye!"),
        ]);
        let r = PromptFormat::Plain
            .render_with_response(&conversation)
            .unwrap();
        assert_eq!(
            r.prompt,
            "Be brief.\n\n### Instruction:\nHi\n\n### Response:\nHello\n\n\
             ### Instruction:\nBye\n\n### Response:\n"
        );
        assert_eq!(r.response(), "Bye!");
        assert_eq!(
            PromptFormat::Plain.render_prompt(&conversation).unwrap(),
            r.prompt,
            "the final assistant message is left out of a prediction prompt"
        );
    }

    #[test]
    fn rows_without_a_response_are_refused() {
        let no_reply = Conversation::Messages(vec![Message::new("user", "Hi")]);
        let e = PromptFormat::Plain
            .render_with_response(&no_reply)
            .unwrap_err();
        assert!(e.contains("last message is a `user` message"), "{e}");
        let empty = Conversation::Messages(vec![
            Message::new("user", "Hi"),
            Message::new("assistant", "  "),
        ]);
        let e = PromptFormat::Plain
            .render_with_response(&empty)
            .unwrap_err();
        assert!(
            e.contains("response (last assistant message) is empty"),
            "{e}"
        );
    }
}
