//! `memfit train`: the Rust trainer. With no arguments, the demo task; `--data/--valid/--tokenizer` (and
//! `--preset`/`--profile`) for real runs; `--resume RUN_DIR` to continue one exactly.

use crate::exit::{Outcome, bad_input};
use anyhow::Context;
use indicatif::ProgressBar;
use memfit_train::config::{BestMetric, ConfigLayer, OptimizerKind, Precision, TrainConfig};
use memfit_train::engine::Engine;
use memfit_train::memory_guard::{GuardSettings, MemoryGuard, NvmlProcessMemory, ProcessMemory};
use memfit_train::schedule::ScheduleKind;
use memfit_train::session::{self, CheckpointSpec, Session};
use memfit_train::train_loop::{Finish, Trainer};
use memfit_train::{
    alloc_reserve, batches::Collate, checkpoint, demo, engine_setup, model_spec, plan_file,
    presets, run_data, signals::StopFlag, text,
};
use std::path::PathBuf;
use std::process::ExitCode;

mod budget;
mod output;

use output::{Bar, print_summary};

#[derive(clap::Args)]
pub struct Args {
    /// Run directory (default: runs/<UTC timestamp>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue the run in this directory from its newest checkpoint (exactly).
    #[arg(long, value_name = "RUN_DIR", conflicts_with_all = ["out", "preset", "profile", "config"])]
    resume: Option<PathBuf>,
    /// With --resume: accept flags that change the training trajectory (prints what changed).
    #[arg(long)]
    allow_config_change: bool,
    /// A run.toml (the keys `memfit plan --emit memfit` writes); flags override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// A model preset (e.g. chatlm-mini, which also takes the seed's `pretrain` profile) or a profile.
    #[arg(long)]
    preset: Option<String>,
    /// The seed's named training configurations: pretrain, sft, sft-small, sft-fast.
    #[arg(long)]
    profile: Option<String>,
    /// Model: a preset name or a config.json (default: the demo's tiny T5, or the --init directory's).
    #[arg(long)]
    model: Option<String>,
    /// Start from the weights of a Hugging Face model directory (config.json + model.safetensors or
    /// its shards; f32, f16 or bf16) or of a memfit checkpoint (RUN/best). Names the model unless
    /// --model is given too (then both must describe the same tensors).
    #[arg(long, value_name = "DIR", conflicts_with = "resume")]
    init: Option<PathBuf>,
    /// Training data: parquet/JSONL (prepared into the run) or a token store directory.
    #[arg(long)]
    data: Option<String>,
    /// Validation data, as --data.
    #[arg(long)]
    valid: Option<String>,
    /// tokenizer.json, or a directory holding it.
    #[arg(long)]
    tokenizer: Option<String>,
    #[arg(long)]
    max_steps: Option<u64>,
    #[arg(long)]
    epochs: Option<u32>,
    #[arg(long)]
    seed: Option<u64>,
    /// Compute threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Micro-batch size (rows).
    #[arg(long)]
    batch: Option<usize>,
    /// Gradient accumulation steps.
    #[arg(long)]
    accum: Option<usize>,
    /// Maximum source tokens (EOS included).
    #[arg(long)]
    seq: Option<usize>,
    /// Maximum target tokens (EOS included).
    #[arg(long)]
    tgt_seq: Option<usize>,
    /// Peak learning rate.
    #[arg(long)]
    lr: Option<f64>,
    #[arg(long, value_parser = ["adamw", "adafactor"])]
    optimizer: Option<String>,
    /// Adafactor at the scheduled rate instead of its relative step size.
    #[arg(long)]
    adafactor_external_lr: bool,
    #[arg(long, value_parser = ["onecycle", "cosine"])]
    schedule: Option<String>,
    #[arg(long)]
    warmup_steps: Option<u64>,
    #[arg(long, value_parser = ["fp32", "bf16"])]
    precision: Option<String>,
    /// Gradient checkpointing.
    #[arg(long)]
    grad_ckpt: bool,
    /// Frozen groups, comma-separated: embeddings, encoder.
    #[arg(long, value_delimiter = ',')]
    freeze: Option<Vec<String>>,
    /// Global-norm gradient clipping (0 turns it off).
    #[arg(long)]
    max_grad_norm: Option<f64>,
    /// Checkpoint every N optimizer steps (and at each epoch end).
    #[arg(long)]
    save_steps: Option<u64>,
    /// Step checkpoints to keep (plus best/).
    #[arg(long)]
    keep: Option<usize>,
    /// Evaluate every N optimizer steps (and at each epoch end).
    #[arg(long)]
    eval_steps: Option<u64>,
    /// Validation rows generated and scored by BLEU at each evaluation (default 8).
    #[arg(long)]
    eval_rows: Option<usize>,
    /// Validation rows whose loss each evaluation computes (default: sized to 5% of the training
    /// between two evaluations, at least 16).
    #[arg(long, value_name = "N")]
    eval_loss_rows: Option<usize>,
    /// Evaluate before the first step too (the summary's BLEU "before").
    #[arg(long)]
    eval_at_start: bool,
    /// Metric that picks best/.
    #[arg(long, value_parser = ["bleu4", "valid-loss"])]
    best_metric: Option<String>,
    /// RAM budget the start is planned for and the run keeps (e.g. 8GiB, 1500MB, 60%; default:
    /// 80% of the effective available memory, cgroup limits included). `--budget` is an alias.
    #[arg(long, alias = "budget", value_name = "SIZE|PCT")]
    budget_ram: Option<String>,
    /// GPU memory budget (recorded in plan.json; this trainer computes on the CPU).
    #[arg(long, value_name = "SIZE")]
    budget_gpu: Option<String>,
    /// How the start is chosen: auto (the planner: fastest setup predicted to fit the budget),
    /// chatlm-v8 or chatlm-v3 (the seed's start-up tables).
    #[arg(long, default_value = "auto")]
    policy: String,
    /// Print the planned start and exit (no run directory).
    #[arg(long)]
    plan_only: bool,
    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,
}

