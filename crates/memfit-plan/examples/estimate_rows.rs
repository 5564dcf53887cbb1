//! Prints memfit's GPU estimate of every row of a CSV in validation's columns
//! (validation/README.md), measured or not, a JSON line per row — what
//! `scripts/meta_compare.py estimate` sets beside the meta device's peaks:
//! `cargo run --release -p memfit-plan --example estimate_rows -- scripts/meta_grid.csv`.

use memfit_plan::validation;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("give a CSV of rows")?;
    let cases = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let models = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../validation/models"
    ));
    let model_text =
        |f: &str| std::fs::read_to_string(models.join(f)).map_err(|e| format!("{f}: {e}"));
    for (id, estimate) in validation::estimates(&cases, &model_text)? {
        let gpu = estimate
            .gpu
            .ok_or_else(|| format!("{id}: no GPU estimate"))?;
        println!(
            "{}",
            serde_json::json!({
                "id": id,
                "peak_allocated_bytes": gpu.peak_allocated_bytes,
                "peak_reserved_bytes": gpu.peak_reserved_bytes,
                "nvml_used_bytes": gpu.nvml_used_bytes,
            })
        );
    }
    Ok(())
}
