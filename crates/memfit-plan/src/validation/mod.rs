//! The accuracy harness: reads `validation/cases.csv` (text handed in by the caller), turns each
//! row into a [`Setup`], estimates it, and compares the metric the row names.
//!
//! A row's `software` column picks the framework profile (`torch1`: [`Framework::torch_1x`], the
//! 2022 rows; `torch2.0`: [`Framework::TORCH_2_0_PEFT_05`], PyTorch 2.0 with PEFT 0.5–0.6 (late
//! 2023); `torch2`: [`Framework::TORCH_2_BNB_LT_044`], 2023 to mid-2024; `torch2.4`:
//! [`Framework::TORCH_2`]), its `stack` column the training stack (`memory::stack`). The only value taken from measurements is the CUDA
//! context (NVML rows only), read from `constants.csv`; in [`Mode::LeaveOneSourceOut`] a row never
//! gets a context measured by its own source ([`context`]). [`stats`] summarises errors per mode
//! and source and derives the uncertainty band; [`report`] writes `docs/accuracy.md`.

pub mod report;
pub mod stats;

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
    s.stack = Stack::parse(get(r, "stack")).ok_or_else(|| bad("stack"))?;
    s.optimizer_in_backward = optional_bool(r, "opt_in_bwd").ok_or_else(|| bad("opt_in_bwd"))?;
    s.chunked_loss = optional_bool(r, "chunked_loss").ok_or_else(|| bad("chunked_loss"))?;
    s.outputs_kept = optional_bool(r, "outputs_kept").ok_or_else(|| bad("outputs_kept"))?;
    s.zero_bucket_size = match get(r, "zero_bucket") {
        "" => None,
        v => Some(v.parse().map_err(|_| bad("zero_bucket"))?),
    };
    s.length_spread = match get(r, "length_spread") {
        "" => 1.0,
        v => v
            .parse()
            .ok()
            .filter(|x: &f64| *x > 0.0 && *x <= 1.0)
            .ok_or_else(|| bad("length_spread"))?,
    };
    // The rows measure a training process that already holds its data (a few hundred rows).
    s.dataset = DatasetMode::Reread;
    Ok(s)
}

/// A column that is `true`, `false` or empty (`Some(None)`); `None` for anything else.
fn optional_bool(r: &Record, k: &str) -> Option<Option<bool>> {
    match get(r, k) {
        "" => Some(None),
        "true" => Some(Some(true)),
        "false" => Some(Some(false)),
        _ => None,
    }
}

/// How a row's measured constants are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every constant from every source (the published table as one body of data).
    AllSources,
    /// A row is estimated with no constant measured by its own source.
    LeaveOneSourceOut,
}

impl Mode {
    pub fn label(self) -> &'static str {
        match self {
            Mode::AllSources => "all sources",
            Mode::LeaveOneSourceOut => "leave-one-source-out",
        }
    }
}

/// The independent project behind each id letter (validation/README.md). Rows of one project
/// are left out together: `L` and `M` are two LitGPT tables, `B` and `P` two PEFT ones.
pub const SOURCES: &[(char, &str)] = &[
    ('A', "huggingface/transformers docs"),
    ('B', "huggingface/peft"),
    ('F', "AnswerDotAI/fsdp_qlora"),
    ('K', "stas00/ml-engineering + accelerate docs"),
    ('L', "Lightning-AI/litgpt"),
    ('M', "Lightning-AI/litgpt"),
    ('P', "huggingface/peft"),
    ('T', "pytorch/torchtune"),
    ('S', "modelscope/ms-swift"),
    ('Q', "QwenLM/Qwen"),
    ('Y', "THUDM/ChatGLM3 + THUDM/GLM-4 finetune demos"),
    ('U', "unslothai/unsloth"),
    (
        'H',
        "memfit, measured on a lent GPU (validation/measured_here.csv)",
    ),
];

/// The project of a row id (its first letter).
pub fn source_of(id: &str) -> Result<&'static str, String> {
    let letter = id.chars().next().unwrap_or(' ');
    SOURCES
        .iter()
        .find(|(l, _)| *l == letter)
        .map(|(_, s)| *s)
        .ok_or_else(|| format!("id {id:?}: its letter names no source in validation::SOURCES"))
}

/// One compared row.
#[derive(Debug, Clone)]
pub struct Compared {
    pub id: String,
    /// The project it comes from ([`SOURCES`]).
    pub source: &'static str,
    /// The band class of its setup ([`stats::band_class`]).
    pub class: String,
    pub grade: String,
    pub metric: String,
    pub measured_bytes: f64,
    pub predicted_bytes: f64,
    /// (predicted − measured) / measured
    pub error: f64,
    /// The row's notes say it depends on a feature the columns cannot express.
    pub needs_feature: bool,
    /// Why the row is compared but kept out of every summary and band ([`unscored_reason`]).
    pub unscored: Option<&'static str>,
}

