//! From a prepared start to the end of the run, whatever the task: the session (a new run's
//! directory, or the checkpoint a resume continues from), plan.json, the memory reserve and guard,
//! the loop, the summary and the exit code.

use super::args::Args;
use super::output::{Bar, print_summary};
use super::setup::{Mode, Setup};
use super::thousands;
use crate::exit::{Outcome, bad_input};
use anyhow::Context;
use memfit_train::device::ChosenDevice;
use memfit_train::engine::Engine;
use memfit_train::memory_guard::{
    BurnPoolMemory, GpuMemory, GuardSettings, MemoryGuard, NvmlProcessMemory, ProcessMemory,
};
use memfit_train::run_lock::Claim;
use memfit_train::session::{self, CheckpointSpec, Session};
use memfit_train::task::{RowSource, Task};
use memfit_train::text::CheckpointFile;
use memfit_train::train_loop::{Finish, Trainer};
use memfit_train::{alloc_reserve, checkpoint, plan_file, signals::StopFlag, verdict};
use std::process::ExitCode;

/// What the task-specific part hands over: the engine, the task, its rows and the tokenizer files
/// checkpoints carry.
pub struct Run<'a, E: Engine, T: Task<E>> {
    pub engine: E,
    pub task: &'a T,
    pub train: &'a dyn RowSource<T::Row>,
    pub valid: Option<&'a dyn RowSource<T::Row>>,
    pub tokenizer_files: Vec<CheckpointFile>,
}

/// A start, its data handed to the task: what the run itself needs of it.
pub struct Prepared {
    pub setup: Setup,
    /// The model's `config.json`.
    pub model_json: serde_json::Value,
    pub claim: Claim,
    /// The tokenizer's vocabulary size (checked against a resumed checkpoint's).
    pub vocab: usize,
}

/// An error of a library that knows bad input (exit 2) from a failure at run time (exit 1).
fn classify(e: session::SessionError) -> anyhow::Error {
    if e.is_bad_input() {
        bad_input(e.to_string())
    } else {
        anyhow::Error::new(e)
    }
}