impl Args {
    /// The settings given on the command line.
    fn layer(&self) -> anyhow::Result<ConfigLayer> {
        let parse_err = |e: String| bad_input(e);
        let init = self
            .init
            .as_deref()
            .map(|d| absolute(&d.display().to_string()));
        Ok(ConfigLayer {
            model: self.model.clone().or_else(|| init.clone()),
            init,
            data: self.data.as_deref().map(absolute),
            valid: self.valid.as_deref().map(absolute),
            tokenizer: self.tokenizer.as_deref().map(absolute),
            batch: self.batch,
            accum: self.accum,
            seq: self.seq,
            tgt_seq: self.tgt_seq,
            precision: self.precision.as_deref().map(|p| match p {
                "bf16" => Precision::Bf16,
                _ => Precision::Fp32,
            }),
            optimizer: self.optimizer.as_deref().map(|o| match o {
                "adafactor" => OptimizerKind::Adafactor,
                _ => OptimizerKind::Adamw,
            }),
            adafactor_relative_step: self.adafactor_external_lr.then_some(false),
            grad_ckpt: self.grad_ckpt.then_some(true),
            freeze: self.freeze.clone(),
            lr: self.lr,
            schedule: self
                .schedule
                .as_deref()
                .map(str::parse::<ScheduleKind>)
                .transpose()
                .map_err(parse_err)?,
            warmup_steps: self.warmup_steps,
            max_grad_norm: self.max_grad_norm,
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
                _ => BestMetric::Bleu4,
            }),
            // a new budget is bookkeeping: on --resume it applies without re-planning
            memory_budget_bytes: match self.budget_ram {
                Some(_) => Some(budget::budget(self, None)?.ram_bytes),
                None => None,
            },
            gpu_memory_budget_bytes: budget::gpu_budget(self)?,
            ..ConfigLayer::default()
        })
    }
}

/// Paths in the resolved config are absolute, so a resume from another directory finds them.
fn absolute(p: &str) -> String {
    std::path::absolute(p).map_or_else(|_| p.to_string(), |a| a.display().to_string())
}

fn default_out() -> PathBuf {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's days_from_civil, inverted).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    PathBuf::from(format!(
        "runs/{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    ))
}

