//! `memfit bench train`: trains a T5 on seeded synthetic tokens for a fixed number of steps and
//! reports the median step time, tokens/s and peak RSS (DESIGN.md §3), counted as
//! `../shared/bench/pytorch/bench_t5.py` counts them, so the two can be compared side by side.

use std::time::Instant;

use serde::Serialize;
use serde_json::{Value, json};

use crate::engine::{Engine, Seq2SeqBatch};
use crate::optim::{AdafactorConfig, AdafactorLr, AdamWConfig, OptimizerConfig};
use crate::t5_engine::{EngineOptions, Precision, T5Engine, set_threads};
use memfit_nn::ModelError;
use memfit_nn::kernels::dropout::SplitMix64;
use memfit_nn::t5::T5Config;
use memfit_nn::t5::flops::t5_training_flops;
use memfit_plan::grid;

/// Steps excluded from the median, as bench_t5.py's `WARMUP`.
pub const WARMUP_STEPS: usize = 3;

/// Learning rate, weight decay and clipping of bench_t5.py's runs (lr 1e-3, AdamW weight decay 0.01,
/// clip 1.0).
const LR: f64 = 1e-3;
const MAX_GRAD_NORM: f64 = 1.0;

/// The first id bench_t5.py draws words from (`benchcommon.T5_FIRST_WORD`: after pad, eos, unk).
const FIRST_WORD: u32 = 3;

#[derive(Debug, Clone)]
pub struct BenchSetup {
    /// Name shown in the report (preset name or config path).
    pub model_name: String,
    pub config: T5Config,
    pub batch: usize,
    pub src_len: usize,
    pub tgt_len: usize,
    pub accum: usize,
    pub steps: usize,
    pub threads: usize,
    pub grad_ckpt: bool,
    pub precision: Precision,
    /// `adamw` or `adafactor` (external lr 1e-3, no parameter scaling, as bench_t5.py's `--optim adafactor`).
    pub optimizer: String,
    /// Frozen module groups (no gradients, no optimizer state).
    pub freeze: Vec<memfit_nn::t5::Group>,
    pub seed: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub sec_per_step_median: f64,
    /// Median CPU time (user + system, all threads) per step: the figure to compare on a busy machine.
    pub cpu_sec_per_step_median: f64,
    pub tokens_per_s: f64,
    pub peak_rss_bytes: u64,
    pub loss_first: f64,
    pub loss_last: f64,
    pub steps: usize,
    pub warmup_steps: usize,
    pub threads: usize,
    pub setup: Value,
    /// Every step's wall time, seconds.
    pub step_seconds: Vec<f64>,
    pub params_total: u64,
    /// Model FLOPs of one optimizer step (forward + backward matmuls; no recomputation).
    pub model_flops_per_step: f64,
    /// One core's peak FLOP/s for the run's products, measured on the core ([`crate::peak_flops`]):
    /// f32 FMA, or for bf16 the AVX512-BF16 dot product where the CPU has it.
    pub cpu_peak_flops_per_core: Option<f64>,
    /// How that peak was measured (instruction set and operation).
    pub cpu_peak_basis: String,
    /// Model FLOPs utilisation per CPU-second: model FLOPs ÷ (CPU-seconds × one core's peak). It
    /// equals the usual wall-clock MFU when every thread is busy, and stays comparable on a
    /// machine others are loading.
    pub mfu: Option<f64>,
}

/// A model spec on the command line: `tiny` (issue 6's configuration a: vocab 8000, d_model 256,
/// d_ff 1024, 4+4 layers, 4 heads; used until the planner's presets are wired in) or a config.json path.
pub fn resolve_model(spec: &str) -> Result<T5Config, ModelError> {
    if spec == "tiny" {
        return T5Config::from_json(&tiny_config_json());
    }
    // A planner preset (t5-small, chatlm-mini, …) unless a file of that name exists.
    let path = std::path::Path::new(spec);
    match memfit_plan::arch::preset_config_json(spec) {
        Some(config) if !path.exists() => T5Config::from_json(&config),
        _ => T5Config::from_file(path),
    }
}

/// Issue 6 configuration (a), shaped as bench_t5.py builds it (d_kv = d_model / heads).
pub fn tiny_config_json() -> Value {
    json!({
        "model_type": "t5", "vocab_size": 8000, "d_model": 256, "d_kv": 64, "d_ff": 1024,
        "num_layers": 4, "num_decoder_layers": 4, "num_heads": 4, "feed_forward_proj": "relu",
        "dropout_rate": 0.1, "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0
    })
}

