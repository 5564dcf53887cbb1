//! `memfit check`: what this machine has, what is missing, and what to watch out for; with `--model`,
//! the planner's recommendation for this machine and the commands that run it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use comfy_table::Table;
use memfit_sys::probe::cgroup::CgroupMemory;
use memfit_sys::probe::cpu::Cpu;
use memfit_sys::probe::{self, HostMemory, Machine};
use memfit_sys::units::human_bytes as h;
use memfit_train::device::{GpuTraining, gpu_training};
use serde_json::Value;

use crate::exit::{Outcome, bad_input, does_not_fit};

#[derive(clap::Args)]
pub struct Args {
    /// Where runs will be written (its free disk space is reported).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Ask the planner for the best setup on this machine: a preset name or a config.json path.
    #[arg(long)]
    model: Option<String>,
    /// With --model: seq2seq, causal-lm or classification (default: the model's own).
    #[arg(long, requires = "model")]
    task: Option<String>,
    /// With --model: sequence length.
    #[arg(long, requires = "model")]
    seq: Option<u64>,
    /// With --model: samples per optimizer step.
    #[arg(long, requires = "model")]
    target_batch: Option<u64>,
    /// With --model: full, lora, qlora or freeze.
    #[arg(long, requires = "model")]
    method: Option<String>,
    /// With --model: where the configs go (default: DIR/memfit-plan).
    #[arg(long, requires = "model")]
    out: Option<PathBuf>,
    /// With --model: training data the memfit train config names (parquet/JSONL or a token store);
    /// without it, the printed command carries --data/--tokenizer placeholders.
    #[arg(long, requires = "model", value_name = "FILE|STORE")]
    data: Option<PathBuf>,
    /// With --data: validation data, as --data.
    #[arg(long, requires = "data", value_name = "FILE|STORE")]
    valid: Option<PathBuf>,
    /// With --data: tokenizer.json or its directory.
    #[arg(long, requires = "data", value_name = "PATH")]
    tokenizer: Option<PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Outcome {
    let machine = probe::machine(&args.dir);
    let recommendation = match &args.model {
        Some(model) => Some(recommend(&args, model)?),
        None => None,
    };
    if args.json {
        let mut v = serde_json::to_value(&machine)?;
        if let Value::Object(map) = &mut v {
            map.insert(
                "memfit_train_gpu".into(),
                gpu_training_json(&gpu_training()),
            );
            if let Some(rec) = &recommendation {
                map.insert("recommendation".into(), rec.clone());
            }
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", render(&machine));
        if let Some(rec) = &recommendation {
            print!("{}", render_recommendation(rec));
        }
    }
    let fits = |stack: &str| {
        recommendation
            .as_ref()
            .is_none_or(|r| r[stack]["fits"].as_bool() == Some(true))
    };
    if !fits("memfit") && !fits("pytorch") {
        return Err(does_not_fit(
            "nothing fits this machine for either stack (reasons above)",
        ));
    }
    Ok(ExitCode::SUCCESS)
}

/// The planner's answer for one stack: its JSON, or why nothing fits (exit 3 of `memfit plan`).
enum Planned {
    Fits(Value),
    DoesNotFit(String),
}

/// Runs `memfit plan --json --runtime R --emit … --out …` (this same binary) for the machine's own
/// budgets. Bad input (exit 2) carries over; "nothing fits" (exit 3) is an answer, not an error.
fn run_plan(
    args: &Args,
    model: &str,
    runtime: &str,
    emit: &str,
    out: &Path,
) -> anyhow::Result<Planned> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let exe = std::env::current_exe().context("locating the memfit binary")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args([
        "plan",
        "--json",
        "--runtime",
        runtime,
        "--emit",
        emit,
        "--model",
        model,
        "--out",
    ])
    .arg(out);
    for (flag, value) in [
        ("--task", args.task.clone()),
        ("--seq", args.seq.map(|v| v.to_string())),
        ("--target-batch", args.target_batch.map(|v| v.to_string())),
        ("--method", args.method.clone()),
        // QLoRA is LoRA on an NF4 base (Dettmers et al. 2023); plan asks which quantisation
        (
            "--quant",
            (args.method.as_deref() == Some("qlora")).then(|| "nf4".to_string()),
        ),
    ] {
        if let Some(v) = value {
            cmd.args([flag, &v]);
        }
    }
    if runtime == "memfit" {
        // memfit train computes on a GPU where this binary can (`--device auto`): its plan then
        // reads the GPU's memory; elsewhere on the CPU, planned for RAM
        if gpu_training().ready.is_err() {
            cmd.args(["--gpu-mem", "none"]);
        }
        for (flag, value) in [
            ("--data", &args.data),
            ("--valid", &args.valid),
            ("--tokenizer", &args.tokenizer),
        ] {
            if let Some(v) = value {
                cmd.arg(flag).arg(v);
            }
        }
    }
    let output = cmd.output().context("running memfit plan")?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let message = stderr.trim().trim_start_matches("error: ").to_owned();
    match output.status.code() {
        Some(0) => Ok(Planned::Fits(
            serde_json::from_slice(&output.stdout).context("reading memfit plan's JSON")?,
        )),
        Some(2) => Err(bad_input(format!("--model {model}: {message}"))),
        Some(3) => Ok(Planned::DoesNotFit(message)),
        _ => anyhow::bail!("memfit plan failed: {message}"),
    }
}

/// The setup for each stack with the files the planner wrote and the commands that use them:
/// `memfit` (the Rust trainer's runtime) and `pytorch` (accelerate/DeepSpeed, the Python runtime).
fn recommend(args: &Args, model: &str) -> anyhow::Result<Value> {
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.dir.join("memfit-plan"));
    let (mf_dir, pt_dir) = (out.join("memfit"), out.join("pytorch"));
    let file = |dir: &Path, name: &str| dir.join(name).display().to_string();
    let (train, profiles) = (
        file(&mf_dir, "memfit-train.toml"),
        file(&mf_dir, "profiles.toml"),
    );
    let (accelerate, deepspeed) = (
        file(&pt_dir, "accelerate.yaml"),
        file(&pt_dir, "deepspeed.json"),
    );
    let (q_train, q_profiles, q_accelerate) = (shell(&train), shell(&profiles), shell(&accelerate));
    let (train_cmd, note) = match &args.data {
        Some(_) => (format!("memfit train --config {q_train}"), None),
        None => (
            format!("memfit train --config {q_train} --data TRAIN_FILE --tokenizer TOKENIZER"),
            Some(format!(
                "{train} names no training data: replace TRAIN_FILE and TOKENIZER, or run memfit \
                 check with --data/--tokenizer to write them into it"
            )),
        ),
    };
    let memfit = match run_plan(args, model, "memfit", "memfit,profiles", &mf_dir)? {
        Planned::Fits(plan) => match train_refuses(&train)? {
            Some(reason) => Planned::DoesNotFit(reason),
            None => Planned::Fits(plan),
        },
        other => other,
    };
    let mut memfit = section(
        memfit,
        serde_json::json!({"memfit_train": train, "profiles": profiles}),
        serde_json::json!({
            "train": train_cmd,
            "guarded": format!("memfit run --profiles {q_profiles} -- {train_cmd}"),
        }),
    );
    if let (Some(note), Value::Object(map)) = (note, &mut memfit)
        && map.get("fits") == Some(&Value::Bool(true))
    {
        map.insert("note".into(), note.into());
    }
    let pytorch = section(
        run_plan(args, model, "pytorch", "accelerate,deepspeed", &pt_dir)?,
        serde_json::json!({"accelerate": accelerate, "deepspeed": deepspeed}),
        serde_json::json!({
            "accelerate": format!("accelerate launch --config_file {q_accelerate} train.py"),
        }),
    );
    Ok(serde_json::json!({"memfit": memfit, "pytorch": pytorch}))
}

