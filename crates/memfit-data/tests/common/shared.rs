//! `../shared` (the seed's fixtures, beside the workspace) for the tests that need it. Without it
//! such a test cannot run: it says so where the test output shows it, and under CI (`CI=true`,
//! which `.ci/run` sets: CI always has `../shared`) it fails instead of passing silently.
//! Included by path by every test crate that needs it (memfit-data's and memfit's).

use std::io::Write;
use std::path::PathBuf;

/// `../shared` relative to the workspace root; `None` (after a visible SKIPPED line) when absent.
/// Panics when absent under `CI=true`.
pub fn shared_dir_or_skip(test: &str) -> Option<PathBuf> {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared"));
    resolve(dir, std::env::var("CI").as_deref() == Ok("true"), test)
}

/// `dir` if it exists; else a visible SKIPPED line and `None`, or, under CI, a panic.
pub fn resolve(dir: PathBuf, ci: bool, test: &str) -> Option<PathBuf> {
    if dir.exists() {
        return Some(dir);
    }
    assert!(
        !ci,
        "{test}: {} is missing, and CI must run every test that needs it",
        dir.display()
    );
    // libtest hides what a passing test prints through print!/eprint!; a direct write is shown
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: {} is not present",
        dir.display()
    );
    None
}
