//! `memfit estimate`: predicted peak GPU and host memory of one training setup, by component.

use crate::exit::{Outcome, bad_input};
use comfy_table::{Cell, CellAlignment, Table, presets::UTF8_FULL_CONDENSED};
use memfit_plan::Task;
use memfit_plan::arch::{self, Arch};
use memfit_plan::memory::{
    self, Attention, Component, DatasetMode, Device, Estimate, Framework, FreezeGroup, LoraTarget,
    Method, Optimizer, Precision, Quant, Runtime, Setup, Stack, Zero, gib,
};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// A preset name (e.g. chatlm-mini, qwen2.5-0.5b) or a Hugging Face config.json path.
    #[arg(long)]
    pub model: String,
    /// seq2seq, causal-lm or classification (default: from the architecture).
    #[arg(long, value_parser = parse_task)]
    pub task: Option<Task>,
    /// Micro-batch per GPU.
    #[arg(long)]
    pub batch: u64,
    /// Tokens per sample (encoder length for seq2seq).
    #[arg(long)]
    pub seq: u64,
    /// Decoder length for seq2seq (default: seq / 4).
    #[arg(long)]
    pub tgt_seq: Option<u64>,
    #[arg(long, default_value_t = 1)]
    pub accum: u64,
    #[arg(long, default_value = "fp32", value_parser = parse_enum::<Precision>)]
    pub precision: Precision,
    #[arg(long, default_value = "adamw", value_parser = parse_enum::<Optimizer>)]
    pub optimizer: Optimizer,
    #[arg(long)]
    pub grad_ckpt: bool,
    #[command(flatten)]
    pub method: MethodArgs,
    #[command(flatten)]
    pub lengths: LengthArgs,
    #[arg(long, default_value = "0", value_parser = parse_enum::<Zero>)]
    pub zero: Zero,
    /// DeepSpeed's `reduce_bucket_size` (elements) where the run's config sets one (default:
    /// transformers' "auto", hidden²).
    #[arg(long)]
    pub zero_bucket_size: Option<u64>,
    /// Offload optimizer states to the host: `cpu`.
    #[arg(long, value_parser = parse_cpu)]
    pub offload_optimizer: Option<bool>,
    /// Offload parameters to the host: `cpu` (ZeRO-3).
    #[arg(long, value_parser = parse_cpu)]
    pub offload_params: Option<bool>,
    /// GPUs per node.
    #[arg(long, default_value_t = 1)]
    pub gpus: u64,
    #[arg(long, default_value_t = 1)]
    pub nodes: u64,
    #[arg(long, default_value = "eager", value_parser = parse_enum::<Attention>)]
    pub attention: Attention,
    #[arg(long, default_value = "cuda", value_parser = parse_enum::<Device>)]
    pub device: Device,
    #[arg(long, default_value = "pytorch", value_parser = parse_enum::<Runtime>)]
    pub runtime: Runtime,
    /// DataLoader workers.
    #[arg(long, default_value_t = 0)]
    pub workers: u64,
    #[arg(long)]
    pub pin_memory: bool,
    /// Rows of the training set (held in memory by the pytorch runtime; memfit reads its token store
    /// with positioned reads, page cache rather than RSS).
    #[arg(long, default_value_t = 0)]
    pub dataset_rows: u64,
    /// One JSON object on stdout (docs/architecture.md §3).
    #[arg(long)]
    pub json: bool,
}

/// What is trained: shared by `memfit estimate` and `memfit plan`.
#[derive(clap::Args)]
pub struct MethodArgs {
    #[arg(long, default_value = "full", value_parser = parse_enum::<Method>)]
    pub method: Method,
    #[arg(long, default_value_t = 8)]
    pub lora_r: u64,
    #[arg(long, default_value_t = 16)]
    pub lora_alpha: u64,
    /// Comma list of q,k,v,o,qkv,gate,up,down,mlp,lm_head.
    #[arg(long, default_value = "q,v", value_parser = parse_list::<LoraTarget>)]
    pub lora_targets: ListOf<LoraTarget>,
    #[arg(long, value_parser = parse_enum::<Quant>)]
    pub quant: Option<Quant>,
    /// `--runtime memfit` under LoRA: the frozen base's precision, fp32 or bf16 (apart from the
    /// activations' --precision; default fp32).
    #[arg(long, value_parser = parse_enum::<Precision>)]
    pub base_precision: Option<Precision>,
    /// Comma list of embeddings,encoder,decoder (with --method freeze).
    #[arg(long, value_parser = parse_list::<FreezeGroup>)]
    pub freeze: Option<ListOf<FreezeGroup>>,
    /// The training code: hf-trainer, peft, torchtune, litgpt, accelerate-deepspeed, lightning
    /// (what each keeps differently: docs/memory-model.md, "Training stacks").
    #[arg(long, default_value = "hf-trainer", value_parser = parse_enum::<Stack>)]
    pub stack: Stack,
}

