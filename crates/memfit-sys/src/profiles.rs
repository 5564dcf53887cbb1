//! Lower-memory variants of a command, tried in order after the guard stops it.
//!
//! ```toml
//! [[profile]]
//! name = "batch4"
//! args = ["--batch", "4", "--accum", "8"]   # replaces the value after --batch / --accum, or appends
//! env = { PYTORCH_CUDA_ALLOC_CONF = "expandable_segments:True" }
//! resume_args = ["--resume", "runs/x/checkpoints/last"]
//! ```

use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub resume_args: Vec<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfilesFile {
    #[serde(default)]
    profile: Vec<Profile>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("cannot read profiles file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("profiles file {path}: {message}")]
    Parse { path: String, message: String },
}

/// Reads a profiles file; an empty list or a profile without a name is an error naming the file.
pub fn load(path: &Path) -> Result<Vec<Profile>, ProfileError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read {
        path: shown.clone(),
        source,
    })?;
    parse(&text).map_err(|message| ProfileError::Parse {
        path: shown,
        message,
    })
}

pub fn parse(text: &str) -> Result<Vec<Profile>, String> {
    let file: ProfilesFile = toml::from_str(text).map_err(|e| e.to_string())?;
    if file.profile.is_empty() {
        return Err("no [[profile]] entries".into());
    }
    for (i, p) in file.profile.iter().enumerate() {
        if p.name.trim().is_empty() {
            return Err(format!("profile {} has an empty name", i + 1));
        }
        for k in p.env.keys() {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(format!(
                    "profile {:?}: bad environment variable name {k:?}",
                    p.name
                ));
            }
        }
    }
    Ok(file.profile)
}

fn is_flag(token: &str) -> bool {
    token.starts_with('-') && token.len() > 1 && token.parse::<f64>().is_err()
}

/// Applies overrides such as `["--batch", "4", "--grad-ckpt"]` to `argv` (program first): a flag followed
/// by a value replaces the value after the same flag (also in `--flag=value` form) or is appended; a flag
/// without a value is appended when absent.
pub fn apply_overrides(argv: &[String], overrides: &[String]) -> Vec<String> {
    let mut out = argv.to_vec();
    let mut i = 0;
    while i < overrides.len() {
        let flag = &overrides[i];
        i += 1;
        if !is_flag(flag) {
            // A bare word: nothing to match it against, so it is appended.
            out.push(flag.clone());
            continue;
        }
        let value = overrides.get(i).filter(|v| !is_flag(v));
        if value.is_some() {
            i += 1;
        }
        let eq_form = format!("{flag}=");
        let at = out
            .iter()
            .skip(1)
            .position(|a| a == flag || a.starts_with(&eq_form));
        match (at.map(|p| p + 1), value) {
            (Some(p), Some(v)) if out[p] == *flag && p + 1 < out.len() && !is_flag(&out[p + 1]) => {
                out[p + 1] = v.clone()
            }
            (Some(p), Some(v)) if out[p] == *flag => out.insert(p + 1, v.clone()),
            (Some(p), Some(v)) => out[p] = format!("{flag}={v}"),
            (Some(_), None) => {}
            (None, Some(v)) => out.extend([flag.clone(), v.clone()]),
            (None, None) => out.push(flag.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn overrides_replace_or_append() {
        let argv = v(&["train", "--batch", "16", "--lr=3e-4", "--seq", "512"]);
        let got = apply_overrides(
            &argv,
            &v(&[
                "--batch",
                "4",
                "--accum",
                "8",
                "--lr",
                "1e-4",
                "--grad-ckpt",
            ]),
        );
        assert_eq!(
            got,
            v(&[
                "train",
                "--batch",
                "4",
                "--lr=1e-4",
                "--seq",
                "512",
                "--accum",
                "8",
                "--grad-ckpt"
            ])
        );
        // A flag already present is not repeated; negative numbers are values, not flags.
        let got = apply_overrides(
            &v(&["x", "--grad-ckpt", "--shift", "1"]),
            &v(&["--grad-ckpt", "--shift", "-2"]),
        );
        assert_eq!(got, v(&["x", "--grad-ckpt", "--shift", "-2"]));
    }

    #[test]
    fn parse_file() {
        let text = r#"
            [[profile]]
            name = "small"
            args = ["--batch", "4"]
            env = { A = "1" }
            resume_args = ["--resume", "ck"]

            [[profile]]
            name = "tiny"
        "#;
        let p = parse(text).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].env["A"], "1");
        assert!(p[1].args.is_empty());
        assert!(parse("").unwrap_err().contains("no [[profile]]"));
        assert!(
            parse("[[profile]]\nname = \"x\"\nbatch = 3\n")
                .unwrap_err()
                .contains("batch")
        );
        assert!(
            parse("[[profile]]\nname = \"\"\n")
                .unwrap_err()
                .contains("empty name")
        );
    }
}
