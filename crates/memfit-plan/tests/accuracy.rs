//! The accuracy gate: every row of validation/cases.csv through the estimator, and
//! docs/accuracy.md must be what the model predicts now.

use memfit_plan::validation::{self, Mode, stats};
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn rows_in(mode: Mode) -> Vec<validation::Compared> {
    compared("cases.csv", mode)
}

/// The rows measured on a lent GPU (validation/measured_here.csv): no constant comes from them.
fn measured_here() -> Vec<validation::Compared> {
    compared("measured_here.csv", Mode::AllSources)
}

fn compared(file: &str, mode: Mode) -> Vec<validation::Compared> {
    let d = root().join("validation");
    let cases = std::fs::read_to_string(d.join(file)).unwrap();
    let constants = std::fs::read_to_string(d.join("constants.csv")).unwrap();
    validation::compare(
        &cases,
        &constants,
        &|f| std::fs::read_to_string(d.join("models").join(f)).map_err(|e| format!("{f}: {e}")),
        mode,
    )
    .unwrap()
}

fn rows() -> Vec<validation::Compared> {
    rows_in(Mode::AllSources)
}

#[test]
fn median_error_and_grade_a_rows() {
    let every = rows();
    println!(
        "{}",
        validation::markdown_table(&every, &rows_in(Mode::LeaveOneSourceOut))
    );
    let rows: Vec<_> = every.into_iter().filter(|r| r.is_scored()).collect();
    let median = validation::median_abs_error(&rows);
    println!("median |error| = {:.1}%", 100.0 * median);
    assert!(rows.len() >= 80);
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

/// The rows measured on a lent GPU (seen before the model changes they led to): MoE (every
/// expert's weights, gradients and states; routed activations), the new model types, fp32, bf16
/// and amp, LoRA and full, with and without checkpointing — each within 15% of its allocated
/// peak.
#[test]
fn measured_here_rows_within_15_percent() {
    let rows = measured_here();
    assert!(rows.len() >= 20, "{} rows", rows.len());
    for r in &rows {
        assert_eq!(r.metric, "ALLOC", "{}", r.id);
        assert!(
            r.error.abs() <= 0.15,
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

/// memfit's own trainer: the grid covers every axis, and every *held-out* point (the half the
/// constants were not fitted to) is within 10% of the host model.
#[test]
fn memfit_grid_held_out_points_within_10_percent() {
    let rows = grid();
    println!("{}", memfit_plan::grid::markdown_table(&rows));
    assert!(rows.len() >= 12);
    assert!(rows.iter().any(|r| r.setup.contains("ckpt")));
    // BERT classification points beside T5's, with and without checkpointing, fp32 and bf16
    let bert: Vec<_> = rows
        .iter()
        .filter(|r| r.setup.starts_with("bert"))
        .collect();
    assert!(bert.len() >= 8, "{} BERT points", bert.len());
    assert!(bert.iter().any(|r| r.setup.contains("ckpt")));
    assert!(bert.iter().any(|r| !r.setup.contains("ckpt")));
    assert!(bert.iter().any(|r| r.setup.contains("bf16")));
    // decoder LoRA points: fp32 and bf16 base, with and without checkpointing
    let lora: Vec<_> = rows.iter().filter(|r| r.setup.contains(" lora ")).collect();
    assert!(lora.len() >= 8, "{} decoder LoRA points", lora.len());
    assert!(lora.iter().any(|r| r.setup.contains("ckpt")));
    assert!(lora.iter().any(|r| !r.setup.contains("ckpt")));
    assert!(lora.iter().any(|r| r.setup.ends_with("base bf16")));
    assert!(lora.iter().any(|r| r.setup.ends_with("base fp32")));
    let held_out = memfit_plan::grid::held_out(&rows);
    assert!(
        held_out.len() >= rows.len() / 2 - 1,
        "{} held out",
        held_out.len()
    );
    for family in ["bert", "qwen", "t5-small"] {
        assert!(
            held_out.iter().any(|r| r.setup.contains(family)),
            "{family}"
        );
    }
    for r in &held_out {
        assert!(
            r.error.abs() <= 0.10,
            "{} ({}) off by {:+.1}%",
            r.id,
            r.setup,
            100.0 * r.error
        );
    }
}

/// The committed constants of the host model are what the fit over the fit half of the grid
/// finds (so no held-out point shaped them), and the fit's own residuals are reported as such.
#[test]
fn memfit_grid_constants_are_the_fit_halfs_fit() {
    let text = std::fs::read_to_string(root().join("validation/memfit_grid.csv")).unwrap();
    let (found, worst) = memfit_plan::grid::fit::fit(&text).unwrap();
    println!("fit half: {found:?}, worst |error| {:.1}%", 100.0 * worst);
    assert_eq!(found, memfit_plan::memory::memfit_host::FITTED);
    let fit_points: Vec<_> = grid().into_iter().filter(|r| r.fit_point).collect();
    let in_sample = memfit_plan::grid::worst_abs_error(&fit_points);
    assert!((in_sample - worst).abs() < 1e-9, "{in_sample} vs {worst}");
}

#[test]
fn docs_accuracy_md_is_current() {
    let loso = rows_in(Mode::LeaveOneSourceOut);
    let expected = validation::accuracy_markdown(&rows(), &loso, &measured_here(), &grid());
    assert!(
        stats::bands_match_table(&stats::bands(&loso)),
        "crates/memfit-plan/src/memory/band/table.rs is stale: regenerate it with `{}`",
        validation::REGENERATE
    );
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

/// `length_spread`: empty is every step at `seq`; a value in (0, 1] is the setup's; anything else is
/// refused naming the row and the column. The ms-swift rows carry theirs, and it moves the estimate.
#[test]
fn length_spread_column() {
    use memfit_plan::{arch, memory};
    let d = root().join("validation");
    let rows =
        validation::parse_csv(&std::fs::read_to_string(d.join("cases.csv")).unwrap()).unwrap();
    let mut row = rows.iter().find(|r| r["id"] == "S4").unwrap().clone();
    let file = row["model"].clone();
    let text = std::fs::read_to_string(d.join("models").join(&file)).unwrap();
    let a = arch::parse_config(&file, &text, &file).unwrap();
    let reserved = |r: &validation::Record| {
        let s = validation::setup_of(r, &a).unwrap();
        let fw = validation::framework_of(r, None).unwrap();
        let est = memory::estimate(&a.clone().with_task(s.task), &s, &fw).unwrap();
        (s.length_spread, est.gpu.unwrap().peak_reserved_bytes)
    };
    let (spread, varying) = reserved(&row);
    assert!((spread - 91.0 / 2048.0).abs() < 1e-4, "{spread}");
    row.insert("length_spread".into(), String::new());
    let (spread, fixed) = reserved(&row);
    assert_eq!(spread, 1.0);
    assert!(varying > fixed, "{varying} <= {fixed}");
    for bad in ["0", "1.5", "-0.2", "half"] {
        row.insert("length_spread".into(), bad.into());
        let err = validation::setup_of(&row, &a).unwrap_err();
        assert!(err.contains("S4") && err.contains("length_spread"), "{err}");
    }
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
        let fw = validation::framework_of(&r, None).unwrap();
        let est = memory::estimate(&a, &setup, &fw).unwrap();
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
        let weights = memory::states::model_states(&a, &setup, &memory::Framework::default())
            .gpu_weights as f64;
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

/// Leave-one-source-out: an `A` row (V100, torch1) takes the V100 context of its own source
/// (A0-CTX) only when every source may be used; left out, it takes the median of the other
/// source's torch1 contexts.
#[test]
fn leave_one_source_out_never_uses_the_rows_own_context() {
    let d = root().join("validation");
    let read = |f: &str| std::fs::read_to_string(d.join(f)).unwrap();
    let constants = validation::parse_csv(&read("constants.csv")).unwrap();
    let cases = validation::parse_csv(&read("cases.csv")).unwrap();
    let a1 = cases.iter().find(|r| r["id"] == "A1").unwrap();
    let bytes = |id: &str| {
        let c = constants.iter().find(|c| c["id"] == id).unwrap();
        validation::to_bytes(&c["measured_value"], &c["measured_unit"]).unwrap()
    };
    let all = validation::context(&constants, a1, Mode::AllSources).unwrap();
    assert_eq!(all, Some(bytes("A0-CTX") as u64));
    let loso = validation::context(&constants, a1, Mode::LeaveOneSourceOut).unwrap();
    assert_eq!(loso, Some(((bytes("K2") + bytes("K3")) / 2.0) as u64));
    for r in &cases {
        let own = validation::source_of(&r["id"]).unwrap();
        if let Some(c) = validation::context(&constants, r, Mode::LeaveOneSourceOut).unwrap() {
            let from_own = constants.iter().any(|k| {
                validation::source_of(&k["id"]).unwrap() == own
                    && k["model"].is_empty()
                    && (validation::to_bytes(&k["measured_value"], &k["measured_unit"]).unwrap()
                        as u64)
                        == c
            });
            assert!(!from_own, "{}: context {c} is its own source's", r["id"]);
        }
    }
}

/// The rows that break a per-row target today, leave-one-source-out (docs/accuracy.md, "Where the
/// model is weakest", gives the causes): estimated low by more than 25%, and beyond ±35%.
const KNOWN_LOW_BEYOND_25: &[&str] = &["T2"];
const KNOWN_BEYOND_35: &[&str] = &["T2"];

/// Issues 17 and 31's targets over the committed rows, leave-one-source-out (each row estimated
/// without a constant measured by its own project, rows that are a constant's measurement not
/// scored): every row estimable, median |error| ≤ 8%, p90 ≤ 20%; the rows low by more than 25% or
/// beyond 35% exactly the known ones, so that a new one fails here.
#[test]
fn leave_one_source_out_goals() {
    let loso = rows_in(Mode::LeaveOneSourceOut);
    // every row of cases.csv was estimated (compare fails on the first that is not)
    let lines = std::fs::read_to_string(root().join("validation/cases.csv")).unwrap();
    assert_eq!(loso.len(), validation::parse_csv(&lines).unwrap().len());
    // the sources the model was built against; the fresh ones are gated (and pinned) below
    let scored: Vec<&validation::Compared> = loso
        .iter()
        .filter(|r| r.is_scored() && !is_fresh(r.source))
        .collect();
    let s = stats::summarize(&scored);
    println!(
        "LOSO: {} scored rows of {}, median {:.1}%, p90 {:.1}%, worst {:?}, beyond 35%: {}, low by > 25%: {:?}",
        s.rows,
        loso.len(),
        100.0 * s.median,
        100.0 * s.p90,
        s.worst,
        s.beyond_35,
        s.low_beyond_25
    );
    assert!(s.median <= 0.08, "median {:.1}% > 8%", 100.0 * s.median);
    assert!(s.p90 <= 0.20, "p90 {:.1}% > 20%", 100.0 * s.p90);
    let mut low = s.low_beyond_25.clone();
    low.sort();
    assert_eq!(
        low, KNOWN_LOW_BEYOND_25,
        "rows estimated low by more than 25%"
    );
    let mut beyond: Vec<&str> = scored
        .iter()
        .filter(|r| r.error.abs() > 0.35)
        .map(|r| r.id.as_str())
        .collect();
    beyond.sort();
    assert_eq!(beyond, KNOWN_BEYOND_35, "rows beyond 35%");
    // rows from at least six independent projects, every row from a known one
    let mut projects: Vec<&str> = loso.iter().map(|r| r.source).collect();
    projects.sort();
    projects.dedup();
    assert!(projects.len() >= 6, "{projects:?}");
}

/// Sources added after the model was written, never used to change it (issue 31: "rows of a
/// source the estimator has never seen"), each with what it gives today (leave-one-source-out),
/// pinned where issue 31's goal is not met on it. A model change that moves these figures must
/// update the pins (and may not be fitted to them).
///
/// `QwenLM/Qwen`: every goal of issue 31 is met — median |error| 7.7% (goal 8%), p90 19.2% (goal
/// 20%), no row low by more than 25%, the band of the other sources holding 46 of 48 rows (goal
/// 80%). History: 20.1%, 52.6%, 19 rows, 7/48 when the source was added; 11.7%, 26.3%, 5, 21/48
/// once a ZeRO optimizer's fp32 partitions counted for a 16-bit module; 9.3%, 20.2%, 1 (Q1
/// −26.3%), 23/48 once ZeRO-2's two ipg buffers followed the config's reduce_bucket_size (Qwen's
/// 2e8); 7.7%, 19.2%, 0, 27/48 once PEFT 0.5–0.6's fp32 LoRA weights counted
/// (`Framework::TORCH_2_0_PEFT_05`); 46/48 with the band that counts the sources' biases
/// (`stats::band_width`). Still open (docs/accuracy.md, "Where the model is weakest"): the Q rows'
/// metric and unit are inferred (NV GiB, grade C); LoRA at 256–1,024 tokens is still low by about
/// 1.2 GiB (1.8B) to 3.6 GiB (14B), the 1.8B GPTQ Q-LoRA rows by 15–24%.
///
/// `THUDM/ChatGLM3 + THUDM/GLM-4 finetune demos` (rows `Y`): 4 rows, not the 10 a fresh source
/// should give — the two repositories publish four measured setups that the columns express
/// (p-tuning v2 is not one, GLM-4's SFT figure is the card's ceiling and is in boundaries.csv).
/// Median 7.0%, p90 33.1% (goal 20%), 1 row low by more than 25% (Y4 −33.1%, whose "23GB" names
/// neither tool nor unit; goal none), band holds 3 of 4; every row is grade C (the README names no
/// measuring tool; the longest sample of a per-batch-padded dataset is estimated; evaluation with
/// generation runs inside the measured span). History: first contact 16.8%, 33.1%, 1, 1/4; 2/4
/// with the band that counts the sources' biases; Y2 (fp32 full fine-tuning under ZeRO-3) −22.1% →
/// +2.5% once DeepSpeed's ZeRO optimizer counted its `.clone().float()` partition under fp32
/// training too (found from Y2's miss, read in stage3.py, applied to every ZeRO run in fp32).
/// docs/accuracy.md, "Where the model is weakest", says what the low rows point at.
///
/// `modelscope/ms-swift` (`S2`–`S49`: the benchmark page of 2024-01-04 whose rows issue 31 was filed
/// on, added with the model unchanged, beside the project's one earlier row `S1`; first contact):
/// median 12.4% (goal 8%), p90 36.4% (goal 20%), 13 rows low by more than 25% (goal none), the band
/// holding 31 of 49 (goal 80%). The lengths vary from step to step (swift keeps every sample up to
/// `max_length`), and the caching allocator's pool under varying lengths is what is missed: the
/// same Qwen v1 LoRA at a fixed length (`Q`) reserves 5–15 GiB less. docs/accuracy.md says which.
///
/// `unslothai/unsloth` (the Hugging Face QLoRA baseline of Unsloth's README, Llama-2-7B on one
/// and on two T4s; first contact, nothing changed since): median 11.9% (goal 8%), p90 33.1%
/// (goal 20%), 2 rows low by more than 25% (U10 −36.4%, U12 −33.0%: the 2xT4 DDP rows with
/// SDPA at batch 1; goal none), the band holding 10 of 12 (goal 80%: met; 9 under the band before
/// it counted the sources' biases). Reasons: every row is grade
/// C (the notebooks are not readable; sequence lengths, metric and unit are inferred); the 2xT4
/// rows measure about 2 GiB more than the one-T4 rows of the same stated setup (U7 9176 vs U1
/// 7199 MiB), more than DDP's buckets for 40M LoRA parameters explain; the Alpaca rows take the
/// longest Alpaca sample (1304 tokens) as the length, an upper bound for a run shorter than an
/// epoch (U1 +33.1%).
const FRESH: &[(&str, FreshFigures)] = &[
    (
        "QwenLM/Qwen",
        FreshFigures {
            rows: 48,
            median: 0.077,
            p90: 0.192,
            low_beyond_25: 0,
            band_holds: 46,
        },
    ),
    (
        "THUDM/ChatGLM3 + THUDM/GLM-4 finetune demos",
        FreshFigures {
            rows: 4,
            median: 0.070,
            p90: 0.331,
            low_beyond_25: 1,
            band_holds: 3,
        },
    ),
    (
        "modelscope/ms-swift",
        FreshFigures {
            rows: 49,
            median: 0.125,
            p90: 0.364,
            low_beyond_25: 13,
            band_holds: 31,
        },
    ),
    (
        "unslothai/unsloth",
        FreshFigures {
            rows: 12,
            median: 0.119,
            p90: 0.331,
            low_beyond_25: 2,
            band_holds: 10,
        },
    ),
];

/// Issue 31 asks for at least 30 fresh rows in all; each fresh source should give at least 10
/// (fewer is pinned: `FreshFigures::rows`).
const FRESH_ROWS_PER_SOURCE: usize = 10;
const FRESH_ROWS_IN_ALL: usize = 30;

struct FreshFigures {
    rows: usize,
    median: f64,
    p90: f64,
    low_beyond_25: usize,
    band_holds: usize,
}

fn is_fresh(source: &str) -> bool {
    FRESH.iter().any(|(s, _)| *s == source)
}

/// Issue 31's goal on rows of a source the estimator has never seen: every row estimable,
/// median |error| ≤ 8%, p90 ≤ 20%, no row low by more than 25%, and the band — taken from the
/// rows of the *other* sources only — holds at least 80% of the rows (the measurement under
/// predicted / (1 − p90 of the row's class)). Where the goal is not met the figure is pinned
/// (`FRESH`): the test fails when it changes either way.
#[test]
fn fresh_source_goals() {
    let loso = rows_in(Mode::LeaveOneSourceOut);
    let others: Vec<validation::Compared> = loso
        .iter()
        .filter(|r| !is_fresh(r.source))
        .cloned()
        .collect();
    let bands = stats::bands(&others);
    let band_of = |class: &str| stats::width_for(&bands, class);
    let mut in_all = 0;
    for (source, pin) in FRESH {
        let fresh: Vec<&validation::Compared> = loso
            .iter()
            .filter(|r| r.source == *source && r.is_scored())
            .collect();
        in_all += fresh.len();
        let holds = fresh
            .iter()
            .filter(|r| r.measured_bytes <= r.predicted_bytes / (1.0 - band_of(&r.class)))
            .count();
        let s = stats::summarize(&fresh);
        println!(
            "{source}: {} rows, median {:.1}%, p90 {:.1}%, low by > 25%: {}, band holds {}/{}",
            s.rows,
            100.0 * s.median,
            100.0 * s.p90,
            s.low_beyond_25.len(),
            holds,
            fresh.len()
        );
        let near = |a: f64, b: f64| (a - b).abs() < 0.0005;
        let goal_or_pin = |met: bool, pinned: bool, what: &str| {
            assert!(
                met || pinned,
                "{source}: {what} neither meets the goal nor the pin"
            );
        };
        goal_or_pin(
            fresh.len() >= FRESH_ROWS_PER_SOURCE,
            fresh.len() == pin.rows,
            "row count",
        );
        goal_or_pin(s.median <= 0.08, near(s.median, pin.median), "median");
        goal_or_pin(s.p90 <= 0.20, near(s.p90, pin.p90), "p90");
        goal_or_pin(
            s.low_beyond_25.is_empty(),
            s.low_beyond_25.len() == pin.low_beyond_25,
            "rows low by > 25%",
        );
        goal_or_pin(
            holds * 10 >= fresh.len() * 8,
            holds == pin.band_holds,
            "band coverage",
        );
    }
    assert!(in_all >= FRESH_ROWS_IN_ALL, "{in_all} fresh rows in all");
}

/// Sources whose held-out rows the band does not hold to 80% (docs/accuracy.md, "Where the model
/// is weakest": ms-swift's pool under step lengths that vary, 31 of 49 held). torchtune (4 of 5)
/// left this list when ms-swift's rows widened the bands.
const KNOWN_BAND_MISSES: &[&str] = &["modelscope/ms-swift"];

/// The band as every validated source meets it when it is the fresh one: computed without its
/// rows, it holds at least 80% of them — for every source with 5 rows or more but the known ones.
#[test]
fn band_holds_each_held_out_source() {
    let loso = rows_in(Mode::LeaveOneSourceOut);
    let coverage = stats::held_out_coverage(&loso);
    assert!(coverage.len() >= 5, "{coverage:?}");
    for (source, held, n) in coverage {
        println!("{source}: band holds {held}/{n}");
        let met = held * 10 >= n * 8;
        assert_eq!(
            met,
            !KNOWN_BAND_MISSES.contains(&source),
            "{source}: {held}/{n} under the band of the other sources"
        );
    }
}

/// A row that is the measurement of a constant is never scored; in leave-one-source-out mode no
/// host-RSS row of that project is either (it would use its own project's figure).
#[test]
fn constant_rows_are_not_scored() {
    for mode in [Mode::AllSources, Mode::LeaveOneSourceOut] {
        let rows = rows_in(mode);
        for id in validation::CONSTANT_ROWS {
            let r = rows.iter().find(|r| r.id == *id).unwrap();
            assert!(!r.is_scored(), "{id} scored in {mode:?}");
        }
        let peft_rss: Vec<_> = rows
            .iter()
            .filter(|r| r.metric == "RSS" && r.source == "huggingface/peft")
            .collect();
        assert!(peft_rss.len() >= 4);
        let scored = peft_rss.iter().filter(|r| r.is_scored()).count();
        match mode {
            Mode::AllSources => {
                assert_eq!(scored, peft_rss.len() - validation::CONSTANT_ROWS.len())
            }
            Mode::LeaveOneSourceOut => assert_eq!(scored, 0),
        }
    }
    // the constant is the rows' figure in the unit they state (2.96 GB, not 2960 MiB)
    let text = std::fs::read_to_string(root().join("validation/cases.csv")).unwrap();
    for r in validation::parse_csv(&text).unwrap() {
        if validation::CONSTANT_ROWS.contains(&r["id"].as_str()) {
            let b = validation::to_bytes(&r["measured_value"], &r["measured_unit"]).unwrap();
            assert_eq!(
                b as u64,
                memfit_plan::memory::framework::PYTORCH_CUDA_RUNTIME_RSS
            );
        }
    }
}
