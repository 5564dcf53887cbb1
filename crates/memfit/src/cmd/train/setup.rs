//! The flags resolved once into the setup every later step reads (ripgrep's low-level → high-level
//! arguments): the run's config (defaults ← the demo's or, with a model, the task's defaults
//! (`fit`) ← profile ← preset ← `--config` file ← flags, the task from the model's family when no
//! layer names it), its budget (the machine probed once), the planned start (after the data is read
//! when its sequence length comes from the data), and where the run lives.

use super::args::Args;
use super::fit::{self, Fit};
use super::{budget, default_out};
use crate::exit::bad_input;
use memfit_nn::families;
use memfit_sys::units::human_bytes;
use memfit_train::config::{ConfigLayer, TaskKind, TrainConfig};
use memfit_train::device::ChosenDevice;
use memfit_train::plan_file::Budget;
use memfit_train::task_defaults::{self, TaskDefaults};
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
    /// What the defaults chose for a run on real data (printed at its start).
    pub fit: Fit,
    /// A start planned once the data is read (the sequence length may come from the data, and
    /// what the data and tokenizer hold is measured then).
    pub plan_after_data: Option<PlanAfterData>,
}

/// What planning the start needs once the data is prepared.
pub struct PlanAfterData {
    pub policy: String,
    pub budget: Budget,
    pub available_bytes: u64,
    /// The longest sequence the model takes (the data's is cut to it).
    pub max_seq: usize,
}

/// The machine's memory, probed at most once: what a new job can use (effective available) and
/// what the machine has at all (total, capped by the cgroup limit).
pub struct Available(Cell<Option<(u64, u64)>>);

impl Available {
    pub fn new() -> Self {
        Self(Cell::new(None))
    }

    /// Available memory probed before (the machine's total is then taken as the same).
    pub fn known(bytes: u64) -> Self {
        Self(Cell::new(Some((bytes, bytes))))
    }

    fn probe(&self) -> anyhow::Result<(u64, u64)> {
        if let Some(known) = self.0.get() {
            return Ok(known);
        }
        let m = memfit_sys::probe::host_memory()?;
        let machine = m
            .cgroup_limit_bytes
            .map_or(m.total_bytes, |l| l.min(m.total_bytes));
        let known = (m.effective_available_bytes, machine);
        self.0.set(Some(known));
        Ok(known)
    }

    pub fn bytes(&self) -> anyhow::Result<u64> {
        Ok(self.probe()?.0)
    }

    /// The most memory any budget here can have: MemTotal, capped by the cgroup limit.
    pub fn machine_bytes(&self) -> anyhow::Result<u64> {
        Ok(self.probe()?.1)
    }
}

