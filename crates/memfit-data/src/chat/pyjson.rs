//! The `tojson` filter as transformers defines it for chat templates: Python's
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, not Jinja's
//! own `tojson` (which escapes `<`, `>`, `&` and `'` for HTML, and would put `\u003c` into prompts).
//!
//! Python's separators are `", "` and `": "` without `indent`, `","` and `": "` with it; strings
//! keep non-ASCII characters unless `ensure_ascii=True`. Object keys come out in the order the
//! value holds them: memfit's values are parsed into sorted maps, so keys are sorted (Python keeps
//! insertion order); this touches only templates that print objects (tool schemas).

use minijinja::value::Kwargs;
use minijinja::{Error, ErrorKind, Value};
use serde_json::Value as Json;

struct Style {
    indent: Option<usize>,
    item_separator: String,
    key_separator: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

/// `value | tojson(indent=…, separators=…, ensure_ascii=…, sort_keys=…)`.
pub fn tojson(value: &Value, kwargs: Kwargs) -> Result<String, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let (item_separator, key_separator) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be (item_separator, key_separator)",
            ));
        }
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let style = Style {
        indent,
        item_separator,
        key_separator,
        ensure_ascii: ensure_ascii.unwrap_or(false),
        sort_keys: sort_keys.unwrap_or(false),
    };
    let json = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::BadSerialization, format!("tojson: {e}")))?;
    let mut out = String::new();
    write_value(&mut out, &json, &style, 0);
    Ok(out)
}

fn newline(out: &mut String, style: &Style, level: usize) {
    if let Some(n) = style.indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', n * level));
    }
}

fn write_value(out: &mut String, v: &Json, style: &Style, level: usize) {
    match v {
        Json::Array(items) if !items.is_empty() => {
            out.push('[');
            for (k, item) in items.iter().enumerate() {
                if k > 0 {
                    out.push_str(&style.item_separator);
                }
                newline(out, style, level + 1);
                write_value(out, item, style, level + 1);
            }
            newline(out, style, level);
            out.push(']');
        }
        Json::Object(map) if !map.is_empty() => {
            let mut entries: Vec<(&String, &Json)> = map.iter().collect();
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (k, (key, item)) in entries.into_iter().enumerate() {
                if k > 0 {
                    out.push_str(&style.item_separator);
                }
                newline(out, style, level + 1);
                write_string(out, key, style.ensure_ascii);
                out.push_str(&style.key_separator);
                write_value(out, item, style, level + 1);
            }
            newline(out, style, level);
            out.push('}');
        }
        Json::String(s) => write_string(out, s, style.ensure_ascii),
        // Numbers, booleans, null, `[]` and `{}` print as serde_json prints them, as Python does.
        other => out.push_str(&other.to_string()),
    }
}

fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    if !ensure_ascii {
        // serde_json escapes exactly what Python's json does with ensure_ascii=False.
        out.push_str(&Json::String(s.to_string()).to_string());
        return;
    }
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use minijinja::Environment;

    fn render(expr: &str) -> String {
        let mut env = Environment::new();
        env.add_filter("tojson", super::tojson);
        let value = serde_json::json!({"a": [1, 2.5, "x<y>"], "b": {}, "c": "é\n", "d": []});
        env.render_str(
            expr,
            minijinja::context! {v => minijinja::Value::from(minijinja::value::Serde(&value))},
        )
        .unwrap()
    }

    #[test]
    fn matches_python_json_dumps() {
        // Expected strings are Python 3's json.dumps with the same arguments.
        assert_eq!(
            render("{{ v | tojson }}"),
            r#"{"a": [1, 2.5, "x<y>"], "b": {}, "c": "é\n", "d": []}"#
        );
        assert_eq!(
            render("{{ v.a | tojson(indent=2) }}"),
            "[\n  1,\n  2.5,\n  \"x<y>\"\n]"
        );
        assert_eq!(
            render("{{ v.c | tojson(ensure_ascii=true) }}"),
            r#""\u00e9\n""#
        );
        assert_eq!(
            render("{{ v.a | tojson(separators=[',', ':']) }}"),
            r#"[1,2.5,"x<y>"]"#
        );
    }
}
