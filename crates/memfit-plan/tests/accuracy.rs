//! The accuracy gate: every row of validation/cases.csv through the estimator, and
//! docs/accuracy.md must be what the model predicts now.

use memfit_plan::validation;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn rows() -> Vec<validation::Compared> {
    let d = root().join("validation");
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
    assert!(
        median <= 0.10,
        "median |error| {:.1}% > 10%",
        100.0 * median
    );
    let grade_a = rows.iter().filter(|r| r.grade == "A").count();
    assert!(grade_a >= 10);
    for r in rows.iter().filter(|r| r.grade == "A") {
        assert!(
            r.error.abs() <= 0.25,
            "{} off by {:+.1}%",
            r.id,
            100.0 * r.error
        );
    }
}

#[test]
fn docs_accuracy_md_is_current() {
    let expected = validation::accuracy_markdown(&rows());
    let path = root().join("docs/accuracy.md");
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        actual == expected,
        "{} is stale: regenerate it with `{}`",
        path.display(),
        validation::REGENERATE
    );
}

#[test]
fn csv_parser_handles_quotes() {
    let rows = validation::parse_csv("a,b\n\"x, \"\"y\"\"\",2\n").unwrap();
    assert_eq!(rows[0]["a"], "x, \"y\"");
    assert_eq!(rows[0]["b"], "2");
    assert!(validation::parse_csv("a,b\n1\n").is_err());
}