impl Compared {
    /// A GPU metric (NV, RES, ALLOC, ACT), not host RSS.
    pub fn is_gpu(&self) -> bool {
        self.metric != "RSS"
    }

    /// The row counts in summaries and bands.
    pub fn is_scored(&self) -> bool {
        self.unscored.is_none()
    }
}

/// The rows a constant of the model was measured on: `memory::framework::PYTORCH_CUDA_RUNTIME_RSS`
/// is the host RSS of rows B1-CPU and B2-CPU (PEFT's 2022 log).
pub const CONSTANT_ROWS: &[&str] = &["B1-CPU", "B2-CPU"];

/// Why a row is compared but not scored, if it is not: it is the measurement of a constant
/// ([`CONSTANT_ROWS`]), or, in leave-one-source-out mode, a PyTorch host-RSS row of the project
/// that measured that constant (no other project published it, so the row cannot be estimated
/// without its own project's figure).
pub fn unscored_reason(id: &str, metric: &str, mode: Mode) -> Result<Option<&'static str>, String> {
    if CONSTANT_ROWS.contains(&id) {
        return Ok(Some("the measurement of PYTORCH_CUDA_RUNTIME_RSS"));
    }
    let constant_source = source_of(CONSTANT_ROWS[0])?;
    let own_constant = metric == "RSS" && source_of(id)? == constant_source;
    Ok((mode == Mode::LeaveOneSourceOut && own_constant)
        .then_some("its runtime RSS constant is its own project's measurement"))
}

/// The CUDA module loading a `software` value implies: PyTorch 2.0 loads lazily as 2.1+ does,
/// so a `torch2.0` row takes the `torch2` context measurements.
fn loading_era(software: &str) -> &str {
    match software {
        "torch2.0" => "torch2",
        other => other,
    }
}

/// The CUDA context for a row: a `constants.csv` row with no model, metric NV, one GPU and the
/// row's `software`, measured on the row's GPU if one is (else the median of those there are);
/// in leave-one-source-out mode only rows of other sources count. `None`: no such row, the
/// framework's own default applies.
pub fn context(constants: &[Record], row: &Record, mode: Mode) -> Result<Option<u64>, String> {
    let own = source_of(get(row, "id"))?;
    let mut usable = Vec::new();
    for c in constants {
        let other = source_of(get(c, "id"))? != own;
        if get(c, "model").is_empty()
            && get(c, "metric") == "NV"
            && get(c, "gpus") == "1"
            && loading_era(get(c, "software")) == loading_era(get(row, "software"))
            && (mode == Mode::AllSources || other)
        {
            let bytes = to_bytes(get(c, "measured_value"), get(c, "measured_unit"))?;
            usable.push((get(c, "gpu_name") == get(row, "gpu_name"), bytes));
        }
    }
    if let Some((_, b)) = usable.iter().find(|(same_gpu, _)| *same_gpu) {
        return Ok(Some(*b as u64));
    }
    let mut b: Vec<f64> = usable.into_iter().map(|(_, b)| b).collect();
    b.sort_by(f64::total_cmp);
    Ok(match b.len() {
        0 => None,
        n if n % 2 == 1 => Some(b[n / 2] as u64),
        n => Some(((b[n / 2 - 1] + b[n / 2]) / 2.0) as u64),
    })
}

/// The framework profile a row's `software` names, with its CUDA context.
pub fn framework_of(row: &Record, context: Option<u64>) -> Result<Framework, String> {
    let ctx = context.unwrap_or(Framework::TORCH_2.cuda_context_bytes);
    match get(row, "software") {
        "torch1" => Ok(Framework::torch_1x(ctx)),
        "torch2" => Ok(Framework {
            cuda_context_bytes: ctx,
            ..Framework::TORCH_2_BNB_LT_044
        }),
        "torch2.0" => Ok(Framework {
            cuda_context_bytes: ctx,
            ..Framework::TORCH_2_0_PEFT_05
        }),
        "torch2.4" => Ok(Framework {
            cuda_context_bytes: ctx,
            ..Framework::TORCH_2
        }),
        other => Err(format!(
            "{}: software = {other:?} not understood (torch1, torch2.0, torch2 or torch2.4)",
            get(row, "id")
        )),
    }
}

