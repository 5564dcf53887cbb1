//! Prints the GPU breakdown of chosen validation rows (cases.csv, measured_here.csv) beside their
//! measurement:
//! `cargo run --release -p memfit-plan --example explain_rows -- M24 L3`.

use memfit_plan::validation::{self, Mode};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ids: Vec<String> = std::env::args().skip(1).collect();
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../validation"));
    let constants = std::fs::read_to_string(dir.join("constants.csv"))?;
    let models = |f: &str| {
        std::fs::read_to_string(dir.join("models").join(f)).map_err(|e| format!("{f}: {e}"))
    };
    for file in ["cases.csv", "measured_here.csv"] {
        let cases = std::fs::read_to_string(dir.join(file))?;
        for e in validation::explain(&cases, &constants, &models, Mode::LeaveOneSourceOut, &ids)? {
            println!("{e}");
        }
    }
    Ok(())
}
