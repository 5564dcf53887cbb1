//! `memfit plan`: the fastest setup that fits the budgets, the alternatives, why faster ones were
//! rejected, the tier table, and config files for the tools that run it; with `--policy NAME`, a
//! fixed preset estimated instead of the search ([`preset`]).

mod preset;

use super::estimate::{
    LengthArgs, MethodArgs, apply_task, band_line, component_table, dataset_of, estimate_json,
    load_model, out, parse_enum, parse_task, write_stdout,
};
use crate::exit::{Outcome, bad_input, does_not_fit};
use anyhow::Context;
use comfy_table::{Table, presets::ASCII_MARKDOWN, presets::UTF8_FULL_CONDENSED};
use memfit_plan::Task;
use memfit_plan::emit::{self, FsdpVersion, Hyper, Kind};
use memfit_plan::memory::{Framework, Optimizer, Runtime, Setup, Zero, gib};
use memfit_plan::search::{self, Budget, Candidate, Request, data_parallel, tiers};
use memfit_sys::units::parse_size;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// A preset name or a Hugging Face config.json path.
    #[arg(long)]
    pub model: String,
    #[arg(long, value_parser = parse_task)]
    pub task: Option<Task>,
    /// GPUs per node.
    #[arg(long, default_value_t = 1)]
    pub gpus: u64,
    #[arg(long, default_value_t = 1)]
    pub nodes: u64,
    /// Memory of each GPU (e.g. 24GiB), `auto` (NVML), or `none` to train on the CPU.
    #[arg(long, default_value = "auto")]
    pub gpu_mem: String,
    /// Host RAM to plan for (e.g. 16GiB) or `auto` (what this machine can give a new job).
    #[arg(long, default_value = "auto")]
    pub host_mem: String,
    #[arg(long, default_value_t = 512)]
    pub seq: u64,
    /// Decoder length for seq2seq (default: seq / 4).
    #[arg(long)]
    pub tgt_seq: Option<u64>,
    /// Samples per optimizer step over all GPUs (held by micro-batch × accumulation).
    #[arg(long, default_value_t = 32)]
    pub target_batch: u64,
    #[command(flatten)]
    pub method: MethodArgs,
    #[command(flatten)]
    pub lengths: LengthArgs,
    #[arg(long, default_value = "adamw", value_parser = parse_enum::<Optimizer>)]
    pub optimizer: Optimizer,
    #[arg(long, default_value = "pytorch", value_parser = parse_enum::<Runtime>)]
    pub runtime: Runtime,
    /// How the PyTorch stack shards model states across GPUs: `deepspeed` (ZeRO stages 1–3),
    /// `fsdp2` (`fully_shard`, accelerate's FSDP version 2) or `fsdp1` (FSDP version 1).
    #[arg(long, default_value = "deepspeed", value_parser = parse_sharding)]
    pub sharding: Sharding,
    /// DeepSpeed's `reduce_bucket_size` (elements) to plan for and write into the emitted config
    /// (default: transformers' "auto", hidden²). ZeRO-1/2 hold two 16-bit buckets of it through
    /// the backward.
    #[arg(long)]
    pub zero_bucket_size: Option<u64>,
    /// Memory kept free on GPU and host: `10%` or `0.1`.
    #[arg(long, default_value = "10%", value_parser = parse_headroom)]
    pub headroom: f64,
    /// Config files to write: deepspeed,accelerate,hf,memfit,profiles (needs --out).
    #[arg(long, value_delimiter = ',')]
    pub emit: Vec<String>,
    /// Directory for --emit files.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Training data the emitted memfit train TOML names (parquet/JSONL or a token store).
    #[arg(long, value_name = "FILE|STORE")]
    pub data: Option<PathBuf>,
    /// Validation data for the memfit train TOML, as --data.
    #[arg(long, value_name = "FILE|STORE")]
    pub valid: Option<PathBuf>,
    /// Tokenizer for the memfit train TOML: tokenizer.json or its directory.
    #[arg(long, value_name = "PATH")]
    pub tokenizer: Option<PathBuf>,
    /// Print the tier table (host RAM × GPU memory) instead of one plan.
    #[arg(long)]
    pub tiers: bool,
    /// `auto` (the search) or a fixed preset to estimate instead: bert-ultra-low, bert-safe,
    /// bert-original (classification), qwen-deepspeed, qwen-stage2-offload, qwen-stage3,
    /// qwen-minimal (LoRA on a decoder, PyTorch stack).
    #[arg(long, default_value = "auto")]
    pub policy: String,
    #[arg(long)]
    pub json: bool,
}

