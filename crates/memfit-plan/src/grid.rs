//! The memory grid of memfit's own trainer: the points `memfit bench memory-grid` measures (each
//! one `memfit bench train` process), the CSV it writes (`validation/memfit_grid.csv`), and the
//! comparison of each measured peak RSS with [`crate::memory::memfit_host`]'s prediction.
//!
//! The CSV carries the model's dimensions, so the comparison needs nothing but the file.

use crate::Task;
use crate::arch::{self, Arch};
use crate::memory::{self, DatasetMode, Device, Framework, FreezeGroup, Method, Runtime, Setup};
use crate::memory::{Optimizer, Precision};
use crate::validation::{Record, parse_csv};
use serde_json::json;

/// One grid point: a `memfit bench train` invocation (target length = source length).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub id: &'static str,
    /// `tiny` or a T5 preset name, as `memfit bench train --model` takes it.
    pub model: &'static str,
    pub batch: u64,
    pub seq: u64,
    pub accum: u64,
    pub precision: Precision,
    pub optimizer: Optimizer,
    pub grad_ckpt: bool,
    pub freeze_encoder: bool,
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

/// The grid: three model sizes (tiny = 9.4M, t5-small = 60.5M, chatlm-mini = 187.7M parameters) ×
/// micro-batch × length, with checkpointing, accumulation, Adafactor, bf16 (also with
/// checkpointing) and a frozen encoder. It runs in about twenty minutes on two busy cores.
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
];

/// Steps and threads of every measurement (the first 3 steps are `memfit bench train`'s warm-up;
/// the peak is reached once the optimizer states exist, from the second step on).
pub const STEPS: u64 = 4;
pub const THREADS: u64 = 2;

/// The T5 dimensions a measurement ran with (from the trainer's resolved config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub vocab: u64,
    pub d_model: u64,
    pub d_kv: u64,
    pub d_ff: u64,
    pub heads: u64,
    pub layers: u64,
    pub decoder_layers: u64,
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

/// The CSV columns, in order.
pub const CSV_HEADER: &str = "id,model,vocab,d_model,d_kv,d_ff,heads,layers,decoder_layers,batch,seq,tgt_seq,accum,precision,optimizer,grad_ckpt,freeze,threads,steps,peak_rss_bytes,sec_per_step";

impl Measured {
    pub fn csv_line(&self) -> String {
        let p = &self.point;
        let d = &self.dims;
        format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.3}",
            p.id,
            p.model,
            d.vocab,
            d.d_model,
            d.d_kv,
            d.d_ff,
            d.heads,
            d.layers,
            d.decoder_layers,
            p.batch,
            p.seq,
            p.seq,
            p.accum,
            p.precision,
            p.optimizer,
            p.grad_ckpt,
            if p.freeze_encoder { "encoder" } else { "" },
            self.threads,
            self.steps,
            self.peak_rss_bytes,
            self.sec_per_step
        )
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

/// The architecture of a row: a T5 built from its dimension columns.
pub fn row_arch(r: &Record) -> Result<Arch, String> {
    let config = json!({
        "model_type": "t5",
        "vocab_size": number(r, "vocab")?, "d_model": number(r, "d_model")?,
        "d_kv": number(r, "d_kv")?, "d_ff": number(r, "d_ff")?, "num_heads": number(r, "heads")?,
        "num_layers": number(r, "layers")?, "num_decoder_layers": number(r, "decoder_layers")?,
        "feed_forward_proj": "relu", "dropout_rate": 0.1, "is_encoder_decoder": true,
    });
    let name = field(r, "model");
    arch::config::from_value("memfit_grid.csv", &config, name).map_err(|e| e.to_string())
}

/// The memfit-runtime setup of a row (CPU, token store, no loader workers).
pub fn row_setup(r: &Record, arch: &Arch) -> Result<Setup, String> {
    let id = field(r, "id");
    let bad = |k: &str| format!("{id}: {k} = {:?} not understood", field(r, k));
    let mut s = Setup::new(arch);
    s.task = Task::Seq2seq;
    s.batch = number(r, "batch")?;
    s.seq = number(r, "seq")?;
    s.tgt_seq = number(r, "tgt_seq")?;
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
    s.device = Device::Cpu;
    s.runtime = Runtime::Memfit;
    s.dataset = DatasetMode::TokenStore;
    Ok(s)
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
    parse_csv(text)?
        .iter()
        .map(|r| {
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
            Ok(Compared {
                id: field(r, "id").to_string(),
                setup,
                measured_bytes: measured,
                predicted_bytes: predicted,
                error: (predicted as f64 - measured as f64) / measured as f64,
            })
        })
        .collect()
}

/// Largest |error| over the rows.
pub fn worst_abs_error(rows: &[Compared]) -> f64 {
    rows.iter().map(|r| r.error.abs()).fold(0.0, f64::max)
}

/// The markdown table: one line per point.
pub fn markdown_table(rows: &[Compared]) -> String {
    let mib = (1u64 << 20) as f64;
    let mut s = String::from(
        "| point | setup | measured (MiB) | predicted (MiB) | error |\n| --- | --- | ---: | ---: | ---: |\n",
    );
    for r in rows {
        s += &format!(
            "| {} | {} | {:.0} | {:.0} | {:+.1}% |\n",
            r.id,
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
                vocab: 8000,
                d_model: 256,
                d_kv: 64,
                d_ff: 1024,
                heads: 4,
                layers: 4,
                decoder_layers: 4,
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
        let bad =
            csv(&[]) + "x,tiny,8000,256,64,1024,4,4,4,8,128,128,1,fp64,adamw,false,,2,4,1,1\n";
        assert!(compare(&bad).unwrap_err().contains("precision"));
    }
}
