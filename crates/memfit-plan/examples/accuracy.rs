//! Writes docs/accuracy.md from validation/ (cases.csv, constants.csv and memfit_grid.csv; run from
//! anywhere in the workspace):
//! `cargo run --release -p memfit-plan --example accuracy`

use memfit_plan::validation;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let dir = root.join("validation");
    let cases = std::fs::read_to_string(dir.join("cases.csv"))?;
    let constants = std::fs::read_to_string(dir.join("constants.csv"))?;
    let rows = validation::compare(&cases, &constants, &|f| {
        std::fs::read_to_string(dir.join("models").join(f)).map_err(|e| format!("{f}: {e}"))
    })?;
    let grid = memfit_plan::grid::compare(&std::fs::read_to_string(dir.join("memfit_grid.csv"))?)?;
    let text = validation::accuracy_markdown(&rows, &grid);
    let out = root.join("docs/accuracy.md");
    std::fs::create_dir_all(root.join("docs"))?;
    let tmp = out.with_extension("md.tmp");
    std::fs::write(&tmp, &text)?;
    std::fs::rename(&tmp, &out)?;
    print!("{text}");
    Ok(())
}
