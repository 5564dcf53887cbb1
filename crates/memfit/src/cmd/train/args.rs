//! `memfit train`'s flags as typed (the low-level arguments) and the settings layer they make.
//! Everything later reads the resolved setup (`setup.rs`), never these.

use super::absolute;
use crate::exit::bad_input;
use memfit_train::config::{BestMetric, ConfigLayer, Method, OptimizerKind, Precision, TaskKind};
use memfit_train::device::DeviceRequest;
use memfit_train::schedule::ScheduleKind;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Run directory (default: runs/<UTC timestamp>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Continue the run in this directory from its newest checkpoint (exactly).
    #[arg(long, value_name = "RUN_DIR", conflicts_with_all = ["out", "preset", "profile", "config", "demo"])]
    pub resume: Option<PathBuf>,
    /// With --resume: accept flags that change the training trajectory (prints what changed).
    #[arg(long)]
    pub allow_config_change: bool,
    /// A run.toml (the keys `memfit plan --emit memfit` writes); flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A model preset (e.g. chatlm-mini, which also takes the seed's `pretrain` profile) or a profile.
    #[arg(long)]
    pub preset: Option<String>,
    /// The seed's named training configurations: pretrain, sft, sft-small, sft-fast.
    #[arg(long)]
    pub profile: Option<String>,
    /// What to train for (default: what the model's family does — T5 seq2seq, BERT classification).
    #[arg(long, value_parser = ["seq2seq", "classification", "causal-lm"])]
    pub task: Option<String>,
    /// A demo task with data of its own: seq2seq (the default of `memfit train` with no
    /// arguments) or classification.
    #[arg(long, value_parser = ["seq2seq", "classification"], conflicts_with_all = ["data", "model", "init", "preset"])]
    pub demo: Option<String>,
    /// Model: a preset name or a config.json (default: the demo's, or the --init directory's).
    #[arg(long)]
    pub model: Option<String>,
    /// Start from the weights of a Hugging Face model directory (config.json + model.safetensors or
    /// its shards, else pytorch_model.bin or its shards, read without running the pickle; f32, f16 or
    /// bf16) or of a memfit checkpoint (RUN/best). Names the model unless --model is given too (then
    /// both must describe the same tensors).
    #[arg(long, value_name = "DIR", conflicts_with = "resume")]
    pub init: Option<PathBuf>,
    /// Training data: parquet/JSONL (prepared into the run) or a token store directory.
    #[arg(long)]
    pub data: Option<String>,
    /// Validation data, as --data.
    #[arg(long)]
    pub valid: Option<String>,
    /// tokenizer.json, or a directory holding it.
    #[arg(long)]
    pub tokenizer: Option<String>,
    #[arg(long)]
    pub max_steps: Option<u64>,
    #[arg(long)]
    pub epochs: Option<u32>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// What to compute on: auto (a CUDA GPU when this binary has CUDA and one can run, else the
    /// CPU; the start line says which and why), cpu, cuda, cuda:N; data-parallel: cuda:0,1,2 or
    /// cuda:all (one rank per GPU, effective batch = batch × accum × ranks), cpu:N (N ranks on the
    /// CPU: the same code path, for checks, no speed-up).
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    pub device: DeviceRequest,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Micro-batch size (rows).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Gradient accumulation steps.
    #[arg(long)]
    pub accum: Option<usize>,
    /// Maximum source (classification: text) tokens, specials included (default with a model: the
    /// longest prepared row, rounded up to 8, at most the model's positions).
    #[arg(long)]
    pub seq: Option<usize>,
    /// Maximum target tokens (EOS included; seq2seq).
    #[arg(long)]
    pub tgt_seq: Option<usize>,
    /// Peak learning rate (default with a model: the task's, e.g. 5e-5 for classification; see
    /// docs/train.md "Defaults").
    #[arg(long)]
    pub lr: Option<f64>,
    #[arg(long, value_parser = ["adamw", "adafactor"])]
    pub optimizer: Option<String>,
    /// Adafactor at the scheduled rate instead of its relative step size.
    #[arg(long)]
    pub adafactor_external_lr: bool,
    #[arg(long, value_parser = ["onecycle", "cosine"])]
    pub schedule: Option<String>,
    #[arg(long)]
    pub warmup_steps: Option<u64>,
    #[arg(long, value_parser = ["fp32", "bf16"])]
    pub precision: Option<String>,
    /// Gradient checkpointing.
    #[arg(long)]
    pub grad_ckpt: bool,
    /// Frozen groups, comma-separated (T5: embeddings, encoder, decoder, lm_head; BERT:
    /// embeddings, encoder, pooler, head; decoders: embeddings, layers, norm, lm_head).
    #[arg(long, value_delimiter = ',')]
    pub freeze: Option<Vec<String>>,
    /// How the weights train: full, freeze (full with --freeze groups) or lora (adapters on a
    /// frozen base; decoder models).
    #[arg(long, value_parser = ["full", "freeze", "lora"])]
    pub method: Option<String>,
    /// LoRA rank (default 16).
    #[arg(long)]
    pub lora_r: Option<usize>,
    /// LoRA scaling numerator: the update is scaled by alpha / r (default 32).
    #[arg(long)]
    pub lora_alpha: Option<f64>,
    /// Dropout on the adapters' input (default 0.05).
    #[arg(long)]
    pub lora_dropout: Option<f64>,
    /// Adapted projections, comma-separated: q,k,v,o,gate,up,down (or PEFT's q_proj, …; default
    /// all seven).
    #[arg(long, value_delimiter = ',')]
    pub lora_targets: Option<Vec<String>>,
    /// The frozen base's precision under LoRA: bf16 halves its memory (default fp32).
    #[arg(long, value_parser = ["fp32", "bf16"])]
    pub base_precision: Option<String>,
    /// Global-norm gradient clipping (0 turns it off).
    #[arg(long)]
    pub max_grad_norm: Option<f64>,
    /// Decoupled weight decay (default: the optimizer's own, AdamW 0.01 as torch's, Adafactor 0).
    #[arg(long)]
    pub weight_decay: Option<f64>,
    /// Checkpoint every N optimizer steps (and at each epoch end).
    #[arg(long)]
    pub save_steps: Option<u64>,
    /// Step checkpoints to keep (plus best/).
    #[arg(long)]
    pub keep: Option<usize>,
    /// Evaluate every N optimizer steps (and at each epoch end).
    #[arg(long)]
    pub eval_steps: Option<u64>,
    /// Validation rows generated and scored by BLEU at each evaluation (seq2seq; default 8).
    #[arg(long)]
    pub eval_rows: Option<usize>,
    /// A cap on the validation rows whose loss (and, for classification, predictions) each
    /// evaluation computes, spread over the set (default: the whole validation set).
    #[arg(long, value_name = "N")]
    pub eval_loss_rows: Option<usize>,
    /// Evaluate before the first step too (the summary's "before"; default for --init with --valid).
    #[arg(long)]
    pub eval_at_start: bool,
    /// Metric that picks best/ (seq2seq: bleu4, valid-loss; classification: accuracy, macro-f1,
    /// valid-loss).
    #[arg(long, value_parser = ["bleu4", "valid-loss", "accuracy", "macro-f1"])]
    pub best_metric: Option<String>,
    /// RAM budget the start is planned for and the run keeps (e.g. 8GiB, 1500MB, 60%; default:
    /// 80% of the effective available memory, cgroup limits included). `--budget` is an alias.
    #[arg(long, alias = "budget", value_name = "SIZE|PCT")]
    pub budget_ram: Option<String>,
    /// GPU memory budget, per GPU (default on a GPU: 90% of the smallest rank's free memory): on a
    /// GPU the start is planned for it (and for the RAM budget) and the memory guard keeps it;
    /// below the model's weights → exit 3. Recorded in plan.json.
    #[arg(long, value_name = "SIZE")]
    pub budget_gpu: Option<String>,
    /// How the start is chosen: auto (the planner: fastest setup predicted to fit the budget),
    /// chatlm-v8 or chatlm-v3 (the seed's start-up tables), bert-ultra-low, bert-safe,
    /// bert-original (the seed's BERT tiers).
    #[arg(long, default_value = "auto")]
    pub policy: String,
    /// Exit 0 even when the run ends worse on its validation set than it started, or predicts one
    /// class for every validation row (both are said in the summary either way).
    #[arg(long)]
    pub allow_regression: bool,
    /// With several data-parallel ranks: ZeRO-1, each rank keeps (and steps) the optimizer state
    /// of about 1/ranks of the trained parameters; the same arithmetic, the optimizer state's
    /// memory divided by the ranks, one more collective a step (the updated weights gathered).
    #[arg(long)]
    pub shard_optimizer: bool,
    /// Print the planned start and exit (no run directory).
    #[arg(long)]
    pub plan_only: bool,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
}