/// Runs every row of `cases` (text of cases.csv) with configs from `model_text(file)`.
pub fn compare(
    cases: &str,
    constants: &str,
    model_text: &dyn Fn(&str) -> Result<String, String>,
    mode: Mode,
) -> Result<Vec<Compared>, String> {
    let constants = parse_csv(constants)?;
    parse_csv(cases)?
        .iter()
        .map(|r| compare_row(r, &constants, model_text, mode).map(|(c, _)| c))
        .collect()
}

/// The rows named by `ids`, each with its GPU breakdown, as text (for
/// `cargo run --release -p memfit-plan --example explain_rows -- ID …`).
pub fn explain(
    cases: &str,
    constants: &str,
    model_text: &dyn Fn(&str) -> Result<String, String>,
    mode: Mode,
    ids: &[String],
) -> Result<Vec<String>, String> {
    let constants = parse_csv(constants)?;
    let mut out = Vec::new();
    for r in parse_csv(cases)?
        .iter()
        .filter(|r| ids.iter().any(|i| i == get(r, "id")))
    {
        let (c, est) = compare_row(r, &constants, model_text, mode)?;
        let mib = |b: f64| b / (1u64 << 20) as f64;
        let mut text = format!(
            "{} ({}, {}): measured {:.0} MiB, predicted {:.0} MiB, {:+.1}%\n",
            c.id,
            get(r, "stack"),
            c.metric,
            mib(c.measured_bytes),
            mib(c.predicted_bytes),
            100.0 * c.error
        );
        for comp in est.gpu.iter().flat_map(|g| &g.components) {
            text += &format!(
                "  {:<28} {:>9.0} MiB  {}\n",
                comp.name,
                mib(comp.bytes as f64),
                comp.note
            );
        }
        out.push(text);
    }
    Ok(out)
}

/// Every row of `cases` (CSV text in these columns, measured or not: `scripts/meta_grid.csv`)
/// estimated without a measured CUDA context (`Framework::TORCH_2`'s where the row's software
/// names none): its id and estimate.
pub fn estimates(
    cases: &str,
    model_text: &dyn Fn(&str) -> Result<String, String>,
) -> Result<Vec<(String, memory::Estimate)>, String> {
    parse_csv(cases)?
        .iter()
        .map(|r| {
            Ok((
                get(r, "id").to_string(),
                estimate_row(r, model_text, None)?.1,
            ))
        })
        .collect()
}

/// One row's setup and estimate, the CUDA context `context` where one was measured.
fn estimate_row(
    r: &Record,
    model_text: &dyn Fn(&str) -> Result<String, String>,
    context: Option<u64>,
) -> Result<(Setup, memory::Estimate), String> {
    let id = get(r, "id");
    let file = get(r, "model");
    let text = model_text(file)?;
    let arch = arch::parse_config(file, &text, file).map_err(|e| e.to_string())?;
    let setup = setup_of(r, &arch)?;
    let arch = arch.with_task(setup.task);
    let fw = framework_of(r, context)?;
    let est = memory::estimate(&arch, &setup, &fw).map_err(|e| format!("{id}: {e}"))?;
    Ok((setup, est))
}

/// One row estimated and compared.
fn compare_row(
    r: &Record,
    constants: &[Record],
    model_text: &dyn Fn(&str) -> Result<String, String>,
    mode: Mode,
) -> Result<(Compared, memory::Estimate), String> {
    let id = get(r, "id").to_string();
    let (setup, est) = estimate_row(r, model_text, context(constants, r, mode)?)?;
    let gpu = est
        .gpu
        .as_ref()
        .ok_or_else(|| format!("{id}: no GPU estimate"))?;
    let metric = get(r, "metric").to_string();
    let predicted = match metric.as_str() {
        "NV" => gpu.nvml_used_bytes,
        "RES" => gpu.peak_reserved_bytes,
        "ALLOC" | "ACT" => gpu.peak_allocated_bytes,
        "RSS" => est.host.train_rss_bytes,
        m => return Err(format!("{id}: metric {m:?} unknown")),
    } as f64;
    let measured = to_bytes(get(r, "measured_value"), get(r, "measured_unit"))?;
    let compared = Compared {
        source: source_of(&id)?,
        class: stats::band_class(&setup),
        id,
        grade: get(r, "grade").to_string(),
        metric,
        measured_bytes: measured,
        predicted_bytes: predicted,
        error: (predicted - measured) / measured,
        needs_feature: get(r, "notes").starts_with("[needs:"),
        unscored: unscored_reason(get(r, "id"), get(r, "metric"), mode)?,
    };
    Ok((compared, est))
}

pub use report::{REGENERATE, accuracy_markdown, markdown_table};
pub use stats::median_abs_error;
