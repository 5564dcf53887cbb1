//! The accuracy harness: reads `validation/cases.csv` (text handed in by the caller), turns each
//! row into a [`Setup`], estimates it, and compares the metric the row names.
//!
//! Every row runs under one software profile, [`Framework::torch_1x`]: all published rows are
//! 2022 runs (transformers 4.16–4.25, PyTorch ≤ 1.13). The only machine constant is the CUDA
//! context of the row's GPU, read from `constants.csv` (the row with no model, metric NV, same GPU).

use crate::Task;
use crate::arch::{self, Arch};
use crate::memory::setup::*;
use crate::memory::{self, Framework, Setup};
use std::collections::BTreeMap;

/// One parsed CSV record as column → value.
pub type Record = BTreeMap<String, String>;

/// Parses RFC 4180 CSV (quoted fields with commas and doubled quotes).
pub fn parse_csv(text: &str) -> Result<Vec<Record>, String> {
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut row = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(ch) = chars.next() {
        match (quoted, ch) {
            (true, '"') if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut field)),
            (false, '\n') => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            (false, '\r') => {}
            (false, c) => field.push(c),
        }
    }
    if !field.is_empty() || !row.is_empty() {
        row.push(field);
        rows.push(row);
    }
    let header = rows.first().ok_or("empty CSV")?.clone();
    rows.iter()
        .skip(1)
        .enumerate()
        .map(|(i, r)| {
            if r.len() != header.len() {
                return Err(format!(
                    "row {}: {} fields, header has {}",
                    i + 2,
                    r.len(),
                    header.len()
                ));
            }
            Ok(header.iter().cloned().zip(r.iter().cloned()).collect())
        })
        .collect()
}

/// A measured value in bytes, with the unit as validation/README.md defines it.
pub fn to_bytes(value: &str, unit: &str) -> Result<f64, String> {
    let v: f64 = value
        .parse()
        .map_err(|_| format!("measured_value {value:?} is not a number"))?;
    let scale = match unit {
        "MB" => 1e6,
        "GB" => 1e9,
        "MiB" => (1u64 << 20) as f64,
        "GiB" => (1u64 << 30) as f64,
        other => return Err(format!("measured_unit {other:?} unknown")),
    };
    Ok(v * scale)
}

fn get<'a>(r: &'a Record, k: &str) -> &'a str {
    r.get(k).map(String::as_str).unwrap_or("")
}

fn num(r: &Record, k: &str, default: u64) -> Result<u64, String> {
    let s = get(r, k);
    if s.is_empty() {
        return Ok(default);
    }
    s.parse()
        .map_err(|_| format!("{}: {k} = {s:?} is not a number", get(r, "id")))
}

/// The row's setup.
pub fn setup_of(r: &Record, arch: &Arch) -> Result<Setup, String> {
    let id = get(r, "id");
    let bad = |k: &str| format!("{id}: {k} = {:?} not understood", get(r, k));
    let mut s = Setup::new(arch);
    s.task = Task::parse(get(r, "task")).ok_or_else(|| bad("task"))?;
    s.method = Method::parse(get(r, "method")).ok_or_else(|| bad("method"))?;
    s.precision = Precision::parse(get(r, "precision")).ok_or_else(|| bad("precision"))?;
    s.optimizer = Optimizer::parse(get(r, "optimizer")).ok_or_else(|| bad("optimizer"))?;
    s.batch = num(r, "batch", 1)?;
    s.seq = num(r, "seq", 1)?;
    s.tgt_seq = num(r, "tgt_seq", 0)?;
    s.accum = num(r, "accum", 1)?;
    s.grad_ckpt = get(r, "grad_ckpt") == "true";
    s.lora_r = num(r, "lora_r", 8)?;
    s.lora_alpha = num(r, "lora_alpha", 16)?;
    if !get(r, "lora_targets").is_empty() {
        s.lora_targets = get(r, "lora_targets")
            .split(',')
            .map(|t| LoraTarget::parse(t.trim()).ok_or_else(|| bad("lora_targets")))
            .collect::<Result<_, _>>()?;
    }
    s.quant = match get(r, "quant") {
        "" => None,
        q => Some(Quant::parse(q).ok_or_else(|| bad("quant"))?),
    };
    s.zero = Zero::parse(get(r, "zero")).ok_or_else(|| bad("zero"))?;
    s.offload_optimizer = get(r, "offload_optimizer") == "cpu";
    s.offload_params = get(r, "offload_params") == "cpu";
    s.gpus = num(r, "gpus", 1)?;
    s.nodes = num(r, "nodes", 1)?;
    s.attention = match get(r, "attention") {
        "flash2" => Attention::Flash,
        a => Attention::parse(a).ok_or_else(|| bad("attention"))?,
    };
    // The rows measure a training process that already holds its data (a few hundred rows).
    s.dataset = DatasetMode::Reread;
    Ok(s)
}

