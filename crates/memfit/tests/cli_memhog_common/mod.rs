//! Helpers for the CLI tests that drive memfit-memhog (`memfit run`, `memfit calibrate`).

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn memfit() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memfit"))
}

/// memfit-memhog is a binary of memfit-sys; `cargo test --workspace` builds it next to memfit.
pub fn memhog() -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_BIN_EXE_memfit")).with_file_name("memfit-memhog");
    if path.exists() {
        Some(path)
    } else {
        println!(
            "skipped: {} is not built (run `cargo test --workspace`)",
            path.display()
        );
        None
    }
}
