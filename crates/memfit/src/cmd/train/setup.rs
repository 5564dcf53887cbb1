//! The flags resolved once into the setup every later step reads (ripgrep's low-level → high-level
//! arguments): the run's config (defaults ← demo ← profile ← preset ← `--config` file ← flags, the
//! task from the model's family when no layer names it), its budget (the machine probed once), the
//! planned start, and where the run lives.

use super::args::Args;
use super::{budget, default_out};
use crate::exit::bad_input;
use memfit_sys::units::human_bytes;
use memfit_train::config::{ConfigLayer, TaskKind, TrainConfig};
use memfit_train::device::ChosenDevice;
use memfit_train::plan_file::Budget;
use memfit_train::{demo, model_spec, presets};
use serde_json::Value;
use std::cell::Cell;
use std::path::PathBuf;

/// A new run or one to continue.
pub enum Mode {
    New,
    Resume,
}

/// Everything `memfit train` decided before anything is written.
pub struct Setup {
    pub mode: Mode,
    pub config: TrainConfig,
    pub root: PathBuf,
    /// The flags as a layer (a resume applies them over the run's config and checks the trajectory).
    pub flags: ConfigLayer,
    /// The planned start (`planning` of plan.json): this start's, or the run's first one.
    pub planning: Option<Value>,
    /// The planned start's lines, printed once the run exists.
    pub plan_lines: Vec<String>,
    /// Where a resumed demo run's model config is.
    pub demo_config: Option<PathBuf>,
    /// What the run computes on (`--device`, settled before anything is created).
    pub device: ChosenDevice,
}

/// The machine's effective available memory, probed at most once.
pub struct Available(Cell<Option<u64>>);

impl Available {
    pub fn new() -> Self {
        Self(Cell::new(None))
    }

    pub fn bytes(&self) -> anyhow::Result<u64> {
        if let Some(b) = self.0.get() {
            return Ok(b);
        }
        let b = memfit_sys::probe::host_memory()?.effective_available_bytes;
        self.0.set(Some(b));
        Ok(b)
    }
}

impl Setup {
    pub fn resolve(args: &Args) -> anyhow::Result<Self> {
        let device =
            memfit_train::device::resolve(args.device).map_err(|e| bad_input(e.to_string()))?;
        let available = Available::new();
        let gpu = budget::gpu_budget(args)?.or_else(|| device.default_gpu_budget());
        let ram = args
            .budget_ram
            .as_deref()
            .map(|t| budget::parse_ram(t, &|| available.bytes()))
            .transpose()?;
        let flags = args.layer(ram.as_ref().map(|b| b.ram_bytes), gpu)?;
        match &args.resume {
            Some(dir) => resume(args, dir, flags, device),
            None => new_run(args, flags, (ram, gpu), &available, device),
        }
    }
}

