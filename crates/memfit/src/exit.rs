//! Exit codes (DESIGN.md §3): 0 ok; 1 failure at run time; 2 bad usage or bad input; 3 does not fit;
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
            eprintln!("error: {err:#}");
            let code = err
                .chain()
                .find_map(|e| e.downcast_ref::<Exit>())
                .map_or(1, |e| e.code);
            ExitCode::from(code)
        }
    }
}