/// A path as one shell word: single-quoted when it holds anything but `[A-Za-z0-9_./+-]`, so that a
/// printed command runs as printed.
fn shell(path: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_./+-".contains(c);
    if !path.is_empty() && path.chars().all(plain) {
        path.to_owned()
    } else {
        format!("'{}'", path.replace('\'', r"'\''"))
    }
}

/// Why memfit train would not run the config `memfit plan` wrote (it cannot train this model, task
/// or method), asked of memfit train itself (`--plan-only`, this same binary); `None` when it would.
fn train_refuses(config: &str) -> anyhow::Result<Option<String>> {
    let exe = std::env::current_exe().context("locating the memfit binary")?;
    let output = std::process::Command::new(exe)
        .args(["train", "--plan-only", "--json", "--config", config])
        .output()
        .context("running memfit train --plan-only")?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let ignored = stderr
        .lines()
        .find(|l| l.contains("is not a memfit train setting"));
    Ok(match (output.status.code(), ignored) {
        (Some(0), None) => None,
        (Some(0), Some(line)) => Some(format!("cannot run this config: {line}")),
        _ => Some(format!(
            "cannot run this config: {}",
            stderr
                .trim()
                .lines()
                .last()
                .unwrap_or("")
                .trim_start_matches("error: ")
        )),
    })
}