/// `--sharding`: DeepSpeed's ZeRO, or FSDP in one of its two versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharding {
    Deepspeed,
    Fsdp(FsdpVersion),
}

fn parse_sharding(s: &str) -> Result<Sharding, String> {
    match s {
        "deepspeed" => Ok(Sharding::Deepspeed),
        "fsdp2" | "fsdp" => Ok(Sharding::Fsdp(FsdpVersion::V2)),
        "fsdp1" => Ok(Sharding::Fsdp(FsdpVersion::V1)),
        _ => Err(format!("{s:?}: one of deepspeed, fsdp2, fsdp1")),
    }
}

pub(crate) fn parse_headroom(s: &str) -> Result<f64, String> {
    let v = match s.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|x| x / 100.0),
        None => s.trim().parse::<f64>(),
    }
    .map_err(|_| format!("{s:?} is not a fraction like 10% or 0.1"))?;
    if (0.0..0.9).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s:?}: headroom must be in [0%, 90%)"))
    }
}

fn gpu_budget(arg: &str) -> anyhow::Result<Option<u64>> {
    match arg {
        "none" | "cpu" | "0" => Ok(None),
        "auto" => match memfit_sys::probe::gpus() {
            Ok(gpus) if !gpus.is_empty() => Ok(gpus.iter().map(|g| g.total_bytes).min()),
            Ok(_) => Ok(None),
            Err(e) => {
                tracing::info!("no GPU found ({e}); planning for the CPU");
                Ok(None)
            }
        },
        s => parse_size(s)
            .map(Some)
            .map_err(|e| bad_input(format!("--gpu-mem: {e}"))),
    }
}

fn host_budget(arg: &str) -> anyhow::Result<u64> {
    match arg {
        "auto" => Ok(memfit_sys::probe::host_memory()
            .context("--host-mem auto: reading this machine's memory")?
            .effective_available_bytes),
        s => parse_size(s).map_err(|e| bad_input(format!("--host-mem: {e}"))),
    }
}

impl Args {
    fn base(&self, arch: &memfit_plan::arch::Arch) -> Setup {
        let mut s = Setup::new(arch);
        apply_task(&mut s, self.task, self.seq, self.tgt_seq);
        self.method.apply(&mut s);
        self.lengths.apply(&mut s);
        s.optimizer = self.optimizer;
        s.runtime = self.runtime;
        s.gpus = self.gpus;
        s.nodes = self.nodes;
        s.zero_bucket_size = self.zero_bucket_size;
        s.dataset = dataset_of(self.runtime);
        if let Sharding::Fsdp(_) = self.sharding {
            // the search then shards with FSDP's options instead of ZeRO's (search::zero_options)
            s.zero = Zero::FsdpFull;
        }
        s
    }
}

