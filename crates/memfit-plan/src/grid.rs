//! The memory grid of memfit's own trainer: the points `memfit bench memory-grid` measures (each
//! one `memfit bench train` process), the CSV it writes (`validation/memfit_grid.csv`), and the
//! comparison of each measured peak RSS with [`crate::memory::memfit_host`]'s prediction.
//!
//! The CSV carries the model's family and dimensions, so the comparison needs nothing but the file.
//! Rows written before the `family` column existed (T5 only) read as T5.

use crate::Task;
use crate::arch::{self, Arch};
use crate::memory::{self, DatasetMode, Device, Framework, FreezeGroup, Method, Runtime, Setup};
use crate::memory::{LoraTarget, Optimizer, Precision};
use crate::validation::{Record, parse_csv};
use serde_json::json;

pub mod fit;

/// One grid point: a `memfit bench train` invocation (target length = source length); the task is
/// the model's family's (T5 seq2seq, BERT classification, a decoder causal LM).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub id: &'static str,
    /// `tiny`, `bert-small`, `qwen2-small`, … or a preset name, as `memfit bench train --model`
    /// takes it.
    pub model: &'static str,
    pub batch: u64,
    pub seq: u64,
    pub accum: u64,
    pub precision: Precision,
    pub optimizer: Optimizer,
    pub grad_ckpt: bool,
    pub freeze_encoder: bool,
    /// Causal LM: LoRA adapters (bench_causal_lora.py's r 16 on q,k,v,o,gate,up,down) on a frozen
    /// base, held in bf16 when `base_bf16`.
    pub lora: bool,
    pub base_bf16: bool,
}

const fn point(id: &'static str, model: &'static str, batch: u64, seq: u64) -> Point {
    Point {
        id,
        model,
        batch,
        seq,
        accum: 1,
        precision: Precision::Fp32,
        optimizer: Optimizer::AdamW,
        grad_ckpt: false,
        freeze_encoder: false,
        lora: false,
        base_bf16: false,
    }
}

const fn accum(p: Point, accum: u64) -> Point {
    Point { accum, ..p }
}
const fn bf16(p: Point) -> Point {
    Point {
        precision: Precision::Bf16,
        ..p
    }
}
const fn adafactor(p: Point) -> Point {
    Point {
        optimizer: Optimizer::Adafactor,
        ..p
    }
}
const fn ckpt(p: Point) -> Point {
    Point {
        grad_ckpt: true,
        ..p
    }
}
const fn frozen_encoder(p: Point) -> Point {
    Point {
        freeze_encoder: true,
        ..p
    }
}
const fn lora(p: Point) -> Point {
    Point { lora: true, ..p }
}
const fn base_bf16(p: Point) -> Point {
    Point {
        base_bf16: true,
        ..p
    }
}

/// LoRA rank of the grid's decoder points (`memfit bench train`'s default `--lora-r`); its
/// targets are every projection of a block.
pub const LORA_R: u64 = 16;

