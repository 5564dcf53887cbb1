//! `memfit bench matmul`: each matrix product of a model's training step timed alone on the device
//! (`memfit_train::bench::matmul`); `scripts/gpu/matmul_torch.py` times the same list with
//! `torch.matmul` on the same card.

use memfit_train::bench::{self, matmul};
use memfit_train::device::DeviceRequest;
use memfit_train::engine::Precision;
use serde_json::json;

use crate::exit::{Outcome, bad_input};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model: as `bench train --model` (tiny, bert-small, qwen2-small, a preset or a config.json).
    #[arg(long)]
    model: String,
    /// full (every weight trains) or lora (adapters on a frozen base: its weights get no gradient).
    #[arg(long, value_parser = ["full", "lora"], default_value = "full")]
    method: String,
    #[arg(long, default_value_t = 16)]
    lora_r: usize,
    #[arg(long, value_delimiter = ',', default_value = "q,k,v,o,gate,up,down")]
    lora_targets: Vec<String>,
    /// Rows of the micro-batch.
    #[arg(long)]
    batch: usize,
    /// Source (encoder) or text tokens per row.
    #[arg(long)]
    seq: usize,
    /// Target tokens per row (encoder-decoder; default: --seq).
    #[arg(long)]
    tgt_seq: Option<usize>,
    #[arg(long, value_parser = ["fp32", "bf16"], default_value = "bf16")]
    precision: String,
    /// What to compute on: auto, cpu, cuda, cuda:N.
    #[arg(long, default_value = "auto", value_parser = |s: &str| s.parse::<DeviceRequest>())]
    device: DeviceRequest,
    /// Timed runs of each product (after 3 untimed ones), each waited for; the median is reported.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// One JSON object a product instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Outcome {
    if args.batch == 0 || args.seq == 0 || args.iters == 0 || args.tgt_seq == Some(0) {
        return Err(bad_input(
            "--batch, --seq, --tgt-seq and --iters must be > 0",
        ));
    }
    let device =
        memfit_train::device::resolve(&args.device).map_err(|e| bad_input(e.to_string()))?;
    if device.rank_count() > 1 {
        return Err(bad_input(format!(
            "--device {}: bench matmul measures one device",
            args.device
        )));
    }
    let config =
        bench::resolve_model(&args.model).map_err(|e| bad_input(format!("--model: {e}")))?;
    let arch = memfit_plan::arch::config::from_value(&args.model, &config, &args.model)
        .map_err(|e| bad_input(format!("--model: {e}")))?;
    let trained = match args.method.as_str() {
        "lora" if args.lora_r == 0 => return Err(bad_input("--lora-r must be > 0")),
        "lora" => matmul::Trained::Lora {
            r: args.lora_r,
            targets: args.lora_targets.clone(),
        },
        _ => matmul::Trained::All,
    };
    let shape = matmul::StepShape {
        batch: args.batch,
        seq: args.seq,
        tgt_seq: args.tgt_seq.unwrap_or(args.seq),
    };
    let gemms = matmul::training_gemms(&arch, shape, &trained).map_err(bad_input)?;
    let precision = if args.precision == "bf16" {
        Precision::Bf16
    } else {
        Precision::Fp32
    };
    let dtype = precision.dtype();
    let on = device.backend.device();
    if !on.supports_dtype(dtype) {
        return Err(bad_input(format!(
            "--precision {}: {} has no {dtype:?}",
            args.precision, device.label
        )));
    }
    if !args.json {
        println!(
            "{} b{} s{} {} on {}: {} products",
            args.model,
            args.batch,
            args.seq,
            args.precision,
            device.label,
            gemms.len()
        );
        println!(
            "{:>6} {:>6} {:>6} {:>6} {:>3} {:>5} {:>10} {:>8} {:>6}  what",
            "batch", "m", "k", "n", "lay", "count", "us", "TFLOP/s", "share"
        );
    }
    let mut rows = Vec::with_capacity(gemms.len());
    for gemm in &gemms {
        rows.push(
            matmul::time_gemm(gemm, &on, dtype, (3, args.iters)).map_err(anyhow::Error::from)?,
        );
    }
    let step_s: f64 = rows
        .iter()
        .map(|r| r.seconds_median * r.gemm.count as f64)
        .sum();
    for r in &rows {
        let share = r.seconds_median * r.gemm.count as f64 / step_s.max(f64::MIN_POSITIVE);
        let g = &r.gemm;
        if args.json {
            let mut v = serde_json::to_value(r).map_err(anyhow::Error::from)?;
            v["layout"] = json!(g.layout());
            v["share_of_products"] = json!(share);
            v["setup"] = json!({"model": args.model, "method": args.method, "batch": args.batch, "seq": args.seq,
                "tgt_seq": shape.tgt_seq, "precision": args.precision, "device": device.label});
            println!("{v}");
        } else {
            let what: String = g.what.chars().take(60).collect();
            let cut = if what.len() < g.what.len() { "…" } else { "" };
            println!(
                "{:>6} {:>6} {:>6} {:>6} {:>3} {:>5} {:>10.1} {:>8.2} {:>5.1}%  {:?} {what}{cut}",
                g.batch,
                g.m,
                g.k,
                g.n,
                g.layout(),
                g.count,
                r.seconds_median * 1e6,
                r.tflops,
                share * 100.0,
                g.pass
            );
        }
    }
    if !args.json {
        println!(
            "all products of one step, one after the other: {:.3} ms",
            step_s * 1e3
        );
    }
    Ok(std::process::ExitCode::SUCCESS)
}