pub fn run(args: Args) -> Outcome {
    let kinds: Vec<Kind> = args
        .emit
        .iter()
        .map(|k| {
            Kind::parse(k.trim())
                .ok_or_else(|| bad_input(format!("--emit {k:?}: not one of {}", Kind::NAMES)))
        })
        .collect::<Result<_, _>>()?;
    if !kinds.is_empty() && args.out.is_none() {
        return Err(bad_input("--emit needs --out DIR"));
    }
    if let Some(out) = args.out.as_ref().filter(|o| o.exists() && !o.is_dir()) {
        return Err(bad_input(format!(
            "--out {}: a file, not a directory (the --emit files are written into it)",
            out.display()
        )));
    }
    let arch = load_model(&args.model)?;
    let base = args.base(&arch);
    let arch = arch.with_task(base.task);
    let fw = Framework::default();
    if let Some(caveat) = memfit_plan::memory::allocator::length_spread_caveat(&base) {
        eprintln!("warning: {caveat}");
    }
    if args.policy != "auto" {
        return preset::run(&args, &arch, base, &kinds);
    }
    if args.tiers {
        let table = tiers::tier_table(&arch, &base, args.target_batch, args.headroom, &fw)
            .map_err(bad_input)?;
        if args.json {
            let cells: Vec<Vec<Option<String>>> = table
                .cells
                .iter()
                .map(|row| {
                    row.iter()
                        .map(|c| c.as_ref().map(|c| tiers::cell_text(Some(c))))
                        .collect()
                })
                .collect();
            let v = serde_json::json!({"model": arch.name, "target_batch": args.target_batch,
                "headroom": args.headroom, "host_gib": table.host_gib, "gpu_gib": table.gpu_gib, "cells": cells});
            write_stdout(&format!("{}\n", serde_json::to_string_pretty(&v)?))?;
        } else {
            let mut o = String::new();
            out!(o, "{}", tier_heading(&arch.name, &args));
            let mut t = Table::new();
            t.load_style(ASCII_MARKDOWN);
            let mut header = vec!["host RAM".to_string()];
            header.extend(table.column_labels());
            t.set_header(header);
            for (host, row) in table.host_gib.iter().zip(&table.cells) {
                let mut r = vec![format!("{host} GiB")];
                r.extend(row.iter().map(|c| tiers::cell_text(c.as_ref())));
                t.add_row(r);
            }
            out!(o, "{t}");
            out!(
                o,
                "cells: micro-batch×accumulation precision [ckpt = gradient checkpointing] [zN = ZeRO stage, +off-opt/+off-all = CPU offload]; — = nothing fits"
            );
            write_stdout(&o)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let budget = Budget {
        gpu_bytes: gpu_budget(&args.gpu_mem)?,
        host_bytes: host_budget(&args.host_mem)?,
        headroom: args.headroom,
    };
    let req = Request {
        base,
        target_batch: args.target_batch,
        budget,
    };
    let plan = search::plan(&arch, &req, &fw).map_err(bad_input)?;
    if args.json {
        let cand = |c: &Candidate| candidate_json(&arch, c);
        let v = serde_json::json!({
            "policy": "auto",
            "model": {"name": arch.name, "family": arch.model_type, "params_total": arch.params_total()},
            "budget": {"gpu_bytes": budget.gpu_bytes, "host_bytes": budget.host_bytes, "headroom": budget.headroom},
            "target_batch": args.target_batch,
            "chosen": plan.chosen.as_ref().map(cand),
            "alternatives": plan.alternatives.iter().map(cand).collect::<Vec<_>>(),
            "rejected": plan.rejected.iter().map(|c| serde_json::json!({"summary": c.summary(), "tokens_per_s": c.tokens_per_s, "reason": c.rejected})).collect::<Vec<_>>(),
            "considered": plan.considered,
            "reason": plan.reason,
        });
        write_stdout(&format!("{}\n", serde_json::to_string_pretty(&v)?))?;
    } else {
        write_stdout(&report(&arch, &budget, &plan))?;
    }
    let Some(chosen) = plan.chosen.as_ref() else {
        return Err(does_not_fit(
            plan.reason.unwrap_or_else(|| "nothing fits".into()),
        ));
    };
    write_files(&args, &kinds, &arch, &chosen.setup)?;
    Ok(ExitCode::SUCCESS)
}

/// Writes the `--emit` files for `setup` into `--out` (said on stdout unless `--json`).
fn write_files(
    args: &Args,
    kinds: &[Kind],
    arch: &memfit_plan::arch::Arch,
    setup: &Setup,
) -> anyhow::Result<()> {
    let Some(dir) = &args.out else {
        return Ok(());
    };
    let mut o = String::new();
    let mut hyper = hyper(args, setup)?;
    // the accelerate YAML and TrainingArguments name the DeepSpeed JSON by its absolute path: their
    // readers resolve a relative one against where the user launches, not against --out
    let deepspeed = std::path::absolute(dir.join(Kind::Deepspeed.file_name()))
        .with_context(|| format!("--out {}", dir.display()))?;
    hyper.deepspeed_config = Some(deepspeed.display().to_string());
    for (name, text) in emit::render(kinds, arch, setup, &hyper) {
        write_atomic(&dir.join(name), &text)?;
        if !args.json {
            out!(o, "wrote {}", dir.join(name).display());
        }
    }
    write_stdout(&o)
}

/// The `--json` form of one evaluated setup: the estimate (docs/architecture.md §3) with its summary and
/// modelled throughput.
fn candidate_json(arch: &memfit_plan::arch::Arch, c: &Candidate) -> serde_json::Value {
    let mut v = estimate_json(arch, &c.setup, &c.estimate);
    v["summary"] = c.summary().into();
    v["tokens_per_s"] = c.tokens_per_s.into();
    v["data_parallel"] = serde_json::to_value(data_parallel::scaling(arch, &c.setup))
        .unwrap_or(serde_json::Value::Null);
    v
}

/// The data-parallel line of the report: what crosses the link per step, how much of it the
/// backward hides, and the speed-up over one GPU at the same effective batch.
fn scaling_line(arch: &memfit_plan::arch::Arch, setup: &Setup) -> Option<String> {
    let s = data_parallel::scaling(arch, setup);
    if s.ranks <= 1 {
        return None;
    }
    let hidden = match setup.runtime {
        Runtime::Memfit if s.comm.overlap == 0.0 => {
            "reduced after the backward (memfit train overlaps it only under per-block checkpointing)"
                .to_string()
        }
        Runtime::Memfit => format!(
            "{:.0}% hidden behind the backward (block by block)",
            100.0 * s.comm.overlap
        ),
        Runtime::Pytorch => format!(
            "{:.0}% hidden behind the backward (DDP buckets)",
            100.0 * s.comm.overlap
        ),
    };
    Some(format!(
        "data parallel over {} ranks: all-reduce {:.2} GB per rank per step at {:.0} GB/s nominal = {:.3} s, {hidden}; {:.2}× the speed of one GPU at the same effective batch (throughput model, docs/memory-model.md)",
        s.ranks,
        s.comm.allreduce_bytes_per_step / 1e9,
        s.comm.link_bytes_per_s / 1e9,
        s.comm.allreduce_s_per_step,
        s.speedup_vs_one_gpu
    ))
}

/// The estimate of one setup for people: its GPU peaks, band and components, then the host's.
fn describe_candidate(o: &mut String, c: &Candidate) {
    if let Some(g) = &c.estimate.gpu {
        out!(
            o,
            "GPU: peak allocated {} GiB, reserved {} GiB, nvml used {} GiB",
            gib(g.peak_allocated_bytes),
            gib(g.peak_reserved_bytes),
            gib(g.nvml_used_bytes)
        );
        out!(o, "{}", band_line(&c.setup, g));
        out!(o, "{}", component_table(&g.components));
    }
    out!(
        o,
        "host: peak RSS {} GiB",
        gib(c.estimate.host.peak_rss_bytes)
    );
    out!(o, "{}", component_table(&c.estimate.host.components));
}

/// The emitted files' hyper-parameters: paths absolute (the files are read from another
/// directory), each given path checked to exist.
fn hyper(args: &Args, setup: &Setup) -> anyhow::Result<Hyper> {
    let absolute = |flag: &str, p: &Path| {
        if !p.exists() {
            return Err(bad_input(format!("--{flag} {}: no such file", p.display())));
        }
        Ok(std::path::absolute(p)
            .unwrap_or_else(|_| p.to_path_buf())
            .display()
            .to_string())
    };
    let model_path = Path::new(&args.model);
    let model = if model_path.is_file() {
        absolute("model", model_path)?
    } else {
        args.model.clone()
    };
    let path =
        |flag: &str, p: &Option<PathBuf>| p.as_deref().map(|p| absolute(flag, p)).transpose();
    Ok(Hyper {
        data: path("data", &args.data)?,
        valid: path("valid", &args.valid)?,
        tokenizer: path("tokenizer", &args.tokenizer)?,
        fsdp_version: match args.sharding {
            Sharding::Fsdp(v) => v,
            Sharding::Deepspeed => FsdpVersion::default(),
        },
        ..Hyper::defaults(&model, setup)
    })
}

fn tier_heading(model: &str, args: &Args) -> String {
    format!(
        "{model}: method {}, seq {}, effective batch {}, {} runtime, {:.0}% headroom + the validation band of each setup's class; the fastest setup per cell",
        args.method.method,
        args.seq,
        args.target_batch,
        args.runtime,
        args.headroom * 100.0
    )
}

/// Writes through a temporary file in the same directory and renames it into place.
fn write_atomic(path: &Path, text: &str) -> anyhow::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name()
            .map_or("out".into(), |f| f.to_string_lossy())
    ));
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming into {}", path.display()))?;
    Ok(())
}