/// The grid. T5: three model sizes (tiny = 9.4M, t5-small = 60.5M, chatlm-mini = 187.7M
/// parameters) × micro-batch × length, with checkpointing, accumulation, Adafactor, bf16 (also
/// with checkpointing) and a frozen encoder (about twenty minutes on two busy cores). BERT
/// classification: bert-small (8.9M) and bert-base-chinese (102M) × micro-batch × length × fp32/bf16
/// × checkpointing (about four minutes). Decoder LoRA (causal LM): qwen2-small (39M) and
/// qwen2.5-0.5b × micro-batch × length × base fp32/bf16 × checkpointing (about six minutes).
pub const POINTS: &[Point] = &[
    point("tiny-b1-s8", "tiny", 1, 8),
    point("tiny-b8-s64", "tiny", 8, 64),
    point("tiny-b8-s128", "tiny", 8, 128),
    point("tiny-b16-s128", "tiny", 16, 128),
    point("tiny-b4-s256", "tiny", 4, 256),
    accum(point("tiny-b8-s128-accum2", "tiny", 8, 128), 2),
    adafactor(point("tiny-b8-s128-adafactor", "tiny", 8, 128)),
    bf16(point("tiny-b8-s128-bf16", "tiny", 8, 128)),
    ckpt(point("tiny-b8-s128-ckpt", "tiny", 8, 128)),
    ckpt(point("tiny-b16-s128-ckpt", "tiny", 16, 128)),
    point("small-b2-s32", "t5-small", 2, 32),
    point("small-b4-s64", "t5-small", 4, 64),
    point("small-b8-s128", "t5-small", 8, 128),
    accum(point("small-b4-s64-accum2", "t5-small", 4, 64), 2),
    adafactor(point("small-b8-s128-adafactor", "t5-small", 8, 128)),
    bf16(point("small-b4-s128-bf16", "t5-small", 4, 128)),
    frozen_encoder(point("small-b8-s128-frozen-encoder", "t5-small", 8, 128)),
    ckpt(point("small-b8-s128-ckpt", "t5-small", 8, 128)),
    bf16(ckpt(point("small-b8-s128-bf16-ckpt", "t5-small", 8, 128))),
    point("chatlm-b2-s64", "chatlm-mini", 2, 64),
    point("chatlm-b4-s128", "chatlm-mini", 4, 128),
    bf16(point("chatlm-b4-s128-bf16", "chatlm-mini", 4, 128)),
    ckpt(point("chatlm-b4-s128-ckpt", "chatlm-mini", 4, 128)),
    point("bert-small-b8-s128", "bert-small", 8, 128),
    point("bert-small-b32-s128", "bert-small", 32, 128),
    point("bert-small-b8-s512", "bert-small", 8, 512),
    bf16(point("bert-small-b16-s256-bf16", "bert-small", 16, 256)),
    ckpt(point("bert-small-b16-s256-ckpt", "bert-small", 16, 256)),
    bf16(ckpt(point(
        "bert-small-b16-s256-bf16-ckpt",
        "bert-small",
        16,
        256,
    ))),
    point("bert-base-b4-s128", "bert-base-chinese", 4, 128),
    point("bert-base-b8-s256", "bert-base-chinese", 8, 256),
    bf16(point("bert-base-b8-s256-bf16", "bert-base-chinese", 8, 256)),
    ckpt(point("bert-base-b8-s256-ckpt", "bert-base-chinese", 8, 256)),
    bf16(ckpt(point(
        "bert-base-b4-s512-bf16-ckpt",
        "bert-base-chinese",
        4,
        512,
    ))),
    lora(point("qwen2-small-b4-s256-lora", "qwen2-small", 4, 256)),
    lora(point("qwen2-small-b8-s512-lora", "qwen2-small", 8, 512)),
    lora(point("qwen2-small-b2-s1024-lora", "qwen2-small", 2, 1024)),
    base_bf16(lora(point(
        "qwen2-small-b4-s256-lora-base-bf16",
        "qwen2-small",
        4,
        256,
    ))),
    base_bf16(lora(point(
        "qwen2-small-b8-s512-lora-base-bf16",
        "qwen2-small",
        8,
        512,
    ))),
    ckpt(lora(point(
        "qwen2-small-b8-s512-lora-ckpt",
        "qwen2-small",
        8,
        512,
    ))),
    ckpt(base_bf16(lora(point(
        "qwen2-small-b8-s512-lora-base-bf16-ckpt",
        "qwen2-small",
        8,
        512,
    )))),
    base_bf16(lora(point(
        "qwen0.5b-b2-s256-lora-base-bf16",
        "qwen2.5-0.5b",
        2,
        256,
    ))),
    ckpt(lora(point(
        "qwen0.5b-b2-s256-lora-ckpt",
        "qwen2.5-0.5b",
        2,
        256,
    ))),
];

/// The family of a point's model, as `memfit bench memory-grid --family` names it: `t5`, `bert`
/// or `decoder`.
pub fn family_of(p: &Point) -> &'static str {
    match p.model {
        "tiny" | "chatlm-mini" => "t5",
        m if m.starts_with("t5") => "t5",
        m if m.starts_with("bert") => "bert",
        _ => "decoder",
    }
}

/// Steps and threads of every measurement (the first 3 steps are `memfit bench train`'s warm-up;
/// the peak is reached once the optimizer states exist, from the second step on).
pub const STEPS: u64 = 4;
pub const THREADS: u64 = 2;

