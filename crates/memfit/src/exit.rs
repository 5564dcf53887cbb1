//! Exit codes (docs/architecture.md §3): 0 ok; 1 failure at run time; 2 bad usage or bad input; 3 does not fit;
//! 75 stopped by the guard with a resumable checkpoint.

use std::fmt;
use std::process::ExitCode;

/// An error that carries the exit code it must end the process with.
#[derive(Debug)]
pub struct Exit {
    pub code: u8,
    pub message: String,
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Exit {}

/// Bad usage or bad input: exit 2.
pub fn bad_input(message: impl Into<String>) -> anyhow::Error {
    Exit {
        code: 2,
        message: message.into(),
    }
    .into()
}

/// Nothing fits the budget: exit 3.
#[allow(dead_code)]
pub fn does_not_fit(message: impl Into<String>) -> anyhow::Error {
    Exit {
        code: 3,
        message: message.into(),
    }
    .into()
}

/// What a command ends with when it succeeds: usually 0, but `memfit run` passes on its child's code.
pub type Outcome = anyhow::Result<ExitCode>;

/// Prints the error chain and maps it to the process exit code (1 unless an `Exit` says otherwise).
pub fn finish(result: Outcome) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {}", chain_text(&err));
            let code = err
                .chain()
                .find_map(|e| e.downcast_ref::<Exit>())
                .map_or(1, |e| e.code);
            ExitCode::from(code)
        }
    }
}

/// The error and its causes joined by ": ", leaving out a cause whose text the message before it already
/// holds (a library error that prints its source: "…: No space left on device (os error 28)" is not
/// followed by that cause again).
pub fn chain_text(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain().map(ToString::to_string) {
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As thiserror writes `#[error("checkpoint {path}: {source}")]` with a `source` field.
    #[derive(Debug)]
    struct Io {
        path: String,
        source: std::io::Error,
    }

    impl fmt::Display for Io {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "checkpoint {}: {}", self.path, self.source)
        }
    }

    impl std::error::Error for Io {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn a_cause_is_said_once() {
        let io = std::io::Error::from_raw_os_error(28);
        let err = anyhow::Error::new(Io {
            path: "run/checkpoints/step-2".into(),
            source: io,
        })
        .context("saving");
        let text = chain_text(&err);
        assert_eq!(text.matches("os error 28").count(), 1, "{text}");
        assert!(
            text.starts_with("saving: checkpoint run/checkpoints/step-2: "),
            "{text}"
        );
        let plain = anyhow::anyhow!("outer").context("top");
        assert_eq!(chain_text(&plain), "top: outer");
    }
}
