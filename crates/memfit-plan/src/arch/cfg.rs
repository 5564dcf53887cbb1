//! Field access for `config.json` values: every accessor names the file and the field in its
//! errors, and treats `null` as absent (gpt2's `n_inner: null`).

use super::Activation;
use super::config::ArchError;
use serde_json::Value;

/// The largest integer any config field is read as.
const MAX_FIELD: u64 = 1 << 32;

/// Field access that names the file and field in its errors.
pub(crate) struct Cfg<'a> {
    pub file: &'a str,
    pub v: &'a Value,
}

impl Cfg<'_> {
    pub(crate) fn err(&self, field: &str, problem: impl Into<String>) -> ArchError {
        ArchError::Field {
            file: self.file.to_string(),
            field: field.to_string(),
            problem: problem.into(),
        }
    }
    /// An optional positive integer; `null` counts as absent (gpt2's `n_inner: null`).
    pub(crate) fn opt_u64(&self, field: &str) -> Result<Option<u64>, ArchError> {
        match self.v.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => match x.as_u64() {
                // Bounded before any reader computes with it (gpt2's ffn is 4 × n_embd);
                // the model's dimensions have tighter bounds of their own (bounds.rs).
                Some(n) if n > MAX_FIELD => Err(self.err(
                    field,
                    format!("is {n}, past the largest integer a config field may hold here (2^32)"),
                )),
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(self.err(field, format!("must be a positive integer, found {x}"))),
            },
        }
    }
    pub(crate) fn u64(&self, field: &str) -> Result<u64, ArchError> {
        self.opt_u64(field)?
            .ok_or_else(|| self.err(field, "is missing"))
    }
    /// The first of several alternative names (bloom's `n_embed`/`hidden_size`).
    pub(crate) fn u64_any(&self, fields: &[&str]) -> Result<u64, ArchError> {
        for f in fields {
            if let Some(n) = self.opt_u64(f)? {
                return Ok(n);
            }
        }
        Err(self.err(&fields.join("` or `"), "is missing"))
    }
    pub(crate) fn u64_or(&self, field: &str, default: u64) -> Result<u64, ArchError> {
        Ok(self.opt_u64(field)?.unwrap_or(default))
    }
    pub(crate) fn bool_or(&self, field: &str, default: bool) -> Result<bool, ArchError> {
        match self.v.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(x) => Err(self.err(field, format!("must be true or false, found {x}"))),
        }
    }
    /// Whether an optional setting is on: absent means `default`, `null` means off (gemma2's
    /// softcapping fields, whose defaults are numbers).
    pub(crate) fn present_or(&self, field: &str, default: bool) -> bool {
        match self.v.get(field) {
            None => default,
            Some(x) => !x.is_null(),
        }
    }
    /// A list of non-negative integers (qwen2_moe's `mlp_only_layers`); absent or `null` is empty.
    pub(crate) fn u64_list(&self, field: &str) -> Result<Vec<u64>, ArchError> {
        match self.v.get(field) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|x| {
                    x.as_u64().ok_or_else(|| {
                        self.err(field, format!("must hold non-negative integers, found {x}"))
                    })
                })
                .collect(),
            Some(x) => Err(self.err(field, format!("must be a list of integers, found {x}"))),
        }
    }
    pub(crate) fn f64_or(&self, field: &str, default: f64) -> Result<f64, ArchError> {
        match self.v.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(x) => x
                .as_f64()
                .filter(|p| (0.0..1.0).contains(p))
                .ok_or_else(|| {
                    self.err(field, format!("must be a probability in [0, 1), found {x}"))
                }),
        }
    }
    pub(crate) fn str_or<'s>(
        &'s self,
        field: &str,
        default: &'s str,
    ) -> Result<&'s str, ArchError> {
        match self.v.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::String(s)) => Ok(s),
            Some(x) => Err(self.err(field, format!("must be a string, found {x}"))),
        }
    }
    pub(crate) fn architecture(&self) -> String {
        self.v
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    }
    /// `num_labels`, else the size of `id2label`, else 2 (PretrainedConfig default).
    pub(crate) fn labels(&self) -> Result<u64, ArchError> {
        if let Some(n) = self.opt_u64("num_labels")? {
            return Ok(n);
        }
        Ok(self
            .v
            .get("id2label")
            .and_then(Value::as_object)
            .map_or(2, |m| m.len().max(1) as u64))
    }
    pub(crate) fn divides(&self, hidden: u64, heads: u64, field: &str) -> Result<u64, ArchError> {
        if !hidden.is_multiple_of(heads) {
            return Err(self.err(
                field,
                format!("({heads}) does not divide the hidden size {hidden}"),
            ));
        }
        Ok(hidden / heads)
    }
}

pub(crate) fn activation_of(
    cfg: &Cfg,
    field: &str,
    default: &str,
) -> Result<Activation, ArchError> {
    match cfg.str_or(field, default)? {
        "relu" => Ok(Activation::Relu),
        "gelu" | "gelu_python" => Ok(Activation::Gelu),
        "gelu_new" | "gelu_fast" => Ok(Activation::GeluNew),
        "gelu_pytorch_tanh" => Ok(Activation::GeluTanh),
        "silu" | "swish" => Ok(Activation::Silu),
        other => Err(cfg.err(field, format!("activation {other:?} is not supported"))),
    }
}