/// The dimensions a measurement ran with (from the trainer's resolved config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dims {
    /// The config's `model_type`: `t5`, `bert`, `qwen2`, …
    pub family: String,
    pub vocab: u64,
    pub d_model: u64,
    /// Per-head width.
    pub d_kv: u64,
    pub d_ff: u64,
    pub heads: u64,
    /// Key/value heads (grouped attention; = heads elsewhere).
    pub kv_heads: u64,
    /// Encoder blocks (T5, BERT).
    pub layers: u64,
    /// Decoder blocks (T5, decoder-only models).
    pub decoder_layers: u64,
    /// The LM head is the embedding table.
    pub tied: bool,
}

/// One measured point: what the CSV holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    pub point: Point,
    pub dims: Dims,
    pub threads: u64,
    pub steps: u64,
    pub peak_rss_bytes: u64,
    pub sec_per_step: f64,
}

/// The CSV columns, in order. Files written before `family`, `kv_heads`, `tied`, `method`,
/// `lora_r` and `base_precision` existed read with those empty: T5 points, full training.
pub const CSV_HEADER: &str = "id,model,family,vocab,d_model,d_kv,d_ff,heads,kv_heads,layers,decoder_layers,tied,batch,seq,tgt_seq,accum,precision,optimizer,grad_ckpt,freeze,method,lora_r,base_precision,threads,steps,peak_rss_bytes,sec_per_step";

impl Measured {
    pub fn csv_line(&self) -> String {
        let p = &self.point;
        let d = &self.dims;
        let (method, lora_r, base) = if p.lora {
            let base = if p.base_bf16 { "bf16" } else { "fp32" };
            ("lora", LORA_R.to_string(), base)
        } else {
            ("full", String::new(), "")
        };
        let fields = [
            p.id.to_string(),
            p.model.to_string(),
            d.family.clone(),
            d.vocab.to_string(),
            d.d_model.to_string(),
            d.d_kv.to_string(),
            d.d_ff.to_string(),
            d.heads.to_string(),
            d.kv_heads.to_string(),
            d.layers.to_string(),
            d.decoder_layers.to_string(),
            d.tied.to_string(),
            p.batch.to_string(),
            p.seq.to_string(),
            p.seq.to_string(),
            p.accum.to_string(),
            p.precision.to_string(),
            p.optimizer.to_string(),
            p.grad_ckpt.to_string(),
            if p.freeze_encoder { "encoder" } else { "" }.to_string(),
            method.to_string(),
            lora_r,
            base.to_string(),
            self.threads.to_string(),
            self.steps.to_string(),
            self.peak_rss_bytes.to_string(),
            format!("{:.3}", self.sec_per_step),
        ];
        fields.join(",")
    }
}

/// The whole CSV file.
pub fn csv(rows: &[Measured]) -> String {
    let mut s = String::from(CSV_HEADER);
    s.push('\n');
    for r in rows {
        s += &r.csv_line();
        s.push('\n');
    }
    s
}

/// `existing` (a grid CSV, in this header or an older one) with `measured` added, each replacing
/// the row of its id: the CSV after measuring part of the grid. Rows come in [`POINTS`] order,
/// then rows of ids no longer in the grid, as they were.
pub fn merge(existing: &str, measured: &[Measured]) -> Result<String, String> {
    let old = if existing.trim().is_empty() {
        Vec::new()
    } else {
        parse_csv(existing)?
    };
    let columns: Vec<&str> = CSV_HEADER.split(',').collect();
    let mut lines: Vec<(String, String)> = old
        .iter()
        .map(|r| {
            let cells: Vec<&str> = columns
                .iter()
                .map(|c| match (*c, field(r, c)) {
                    ("family", "") => "t5",
                    ("method", "") => "full",
                    (_, v) => v,
                })
                .collect();
            (field(r, "id").to_string(), cells.join(","))
        })
        .collect();
    for m in measured {
        match lines.iter_mut().find(|(id, _)| id == m.point.id) {
            Some(line) => line.1 = m.csv_line(),
            None => lines.push((m.point.id.to_string(), m.csv_line())),
        }
    }
    let rank = |id: &str| {
        POINTS
            .iter()
            .position(|p| p.id == id)
            .unwrap_or(POINTS.len())
    };
    lines.sort_by_key(|(id, _)| rank(id));
    let mut s = String::from(CSV_HEADER);
    s.push('\n');
    for (_, line) in lines {
        s += &line;
        s.push('\n');
    }
    Ok(s)
}