/// Defaults ← profile ← model preset ← --config file ← flags.
fn resolve_new(args: &Args) -> anyhow::Result<TrainConfig> {
    let mut config = TrainConfig::default();
    let mut profile = args.profile.clone();
    if let Some(preset) = &args.preset {
        if presets::PROFILES.contains(&preset.as_str()) {
            profile.get_or_insert_with(|| preset.clone());
        } else {
            // A model preset: the seed's real configuration is its pretrain profile.
            profile.get_or_insert_with(|| "pretrain".into());
        }
    }
    if let Some(name) = &profile {
        presets::profile(name)
            .ok_or_else(|| {
                bad_input(format!(
                    "--profile {name:?}: known profiles: {}",
                    presets::PROFILES.join(", ")
                ))
            })?
            .apply(&mut config);
    }
    if let Some(preset) = &args.preset
        && !presets::PROFILES.contains(&preset.as_str())
    {
        config.model = preset.clone();
    }
    if let Some(path) = &args.config {
        let layer = ConfigLayer::from_file(path).map_err(|e| bad_input(e.to_string()))?;
        for key in layer.unknown.keys() {
            eprintln!(
                "warning: {}: key {key:?} is not a memfit train setting; ignored",
                path.display()
            );
        }
        layer.apply(&mut config);
    }
    args.layer()?.apply(&mut config);
    if config.max_grad_norm == Some(0.0) {
        config.max_grad_norm = None;
    }
    config.validate().map_err(|e| bad_input(e.to_string()))?;
    if config.model == "demo" && config.data.is_some() {
        return Err(bad_input(
            "--data needs --model (a preset such as chatlm-mini, or a config.json) or --preset",
        ));
    }
    if config.model != "demo" && config.data.is_none() && !args.plan_only {
        // an unknown model is the first thing to say
        model_spec::model_config(&config.model, None).map_err(|e| bad_input(e.to_string()))?;
        return Err(bad_input(no_data(args, &config.model)));
    }
    Ok(config)
}

/// A named model with no data: say where the data should have come from (only the demo trains
/// without it).
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