/// How step lengths vary, for the caching allocator (`memory/allocator.rs`): shared by
/// `memfit estimate` and `memfit plan`.
#[derive(clap::Args)]
pub struct LengthArgs {
    /// The shortest sequence of a step as a fraction of the longest (--seq), in (0, 1]: below
    /// 1 the caching allocator keeps the segments of shorter steps reserved beside the
    /// longest's (1 = every step padded to --seq).
    #[arg(long, default_value_t = 1.0, value_parser = parse_spread)]
    pub length_spread: f64,
    /// The run sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place:
    /// shorter steps leave nothing reserved).
    #[arg(long)]
    pub expandable_segments: bool,
}

impl LengthArgs {
    pub fn apply(&self, s: &mut Setup) {
        s.length_spread = self.length_spread;
        s.expandable_segments = self.expandable_segments;
    }
}

fn parse_spread(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(r) if r > 0.0 && r <= 1.0 => Ok(r),
        _ => Err(format!(
            "{v:?}: the shortest step's length over the longest's, a number in (0, 1]"
        )),
    }
}

impl MethodArgs {
    pub fn apply(&self, s: &mut Setup) {
        s.method = self.method;
        s.lora_r = self.lora_r;
        s.lora_alpha = self.lora_alpha;
        s.lora_targets = self.lora_targets.0.clone();
        s.quant = self.quant;
        s.base_precision = self.base_precision;
        s.stack = self.stack;
        s.freeze = self
            .freeze
            .as_ref()
            .map(|l| l.0.clone())
            .unwrap_or_default();
    }
}

/// Task and lengths: the task defaults to the architecture's, the target length to seq / 4.
pub fn apply_task(s: &mut Setup, task: Option<Task>, seq: u64, tgt_seq: Option<u64>) {
    s.task = task.unwrap_or(s.task);
    s.seq = seq;
    s.tgt_seq = match (s.task, tgt_seq) {
        (Task::Seq2seq, Some(t)) => t,
        (Task::Seq2seq, None) => (seq / 4).max(1),
        _ => 0,
    };
}

/// The dataset mode a runtime uses: pytorch holds the table in memory, memfit maps its store.
pub fn dataset_of(runtime: Runtime) -> DatasetMode {
    match runtime {
        Runtime::Pytorch => DatasetMode::InMemory,
        Runtime::Memfit => DatasetMode::TokenStore,
    }
}

/// A comma-separated list of enum values (a newtype so clap treats it as one value).
#[derive(Debug, Clone)]
pub struct ListOf<T>(pub Vec<T>);

/// Enums spelled as on the command line.
pub trait CliEnum: Sized + Copy + Send + Sync + 'static {
    fn parse_cli(s: &str) -> Option<Self>;
    fn names_cli() -> String;
}

macro_rules! cli_enum {
    ($($t:ty),*) => {$(
        impl CliEnum for $t {
            fn parse_cli(s: &str) -> Option<Self> { <$t>::parse(s) }
            fn names_cli() -> String { <$t>::names() }
        }
    )*};
}
cli_enum!(
    Precision,
    Optimizer,
    Method,
    Quant,
    Zero,
    Attention,
    Device,
    Runtime,
    LoraTarget,
    FreezeGroup,
    Stack
);

pub fn parse_enum<T: CliEnum>(s: &str) -> Result<T, String> {
    T::parse_cli(s).ok_or_else(|| format!("{s:?} is not one of: {}", T::names_cli()))
}

pub fn parse_list<T: CliEnum>(s: &str) -> Result<ListOf<T>, String> {
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| parse_enum::<T>(x.trim()))
        .collect::<Result<Vec<_>, _>>()
        .map(ListOf)
}

pub fn parse_task(s: &str) -> Result<Task, String> {
    Task::parse(s).ok_or_else(|| format!("{s:?} is not one of: {}", Task::NAMES))
}

