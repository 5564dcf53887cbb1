//! `memfit bench train`: throughput and peak memory of the trainer on synthetic tokens, seq2seq (T5)
//! or classification (BERT family) (docs/architecture.md §3). All logic is in `memfit_train::bench`; this
//! parses, calls it, prints.

use memfit_train::device::DeviceRequest;
use std::process::ExitCode;

use anyhow::Context;
use memfit_nn::ModelError;
use memfit_nn::families::Training;
use memfit_nn::layers::lora::LoraSettings;
use memfit_train::bench::{self, BenchSetup};
use memfit_train::engine::Precision;

use crate::exit::{Outcome, bad_input};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model: `tiny` (a T5: vocab 8000, d_model 256, d_ff 1024, 4+4 layers, 4 heads),
    /// `bert-small` (bench_bert_cls.py's: vocab 21128, hidden 256, 4 layers, 4 heads), a preset
    /// (t5-small, chatlm-mini, bert-base-chinese, …) or a config.json.
    #[arg(long)]
    model: String,
    /// The task the model trains for (default: its family's; a mismatch is an error).
    #[arg(long, value_parser = ["seq2seq", "classification", "causal-lm"])]
    task: Option<String>,
    /// Causal LM: full (every weight) or lora (adapters on a frozen base).
    #[arg(long, value_parser = ["full", "lora"], default_value = "full")]
    method: String,
    /// LoRA rank, alpha, dropout and targets (bench_causal_lora.py's defaults).
    #[arg(long, default_value_t = 16)]
    lora_r: usize,
    #[arg(long, default_value_t = 32.0)]
    lora_alpha: f64,
    #[arg(long, default_value_t = 0.05)]
    lora_dropout: f64,
    #[arg(long, value_delimiter = ',', default_value = "q,k,v,o,gate,up,down")]
    lora_targets: Vec<String>,
    /// The frozen base's precision under LoRA.
    #[arg(long, value_parser = ["fp32", "bf16"], default_value = "fp32")]
    base_precision: String,
    /// The model's dropout (T5 `dropout_rate`, BERT's hidden and attention, a decoder's attention;
    /// default: the model's). memfit's GPU kernels draw the CPU's masks; a build with burn's fusion
    /// draws its own, and `--dropout 0 --lora-dropout 0` compares it with the CPU.
    #[arg(long)]
    dropout: Option<f64>,
    /// Causal LM: the share of each row that is prompt (masked out of the loss).
    #[arg(long, default_value_t = 0.5)]
    prompt_frac: f64,
    /// Micro-batch size (rows).
    #[arg(long)]
    batch: usize,
    /// Source (encoder) length in tokens; for classification, the text's (with [CLS] and [SEP]).
    #[arg(long)]
    seq: usize,
    /// Target (decoder) length in tokens (default: --seq).
    #[arg(long)]
    tgt_seq: Option<usize>,
    /// Micro-batches per optimizer step.
    #[arg(long, default_value_t = 1)]
    accum: usize,
    /// Optimizer steps, the first 3 of which are warm-up and excluded from the median.
    #[arg(long, default_value_t = 10)]
    steps: usize,
    /// Compute threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// What to compute on: auto, cpu, cuda, cuda:N (as `memfit train --device`).
    #[arg(long, default_value = "auto", value_parser = |s: &str| s.parse::<DeviceRequest>())]
    device: DeviceRequest,
    /// Per-block gradient checkpointing (recompute each block in backward).
    #[arg(long)]
    grad_ckpt: bool,
    #[arg(long, value_parser = ["fp32", "bf16"], default_value = "fp32")]
    precision: String,
    #[arg(long, value_parser = ["adamw", "adafactor"], default_value = "adamw")]
    optimizer: String,
    /// Frozen groups, comma-separated (T5: embeddings, encoder, decoder, lm_head; BERT:
    /// embeddings, encoder, pooler, head).
    #[arg(long, value_delimiter = ',')]
    freeze: Vec<String>,
    /// Seed of the initial weights, the tokens and dropout.
    #[arg(long, default_value_t = 1234)]
    seed: u64,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Outcome {
    // a training step reuses what the last one freed (memfit_train::malloc_tuning)
    memfit_train::malloc_tuning::keep_freed_memory();
    let device =
        memfit_train::device::resolve(&args.device).map_err(|e| bad_input(e.to_string()))?;
    if device.rank_count() > 1 {
        return Err(bad_input(format!(
            "--device {}: bench train measures one device; data-parallel runs are `memfit train`'s",
            args.device
        )));
    }
    let mut config =
        bench::resolve_model(&args.model).map_err(|e| bad_input(format!("--model: {e}")))?;
    if let Some(p) = args.dropout {
        bench::set_dropout(&mut config, p).map_err(|e| bad_input(format!("--dropout: {e}")))?;
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let setup = BenchSetup {
        model_name: args.model.clone(),
        model_config: config,
        batch: args.batch,
        src_len: args.seq,
        tgt_len: args.tgt_seq.unwrap_or(args.seq),
        accum: args.accum,
        steps: args.steps,
        threads,
        grad_ckpt: args.grad_ckpt,
        precision: if args.precision == "bf16" {
            Precision::Bf16
        } else {
            Precision::Fp32
        },
        optimizer: args.optimizer.clone(),
        freeze: args.freeze.clone(),
        seed: args.seed,
        training: match args.method.as_str() {
            "lora" => Training::Lora {
                settings: LoraSettings {
                    r: args.lora_r,
                    alpha: args.lora_alpha,
                    dropout: args.lora_dropout,
                    use_rslora: false,
                },
                targets: args.lora_targets.clone(),
                base_bf16: args.base_precision == "bf16",
            },
            _ => Training::Full,
        },
        prompt_frac: args.prompt_frac,
        device,
    };
    let task = setup.task().map_err(|e| bad_input(e.to_string()))?;
    if let Some(asked) = args.task.as_deref().filter(|t| *t != task.name()) {
        return Err(bad_input(format!(
            "--task {asked}: model {} trains for {} (its model_type's family)",
            args.model,
            task.name()
        )));
    }
    let quiet = args.json;
    let report = bench::run(&setup, |step, loss, secs| {
        if !quiet {
            eprintln!("step {step:>3}  loss {loss:.4}  {secs:.3} s");
        }
    })
    .map_err(|e| match e {
        ModelError::Input(m) | ModelError::Config(m) => bad_input(m),
        other => anyhow::Error::new(other),
    })?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report).context("serialising the report")?
        );
    } else {
        println!(
            "{}: {:.3} s/step, {:.3} CPU-s/step (medians of {} after {} warm-up), {:.0} tokens/s, peak RSS {:.2} GiB, loss {:.4} -> {:.4}, {} threads",
            args.model,
            report.sec_per_step_median,
            report.cpu_sec_per_step_median,
            report.steps - report.warmup_steps,
            report.warmup_steps,
            report.tokens_per_s,
            report.peak_rss_bytes as f64 / (1u64 << 30) as f64,
            report.loss_first,
            report.loss_last,
            report.threads
        );
        if let Some(mfu) = report.mfu {
            println!(
                "MFU {:.1}% ({:.2} GFLOP/step over CPU-seconds × one core's peak f32 {:.1} GFLOP/s)",
                100.0 * mfu,
                report.model_flops_per_step / 1e9,
                report.cpu_peak_flops_per_core.unwrap_or(0.0) / 1e9
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