pub fn run(args: Args) -> Outcome {
    // a training step reuses what the last one freed (memfit_train::malloc_tuning)
    memfit_train::malloc_tuning::keep_freed_memory();
    let spec = |files: Vec<text::CheckpointFile>, bytes: u64| CheckpointSpec {
        tokenizer_files: files,
        free_space: checkpoint::free_bytes,
        expected_bytes: bytes,
    };
    // 1. The run directory and its resolved config (a new run, planned within its budget, or the one
    // to continue).
    let mut planned: Option<serde_json::Value>;
    let mut plan_lines: Vec<String> = Vec::new();
    let (root, mut config, demo_config) = match &args.resume {
        Some(dir) => {
            let text = std::fs::read_to_string(dir.join("config.toml")).map_err(|e| {
                let why = memfit_train::run_dir::RunDirError::not_a_run(dir, &e);
                bad_input(format!("--resume: {why}"))
            })?;
            let mut config = TrainConfig::from_toml(&text, &dir.join("config.toml"))
                .map_err(|e| bad_input(e.to_string()))?;
            // The flags as the session will apply them (it refuses trajectory changes unless allowed).
            args.layer()?.apply(&mut config);
            // the planned start stays the run's: plan.json keeps it across resumes
            planned = std::fs::read_to_string(dir.join("plan.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .and_then(|v| v.get("planning").cloned());
            let demo = dir.join("demo/config.json");
            (dir.clone(), config, demo.is_file().then_some(demo))
        }
        None => {
            let config = resolve_new(&args)?;
            let model_json = if config.model == "demo" {
                demo::model_config(demo::vocabulary().len())
            } else {
                model_spec::model_config(&config.model, None)
                    .map_err(|e| bad_input(e.to_string()))?
            };
            // a budget written in the --config file counts when no flag gives one
            let file_budget = match &args.config {
                Some(path) => {
                    ConfigLayer::from_file(path)
                        .map_err(|e| bad_input(e.to_string()))?
                        .memory_budget_bytes
                }
                None => None,
            };
            let start = budget::plan_start(&args, &config, &model_json, file_budget)?;
            if args.plan_only {
                start.lines.iter().for_each(|l| eprintln!("{l}"));
                if args.json {
                    println!("{}", start.planning);
                }
                return Ok(ExitCode::SUCCESS);
            }
            plan_lines = start.lines;
            planned = Some(start.planning);
            let root = args.out.clone().unwrap_or_else(default_out);
            (root, start.config, None)
        }
    };

    // Compute threads first: the data preparation below already starts the shared thread pool.
    engine_setup::set_threads(&config).map_err(|e| bad_input(e.to_string()))?;
    let (mut config_for_data, mut demo_config) = (config.clone(), demo_config);
    // Removes the run directory this start made if the start fails before the run exists.
    let mut made_root: Option<FailedStart> = None;
    if args.resume.is_none() {
        if root.join("config.toml").exists() {
            return Err(bad_input(format!(
                "{} already holds a run; continue it with --resume {} or choose another --out",
                root.display(),
                root.display()
            )));
        }
        if !root.exists() {
            made_root = Some(FailedStart(root.clone()));
        }
        std::fs::create_dir_all(&root).map_err(|e| {
            bad_input(format!(
                "--out {}: cannot create the run directory: {e}",
                root.display()
            ))
        })?;
        let probe = root.join(".memfit-write-test");
        std::fs::write(&probe, b"")
            .map_err(|e| bad_input(format!("--out {}: not writable: {e}", root.display())))?;
        let _ = std::fs::remove_file(&probe);
        if config.data.is_none() {
            let files = demo::write(&root.join("demo"), config.seed).with_context(|| {
                format!("writing the demo task into {}", root.join("demo").display())
            })?;
            config.data = Some(absolute(&files.train.display().to_string()));
            config.valid = Some(absolute(&files.valid.display().to_string()));
            config.tokenizer = Some(absolute(&files.tokenizer_dir.display().to_string()));
            if config.model == "demo" {
                demo_config = Some(files.model_config);
            }
        }
        config_for_data = config.clone();
    }

    // 2. Data, model config, vocabulary check — before the run directory becomes a run.
    let bar = ProgressBar::new_spinner();
    let data = run_data::open(&config_for_data, &root, &mut |name, rows, total| {
        bar.set_message(format!(
            "preparing {name}: {rows}/{} rows",
            total.map_or("?".into(), |t| t.to_string())
        ));
        bar.tick();
    })
    .map_err(|e| {
        if e.is_bad_input() {
            bad_input(e.to_string())
        } else {
            anyhow::Error::new(e)
        }
    })?;
    bar.finish_and_clear();
    let model_json = model_spec::model_config(&config.model, demo_config.as_deref())
        .map_err(|e| bad_input(e.to_string()))?;
    model_spec::check_vocab(&model_json, &config.model, &data.tokenizer)
        .map_err(|e| bad_input(e.to_string()))?;

    // 3. The engine (before the session, so a bad model leaves no run behind).
    let (mut engine, loaded) = engine_setup::build(&config, &model_json, args.resume.is_none())
        .map_err(|e| bad_input(e.to_string()))?;
    if let (Some(report), Some(init)) = (&loaded, &config.init) {
        eprintln!("{}", init_line(init, report));
    }
    let params = engine.param_counts();
    // Checkpoint size before the first one exists: f32 weights + up to two f32 optimizer moments.
    let expected_bytes = params.total * 4 + params.trainable * 8;
    let eos = data.train.0.eos_id().ok_or_else(|| {
        bad_input(format!(
            "{}: a store without an EOS id",
            data.train.0.dir().display()
        ))
    })?;
    let tokenizer_files = text::checkpoint_tokenizer_files(&data.tokenizer, eos)
        .map_err(|e| bad_input(e.to_string()))?;

    let mut s: Session = match &args.resume {
        Some(dir) => session::resume(
            dir,
            &args.layer()?,
            args.allow_config_change,
            spec(tokenizer_files, expected_bytes),
        )
        .map_err(|e| {
            if e.is_bad_input() {
                bad_input(e.to_string())
            } else {
                anyhow::Error::new(e)
            }
        })?,
        None => session::start(config.clone(), &root, spec(tokenizer_files, expected_bytes))
            .map_err(|e| {
                if e.is_bad_input() {
                    bad_input(e.to_string())
                } else {
                    anyhow::Error::new(e)
                }
            })?,
    };
    if let Some(made) = made_root.take() {
        made.disarm();
    }
    plan_lines.iter().for_each(|l| eprintln!("{l}"));
    if !s.changes.is_empty() {
        eprintln!(
            "config changed (--allow-config-change): {}",
            session::describe(&s.changes)
        );
    }
    config = s.config.clone();
    // From here on a signal stops the run with a resumable checkpoint (the loop acts on it at once).
    let stop = StopFlag::from_signals().context("installing the SIGINT/SIGTERM handlers")?;
    let vocab = data.tokenizer.vocab_size();
    let resume_state = match &s.resume_from {
        Some((ckpt, state)) => {
            session::load_checkpoint(&mut engine, ckpt, state, Some(vocab)).map_err(|e| {
                if e.is_bad_input() {
                    bad_input(e.to_string())
                } else {
                    anyhow::Error::new(e)
                }
            })?;
            eprintln!(
                "resuming {} from {} (step {})",
                root.display(),
                ckpt.display(),
                state.step
            );
            Some(state.clone())
        }
        None => None,
    };
    match plan_file::plan(&config, &model_json, data.train.0.len() as u64) {
        Ok(mut plan) => {
            if let Some(planning) = planned.take() {
                plan["planning"] = planning;
            }
            s.run.write_plan(&plan)?
        }
        Err(e) => eprintln!("warning: no plan.json: memfit-plan cannot estimate this setup: {e}"),
    }
    let params_line = format!(
        "model {}: trainable / total parameters: {} / {}",
        config.model,
        thousands(params.trainable),
        thousands(params.total)
    );
    eprintln!("{params_line}");
    s.run.log(&params_line)?;

    // 4. The loop.
    let eos = data
        .tokenizer
        .require_eos("seq2seq training")
        .map_err(|e| bad_input(e.to_string()))?
        .id;
    let pad = data
        .tokenizer
        .require_pad("seq2seq training")
        .map_err(|e| bad_input(e.to_string()))?
        .id;
    let mut observer = Bar::new(args.json);
    // Address space held back for an allocation failure: the binary's allocator gives it back and
    // the loop checkpoints and exits 75 (memfit_train::alloc_reserve). Its size is the room the
    // stop needs, the share of the budget above the guard's hard limit.
    let reserve = config.memory_budget_bytes.map_or(0, |b| {
        (b as f64 * (1.0 - config.guard_hard_fraction).max(0.0)) as usize
    });
    alloc_reserve::reserve(reserve).context("mapping the memory reserve")?;
    s.run.log(&format!(
        "memory reserve: {} of address space, given back if an allocation fails",
        memfit_sys::units::human_bytes(alloc_reserve::reserved_bytes() as u64)
    ))?;

    // The in-process memory guard: samples this process every 250 ms against the budget (or the
    // RUN/budget override); the loop halves the micro-batch or checkpoints and exits 75.
    // GPU memory too where NVML reads it (this trainer computes on the CPU: it holds none).
    let sampler = match NvmlProcessMemory::new() {
        Some(gpu) => ProcessMemory::with_device(Box::new(gpu)),
        None => ProcessMemory::new(),
    };
    let guard = MemoryGuard::start(GuardSettings::for_run(&config, s.run.root()), sampler)
        .context("starting the memory guard thread")?;
    let summary = Trainer {
        engine: &mut engine,
        config: &config,
        run: &mut s.run,
        checkpointer: &mut s.checkpointer,
        train: &data.train,
        valid: data.valid_source(),
        collate: Collate {
            max_src: config.seq,
            max_tgt: config.tgt_seq,
            pad_id: pad,
            eos_id: eos,
        },
        decoder: &data.tokenizer,
        stop,
        observer: &mut observer,
        resume: resume_state,
        vocab_size: Some(vocab),
        guard: Some(&guard),
    }
    .run()?;
    observer.bar.finish_and_clear();
    print_summary(&summary, &config, &root, args.json);
    if let Some(unsaved) = &summary.unsaved {
        // run-time failure (exit 1): the model of this run is not on disk
        anyhow::bail!("{unsaved}");
    }
    Ok(match summary.finish {
        Finish::Completed => ExitCode::SUCCESS,
        // EX_TEMPFAIL: stopped with a resumable checkpoint (DESIGN.md §3).
        Finish::Stopped => ExitCode::from(75),
    })
}

/// A run directory made by a start that has not got as far as a run: removed when dropped, so a
/// failed start (bad data, tokenizer, model or --init) leaves nothing behind.
struct FailedStart(PathBuf);

impl FailedStart {
    fn disarm(mut self) {
        self.0 = PathBuf::new();
    }
}

impl Drop for FailedStart {
    fn drop(&mut self) {
        if !self.0.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// What `--init` loaded, as transformers reports missing and unexpected keys.
fn init_line(init: &str, report: &memfit_nn::weights::LoadReport) -> String {
    let mut line = format!("init: weights from {init}");
    if !report.initialised.is_empty() {
        line += &format!("; newly initialised: {}", report.initialised.join(", "));
    }
    if !report.unused.is_empty() {
        line += &format!("; unused: {}", report.unused.join(", "));
    }
    line
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}