fn parse_cpu(s: &str) -> Result<bool, String> {
    match s {
        "cpu" => Ok(true),
        "none" => Ok(false),
        _ => Err(format!("{s:?}: only `cpu` (or `none`) is supported")),
    }
}

/// Appends one formatted line to a `String` buffer.
macro_rules! out {
    ($o:ident, $($t:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($o, $($t)*);
    }};
}
pub(crate) use out;

/// Writes a whole report to stdout; a closed pipe (`memfit … | head`) is not an error.
pub fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// Resolves `--model`: an existing file is read as config.json, otherwise a preset name. A config
/// read as a generic decoder (unknown `model_type`) prints its assumption as a warning on stderr.
pub fn load_model(model: &str) -> anyhow::Result<Arch> {
    let path = std::path::Path::new(model);
    if path.is_file() || model.ends_with(".json") {
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad_input(format!("--model {model}: cannot read: {e}")))?;
        let name = path
            .parent()
            .and_then(|p| p.file_name())
            .filter(|_| path.file_name().is_some_and(|f| f == "config.json"))
            .or_else(|| path.file_stem())
            .map_or_else(|| model.to_string(), |n| n.to_string_lossy().into_owned());
        let arch = arch::parse_config(model, &text, &name).map_err(|e| bad_input(e.to_string()))?;
        if let Some(assumption) = &arch.assumption {
            eprintln!("warning: {assumption}");
        }
        Ok(arch)
    } else {
        arch::preset(model).map_err(|e| bad_input(e.to_string()))
    }
}

impl Args {
    /// The fully resolved setup.
    fn setup(&self, arch: &Arch) -> Setup {
        let mut s = Setup::new(arch);
        apply_task(&mut s, self.task, self.seq, self.tgt_seq);
        self.method.apply(&mut s);
        self.lengths.apply(&mut s);
        s.batch = self.batch;
        s.accum = self.accum;
        s.precision = self.precision;
        s.optimizer = self.optimizer;
        s.grad_ckpt = self.grad_ckpt;
        s.zero = self.zero;
        s.zero_bucket_size = self.zero_bucket_size;
        s.offload_optimizer = self.offload_optimizer.unwrap_or(false);
        s.offload_params = self.offload_params.unwrap_or(false);
        s.gpus = self.gpus;
        s.nodes = self.nodes;
        s.attention = self.attention;
        s.device = self.device;
        s.runtime = self.runtime;
        s.workers = self.workers;
        s.pin_memory = self.pin_memory;
        s.dataset_rows = self.dataset_rows;
        s.dataset = dataset_of(self.runtime);
        s
    }
}