impl Setup {
    pub fn resolve(args: &Args) -> anyhow::Result<Self> {
        let device =
            memfit_train::device::resolve(&args.device).map_err(|e| bad_input(e.to_string()))?;
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
    if let Some(bytes) = config.memory_budget_bytes {
        let source = match flags.memory_budget_bytes {
            Some(_) => "--budget-ram".to_string(),
            None => format!("memory_budget_bytes of {}", path.display()),
        };
        let (bytes, source) = budget::within_supervisor(bytes, source)?;
        budget::check_within_machine(bytes, &source, &Available::new())?;
        config.memory_budget_bytes = Some(bytes);
    }
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
        fit: Fit::default(),
        plan_after_data: None,
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
    let (mut config, fit) = resolve_config(args, file.as_ref(), &flags)?;
    let model_json = if config.model == "demo" {
        demo_model_config(config.task)
    } else {
        model_spec::model_config(&config.model, None).map_err(|e| bad_input(e.to_string()))?
    };
    check_gpu_budget(&config, &model_json, &device)?;
    let positions = families::positions(&model_json).map_err(|e| bad_input(e.to_string()))?;
    let max_seq = fit::max_seq(positions);
    if fit.seq_from_data {
        // prepared up to the model's positions; the data's longest row sets it at the start
        config.seq = max_seq;
    }
    if fit.tgt_seq_from_data {
        config.tgt_seq = max_seq;
    }
    fit::check_seq(&config, positions)?;
    // a budget written in the --config file counts when no flag gives one
    let file_budget = file.as_ref().and_then(|f| f.memory_budget_bytes);
    let compute = budget::Compute {
        gpu_bytes: gpu,
        on_gpu: device.is_gpu(),
        ranks: device.rank_count(),
        shard_optimizer: args.shard_optimizer,
    };
    let budget = budget::resolve(ram, file_budget, compute, available)?;
    if !args.plan_only {
        budget::check_within_machine(budget.ram_bytes, &budget.ram_source, available)?;
    }
    let root = args.out.clone().unwrap_or_else(default_out);
    // The start is planned once the data is prepared: its sequence length may come from the data,
    // and what the data and tokenizer hold is measured then and planned beside the training.
    if !args.plan_only && args.policy == "auto" {
        let plan_after_data = PlanAfterData {
            policy: args.policy.clone(),
            budget,
            available_bytes: available.bytes()?,
            max_seq,
        };
        return Ok(Setup {
            mode: Mode::New,
            config,
            root,
            flags,
            planning: None,
            plan_lines: Vec::new(),
            demo_config: None,
            device,
            fit,
            plan_after_data: Some(plan_after_data),
        });
    }
    let mut start = budget::plan_start(
        &args.policy,
        &flags,
        &config,
        &model_json,
        budget,
        available,
    )?;
    if fit.seq_from_data && args.plan_only {
        start.lines.push(format!(
            "  seq: from the data when the run starts (its longest prepared row, at most {max_seq}); \
             planned here at {max_seq}"
        ));
    }
    Ok(Setup {
        mode: Mode::New,
        config: start.config,
        root,
        flags,
        planning: Some(start.planning),
        plan_lines: start.lines,
        demo_config: None,
        device,
        fit,
        plan_after_data: None,
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

/// Defaults ← demo or task defaults ← profile ← model preset ← `--config` file ← flags; the task
/// from the model's family when no layer names it, the metric that picks best/ from the task.
fn resolve_config(
    args: &Args,
    file: Option<&ConfigLayer>,
    flags: &ConfigLayer,
) -> anyhow::Result<(TrainConfig, Fit)> {
    let layers = user_layers(args, file, flags)?;
    let mut config = merge(&layers, None);
    let named_task = layers.iter().rev().find_map(|l| l.task);
    if named_task.is_none() && config.model != "demo" {
        config.task = task_of_model(&config.model)?;
    }
    let mut fit = Fit::default();
    if config.model == "demo" && config.task == TaskKind::Classification {
        config = merge(&layers, Some(demo::classification::config_layer()));
    } else if config.model != "demo" {
        // real data or --init: nothing from the demo
        let task = config.task;
        let defaults = task_defaults::for_run(task, config.method);
        config = merge(&layers, Some(defaults.layer()));
        config.task = task;
        let profiled = args.profile.is_some() || args.preset.is_some();
        fit = real_data_fit(&layers, &mut config, (&defaults, profiled));
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
    Ok((config, fit))
}

/// The layers the user gave: profile, model preset, `--config` file, flags.
fn user_layers(
    args: &Args,
    file: Option<&ConfigLayer>,
    flags: &ConfigLayer,
) -> anyhow::Result<Vec<ConfigLayer>> {
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
    Ok(layers)
}

/// A run on real data: what its task defaults chose (`profiled`: a profile or preset set the
/// rest), the settings taken from the data, an `--init` run evaluated at its start (so its end is
/// judged against it), and a warning for a learning rate far from the defaults'.
fn real_data_fit(
    layers: &[ConfigLayer],
    config: &mut TrainConfig,
    (d, profiled): (&TaskDefaults, bool),
) -> Fit {
    let set = |f: fn(&ConfigLayer) -> bool| layers.iter().any(f);
    if set(|l| l.warmup_steps.is_some() || l.schedule.is_some()) {
        // a warm-up or schedule the user gave is taken as given
        config.warmup_ratio = None;
    }
    let mut chosen = fit::chosen(layers, config, d);
    let judged = config.init.is_some() && config.valid.is_some();
    if judged && !set(|l| l.eval_at_start.is_some()) {
        config.eval_at_start = true;
        chosen.push("an evaluation before the first step (the end is judged against it)".into());
    }
    if config.init.is_none() && !profiled {
        // the task defaults are fine-tuning's; a model from scratch may want the seed's pretraining
        chosen.push(
            "fine-tuning defaults for a model that starts from scratch (no --init; \
             --profile pretrain takes the seed's pretraining settings)"
                .into(),
        );
    }
    fit::warn_lr(layers, config, d);
    Fit {
        chosen,
        seq_from_data: !set(|l| l.seq.is_some()),
        tgt_seq_from_data: config.task == TaskKind::Seq2seq && !set(|l| l.tgt_seq.is_some()),
    }
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
