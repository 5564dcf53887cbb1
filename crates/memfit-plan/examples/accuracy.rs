//! Writes docs/accuracy.md and crates/memfit-plan/src/memory/band/table.rs from validation/
//! (cases.csv, constants.csv, measured_here.csv and memfit_grid.csv; run from anywhere in the workspace):
//! `cargo run --release -p memfit-plan --example accuracy`

use memfit_plan::validation::{self, Mode, stats};
use std::path::{Path, PathBuf};

fn write(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let dir = root.join("validation");
    let cases = std::fs::read_to_string(dir.join("cases.csv"))?;
    let constants = std::fs::read_to_string(dir.join("constants.csv"))?;
    let models = |f: &str| {
        std::fs::read_to_string(dir.join("models").join(f)).map_err(|e| format!("{f}: {e}"))
    };
    let all = validation::compare(&cases, &constants, &models, Mode::AllSources)?;
    let loso = validation::compare(&cases, &constants, &models, Mode::LeaveOneSourceOut)?;
    let here_rows = std::fs::read_to_string(dir.join("measured_here.csv"))?;
    let here = validation::compare(&here_rows, &constants, &models, Mode::AllSources)?;
    let grid = memfit_plan::grid::compare(&std::fs::read_to_string(dir.join("memfit_grid.csv"))?)?;
    let text = validation::accuracy_markdown(&all, &loso, &here, &grid);
    std::fs::create_dir_all(root.join("docs"))?;
    write(&root.join("docs/accuracy.md"), &text)?;
    let table = stats::band_table_source(&stats::bands(&loso));
    write(
        &root.join("crates/memfit-plan/src/memory/band/table.rs"),
        &table,
    )?;
    print!("{text}");
    Ok(())
}