fn section(planned: Planned, files: Value, commands: Value) -> Value {
    match planned {
        Planned::DoesNotFit(reason) => serde_json::json!({"fits": false, "reason": reason}),
        Planned::Fits(plan) => {
            let chosen = &plan["chosen"];
            serde_json::json!({
                "fits": true,
                "summary": chosen["summary"],
                "gpu_peak_allocated_bytes": chosen["gpu"]["peak_allocated_bytes"],
                "host_peak_rss_bytes": chosen["host"]["peak_rss_bytes"],
                "tokens_per_s": chosen["tokens_per_s"],
                "setup": chosen["setup"],
                "files": files,
                "commands": commands,
                "plan": plan,
            })
        }
    }
}

fn render_recommendation(rec: &Value) -> String {
    let text = |v: &Value| v.as_str().unwrap_or("?").to_owned();
    let bytes = |v: &Value| v.as_u64().map_or("-".to_owned(), h);
    let mut out = String::new();
    for (stack, title) in [
        ("memfit", "memfit train"),
        ("pytorch", "PyTorch (accelerate/DeepSpeed)"),
    ] {
        let s = &rec[stack];
        if s["fits"].as_bool() != Some(true) {
            out.push_str(&format!("\n{title}: {}\n", text(&s["reason"])));
            continue;
        }
        out.push_str(&format!(
            "\n{title}: {} (peak GPU {}, peak host {})\n",
            text(&s["summary"]),
            bytes(&s["gpu_peak_allocated_bytes"]),
            bytes(&s["host_peak_rss_bytes"]),
        ));
        for key in ["train", "guarded", "accelerate"] {
            if let Some(command) = s["commands"][key].as_str() {
                out.push_str(&format!("  {command}\n"));
            }
        }
        if let Some(note) = s["note"].as_str() {
            out.push_str(&format!("  ({note})\n"));
        }
        if stack == "pytorch" {
            out.push_str(&format!(
                "  DeepSpeed config: {}\n",
                text(&s["files"]["deepspeed"])
            ));
        }
    }
    out
}

fn yes_no(flag: bool) -> &'static str {
    if flag { "yes" } else { "no" }
}

fn render(m: &Machine) -> String {
    let mut t = Table::new();
    t.load_style(comfy_table::presets::NOTHING);
    for (name, value) in machine_rows(m) {
        t.add_row(vec![name.to_owned(), value]);
    }
    let mut out = format!("{t}\n");
    for (title, items) in [("Not available", &m.missing), ("Warnings", &m.warnings)] {
        if !items.is_empty() {
            out.push_str(&format!("\n{title}:\n"));
            for item in items {
                out.push_str(&format!("  - {item}\n"));
            }
        }
    }
    out
}

/// The table's rows in order. A probe that found nothing leaves its row out; the cgroup, GPUs
/// and OOM daemons rows say so instead.
fn machine_rows(m: &Machine) -> Vec<(&'static str, String)> {
    let mut rows = Vec::new();
    if let Some(c) = &m.cpu {
        rows.push(("CPU", cpu_line(c)));
    }
    if let Some(mem) = &m.memory {
        rows.push(("RAM", ram_line(mem)));
        rows.push(("Swap", swap_line(mem)));
    }
    rows.push(("cgroup", cgroup_line(m.cgroup.as_ref())));
    if let (Some(limit), Some(mem)) = (m.effective_limit_bytes, &m.memory) {
        rows.push((
            "Effective limit",
            format!(
                "{} ({} available to a new job now)",
                h(limit),
                h(mem.effective_available_bytes)
            ),
        ));
    }
    if let Some(p) = &m.pressure {
        rows.push((
            "Memory pressure",
            format!(
                "some {:.2}% / full {:.2}% of the last 10 s",
                p.some.avg10,
                p.full.map_or(0.0, |f| f.avg10)
            ),
        ));
    }
    if let Some(d) = &m.disk {
        rows.push((
            "Disk",
            format!(
                "{} free of {} at {}",
                h(d.free_bytes),
                h(d.total_bytes),
                d.path
            ),
        ));
    }
    if let Some(s) = &m.shm {
        rows.push((
            "/dev/shm",
            format!("{} ({} free)", h(s.total_bytes), h(s.free_bytes)),
        ));
    }
    rows.push(("GPUs", gpus_line(m)));
    rows.push(("memfit train on GPU", gpu_training_line(&gpu_training())));
    rows.push(("OOM daemons", oom_daemons_line(m)));
    rows
}

fn cpu_line(c: &Cpu) -> String {
    format!(
        "{}: {} logical / {} physical cores, {} usable; AVX2 {}, AVX-512 {}, AMX {}",
        c.model,
        c.logical_cores,
        c.physical_cores,
        c.usable_cores,
        yes_no(c.has("avx2")),
        yes_no(c.has("avx512f")),
        yes_no(c.has("amx_tile")),
    )
}