/// A measured row compared with the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Compared {
    pub id: String,
    /// "t5-small b8 s128 fp32 adamw ckpt" — the setup in a few words.
    pub setup: String,
    pub measured_bytes: u64,
    pub predicted_bytes: u64,
    /// (predicted − measured) / measured
    pub error: f64,
    /// The point is in the half the fitted constants were fitted to ([`fit::is_fit_point`]): its
    /// error is a fit's residual, not a validation.
    pub fit_point: bool,
}

fn field<'a>(r: &'a Record, k: &str) -> &'a str {
    r.get(k).map(String::as_str).unwrap_or("")
}

fn number(r: &Record, k: &str) -> Result<u64, String> {
    field(r, k).parse().map_err(|_| {
        format!(
            "{}: {k} = {:?} is not a number",
            field(r, "id"),
            field(r, k)
        )
    })
}

/// The row's `family` (`model_type`); rows from before the column are T5.
fn family(r: &Record) -> &str {
    match field(r, "family") {
        "" => "t5",
        f => f,
    }
}

/// The architecture of a row, built from its family and dimension columns as the trainer built
/// the model (`memfit bench train`'s configs: BERT with 512 positions and 2 labels).
pub fn row_arch(r: &Record) -> Result<Arch, String> {
    let config = match family(r) {
        "t5" => json!({
            "model_type": "t5",
            "vocab_size": number(r, "vocab")?, "d_model": number(r, "d_model")?,
            "d_kv": number(r, "d_kv")?, "d_ff": number(r, "d_ff")?,
            "num_heads": number(r, "heads")?, "num_layers": number(r, "layers")?,
            "num_decoder_layers": number(r, "decoder_layers")?,
            "feed_forward_proj": "relu", "dropout_rate": 0.1, "is_encoder_decoder": true,
        }),
        "bert" => json!({
            "model_type": "bert",
            "vocab_size": number(r, "vocab")?, "hidden_size": number(r, "d_model")?,
            "num_hidden_layers": number(r, "layers")?,
            "num_attention_heads": number(r, "heads")?,
            "intermediate_size": number(r, "d_ff")?, "max_position_embeddings": 512,
            "type_vocab_size": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1, "num_labels": 2,
            "architectures": ["BertForSequenceClassification"],
        }),
        "qwen2" | "llama" | "mistral" => json!({
            "model_type": family(r),
            "vocab_size": number(r, "vocab")?, "hidden_size": number(r, "d_model")?,
            "head_dim": number(r, "d_kv")?, "intermediate_size": number(r, "d_ff")?,
            "num_attention_heads": number(r, "heads")?,
            "num_key_value_heads": number(r, "kv_heads")?,
            "num_hidden_layers": number(r, "decoder_layers")?,
            "tie_word_embeddings": field(r, "tied") == "true", "hidden_act": "silu",
        }),
        other => {
            return Err(format!(
                "{}: family {other:?} not understood",
                field(r, "id")
            ));
        }
    };
    let name = field(r, "model");
    let arch =
        arch::config::from_value("memfit_grid.csv", &config, name).map_err(|e| e.to_string())?;
    Ok(arch.with_task(row_task(r)?))
}

/// The task a row's family trains for in `memfit bench train`.
fn row_task(r: &Record) -> Result<Task, String> {
    match family(r) {
        "t5" => Ok(Task::Seq2seq),
        "bert" => Ok(Task::Classification),
        "qwen2" | "llama" | "mistral" => Ok(Task::CausalLm),
        other => Err(format!(
            "{}: family {other:?} not understood",
            field(r, "id")
        )),
    }
}

