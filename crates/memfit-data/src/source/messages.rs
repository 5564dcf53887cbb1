//! Conversation cells: a list of `{role, content}` messages (JSONL arrays of objects; parquet
//! `list<struct<role, content, …>>` columns, as Hugging Face chat datasets store them).
//!
//! A message keeps every field it has (e.g. `tool_calls`, `name`): the chat template sees the
//! message as the row wrote it. Only `role` and `content` are checked here.

use super::Value;

/// One message of a conversation: a JSON object with at least a string `role` and a string
/// `content` (`content` may be null in an assistant message that carries `tool_calls`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(transparent)]
pub struct Message(serde_json::Map<String, serde_json::Value>);

impl Message {
    /// A message with just a role and a content.
    pub fn new(role: &str, content: &str) -> Self {
        let mut map = serde_json::Map::new();
        map.insert("role".into(), role.into());
        map.insert("content".into(), content.into());
        Message(map)
    }

    /// Checks `object` (the `index`-th message of a row); the error says which field is wrong.
    pub fn from_json(index: usize, object: &serde_json::Value) -> Result<Self, String> {
        let Some(map) = object.as_object() else {
            return Err(format!(
                "message {index} is not an object with role and content"
            ));
        };
        match map.get("role") {
            Some(serde_json::Value::String(r)) if !r.trim().is_empty() => {}
            Some(serde_json::Value::String(_)) => {
                return Err(format!("message {index}: empty `role`"));
            }
            Some(_) => return Err(format!("message {index}: `role` is not a string")),
            None => return Err(format!("message {index} has no `role`")),
        }
        let tool_call = map.contains_key("tool_calls");
        match map.get("content") {
            Some(serde_json::Value::String(_)) => {}
            Some(serde_json::Value::Null) if tool_call => {}
            Some(_) => return Err(format!("message {index}: `content` is not a string")),
            None if tool_call => {}
            None => return Err(format!("message {index} has no `content`")),
        }
        Ok(Message(map.clone()))
    }

    pub fn role(&self) -> &str {
        self.0.get("role").and_then(|v| v.as_str()).unwrap_or("")
    }

    /// The text of the message ("" for a tool call without content).
    pub fn content(&self) -> &str {
        self.0.get("content").and_then(|v| v.as_str()).unwrap_or("")
    }
}

/// A JSON value that should be a list of messages, as a cell.
pub(crate) fn cell_from_json(v: &serde_json::Value) -> Value {
    let invalid = |reason: String| Value::Invalid {
        reason,
        lossy: v.to_string(),
    };
    let Some(items) = v.as_array() else {
        return invalid("not a list of messages".into());
    };
    match items
        .iter()
        .enumerate()
        .map(|(k, m)| Message::from_json(k, m))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(messages) => Value::Messages(messages),
        Err(reason) => invalid(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn messages_need_a_role_and_a_content() {
        let ok = cell_from_json(&json!([{"role": "user", "content": "hi"},
                                        {"role": "assistant", "content": null, "tool_calls": []}]));
        let Value::Messages(m) = ok else {
            panic!("{ok:?}")
        };
        assert_eq!(
            (m[0].role(), m[0].content(), m[1].content()),
            ("user", "hi", "")
        );
        for (bad, why) in [
            (json!([{"role": "user"}]), "message 0 has no `content`"),
            (
                json!([{"role": "user", "content": "a"}, {"content": "b"}]),
                "message 1 has no `role`",
            ),
            (
                json!([{"role": 3, "content": "a"}]),
                "`role` is not a string",
            ),
            (
                json!([{"role": "user", "content": ["a"]}]),
                "`content` is not a string",
            ),
            (json!("hello"), "not a list of messages"),
        ] {
            match cell_from_json(&bad) {
                Value::Invalid { reason, .. } => assert!(reason.contains(why), "{reason}"),
                other => panic!("{other:?}"),
            }
        }
    }
}