/// One compared row.
#[derive(Debug, Clone)]
pub struct Compared {
    pub id: String,
    pub grade: String,
    pub metric: String,
    pub measured_bytes: f64,
    pub predicted_bytes: f64,
    /// (predicted − measured) / measured
    pub error: f64,
    /// The row's notes say it depends on a feature the columns cannot express.
    pub needs_feature: bool,
}

/// Runs every row of `cases` (text of cases.csv) with configs from `model_text(file)`.
pub fn compare(
    cases: &str,
    constants: &str,
    model_text: &dyn Fn(&str) -> Result<String, String>,
) -> Result<Vec<Compared>, String> {
    let constants = parse_csv(constants)?;
    let mut out = Vec::new();
    for r in parse_csv(cases)? {
        let id = get(&r, "id").to_string();
        let file = get(&r, "model");
        let text = model_text(file)?;
        let arch = arch::parse_config(file, &text, file).map_err(|e| e.to_string())?;
        let setup = setup_of(&r, &arch)?;
        let arch = arch.with_task(setup.task);
        let context = constants
            .iter()
            .find(|c| {
                get(c, "model").is_empty()
                    && get(c, "metric") == "NV"
                    && get(c, "gpu_name") == get(&r, "gpu_name")
            })
            .map(|c| to_bytes(get(c, "measured_value"), get(c, "measured_unit")))
            .transpose()?
            .map_or(Framework::TORCH_2.cuda_context_bytes, |b| b as u64);
        let fw = Framework::torch_1x(context);
        let est = memory::estimate(&arch, &setup, &fw).map_err(|e| format!("{id}: {e}"))?;
        let gpu = est
            .gpu
            .as_ref()
            .ok_or_else(|| format!("{id}: no GPU estimate"))?;
        let metric = get(&r, "metric").to_string();
        let predicted = match metric.as_str() {
            "NV" => gpu.nvml_used_bytes,
            "RES" => gpu.peak_reserved_bytes,
            "ALLOC" | "ACT" => gpu.peak_allocated_bytes,
            "RSS" => est.host.train_rss_bytes,
            m => return Err(format!("{id}: metric {m:?} unknown")),
        } as f64;
        let measured = to_bytes(get(&r, "measured_value"), get(&r, "measured_unit"))?;
        out.push(Compared {
            id,
            grade: get(&r, "grade").to_string(),
            metric,
            measured_bytes: measured,
            predicted_bytes: predicted,
            error: (predicted - measured) / measured,
            needs_feature: get(&r, "notes").starts_with("[needs:"),
        });
    }
    Ok(out)
}

/// Median of |error| over the rows.
pub fn median_abs_error(rows: &[Compared]) -> f64 {
    let mut e: Vec<f64> = rows.iter().map(|r| r.error.abs()).collect();
    e.sort_by(f64::total_cmp);
    match e.len() {
        0 => 0.0,
        n if n % 2 == 1 => e[n / 2],
        n => (e[n / 2 - 1] + e[n / 2]) / 2.0,
    }
}

/// The markdown table of docs/accuracy.md.
pub fn markdown_table(rows: &[Compared]) -> String {
    let mib = (1u64 << 20) as f64;
    let mut s = String::from(
        "| row | grade | metric | measured (MiB) | predicted (MiB) | error |\n| --- | --- | --- | ---: | ---: | ---: |\n",
    );
    for r in rows {
        s += &format!(
            "| {} | {} | {} | {:.0} | {:.0} | {:+.1}% |\n",
            r.id,
            r.grade,
            r.metric,
            r.measured_bytes / mib,
            r.predicted_bytes / mib,
            100.0 * r.error
        );
    }
    s
}

/// The command that regenerates docs/accuracy.md.
pub const REGENERATE: &str = "cargo run --release -p memfit-plan --example accuracy";