/// The memfit-runtime setup of a row (CPU, token store, no loader workers).
pub fn row_setup(r: &Record, arch: &Arch) -> Result<Setup, String> {
    let id = field(r, "id");
    let bad = |k: &str| format!("{id}: {k} = {:?} not understood", field(r, k));
    let mut s = Setup::new(arch);
    s.task = row_task(r)?;
    s.batch = number(r, "batch")?;
    s.seq = number(r, "seq")?;
    s.tgt_seq = if s.task == Task::Seq2seq {
        number(r, "tgt_seq")?
    } else {
        0
    };
    s.accum = number(r, "accum")?;
    s.precision = Precision::parse(field(r, "precision")).ok_or_else(|| bad("precision"))?;
    s.optimizer = Optimizer::parse(field(r, "optimizer")).ok_or_else(|| bad("optimizer"))?;
    s.grad_ckpt = match field(r, "grad_ckpt") {
        "true" => true,
        "false" => false,
        _ => return Err(bad("grad_ckpt")),
    };
    match field(r, "freeze") {
        "" => {}
        f => {
            s.freeze = f
                .split(';')
                .map(|g| FreezeGroup::parse(g).ok_or_else(|| bad("freeze")))
                .collect::<Result<_, _>>()?;
            s.method = Method::Freeze;
        }
    }
    match field(r, "method") {
        "" | "full" => {}
        "lora" => {
            s.method = Method::Lora;
            s.lora_r = number(r, "lora_r")?;
            s.lora_alpha = 2 * s.lora_r;
            s.lora_targets = memfit_lora_targets();
            s.base_precision = match field(r, "base_precision") {
                "bf16" => Some(Precision::Bf16),
                "fp32" | "" => Some(Precision::Fp32),
                _ => return Err(bad("base_precision")),
            };
        }
        _ => return Err(bad("method")),
    }
    s.device = Device::Cpu;
    s.runtime = Runtime::Memfit;
    s.dataset = DatasetMode::TokenStore;
    Ok(s)
}

/// The projections `memfit bench train --method lora` adapts by default: every linear of a block.
pub fn memfit_lora_targets() -> Vec<LoraTarget> {
    use LoraTarget::*;
    vec![Q, K, V, O, Gate, Up, Down]
}

/// Predicted training-phase peak RSS of a row (no checkpoint is written while benchmarking).
pub fn predict(r: &Record) -> Result<u64, String> {
    let arch = row_arch(r)?;
    let setup = row_setup(r, &arch)?;
    let est = memory::estimate(&arch, &setup, &Framework::default())
        .map_err(|e| format!("{}: {e}", field(r, "id")))?;
    Ok(est.host.train_rss_bytes)
}

/// Every row of `validation/memfit_grid.csv` (its text) against the model.
pub fn compare(text: &str) -> Result<Vec<Compared>, String> {
    let rows = parse_csv(text)?;
    rows.iter()
        .zip(fit::is_fit_point(&rows))
        .map(|(r, fit_point)| {
            let predicted = predict(r)?;
            let measured = number(r, "peak_rss_bytes")?;
            if measured == 0 {
                return Err(format!("{}: peak_rss_bytes is 0", field(r, "id")));
            }
            let mut setup = format!(
                "{} b{} s{}",
                field(r, "model"),
                field(r, "batch"),
                field(r, "seq")
            );
            if field(r, "accum") != "1" {
                setup += &format!(" accum {}", field(r, "accum"));
            }
            setup += &format!(" {} {}", field(r, "precision"), field(r, "optimizer"));
            if field(r, "grad_ckpt") == "true" {
                setup += " ckpt";
            }
            if !field(r, "freeze").is_empty() {
                setup += &format!(" frozen {}", field(r, "freeze"));
            }
            if field(r, "method") == "lora" {
                setup += &format!(
                    " lora r{} base {}",
                    field(r, "lora_r"),
                    field(r, "base_precision")
                );
            }
            Ok(Compared {
                id: field(r, "id").to_string(),
                setup,
                measured_bytes: measured,
                predicted_bytes: predicted,
                error: (predicted as f64 - measured as f64) / measured as f64,
                fit_point,
            })
        })
        .collect()
}

/// Largest |error| over the rows.
pub fn worst_abs_error(rows: &[Compared]) -> f64 {
    rows.iter().map(|r| r.error.abs()).fold(0.0, f64::max)
}