pub fn run(args: Args) -> Outcome {
    let arch = load_model(&args.model)?;
    let setup = args.setup(&arch);
    let arch = arch.with_task(setup.task);
    let est = memory::estimate(&arch, &setup, &Framework::default()).map_err(bad_input)?;
    if let Some(caveat) = memory::allocator::length_spread_caveat(&setup) {
        eprintln!("warning: {caveat}");
    }
    let text = if args.json {
        serde_json::to_string_pretty(&estimate_json(&arch, &setup, &est))? + "\n"
    } else {
        human(&arch, &setup, &est)
    };
    write_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// The `--json` object of docs/architecture.md §3 (also embedded by `memfit plan --json`).
pub fn estimate_json(arch: &Arch, setup: &Setup, est: &Estimate) -> serde_json::Value {
    let tr = memory::states::trainable(arch, setup);
    serde_json::json!({
        "model": {
            "name": arch.name,
            "family": arch.model_type,
            "params_total": arch.params_total(),
            "params_trainable": tr.total(),
            "assumption": arch.assumption,
        },
        "setup": setup,
        "gpu": gpu_json(setup, est),
        "host": {
            "peak_rss_bytes": est.host.peak_rss_bytes,
            "components": est.host.components,
        },
    })
}

/// The `gpu` object of docs/architecture.md §3 with one added field, `band`: the validation band of the
/// setup's class (`memory::band`), `null` without a GPU.
fn gpu_json(setup: &Setup, est: &Estimate) -> serde_json::Value {
    let Some(g) = &est.gpu else {
        return serde_json::Value::Null;
    };
    let mut v = serde_json::to_value(g).unwrap_or(serde_json::Value::Null);
    if let Some(o) = v.as_object_mut() {
        o.insert(
            "band".into(),
            serde_json::to_value(memory::band::report(setup, g)).unwrap_or_default(),
        );
    }
    v
}

/// The human line of the band: the class, its width and the widened peaks.
pub fn band_line(setup: &Setup, g: &memory::GpuEstimate) -> String {
    let b = memory::band::report(setup, g);
    if b.band.class == memory::band::MEMFIT_DEVICE.class {
        return format!(
            "band ({}): allocated ≤ {} GiB · nvml ≤ {} GiB",
            b.basis,
            gib(b.peak_allocated_high_bytes),
            gib(b.nvml_used_high_bytes)
        );
    }
    format!(
        "validation band ({}, {:.0}% over {} published rows and the biases of {} sources, leave-one-source-out): \
         allocated ≤ {} GiB · reserved ≤ {} GiB · nvml ≤ {} GiB in 90% of them",
        b.band.class,
        100.0 * b.band.width,
        b.band.rows,
        b.band.sources,
        gib(b.peak_allocated_high_bytes),
        gib(b.peak_reserved_high_bytes),
        gib(b.nvml_used_high_bytes)
    )
}

/// A component table: name, GiB, what it scales with, note.
pub fn component_table(components: &[Component]) -> Table {
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED);
    t.set_header(vec!["component", "GiB", "scales with", "note"]);
    for c in components.iter().filter(|c| c.bytes > 0) {
        t.add_row(vec![
            Cell::new(&c.name),
            Cell::new(gib(c.bytes)).set_alignment(CellAlignment::Right),
            Cell::new(c.scales.as_str()),
            Cell::new(&c.note),
        ]);
    }
    t
}

/// The human report: setup line, GPU and host component tables.
fn human(arch: &Arch, setup: &Setup, est: &Estimate) -> String {
    let mut o = String::new();
    let tr = memory::states::trainable(arch, setup);
    out!(
        o,
        "{} ({}): {} parameters, {} trainable",
        arch.name,
        arch.model_type,
        arch.params_total(),
        tr.total()
    );
    out!(
        o,
        "setup: {:?} batch {} × seq {}{} accum {}, {}, {}, {}{}{}, {}",
        setup.task,
        setup.batch,
        setup.seq,
        if setup.tgt_seq > 0 {
            format!(" → {}", setup.tgt_seq)
        } else {
            String::new()
        },
        setup.accum,
        setup.precision,
        setup.optimizer,
        setup.method,
        if setup.grad_ckpt { ", grad ckpt" } else { "" },
        if setup.zero != Zero::Z0 {
            format!(", zero {}", setup.zero)
        } else {
            String::new()
        },
        where_it_runs(setup)
    );
    match setup.runtime {
        memory::Runtime::Memfit => {
            out!(o, "trainer: memfit train ({})", where_memfit_trains(setup))
        }
        memory::Runtime::Pytorch => out!(o, "stack: {}", setup.stack),
    }
    match &est.gpu {
        Some(g) => {
            out!(o, "\nGPU (per rank)");
            out!(o, "{}", component_table(&g.components));
            out!(
                o,
                "peak allocated {} GiB · peak reserved {} GiB · nvml used {} GiB",
                gib(g.peak_allocated_bytes),
                gib(g.peak_reserved_bytes),
                gib(g.nvml_used_bytes)
            );
            out!(o, "{}", band_line(setup, g));
        }
        None => out!(o, "\nGPU: none (--device cpu: activations are host memory)"),
    }
    out!(o, "\nHost (per node)");
    out!(o, "{}", component_table(&est.host.components));
    out!(o, "peak RSS {} GiB", gib(est.host.peak_rss_bytes));
    o
}

/// Where memfit's trainer keeps its training state on this device.
fn where_memfit_trains(setup: &Setup) -> &'static str {
    match setup.device {
        Device::Cuda => "weights, gradients and optimizer states on the GPU, burn's CUDA backend",
        Device::Cpu => "on the CPU, burn's flex backend",
    }
}

/// "CPU" on `--device cpu` (no GPU takes part), else "N GPU(s) × M node(s)".
fn where_it_runs(setup: &Setup) -> String {
    if setup.device == Device::Cpu {
        "CPU".into()
    } else {
        format!("{} GPU(s) × {} node(s)", setup.gpus, setup.nodes)
    }
}