/// The whole of docs/accuracy.md: method, summary and every row, then the grid of memfit's own
/// trainer (`validation/memfit_grid.csv` compared by [`crate::grid::compare`]).
pub fn accuracy_markdown(rows: &[Compared], grid: &[crate::grid::Compared]) -> String {
    let median = median_abs_error(rows);
    let worst_a = rows
        .iter()
        .filter(|r| r.grade == "A")
        .max_by(|a, b| a.error.abs().total_cmp(&b.error.abs()));
    let worst_any = rows
        .iter()
        .max_by(|a, b| a.error.abs().total_cmp(&b.error.abs()));
    let mut s = String::new();
    s += "# Accuracy of the memory model\n\n";
    s += &format!(
        "Generated by `{REGENERATE}` (the test `crates/memfit-plan/tests/accuracy.rs` fails when this\n\
         file differs from what the model predicts now, and asserts the two limits below).\n\n"
    );
    s += "Every row of `validation/cases.csv` (published measurements, see `validation/README.md`) is turned\n\
          into a setup from its columns alone, estimated, and compared with the metric the row names:\n\
          `NV` → `nvml_used`, `RES` → `peak_reserved`, `ALLOC`/`ACT` → `peak_allocated`, `RSS` → the host\n\
          peak while training. Measured values are converted with the units exactly as the row states them\n\
          (`MB`/`GB` = 10^6/10^9 bytes, `MiB`/`GiB` = 2^20/2^30 bytes).\n\n";
    s += "The estimator uses one software profile for all rows, `Framework::torch_1x`: every row is a 2022\n\
          run (transformers 4.16–4.25, PyTorch ≤ 1.13), so gradients persist between steps\n\
          (`zero_grad(set_to_none=False)`) and AdamW steps tensor by tensor (no `foreach` copies). The\n\
          only machine constant is the CUDA context of the row's GPU, taken from `validation/constants.csv`\n\
          (A0-CTX: 1343 MiB on the V100 of the `A` rows). No constant is per row and nothing is fitted per\n\
          case; the constants of the model are listed with their sources in `docs/memory-model.md`.\n\n";
    s += "## Summary\n\n";
    s += &format!("- rows: {}\n", rows.len());
    s += &format!(
        "- median absolute error: **{:.1}%** (limit 10%)\n",
        100.0 * median
    );
    if let Some(w) = worst_a {
        s += &format!(
            "- worst grade-A row: **{} {:+.1}%** (limit ±25%)\n",
            w.id,
            100.0 * w.error
        );
    }
    if let Some(w) = worst_any {
        s += &format!("- worst row overall: {} {:+.1}%\n", w.id, 100.0 * w.error);
    }
    s += "- also asserted by the same test file: every `oom` row of `validation/boundaries.csv` (B5, B8:\n\
          \x20 full fine-tuning of mt0-xxl and bloomz-7b1 on an 80 GB A100) is predicted above the GPU's\n\
          \x20 memory, and the loaded-weights rows of `constants.csv` (A0-LOAD, K1) are within 1%\n";
    s += "\n## Every row\n\n";
    s += &markdown_table(rows);
    s += "\n## Where the model is weakest\n\n\
          - ZeRO-3 with parameter offload (`B3`/`B4`/`B7`/`B10` GPU rows): DeepSpeed keeps gathered\n\
          \x20 parameters resident while they will be reused (`stage3_max_reuse_distance`) up to\n\
          \x20 `stage3_max_live_parameters` = 1e9; the model charges min(1e9, all parameters). The PEFT\n\
          \x20 log of `B4` shows 1916 MiB already allocated before the epoch began, which no column\n\
          \x20 describes (the log does not say what holds it): the model is low there.\n\
          - Host RSS of `B9`/`B10` (BLOOM, a float16 checkpoint loaded into fp32) is under-predicted: the\n\
          \x20 loading path of that checkpoint keeps more than the model accounts for.\n\
          - The `GB` rows of the PEFT table carry a ±5% unit ambiguity (validation/README.md).\n";
    s += &grid_section(grid);
    s
}

/// The docs/accuracy.md section of memfit's own trainer.
fn grid_section(grid: &[crate::grid::Compared]) -> String {
    let mut s = String::from(
        "\n## memfit's own trainer: host peak RSS (`--runtime memfit --device cpu`)\n\n",
    );
    s += &format!(
        "Measured with `{}` (reproduces the table\n\
         below and rewrites the CSV): every point is a separate `memfit bench train` process ({} steps,\n\
         {} threads, target length = source length, synthetic tokens); the measured value is its peak RSS\n\
         (VmHWM). Predicted: the training-phase host peak of `crates/memfit-plan/src/memory/memfit_host.rs`\n\
         (no checkpoint is written while benchmarking). Four constants of that model are fitted to these\n\
         points (`docs/memory-model.md`); everything else is counted from what the trainer holds. The\n\
         test `crates/memfit-plan/tests/accuracy.rs` asserts every point within ±10%. Gradient\n\
         checkpointing is the per-block recomputation of `crates/memfit-nn/src/t5/block_ckpt.rs`.\n\n",
        crate::grid::MEASURE,
        crate::grid::STEPS,
        crate::grid::THREADS
    );
    s += &format!(
        "- points: {}\n- worst |error|: **{:.1}%** (limit 10%)\n\n",
        grid.len(),
        100.0 * crate::grid::worst_abs_error(grid)
    );
    s += &crate::grid::markdown_table(grid);
    s
}