/// The human report: budget, choice with its components, alternatives, rejections.
fn report(arch: &memfit_plan::arch::Arch, budget: &Budget, plan: &search::Plan) -> String {
    let model = &arch.name;
    let mut o = String::new();
    let gpu = budget
        .gpu_bytes
        .map_or("none (CPU training)".to_string(), |g| {
            format!("{} GiB per GPU", gib(g))
        });
    out!(
        o,
        "{model}: budget GPU {gpu}, host {} GiB, {:.0}% headroom; {} setups considered",
        gib(budget.host_bytes),
        budget.headroom * 100.0,
        plan.considered
    );
    if budget.gpu_bytes.is_some() {
        out!(
            o,
            "each setup's GPU need is widened by {} and kept within the usable memory, on top of the headroom",
            if (plan.chosen.iter().chain(&plan.rejected))
                .any(|c| c.setup.runtime == memfit_plan::memory::Runtime::Memfit)
            {
                "the band of memfit's GPU model (its 10% check on the CPU; no card measured yet)"
            } else {
                "the validation band of its class (docs/accuracy.md, Uncertainty band)"
            }
        );
    }
    let row_table = |rows: &[Candidate], with_reason: bool| {
        let mut t = Table::new();
        t.load_style(UTF8_FULL_CONDENSED);
        let mut h = vec!["setup", "tokens/s (model)", "GPU GiB", "host GiB"];
        if with_reason {
            h.push("why not");
        }
        t.set_header(h);
        for c in rows {
            let mut r = vec![
                c.summary(),
                format!("{:.0}", c.tokens_per_s),
                c.gpu_need().map_or("-".into(), gib),
                gib(c.host_need()),
            ];
            if with_reason {
                r.push(c.rejected.clone().unwrap_or_default());
            }
            t.add_row(r);
        }
        t
    };
    if let Some(c) = &plan.chosen {
        out!(
            o,
            "\nchosen: {} — {:.0} tokens/s (throughput model)",
            c.summary(),
            c.tokens_per_s
        );
        if let Some(line) = scaling_line(arch, &c.setup) {
            out!(o, "{line}");
        }
        describe_candidate(&mut o, c);
    }
    if !plan.alternatives.is_empty() {
        out!(o, "\nnext best:");
        out!(o, "{}", row_table(&plan.alternatives, false));
    }
    if !plan.rejected.is_empty() {
        out!(o, "\nfaster but rejected:");
        out!(o, "{}", row_table(&plan.rejected, true));
    }
    if let Some(r) = &plan.reason {
        out!(o, "\n{r}");
    }
    o
}