fn parse_device(s: &str) -> Result<DeviceRequest, String> {
    s.parse()
}

/// `fp32` / `bf16` as typed (clap has checked the value).
fn precision(p: &str) -> Precision {
    match p {
        "bf16" => Precision::Bf16,
        _ => Precision::Fp32,
    }
}

impl Args {
    /// The task asked for: `--task`, or `--demo`'s.
    pub fn task(&self) -> Option<TaskKind> {
        let name = self.task.as_deref().or(self.demo.as_deref())?;
        Some(match name {
            "classification" => TaskKind::Classification,
            "causal-lm" => TaskKind::CausalLm,
            _ => TaskKind::Seq2seq,
        })
    }

    /// The settings given on the command line; `ram_budget` is `--budget-ram` resolved to bytes.
    pub fn layer(
        &self,
        ram_budget: Option<u64>,
        gpu_budget: Option<u64>,
    ) -> anyhow::Result<ConfigLayer> {
        let init = self
            .init
            .as_deref()
            .map(|d| absolute(&d.display().to_string()));
        Ok(ConfigLayer {
            model: self.model.clone().or_else(|| init.clone()),
            init,
            task: self.task(),
            data: self.data.as_deref().map(absolute),
            valid: self.valid.as_deref().map(absolute),
            tokenizer: self.tokenizer.as_deref().map(absolute),
            batch: self.batch,
            accum: self.accum,
            seq: self.seq,
            tgt_seq: self.tgt_seq,
            precision: self.precision.as_deref().map(precision),
            optimizer: self.optimizer.as_deref().map(|o| match o {
                "adafactor" => OptimizerKind::Adafactor,
                _ => OptimizerKind::Adamw,
            }),
            adafactor_relative_step: self.adafactor_external_lr.then_some(false),
            grad_ckpt: self.grad_ckpt.then_some(true),
            freeze: self.freeze.clone(),
            method: self.method.as_deref().map(|m| match m {
                "lora" => Method::Lora,
                "freeze" => Method::Freeze,
                _ => Method::Full,
            }),
            lora_r: self.lora_r,
            lora_alpha: self.lora_alpha,
            lora_dropout: self.lora_dropout,
            lora_targets: self.lora_targets.clone(),
            base_precision: self.base_precision.as_deref().map(precision),
            lr: self.lr,
            schedule: self
                .schedule
                .as_deref()
                .map(str::parse::<ScheduleKind>)
                .transpose()
                .map_err(bad_input)?,
            warmup_steps: self.warmup_steps,
            max_grad_norm: self.max_grad_norm,
            weight_decay: self.weight_decay,
            epochs: self.epochs,
            max_steps: self.max_steps,
            seed: self.seed,
            threads: self.threads,
            save_steps: self.save_steps,
            keep: self.keep,
            eval_steps: self.eval_steps,
            eval_rows: self.eval_rows,
            eval_loss_rows: self.eval_loss_rows,
            eval_at_start: self.eval_at_start.then_some(true),
            best_metric: self.best_metric.as_deref().map(|m| match m {
                "valid-loss" => BestMetric::ValidLoss,
                "accuracy" => BestMetric::Accuracy,
                "macro-f1" => BestMetric::MacroF1,
                _ => BestMetric::Bleu4,
            }),
            // a new budget is bookkeeping: on --resume it applies without re-planning
            memory_budget_bytes: ram_budget,
            gpu_memory_budget_bytes: gpu_budget,
            ..ConfigLayer::default()
        })
    }
}