/// A resumed run: its config.toml with the flags over it, its first planned start.
fn resume(
    args: &Args,
    dir: &std::path::Path,
    flags: ConfigLayer,
    device: ChosenDevice,
) -> anyhow::Result<Setup> {
    let path = dir.join("config.toml");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        let why = memfit_train::run_dir::RunDirError::not_a_run(dir, &e);
        bad_input(format!("--resume: {why}"))
    })?;
    let mut config = TrainConfig::from_toml(&text, &path).map_err(|e| bad_input(e.to_string()))?;
    if let Some(task) = args.task().filter(|t| *t != config.task) {
        return Err(bad_input(format!(
            "--resume {}: the run trains {}; --task {} cannot continue it (start a new run with --init {}/best)",
            dir.display(),
            config.task.name(),
            task.name(),
            dir.display()
        )));
    }
    flags.apply(&mut config);
    let planning = std::fs::read_to_string(dir.join("plan.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v.get("planning").cloned());
    let demo = dir.join("demo/config.json");
    Ok(Setup {
        mode: Mode::Resume,
        config,
        root: dir.to_path_buf(),
        flags,
        planning,
        plan_lines: Vec::new(),
        demo_config: demo.is_file().then_some(demo),
        device,
    })
}

/// A new run: its config, and its start planned within the budget.
fn new_run(
    args: &Args,
    flags: ConfigLayer,
    (ram, gpu): (Option<Budget>, Option<u64>),
    available: &Available,
    device: ChosenDevice,
) -> anyhow::Result<Setup> {
    let file = match &args.config {
        Some(path) => Some(ConfigLayer::from_file(path).map_err(|e| bad_input(e.to_string()))?),
        None => None,
    };
    for key in file.iter().flat_map(|f| f.unknown.keys()) {
        eprintln!(
            "warning: {}: key {key:?} is not a memfit train setting; ignored",
            args.config
                .as_deref()
                .unwrap_or(std::path::Path::new(""))
                .display()
        );
    }
    let config = resolve_config(args, file.as_ref(), &flags)?;
    let model_json = if config.model == "demo" {
        demo_model_config(config.task)
    } else {
        model_spec::model_config(&config.model, None).map_err(|e| bad_input(e.to_string()))?
    };
    check_gpu_budget(&config, &model_json, &device)?;
    // a budget written in the --config file counts when no flag gives one
    let file_budget = file.as_ref().and_then(|f| f.memory_budget_bytes);
    let budget = budget::resolve(ram, file_budget, gpu, available)?;
    let start = budget::plan_start(
        &args.policy,
        &flags,
        &config,
        &model_json,
        budget,
        available,
    )?;
    Ok(Setup {
        mode: Mode::New,
        config: start.config,
        root: args.out.clone().unwrap_or_else(default_out),
        flags,
        planning: Some(start.planning),
        plan_lines: start.lines,
        demo_config: None,
        device,
    })
}

/// On a GPU, a budget below the model's weights alone: exit 3 before anything is created.
fn check_gpu_budget(
    config: &TrainConfig,
    model_json: &Value,
    device: &ChosenDevice,
) -> anyhow::Result<()> {
    let (true, Some(budget)) = (device.is_gpu(), config.gpu_memory_budget_bytes) else {
        return Ok(());
    };
    let weights = memfit_train::plan_file::gpu_weight_bytes(config, model_json)
        .map_err(|e| bad_input(format!("model {}: {e}", config.model)))?;
    if weights > budget {
        return Err(crate::exit::does_not_fit(format!(
            "--budget-gpu {}: the weights of {} alone take {} on {} ({})",
            human_bytes(budget),
            config.model,
            human_bytes(weights),
            device.label,
            config.precision.name()
        )));
    }
    Ok(())
}

/// The demo's model config (written into the run later; the same values).
fn demo_model_config(task: TaskKind) -> Value {
    match task {
        TaskKind::Classification => {
            demo::classification::model_config(demo::classification::vocabulary().len())
        }
        _ => demo::seq2seq::model_config(demo::seq2seq::vocabulary().len()),
    }
}

/// Defaults ← demo ← profile ← model preset ← `--config` file ← flags; then the task's defaults for
/// what no layer set (the task itself from the model's family, the metric that picks best/).
fn resolve_config(
    args: &Args,
    file: Option<&ConfigLayer>,
    flags: &ConfigLayer,
) -> anyhow::Result<TrainConfig> {
    let mut layers = Vec::new();
    let mut profile = args.profile.clone();
    if let Some(preset) = &args.preset {
        // A model preset's real configuration is the seed's pretrain profile.
        let implied = if presets::PROFILES.contains(&preset.as_str()) {
            preset.clone()
        } else {
            "pretrain".into()
        };
        profile.get_or_insert(implied);
    }
    if let Some(name) = &profile {
        layers.push(presets::profile(name).ok_or_else(|| {
            bad_input(format!(
                "--profile {name:?}: known profiles: {}",
                presets::PROFILES.join(", ")
            ))
        })?);
    }
    if let Some(preset) = args
        .preset
        .as_ref()
        .filter(|p| !presets::PROFILES.contains(&p.as_str()))
    {
        layers.push(ConfigLayer {
            model: Some(preset.clone()),
            ..ConfigLayer::default()
        });
    }
    layers.extend(file.cloned());
    layers.push(flags.clone());
    let mut config = merge(&layers, None);
    let named_task = layers.iter().rev().find_map(|l| l.task);
    if named_task.is_none() && config.model != "demo" {
        config.task = task_of_model(&config.model)?;
    }
    if config.model == "demo" && config.task == TaskKind::Classification {
        config = merge(&layers, Some(demo::classification::config_layer()));
    }
    if config.model == "demo" && config.task == TaskKind::CausalLm {
        return Err(bad_input(
            "--task causal-lm has no demo: give the model (--init DIR, a transformers model \
             directory, or --model config.json) and --data FILE --tokenizer DIR",
        ));
    }
    if !layers.iter().any(|l| l.best_metric.is_some()) {
        config.best_metric = config.task.default_best_metric();
    }
    if config.max_grad_norm == Some(0.0) {
        config.max_grad_norm = None;
    }
    config.validate().map_err(|e| bad_input(e.to_string()))?;
    check_data(args, &config)?;
    Ok(config)
}

/// The layers over the defaults, with `demo` (the demo's own settings) first.
fn merge(layers: &[ConfigLayer], demo: Option<ConfigLayer>) -> TrainConfig {
    let mut config = TrainConfig::default();
    for layer in demo.iter().chain(layers) {
        layer.apply(&mut config);
    }
    config
}

/// The task of a named model, from its family.
fn task_of_model(model: &str) -> anyhow::Result<TaskKind> {
    let json = model_spec::model_config(model, None).map_err(|e| bad_input(e.to_string()))?;
    match memfit_nn::families::task_of(&json) {
        Some("classification") => Ok(TaskKind::Classification),
        Some("seq2seq") => Ok(TaskKind::Seq2seq),
        Some("causal-lm") => Ok(TaskKind::CausalLm),
        _ => Err(bad_input(format!(
            "model {model}: model_type {:?} is not a family memfit train trains (t5, mt5: seq2seq; \
             bert, roberta, xlm-roberta: classification; llama, qwen2, mistral, qwen3: causal-lm)",
            memfit_nn::families::model_type(&json)
        ))),
    }
}

/// Only the demo trains without data; a named model needs it.
fn check_data(args: &Args, config: &TrainConfig) -> anyhow::Result<()> {
    if config.model == "demo" && config.data.is_some() {
        return Err(bad_input(
            "--data needs --model (a preset such as chatlm-mini, or a config.json) or --preset",
        ));
    }
    if config.model != "demo" && config.data.is_none() && !args.plan_only {
        return Err(bad_input(no_data(args, &config.model)));
    }
    Ok(())
}

/// A named model with no data: say where the data should have come from.
fn no_data(args: &Args, model: &str) -> String {
    let fix = "set `data` (a parquet/JSONL file or a token store) and `tokenizer` in it, or pass \
               --data FILE --tokenizer DIR";
    match &args.config {
        Some(path) => format!("{} names no training data: {fix}", path.display()),
        None => format!(
            "model {model} needs training data: pass --data FILE --tokenizer DIR (only the demo, \
             `memfit train` without a model, trains on data of its own)"
        ),
    }
}