pub fn launch<E, T>(args: &Args, mut start: Prepared, run: Run<'_, E, T>) -> Outcome
where
    E: Engine,
    T: Task<E>,
{
    let Run {
        mut engine,
        task,
        train,
        valid,
        tokenizer_files,
    } = run;
    let params = engine.param_counts();
    // Checkpoint size before the first one exists: f32 weights + up to two f32 optimizer moments.
    let spec = CheckpointSpec {
        tokenizer_files,
        free_space: checkpoint::free_bytes,
        expected_bytes: params.total * 4 + params.trainable * 8,
    };
    if matches!(start.setup.mode, Mode::New) {
        // the effective batch is micro × accumulation × ranks; config.toml keeps the micro-batches
        // of a step over all ranks, so a resume on another rank count continues the same steps
        start.setup.config.accum *= start.setup.device.rank_count();
    }
    let setup = &start.setup;
    let mut s: Session = match setup.mode {
        Mode::Resume => session::resume(&setup.root, &setup.flags, args.allow_config_change, spec),
        Mode::New => session::start(setup.config.clone(), &setup.root, spec),
    }
    .map_err(classify)?;
    start.claim.keep();
    for why in &s.skipped {
        eprintln!("resume: skipped a damaged checkpoint: {why}");
    }
    for line in &start.setup.plan_lines {
        eprintln!("{line}");
        // the log keeps what the plan or policy set, beside plan.json
        s.run.log(line)?;
    }
    if !s.changes.is_empty() {
        eprintln!(
            "config changed (--allow-config-change): {}",
            session::describe(&s.changes)
        );
    }
    let config = s.config.clone();
    // From here on a signal stops the run with a resumable checkpoint (the loop acts on it at once).
    let stop = StopFlag::from_signals().context("installing the SIGINT/SIGTERM handlers")?;
    let vocab = start.vocab;
    let resume_state = match &s.resume_from {
        Some((ckpt, state)) => {
            session::load_checkpoint(&mut engine, ckpt, state, Some(vocab)).map_err(classify)?;
            eprintln!(
                "resuming {} from {} (step {})",
                start.setup.root.display(),
                ckpt.display(),
                state.step
            );
            Some(state.clone())
        }
        None => None,
    };
    write_plan(&mut s, &mut start, train.len() as u64)?;
    let params_line = format!(
        "model {}: trainable / total parameters: {} / {}",
        config.model,
        thousands(params.trainable),
        thousands(params.total)
    );
    eprintln!("{params_line}");
    s.run.log(&params_line)?;
    let device_line = format!(
        "device {}, training state on the {}",
        start.setup.device.describe(),
        start.setup.device.placement.name()
    );
    eprintln!("{device_line}");
    s.run.log(&device_line)?;
    if let Some(line) = super::ranks::line(&config, &start.setup.device, args.shard_optimizer) {
        eprintln!("{line}");
        s.run.log(&line)?;
    }
    let guard = start_guard(&mut s, &start.setup.device)?;
    let mut observer = Bar::new(args.json);
    let summary = Trainer {
        engine: &mut engine,
        task,
        config: &config,
        run: &mut s.run,
        checkpointer: &mut s.checkpointer,
        train,
        valid,
        stop,
        observer: &mut observer,
        resume: resume_state,
        vocab_size: Some(vocab),
        guard: Some(&guard),
    }
    .run()?;
    observer.bar.finish_and_clear();
    let epoch_steps =
        memfit_train::batches::steps_per_epoch(train.len(), config.batch, config.accum);
    let verdict = verdict::judge(
        summary.headline,
        summary.score_before,
        summary.last_eval.as_ref(),
        // a collapse fails a fine-tune that saw its data; from scratch it may not have learned yet
        config.init.is_some() && summary.steps >= epoch_steps,
    );
    print_summary(&summary, &verdict, &config, &start.setup.root, args.json);
    if let Some(unsaved) = &summary.unsaved {
        // run-time failure (exit 1): the model of this run is not on disk
        anyhow::bail!("{unsaved}");
    }
    if let (true, Some(why), false) = (verdict.failed(), verdict.describe(), args.allow_regression)
    {
        // run-time failure (exit 1): the checkpoints are kept, the result is not what was asked for
        anyhow::bail!("{why} (--allow-regression accepts it)");
    }
    Ok(match summary.finish {
        Finish::Completed => ExitCode::SUCCESS,
        // EX_TEMPFAIL: stopped with a resumable checkpoint (docs/architecture.md §3).
        Finish::Stopped => ExitCode::from(75),
    })
}

/// plan.json: the estimate of this setup, with the planned start it came from.
fn write_plan(s: &mut Session, start: &mut Prepared, rows: u64) -> anyhow::Result<()> {
    let on_gpu = start.setup.device.is_gpu();
    let planning = start.setup.planning.as_ref();
    let resident = planning.and_then(|p| p["resident_before_model_bytes"].as_u64());
    match plan_file::plan(
        &s.config,
        &start.model_json,
        rows,
        on_gpu,
        resident.unwrap_or(0),
    ) {
        Ok(mut plan) => {
            if let Some(planning) = start.setup.planning.take() {
                plan["planning"] = planning;
            }
            s.run.write_plan(&plan)?;
        }
        Err(e) => eprintln!("warning: no plan.json: memfit-plan cannot estimate this setup: {e}"),
    }
    Ok(())
}

/// The memory reserve and the in-process memory guard.
fn start_guard(s: &mut Session, device: &ChosenDevice) -> anyhow::Result<MemoryGuard> {
    let config = &s.config;
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
    // GPU memory too: NVML's figure for this process where it has one, else burn's pools on the
    // run's GPUs (on the CPU, NVML alone: it shows nothing for this process).
    let sampler = if device.is_gpu() {
        let pools = BurnPoolMemory::new(device.ranks.iter().map(|b| b.device()).collect());
        let nvml = NvmlProcessMemory::new();
        ProcessMemory::with_device(Box::new(GpuMemory { nvml, pools }))
    } else {
        match NvmlProcessMemory::new() {
            Some(gpu) => ProcessMemory::with_device(Box::new(gpu)),
            None => ProcessMemory::new(),
        }
    };
    MemoryGuard::start(GuardSettings::for_run(config, s.run.root()), sampler)
        .context("starting the memory guard thread")
}