fn optimizer_config(name: &str) -> Result<OptimizerConfig, ModelError> {
    match name {
        "adamw" => Ok(OptimizerConfig::AdamW(AdamWConfig::default())),
        "adafactor" => Ok(OptimizerConfig::Adafactor(AdafactorConfig {
            lr: AdafactorLr::External,
            scale_parameter: false,
            ..Default::default()
        })),
        other => Err(ModelError::Input(format!(
            "--optimizer {other:?}: expected adamw or adafactor"
        ))),
    }
}

/// Peak resident set size of this process (VmHWM in /proc/self/status), 0 where unavailable.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// CPU time of this process (user + system, all threads) from /proc/self/stat, seconds.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th of those.
    let rest = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    // USER_HZ: /proc reports clock ticks of 1/100 s on Linux (proc(5)).
    (ticks(11) + ticks(12)) / 100.0
}

/// Random tokens in `[FIRST_WORD, vocab)`, every row ending in EOS, no padding (bench_t5.py `--data random`).
fn synthetic_batch(
    rng: &mut SplitMix64,
    cfg: &T5Config,
    batch: usize,
    src: usize,
    tgt: usize,
) -> Seq2SeqBatch {
    let span = (cfg.vocab_size as u64)
        .saturating_sub(FIRST_WORD as u64)
        .max(1);
    let mut row = |len: usize| -> Vec<u32> {
        (0..batch)
            .flat_map(|_| {
                let mut r: Vec<u32> = (0..len)
                    .map(|_| FIRST_WORD + (rng.next_u64() % span) as u32)
                    .collect();
                if let Some(last) = r.last_mut() {
                    *last = cfg.eos_token_id;
                }
                r
            })
            .collect()
    };
    let input_ids = row(src);
    let labels = row(tgt);
    Seq2SeqBatch {
        batch,
        src_len: src,
        tgt_len: tgt,
        input_mask: vec![true; input_ids.len()],
        label_mask: vec![true; labels.len()],
        input_ids,
        labels,
    }
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Runs the benchmark; `on_step(step, loss, seconds)` is called after every optimizer step.
pub fn run(
    setup: &BenchSetup,
    mut on_step: impl FnMut(usize, f64, f64),
) -> Result<BenchReport, ModelError> {
    if setup.steps <= WARMUP_STEPS {
        return Err(ModelError::Input(format!(
            "--steps {}: must be more than the {WARMUP_STEPS} warm-up steps",
            setup.steps
        )));
    }
    if setup.batch == 0
        || setup.src_len == 0
        || setup.tgt_len == 0
        || setup.accum == 0
        || setup.threads == 0
    {
        return Err(ModelError::Input(
            "--batch, --seq, --tgt-seq, --accum and --threads must be > 0".into(),
        ));
    }
    set_threads(setup.threads)?;
    let options = EngineOptions {
        optimizer: optimizer_config(&setup.optimizer)?,
        precision: setup.precision,
        grad_ckpt: setup.grad_ckpt,
        freeze: setup.freeze.clone(),
        ..Default::default()
    };
    let mut engine = T5Engine::new(setup.config.clone(), options, setup.seed)?;
    let mut rng = SplitMix64::new(setup.seed ^ 0xDA7A);
    let mut seconds = Vec::with_capacity(setup.steps);
    let mut cpu = Vec::with_capacity(setup.steps);
    let mut losses = Vec::with_capacity(setup.steps);
    let mut micro = 0u64;
    // The core's peak, measured before and after the steps, the better kept: one measurement
    // can fall in a moment the VM's core is lent elsewhere.
    let bf16_peak = setup.precision == Precision::Bf16;
    let (peak_before, basis) = crate::peak_flops::peak_flops_per_core(bf16_peak);
    for step in 0..setup.steps {
        let batches: Vec<Seq2SeqBatch> = (0..setup.accum)
            .map(|_| {
                synthetic_batch(
                    &mut rng,
                    &setup.config,
                    setup.batch,
                    setup.src_len,
                    setup.tgt_len,
                )
            })
            .collect();
        let t0 = Instant::now();
        let c0 = cpu_seconds();
        let mut loss = 0.0;
        for b in &batches {
            micro += 1;
            loss +=
                engine.accumulate(b, 1.0 / setup.accum as f32, setup.seed.wrapping_add(micro))?
                    as f64;
        }
        engine.step(LR, Some(MAX_GRAD_NORM))?;
        let dt = t0.elapsed().as_secs_f64();
        cpu.push(cpu_seconds() - c0);
        loss /= setup.accum as f64;
        seconds.push(dt);
        losses.push(loss);
        on_step(step, loss, dt);
    }
    let sec = median(&seconds[WARMUP_STEPS..]);
    let cpu_sec = median(&cpu[WARMUP_STEPS..]);
    let tokens = (setup.batch * setup.accum * (setup.src_len + setup.tgt_len)) as f64;
    let frozen = |g| setup.freeze.contains(&g);
    let encoder_backward =
        !(frozen(memfit_nn::t5::Group::Embeddings) && frozen(memfit_nn::t5::Group::Encoder));
    let model_flops = t5_training_flops(
        &setup.config,
        setup.batch * setup.accum,
        setup.src_len,
        setup.tgt_len,
        encoder_backward,
    );
    let peak = Some(
        crate::peak_flops::peak_flops_per_core(bf16_peak)
            .0
            .max(peak_before),
    );
    let precision = match setup.precision {
        Precision::F32 => "fp32",
        Precision::Bf16 => "bf16",
    };
    Ok(BenchReport {
        sec_per_step_median: sec,
        cpu_sec_per_step_median: cpu_sec,
        tokens_per_s: tokens / sec,
        peak_rss_bytes: peak_rss_bytes(),
        loss_first: losses[0],
        loss_last: *losses.last().unwrap_or(&f64::NAN),
        steps: setup.steps,
        warmup_steps: WARMUP_STEPS,
        threads: setup.threads,
        setup: json!({
            "model": setup.model_name, "batch": setup.batch, "seq": setup.src_len,
            "tgt_seq": setup.tgt_len, "accum": setup.accum, "grad_ckpt": setup.grad_ckpt,
            "precision": precision, "optimizer": setup.optimizer, "lr": LR,
            "max_grad_norm": MAX_GRAD_NORM, "dropout": setup.config.dropout_rate,
            "seed": setup.seed, "backend": "flex",
            "freeze": setup.freeze.iter().map(|g| format!("{g:?}").to_lowercase()).collect::<Vec<_>>(),
        }),
        params_total: engine.param_counts().total,
        step_seconds: seconds,
        model_flops_per_step: model_flops,
        cpu_peak_flops_per_core: peak,
        cpu_peak_basis: basis.to_string(),
        mfu: peak
            .filter(|_| cpu_sec > 0.0)
            .map(|p| model_flops / (cpu_sec * p)),
    })
}

/// Measures one point of the memory grid ([`memfit_plan::grid::POINTS`]) in its own process:
/// `exe bench train … --json` (exe is the memfit binary), so every peak RSS starts from a fresh
/// process. Returns the row of `validation/memfit_grid.csv`.
pub fn measure_grid_point(
    exe: &std::path::Path,
    point: &grid::Point,
) -> Result<grid::Measured, ModelError> {
    let config = resolve_model(point.model)?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["bench", "train", "--model", point.model, "--json"])
        .args(["--batch", &point.batch.to_string()])
        .args(["--seq", &point.seq.to_string()])
        .args(["--accum", &point.accum.to_string()])
        .args(["--steps", &grid::STEPS.to_string()])
        .args(["--threads", &grid::THREADS.to_string()])
        .args(["--precision", point.precision.as_str()])
        .args(["--optimizer", point.optimizer.as_str()]);
    if point.grad_ckpt {
        cmd.arg("--grad-ckpt");
    }
    if point.freeze_encoder {
        cmd.args(["--freeze", "encoder"]);
    }
    let out = cmd
        .output()
        .map_err(|e| ModelError::Io(format!("running {}: {e}", exe.display())))?;
    if !out.status.success() {
        return Err(ModelError::Io(format!(
            "grid point {}: memfit bench train failed ({}): {}",
            point.id,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let report: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        ModelError::Io(format!(
            "grid point {}: unreadable bench output: {e}",
            point.id
        ))
    })?;
    let number = |k: &str| report[k].as_f64().unwrap_or(f64::NAN);
    Ok(grid::Measured {
        point: *point,
        dims: grid::Dims {
            vocab: config.vocab_size as u64,
            d_model: config.d_model as u64,
            d_kv: config.d_kv as u64,
            d_ff: config.d_ff as u64,
            heads: config.num_heads as u64,
            layers: config.num_layers as u64,
            decoder_layers: config.num_decoder_layers as u64,
        },
        threads: grid::THREADS,
        steps: grid::STEPS,
        peak_rss_bytes: report["peak_rss_bytes"].as_u64().unwrap_or(0),
        sec_per_step: number("sec_per_step_median"),
    })
}

#[cfg(test)]
mod tests {
    use super::resolve_model;

    #[test]
    fn planner_presets_resolve_to_t5_configs() {
        let chatlm = resolve_model("chatlm-mini").unwrap();
        assert_eq!(
            (chatlm.vocab_size, chatlm.d_model, chatlm.num_layers),
            (29_298, 768, 10)
        );
        let tiny = resolve_model("tiny").unwrap();
        assert_eq!((tiny.vocab_size, tiny.d_model), (8000, 256));
        assert!(resolve_model("no-such-model-or-file").is_err());
    }
}