fn ram_line(mem: &HostMemory) -> String {
    format!(
        "{} total, {} available",
        h(mem.total_bytes),
        h(mem.available_bytes)
    )
}

fn swap_line(mem: &HostMemory) -> String {
    if mem.swap_total_bytes == 0 {
        "none".to_owned()
    } else {
        format!(
            "{} total, {} free",
            h(mem.swap_total_bytes),
            h(mem.swap_free_bytes)
        )
    }
}

fn cgroup_line(cgroup: Option<&CgroupMemory>) -> String {
    let Some(cg) = cgroup else {
        return "no memory cgroup found".to_owned();
    };
    let version = serde_json::to_value(cg.version).unwrap_or_default();
    let limit = match (cg.limit_bytes(), &cg.limited_by) {
        (Some(l), Some(dir)) => format!("limit {} set by {}", h(l), dir.display()),
        _ => "no limit".to_owned(),
    };
    format!(
        "{} {}: {limit}; {} in use; {} OOM kills",
        version.as_str().unwrap_or("?"),
        cg.dir.display(),
        cg.current_bytes.map_or("?".to_owned(), h),
        cg.events.oom_kill
    )
}

/// One line per GPU, then the driver version.
fn gpus_line(m: &Machine) -> String {
    if m.gpus.is_empty() {
        return "none".to_owned();
    }
    m.gpus
        .iter()
        .map(|g| {
            format!(
                "{}: {} free of {}",
                g.name,
                h(g.free_bytes),
                h(g.total_bytes)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
        + &m.gpu_driver
            .as_ref()
            .map(|d| format!("\ndriver {d}"))
            .unwrap_or_default()
}

/// `memfit_train_gpu` of `--json`: `{"ready": bool, "devices": [names], "detail": "…"}`.
fn gpu_training_json(t: &GpuTraining) -> Value {
    let (ready, detail) = match &t.ready {
        Ok(with) => (true, with),
        Err(why) => (false, why),
    };
    let mut v = serde_json::json!({"ready": ready, "devices": t.devices, "detail": detail});
    if let Some(nccl) = &t.nccl {
        v["data_parallel"] = match nccl {
            Ok(name) => serde_json::json!({"ready": true, "nccl": name, "device": "cuda:all"}),
            Err(why) => serde_json::json!({"ready": false, "detail": why}),
        };
    }
    v
}

/// Whether this binary can train on the GPUs it sees, and with what (or why not).
fn gpu_training_line(t: &GpuTraining) -> String {
    match (&t.ready, t.devices.is_empty()) {
        (Ok(with), _) => {
            let several = match &t.nccl {
                Some(Ok(nccl)) => format!(
                    "; all {} at once: --device cuda:all ({nccl})",
                    t.devices.len()
                ),
                Some(Err(why)) => format!("; several at once: no ({why})"),
                None => String::new(),
            };
            format!(
                "yes: cuda:0..cuda:{} ({with}){several}",
                t.devices.len() - 1
            )
        }
        (Err(why), true) => format!("no GPU: {why}"),
        (Err(why), false) => format!("no: {why}"),
    }
}

fn oom_daemons_line(m: &Machine) -> String {
    if m.oom_daemons.is_empty() {
        return "none running".to_owned();
    }
    m.oom_daemons
        .iter()
        .map(|d| format!("{} (pid {})", d.name, d.pid))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use memfit_train::device::GpuTraining;

    #[test]
    fn several_gpus_say_whether_data_parallel_training_finds_nccl() {
        let two = |nccl| GpuTraining {
            devices: vec!["H100".into(), "H100".into()],
            ready: Ok("CUDA 13.0 driver".into()),
            nccl: Some(nccl),
        };
        let ok = two(Ok("libnccl.so".into()));
        let line = super::gpu_training_line(&ok);
        assert!(line.contains("--device cuda:all (libnccl.so)"), "{line}");
        assert_eq!(
            super::gpu_training_json(&ok)["data_parallel"]["ready"],
            true
        );
        let missing = two(Err("several GPUs need NCCL: …".into()));
        let line = super::gpu_training_line(&missing);
        assert!(
            line.contains("several at once: no (several GPUs need NCCL"),
            "{line}"
        );
        let json = super::gpu_training_json(&missing);
        assert_eq!(json["data_parallel"]["ready"], false);
        assert_eq!(json["ready"], true, "one GPU still trains");
    }

    #[test]
    fn paths_become_one_shell_word() {
        assert_eq!(super::shell("/a/b-c_d.toml"), "/a/b-c_d.toml");
        assert_eq!(super::shell("/my runs/x.toml"), "'/my runs/x.toml'");
        assert_eq!(super::shell("it's"), r"'it'\''s'");
    }
}
