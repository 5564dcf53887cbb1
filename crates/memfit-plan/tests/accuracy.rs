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

fn grid() -> Vec<memfit_plan::grid::Compared> {
    let text = std::fs::read_to_string(root().join("validation/memfit_grid.csv")).unwrap();
    memfit_plan::grid::compare(&text).unwrap()
}

/// memfit's own trainer: every measured point of the grid within 10% of the host model.
#[test]
fn memfit_grid_every_point_within_10_percent() {
    let rows = grid();
    println!("{}", memfit_plan::grid::markdown_table(&rows));
    assert!(rows.len() >= 12);
    assert!(rows.iter().any(|r| r.setup.contains("ckpt")));
    for r in &rows {
        assert!(
            r.error.abs() <= 0.10,
            "{} ({}) off by {:+.1}%",
            r.id,
            r.setup,
            100.0 * r.error
        );
    }
}

#[test]
fn docs_accuracy_md_is_current() {
    let expected = validation::accuracy_markdown(&rows(), &grid());
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

/// boundaries.csv: an `oom` row must be predicted above the GPU's memory, a `fit` row below it.
#[test]
fn boundaries_fit_or_oom() {
    use memfit_plan::{arch, memory};
    let d = root().join("validation");
    let rows =
        validation::parse_csv(&std::fs::read_to_string(d.join("boundaries.csv")).unwrap()).unwrap();
    assert!(!rows.is_empty());
    for r in rows {
        let file = &r["model"];
        let text = std::fs::read_to_string(d.join("models").join(file)).unwrap();
        let a = arch::parse_config(file, &text, file).unwrap();
        let setup = validation::setup_of(&r, &a).unwrap();
        let a = a.with_task(setup.task);
        let est = memory::estimate(&a, &setup, &memory::Framework::torch_1x(0)).unwrap();
        let need = est.gpu.unwrap().peak_allocated_bytes as f64;
        let total: f64 = r["gpu_total_gib"].parse::<f64>().unwrap() * (1u64 << 30) as f64;
        match r["measured_value"].as_str() {
            "oom" => assert!(
                need > total,
                "{}: predicted {need} fits in {total}",
                r["id"]
            ),
            "fit" => assert!(
                need <= total,
                "{}: predicted {need} exceeds {total}",
                r["id"]
            ),
            other => panic!("{}: measured_value {other}", r["id"]),
        }
    }
}

/// constants.csv rows with a model: the weights just loaded (ALLOC), or context + weights (NV).
#[test]
fn loaded_weights_match_constants() {
    use memfit_plan::{arch, memory};
    let d = root().join("validation");
    let rows =
        validation::parse_csv(&std::fs::read_to_string(d.join("constants.csv")).unwrap()).unwrap();
    let context = rows.iter().find(|r| r["id"] == "A0-CTX").unwrap();
    let context =
        validation::to_bytes(&context["measured_value"], &context["measured_unit"]).unwrap();
    let mut checked = 0;
    for r in rows.iter().filter(|r| !r["model"].is_empty()) {
        let file = &r["model"];
        let text = std::fs::read_to_string(d.join("models").join(file)).unwrap();
        let a = arch::parse_config(file, &text, file).unwrap();
        let setup = memory::Setup::new(&a);
        let weights = memory::states::model_states(&a, &setup).gpu_weights as f64;
        let predicted = if r["metric"] == "NV" {
            weights + context
        } else {
            weights
        };
        let measured = validation::to_bytes(&r["measured_value"], &r["measured_unit"]).unwrap();
        let err = (predicted - measured) / measured;
        assert!(err.abs() < 0.01, "{}: {:+.2}%", r["id"], 100.0 * err);
        checked += 1;
    }
    assert_eq!(checked, 2);
}