/// The held-out points only: the ones that validate the fit.
pub fn held_out(rows: &[Compared]) -> Vec<Compared> {
    rows.iter().filter(|r| !r.fit_point).cloned().collect()
}

/// The markdown table: one line per point.
pub fn markdown_table(rows: &[Compared]) -> String {
    let mib = (1u64 << 20) as f64;
    let mut s = String::from(
        "| point | half | setup | measured (MiB) | predicted (MiB) | error |\n| --- | --- | --- | ---: | ---: | ---: |\n",
    );
    for r in rows {
        s += &format!(
            "| {} | {} | {} | {:.0} | {:.0} | {:+.1}% |\n",
            r.id,
            if r.fit_point { "fit" } else { "held out" },
            r.setup,
            r.measured_bytes as f64 / mib,
            r.predicted_bytes as f64 / mib,
            100.0 * r.error
        );
    }
    s
}

/// The command that measures the grid (and rewrites the CSV).
pub const MEASURE: &str =
    "cargo run --release -p memfit -- bench memory-grid --out validation/memfit_grid.csv";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_unique_and_cover_the_axes() {
        let mut ids: Vec<_> = POINTS.iter().map(|p| p.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), POINTS.len());
        assert!(POINTS.len() >= 12);
        for model in ["tiny", "t5-small", "chatlm-mini"] {
            assert!(POINTS.iter().any(|p| p.model == model && p.grad_ckpt));
            assert!(POINTS.iter().any(|p| p.model == model && !p.grad_ckpt));
        }
    }

    #[test]
    fn csv_round_trips_through_the_comparison() {
        let m = Measured {
            point: POINTS[2],
            dims: Dims {
                family: "t5".into(),
                vocab: 8000,
                d_model: 256,
                d_kv: 64,
                d_ff: 1024,
                heads: 4,
                kv_heads: 4,
                layers: 4,
                decoder_layers: 4,
                tied: true,
            },
            threads: 2,
            steps: 4,
            peak_rss_bytes: 600 << 20,
            sec_per_step: 1.5,
        };
        let rows = compare(&csv(&[m])).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].id, "tiny-b8-s128");
        assert!(rows[0].predicted_bytes > 100 << 20);
        let bad = csv(&[])
            + "x,tiny,t5,8000,256,64,1024,4,4,4,4,true,8,128,128,1,fp64,adamw,false,,full,,,2,4,1,1\n";
        assert!(compare(&bad).unwrap_err().contains("precision"));
    }

    /// A CSV from before the `family` column still reads (as T5), and merging re-measured points
    /// into it keeps the others, in the grid's order.
    #[test]
    fn old_rows_read_as_t5_and_merge_keeps_them() {
        let old = "id,model,vocab,d_model,d_kv,d_ff,heads,layers,decoder_layers,batch,seq,tgt_seq,accum,precision,optimizer,grad_ckpt,freeze,threads,steps,peak_rss_bytes,sec_per_step\n\
            tiny-b8-s128,tiny,8000,256,64,1024,4,4,4,8,128,128,1,fp32,adamw,false,,2,4,339787776,0.493\n\
            tiny-b1-s8,tiny,8000,256,64,1024,4,4,4,1,8,8,1,fp32,adamw,false,,2,4,172527616,0.039\n";
        let before = compare(old).unwrap();
        let bert = POINTS.iter().find(|p| p.model == "bert-small").unwrap();
        let m = Measured {
            point: *bert,
            dims: Dims {
                family: "bert".into(),
                vocab: 21128,
                d_model: 256,
                d_kv: 64,
                d_ff: 1024,
                heads: 4,
                kv_heads: 4,
                layers: 4,
                decoder_layers: 0,
                tied: false,
            },
            threads: 2,
            steps: 4,
            peak_rss_bytes: 300 << 20,
            sec_per_step: 1.0,
        };
        let merged = merge(old, &[m]).unwrap();
        let after = compare(&merged).unwrap();
        let ids: Vec<&str> = after.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["tiny-b1-s8", "tiny-b8-s128", bert.id]);
        assert_eq!(after[1].predicted_bytes, before[0].predicted_bytes);
        assert!(merged.lines().nth(1).unwrap().contains(",t5,"));
    }
}
