//! Typed reads of a `config.json` object: absent or `null` gives the default, a value of another
//! type is an error naming the field (and, through [`crate::weights::read_config`], the file).

use serde_json::{Map, Value};

use crate::ModelError;

pub fn bad(field: &str, what: impl std::fmt::Display) -> ModelError {
    ModelError::Config(format!("{field}: {what}"))
}

/// A config object's fields.
pub struct Fields<'a>(pub &'a Map<String, Value>);

impl Fields<'_> {
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    pub fn usize_or(&self, name: &str, default: usize) -> Result<usize, ModelError> {
        Ok(self.opt_usize(name)?.unwrap_or(default))
    }

    pub fn opt_usize(&self, name: &str) -> Result<Option<usize>, ModelError> {
        self.get(name)
            .map(|v| {
                v.as_u64()
                    .map(|n| n as usize)
                    .ok_or_else(|| bad(name, format!("{v} is not a non-negative integer")))
            })
            .transpose()
    }

    pub fn f64_or(&self, name: &str, default: f64) -> Result<f64, ModelError> {
        Ok(self.opt_f64(name)?.unwrap_or(default))
    }

    pub fn opt_f64(&self, name: &str) -> Result<Option<f64>, ModelError> {
        self.get(name)
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| bad(name, format!("{v} is not a number")))
            })
            .transpose()
    }

    pub fn bool_or(&self, name: &str, default: bool) -> Result<bool, ModelError> {
        self.get(name)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| bad(name, format!("{v} is not true or false")))
            })
            .transpose()
            .map(|b| b.unwrap_or(default))
    }

    pub fn str_or<'s>(&'s self, name: &str, default: &'s str) -> Result<&'s str, ModelError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v
                .as_str()
                .ok_or_else(|| bad(name, format!("{v} is not a string"))),
        }
    }

    /// Token ids: one integer or a list of them.
    pub fn ids(&self, name: &str) -> Result<Vec<u32>, ModelError> {
        let id = |v: &Value| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| bad(name, format!("{v} is not a token id")))
        };
        match self.get(name) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a.iter().map(id).collect(),
            Some(v) => Ok(vec![id(v)?]),
        }
    }
}
