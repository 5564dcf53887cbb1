//! The accuracy gate: every row of validation/cases.csv through the estimator.

use memfit_plan::validation;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../validation"))
}

fn rows() -> Vec<validation::Compared> {
    let d = dir();
    let cases = std::fs::read_to_string(d.join("cases.csv")).unwrap();
    let constants = std::fs::read_to_string(d.join("constants.csv")).unwrap();
    validation::compare(&cases, &constants, &|f| {
        std::fs::read_to_string(d.join("models").join(f)).map_err(|e| format!("{f}: {e}"))
    })
    .unwrap()
}

#[test]
fn median_error_and_grade_a_rows() {
    let rows = rows();
    println!("{}", validation::markdown_table(&rows));
    let median = validation::median_abs_error(&rows);
    println!("median |error| = {:.1}%", 100.0 * median);
    assert!(rows.len() >= 20);
    assert!(median <= 0.10, "median |error| {:.1}% > 10%", 100.0 * median);
    for r in rows.iter().filter(|r| r.grade == "A") {
        assert!(r.error.abs() <= 0.25, "{} off by {:+.1}%", r.id, 100.0 * r.error);
    }
}
