//! `plan.json`: the estimate the run trained under — memfit-plan's memory model for this setup with
//! `--runtime memfit --device cpu`, beside the setup itself — and the planned start that chose the
//! setup from a memory budget ([`planned_start`]: the planner, or a named policy: one of the seed's
//! tables or a fixed preset such as `bert-ultra-low`).

use crate::config::{OptimizerKind, Precision, TaskKind, TrainConfig};
use memfit_plan::arch::Arch;
use memfit_plan::memory::{
    self, DatasetMode, Device, Framework, FreezeGroup, Method, Runtime, Setup,
};
use memfit_plan::search::{self, Candidate, Fixed, policy};
use serde::Serialize;
use serde_json::{Value, json};

mod table;
use table::Table;

/// On a GPU: the bytes the model's weights alone take there — every parameter at the dtype a pass
/// computes with (bf16 under `--precision bf16`, else f32; a LoRA base at its own precision) —
/// which no start can go below.
pub fn gpu_weight_bytes(config: &TrainConfig, model_config: &Value) -> Result<u64, String> {
    let arch = arch_of(config, model_config)?;
    let width = |p: Precision| if p == Precision::Bf16 { 2 } else { 4 };
    let base = match config.base_precision {
        Some(p) if config.method == crate::config::Method::Lora => p,
        _ => config.precision,
    };
    Ok(arch.params_total() * width(base))
}

/// memfit's GPU model (`memfit_device`) of `config` trained on one GPU: what a run of it should
/// hold there at its worst moment.
pub fn gpu_estimate(
    config: &TrainConfig,
    model_config: &Value,
) -> Result<memory::GpuEstimate, String> {
    let arch = arch_of(config, model_config)?;
    let setup = setup_on(config, &arch, 0, true);
    let estimate = memory::estimate(&arch, &setup, &Framework::default())?;
    Ok(estimate.gpu.expect("a GPU setup's estimate has a GPU part"))
}

fn arch_of(config: &TrainConfig, model_config: &Value) -> Result<Arch, String> {
    memfit_plan::arch::config::from_value("config.json", model_config, &config.model)
        .map_err(|e| e.to_string())
}

/// The memory-model setup of `config`: its task on the CPU under memfit's trainer, reading a token
/// store.
fn setup_of(config: &TrainConfig, arch: &Arch, dataset_rows: u64) -> Setup {
    let mut setup = Setup::new(arch);
    setup.task = match config.task {
        TaskKind::Seq2seq => memfit_plan::Task::Seq2seq,
        TaskKind::Classification => memfit_plan::Task::Classification,
        TaskKind::CausalLm => memfit_plan::Task::CausalLm,
    };
    setup.batch = config.batch as u64;
    setup.seq = config.seq as u64;
    if config.task == TaskKind::Seq2seq {
        setup.tgt_seq = config.tgt_seq as u64;
    }
    setup.accum = config.accum as u64;
    setup.precision = match config.precision {
        Precision::Fp32 => memory::Precision::Fp32,
        Precision::Bf16 => memory::Precision::Bf16,
    };
    setup.optimizer = match config.optimizer {
        OptimizerKind::Adamw => memory::Optimizer::AdamW,
        OptimizerKind::Adafactor => memory::Optimizer::Adafactor,
    };
    setup.grad_ckpt = config.grad_ckpt;
    setup.freeze = config
        .freeze
        .iter()
        .filter_map(|g| FreezeGroup::parse(g))
        .collect();
    if !setup.freeze.is_empty() {
        setup.method = Method::Freeze;
    }
    if config.method == crate::config::Method::Lora {
        lora_setup(config, &mut setup);
    }
    setup.device = Device::Cpu;
    setup.runtime = Runtime::Memfit;
    setup.dataset = DatasetMode::TokenStore;
    setup.dataset_rows = dataset_rows;
    setup
}

/// [`setup_of`] on the device the run computes on: a GPU (`on_gpu`) or the CPU.
fn setup_on(config: &TrainConfig, arch: &Arch, dataset_rows: u64, on_gpu: bool) -> Setup {
    let mut setup = setup_of(config, arch, dataset_rows);
    if on_gpu {
        setup.device = Device::Cuda;
    }
    setup
}

/// LoRA as the trainer runs it: rank and alpha (defaults r 16, alpha 32), the adapted projections
/// (memfit's or PEFT's names; default every projection), the frozen base's precision.
fn lora_setup(config: &TrainConfig, setup: &mut Setup) {
    setup.method = Method::Lora;
    setup.lora_r = config.lora_r.unwrap_or(16) as u64;
    setup.lora_alpha = config.lora_alpha.unwrap_or(32.0).round() as u64;
    // The decoder's parser (groups such as `mlp` included); names were checked by `validate`.
    let projections = config
        .lora_targets
        .as_ref()
        .and_then(|names| memfit_nn::decoder::lora::parse_targets(names).ok());
    setup.lora_targets = match projections {
        Some(projs) => projs
            .iter()
            .filter_map(|p| memory::LoraTarget::parse(p.module().trim_end_matches("_proj")))
            .collect(),
        None => memfit_plan::grid::memfit_lora_targets(),
    };
    setup.base_precision = Some(match config.base_precision {
        Some(Precision::Bf16) => memory::Precision::Bf16,
        _ => memory::Precision::Fp32,
    });
}

/// The plan of `config` for the model described by `model_config` (a `config.json` value), on a
/// GPU (`on_gpu`: memfit's GPU model) or the CPU, with `resident_bytes` already held beside it
/// ([`Budget::resident_bytes`]).
pub fn plan(
    config: &TrainConfig,
    model_config: &Value,
    dataset_rows: u64,
    on_gpu: bool,
    resident_bytes: u64,
) -> Result<Value, String> {
    let arch = arch_of(config, model_config)?;
    let mut setup = setup_on(config, &arch, dataset_rows, on_gpu);
    setup.host_resident_bytes = resident_bytes;
    let estimate = memory::estimate(&arch, &setup, &Framework::default())?;
    Ok(json!({
        "model": {
            "name": config.model,
            "params_total": arch.params_total(),
        },
        "setup": setup,
        "gpu": estimate.gpu,
        "host": estimate.host,
    }))
}

/// The memory budget a run plans for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Budget {
    pub ram_bytes: u64,
    /// How it was set: the flag as typed, or the default and what it was computed from.
    pub ram_source: String,
    /// `--budget-gpu` (on a GPU, by default 90% of its free memory): the start is planned for it
    /// when the run computes on a GPU, and the guard keeps it per GPU.
    pub gpu_bytes: Option<u64>,
    /// The run computes on a GPU (`--device`): its start is planned for `gpu_bytes` too.
    #[serde(skip)]
    pub on_gpu: bool,
    /// Data-parallel ranks (one model replica each): the start is planned per rank, within what
    /// the other ranks leave of the RAM budget.
    #[serde(skip)]
    pub ranks: usize,
    /// `--shard-optimizer` (ZeRO-1): on GPUs each rank is planned with its share of the
    /// optimizer state (CPU ranks, which are for checks, are planned with all of it).
    #[serde(skip)]
    pub shard_optimizer: bool,
    /// RSS the run already holds beyond the runtime before its model exists (measured by `memfit
    /// train` once its data is prepared: the tokenizer, the readers' state, the validation rows):
    /// planned as a host component of its own. 0 where nothing was measured.
    #[serde(skip)]
    pub resident_bytes: u64,
}

impl Budget {
    /// The GPU budget the start is planned for: `gpu_bytes` on a GPU run.
    fn planned_gpu_bytes(&self) -> Option<u64> {
        self.gpu_bytes.filter(|_| self.on_gpu)
    }

    /// The ranks one rank's optimizer state is a share of, as planned.
    fn optimizer_shards(&self) -> u64 {
        if self.shard_optimizer && self.on_gpu {
            self.ranks.max(1) as u64
        } else {
            1
        }
    }
}

/// Which start-up policy decides the setup.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PolicyChoice {
    /// memfit-plan's planner: the fastest setup whose predicted peak fits the budget.
    Auto,
    /// One of the seed's tables ([`policy::POLICIES`]).
    Table(&'static policy::Policy),
}

impl PolicyChoice {
    /// `auto` or a table's name; the error lists the names.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "auto" => Ok(Self::Auto),
            other => {
                let p = policy::find(other).ok_or_else(|| {
                    format!(
                        "--policy {other:?}: known policies: {}",
                        policy::names_for(Runtime::Memfit)
                    )
                })?;
                p.check_runtime(Runtime::Memfit)?;
                Ok(Self::Table(p))
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The request cannot be planned (bad model config, a policy table we do not have …).
    #[error("{0}")]
    Input(String),
    /// No setup's predicted peak fits the budget.
    #[error("{0}")]
    DoesNotFit(String),
}

/// The outcome of a planned start.
#[derive(Debug, Clone)]
pub struct PlannedStart {
    /// `config` with the chosen settings and the budget in `memory_budget_bytes`.
    pub config: TrainConfig,
    pub predicted_peak_rss_bytes: u64,
    /// The `planning` object of `plan.json`.
    pub planning: Value,
    /// What to print, one line each.
    pub lines: Vec<String>,
}

const GIB: f64 = (1u64 << 30) as f64;

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / GIB)
}

/// memfit's trainer has one data-loading mode; the plan records it (the seed's knobs map onto it).
fn data_loading() -> Value {
    json!({
        "mode": "token-store",
        "workers": 0,
        "pin_memory": false,
        "note": "the trainer reads its token store (positioned reads) on the training thread: no loader \
                 workers, nothing pinned, RSS does not grow with the dataset (the seed's \
                 ultra-low-memory loading is the only mode)",
    })
}

fn settings(s: &Setup) -> Value {
    json!({
        "batch": s.batch, "accum": s.accum, "effective_batch": s.batch * s.accum,
        "seq": s.seq, "precision": s.precision, "grad_ckpt": s.grad_ckpt,
    })
}

fn candidate(c: &Candidate) -> Value {
    let mut v = json!({
        "settings": settings(&c.setup),
        "summary": c.summary(),
        "predicted_peak_rss_bytes": c.host_need(),
        "tokens_per_s_model": c.tokens_per_s,
        "rejected": c.rejected,
    });
    if let Some(gpu) = c.gpu_need() {
        v["predicted_peak_gpu_bytes"] = json!(gpu);
    }
    v
}

fn apply(config: &mut TrainConfig, s: &Setup) {
    config.batch = s.batch as usize;
    config.accum = s.accum as usize;
    config.seq = s.seq as usize;
    config.grad_ckpt = s.grad_ckpt;
    config.precision = match s.precision {
        memory::Precision::Bf16 => Precision::Bf16,
        _ => Precision::Fp32,
    };
}

/// A start the planner cannot make: the configured setup as it is, the budget kept by the memory
/// guard alone, and why.
fn unplanned(config: &TrainConfig, budget: &Budget, why: &str) -> PlannedStart {
    let mut out = config.clone();
    out.memory_budget_bytes = Some(budget.ram_bytes);
    let lines = vec![
        format!("no planned start: {why}"),
        format!(
            "  the run keeps its configured setup (micro {} × accum {}, {}{}); the memory guard \
             holds the budget of {} ({})",
            config.batch,
            config.accum,
            config.precision.name(),
            if config.grad_ckpt { ", grad ckpt" } else { "" },
            memfit_sys::units::human_bytes(budget.ram_bytes),
            budget.ram_source
        ),
    ];
    PlannedStart {
        config: out,
        predicted_peak_rss_bytes: 0,
        planning: json!({"policy": "none", "reason": why, "budget": budget}),
        lines,
    }
}

/// Plans the start of a run within `budget`: the effective batch `batch × accum` of `config` is kept,
/// the settings in `fixed` (the flags the user gave) are constraints. `available_bytes` is what the
/// machine has (the policies' tables read it).
pub fn planned_start(
    config: &TrainConfig,
    model_config: &Value,
    budget: &Budget,
    fixed: Fixed,
    choice: PolicyChoice,
    available_bytes: u64,
) -> Result<PlannedStart, PlanError> {
    let arch = arch_of(config, model_config).map_err(PlanError::Input)?;
    let mut base = setup_of(config, &arch, 0);
    base.optimizer_shards = budget.optimizer_shards();
    base.host_resident_bytes = budget.resident_bytes;
    if let PolicyChoice::Table(p) = choice {
        // before anything else: a policy made for another task is refused, not ignored
        p.check_run(base.task, base.method)
            .map_err(PlanError::Input)?;
    }
    if let Err(why) = memory::memfit_runtime_modeled(&arch, &base) {
        return Ok(unplanned(config, budget, &why));
    }
    // MiB (or less) for a small budget: "0.00 GiB" hid what was given
    let human = memfit_sys::units::human_bytes;
    let mut budget_line = format!("budget {} ({})", human(budget.ram_bytes), budget.ram_source);
    if let Some(gpu) = budget.planned_gpu_bytes() {
        budget_line += &format!(", GPU {}", human(gpu));
    }
    // the memory guard halves the micro-batch above this share of the budget: plan below it
    let soft_limit = (budget.ram_bytes as f64 * config.guard_soft_fraction) as u64;
    let mut lines = Vec::new();
    if base.optimizer_shards > 1 {
        lines.push(format!(
            "--shard-optimizer: each GPU rank is planned with its share of the optimizer state \
             (ZeRO-1 over {} ranks)",
            base.optimizer_shards
        ));
    }
    let mut out = config.clone();
    out.memory_budget_bytes = Some(budget.ram_bytes);
    if budget.gpu_bytes.is_some() && !budget.on_gpu {
        lines.push(
            "--budget-gpu is recorded in plan.json; this run computes on the CPU, so its start is \
             planned for the RAM budget"
                .to_string(),
        );
    }
    let (setup, planning, peak) = match choice {
        PolicyChoice::Auto => auto_start(
            &arch,
            &base,
            config,
            budget,
            &fixed,
            &budget_line,
            &mut lines,
        )?,
        PolicyChoice::Table(p) => {
            let table = Table {
                policy: p,
                available_bytes,
                budget_line: &budget_line,
                soft_limit,
                gpu_soft_limit: (budget.planned_gpu_bytes())
                    .map(|g| (g as f64 * config.guard_soft_fraction) as u64),
                guard_soft_fraction: config.guard_soft_fraction,
            };
            table.start(&arch, &base, model_config, &fixed, &mut lines)?
        }
    };
    apply(&mut out, &setup);
    let mut planning = planning;
    planning["evaluation"] = plan_evaluation(&arch, &setup, soft_limit, &mut out, &mut lines);
    planning["budget"] = json!(budget);
    planning["planned_below_bytes"] = json!(soft_limit);
    planning["planned_below"] = json!(format!(
        "the memory guard's soft limit: {:.0}% of the budget",
        100.0 * config.guard_soft_fraction
    ));
    planning["available_bytes"] = json!(available_bytes);
    planning["data_loading"] = data_loading();
    planning["predicted_peak_rss_bytes"] = json!(peak);
    planning["resident_before_model_bytes"] = json!(budget.resident_bytes);
    if let Some(gpu) = planning["chosen"]["predicted_peak_gpu_bytes"].as_u64() {
        planning["predicted_peak_gpu_bytes"] = json!(gpu);
    }
    Ok(PlannedStart {
        config: out,
        predicted_peak_rss_bytes: peak,
        planning,
        lines,
    })
}

/// Evaluation as its own phase of the planned start: its predicted peak at the training
/// micro-batch and, where that passes `limit` (the guard's soft limit), the evaluation batch
/// halved until it fits, set in `out` and said on a line. The `evaluation` object of plan.json.
fn plan_evaluation(
    arch: &Arch,
    setup: &Setup,
    limit: u64,
    out: &mut TrainConfig,
    lines: &mut Vec<String>,
) -> Value {
    use memory::memfit_host::eval::{eval_batch_within, eval_phase};
    let phase = |batch: u64| eval_phase(arch, setup, batch);
    let at_micro = phase(setup.batch);
    let batch = eval_batch_within(arch, setup, limit);
    if batch < setup.batch {
        out.eval_batch = Some(batch as usize);
        lines.push(format!(
            "  evaluation alone would peak at {} at micro-batch {} (over {}): evaluation batch {batch} \
             → {}",
            gib(at_micro),
            setup.batch,
            gib(limit),
            gib(phase(batch))
        ));
    }
    json!({
        "predicted_peak_rss_bytes_at_micro_batch": at_micro,
        "batch": batch,
        "predicted_peak_rss_bytes": phase(batch),
    })
}

/// The planner's start (`--policy auto`): the fastest setup of the effective batch that the
/// search finds below the memory guard's soft limit.
fn auto_start(
    arch: &Arch,
    base: &Setup,
    config: &TrainConfig,
    budget: &Budget,
    fixed: &Fixed,
    budget_line: &str,
    lines: &mut Vec<String>,
) -> Result<(Setup, Value, u64), PlanError> {
    let effective = base.batch * base.accum;
    let host_bytes = rank_share(arch, base, budget, lines);
    let request = search::Request {
        base: base.clone(),
        target_batch: effective,
        // plan below the memory guard's soft limit, where it would halve the micro-batch
        budget: search::Budget {
            gpu_bytes: budget.planned_gpu_bytes(),
            host_bytes,
            headroom: 1.0 - config.guard_soft_fraction,
        },
    };
    let plan = search::plan_with(arch, &request, &Framework::default(), fixed)
        .map_err(PlanError::Input)?;
    let Some(chosen) = &plan.chosen else {
        let why = plan
            .reason
            .clone()
            .unwrap_or_else(|| "no setup agrees with the flags given".into());
        return Err(PlanError::DoesNotFit(format!(
            "{why} — {budget_line}; give a larger {}, a shorter --seq/--tgt-seq, or drop flags \
             that fix the setup",
            if budget.on_gpu {
                "--budget-gpu (or --budget-ram)"
            } else {
                "--budget-ram"
            }
        )));
    };
    lines.push(format!(
        "planned start (auto, {budget_line}): {} (effective batch {effective}) → predicted peak {}",
        chosen.summary(),
        needs(chosen)
    ));
    for a in &plan.alternatives {
        lines.push(format!("  alternative: {} → {}", a.summary(), needs(a)));
    }
    let planning = json!({
        "policy": "auto",
        "chosen": candidate(chosen),
        "alternatives": plan.alternatives.iter().map(candidate).collect::<Vec<_>>(),
        "rejected": plan.rejected.iter().map(candidate).collect::<Vec<_>>(),
        "considered": plan.considered,
        "fixed_by_flags": fixed,
    });
    Ok((chosen.setup.clone(), planning, chosen.host_need()))
}

/// The RAM one rank is planned within: the whole budget for one; for several on the CPU an equal
/// share (each rank holds a whole replica there); for several GPUs what the other ranks' host
/// copies of the weights leave (memfit keeps an f32 copy per replica: the adapters under LoRA).
/// A line says which.
fn rank_share(arch: &Arch, base: &Setup, budget: &Budget, lines: &mut Vec<String>) -> u64 {
    let ranks = budget.ranks.max(1) as u64;
    if ranks == 1 {
        return budget.ram_bytes;
    }
    let human = memfit_sys::units::human_bytes;
    if !budget.on_gpu {
        let share = budget.ram_bytes / ranks;
        lines.push(format!(
            "{ranks} ranks on the CPU, a replica each: each planned within {} of the RAM budget",
            human(share)
        ));
        return share;
    }
    let others = (ranks - 1) * memory::host::memfit_host_weights(arch, base);
    lines.push(format!(
        "{ranks} GPU ranks: the other {} ranks' host copies of the weights ({}) are set aside from the RAM budget",
        ranks - 1,
        human(others)
    ));
    budget.ram_bytes.saturating_sub(others)
}

/// A candidate's predicted peaks as the start line says them ([`peaks`]).
fn needs(c: &search::Candidate) -> String {
    peaks(c.gpu_need(), c.host_need())
}

/// Predicted peaks as a start line says them: host RAM, and on a GPU the GPU's (what NVML shows)
/// first.
fn peaks(gpu: Option<u64>, host: u64) -> String {
    match gpu {
        Some(gpu) => format!("GPU {} (NVML), host {}", gib(gpu), gib(host)),
        None => gib(host),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `--budget-gpu` is checked against: every weight at the compute width, a LoRA base at
    /// its own.
    #[test]
    fn gpu_weights_are_the_parameters_at_the_compute_width() {
        let model = crate::model_spec::model_config("chatlm-mini", None).unwrap();
        let mut c = TrainConfig::default();
        assert_eq!(gpu_weight_bytes(&c, &model).unwrap(), 187_692_288 * 4);
        c.precision = Precision::Bf16;
        assert_eq!(gpu_weight_bytes(&c, &model).unwrap(), 187_692_288 * 2);
        let qwen = crate::model_spec::model_config("qwen2.5-0.5b", None).unwrap();
        c.model = "qwen2.5-0.5b".into();
        c.method = crate::config::Method::Lora;
        c.precision = Precision::Fp32;
        c.base_precision = Some(Precision::Bf16);
        assert_eq!(gpu_weight_bytes(&c, &qwen).unwrap(), 494_032_768 * 2);
    }

    /// On the CPU plan.json has a host peak and no GPU; on a GPU, memfit's GPU model beside a host
    /// that holds little more than the weights' copy.
    #[test]
    fn chatlm_mini_plan_has_a_host_peak_and_a_gpu_one_on_a_gpu() {
        let model = crate::model_spec::model_config("chatlm-mini", None).unwrap();
        let mut c = TrainConfig::default();
        crate::presets::profile("sft-small").unwrap().apply(&mut c);
        let p = plan(&c, &model, 3000, false, 0).unwrap();
        assert!(p["gpu"].is_null());
        assert_eq!(p["model"]["params_total"], 187_692_288);
        let host = p["host"]["peak_rss_bytes"].as_u64().unwrap();
        assert!(host > 1 << 30);
        assert_eq!(p["setup"]["runtime"], "memfit");
        let g = plan(&c, &model, 3000, true, 0).unwrap();
        assert!(g["gpu"]["peak_allocated_bytes"].as_u64().unwrap() > 1 << 30);
        assert!(g["host"]["peak_rss_bytes"].as_u64().unwrap() < host);
    }

    /// What the data and tokenizer hold (measured by `memfit train`) is a host component of the
    /// plan and of the planned start: the same start predicts that much more, and a budget that
    /// held the start without it holds a smaller one.
    #[test]
    fn resident_data_is_planned_beside_the_training() {
        let (c, model) = t5_small();
        let held = 300 << 20;
        let without = plan(&c, &model, 0, false, 0).unwrap();
        let with = plan(&c, &model, 0, false, held).unwrap();
        let peak = |p: &Value| p["host"]["peak_rss_bytes"].as_u64().unwrap();
        assert_eq!(peak(&with), peak(&without) + held);
        let names: Vec<&str> = with["host"]["components"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"data and tokenizer"), "{names:?}");
        let planned = |resident_bytes| {
            let b = Budget {
                resident_bytes,
                ..budget(4)
            };
            auto(&c, &model, &b, Fixed::default()).unwrap()
        };
        let (free, busy) = (planned(0), planned(held));
        assert_eq!(busy.planning["resident_before_model_bytes"], held);
        assert!(busy.predicted_peak_rss_bytes >= held + 20_000_000);
        assert!(
            (busy.config.batch, busy.config.grad_ckpt)
                != (free.config.batch, free.config.grad_ckpt)
                || busy.predicted_peak_rss_bytes > free.predicted_peak_rss_bytes,
            "the held bytes changed nothing"
        );
    }

    fn t5_small() -> (TrainConfig, Value) {
        let model = crate::model_spec::model_config("t5-small", None).unwrap();
        let c = TrainConfig {
            model: "t5-small".into(),
            batch: 16,
            accum: 2,
            seq: 256,
            tgt_seq: 256,
            ..TrainConfig::default()
        };
        (c, model)
    }

    /// One of the start's lines contains `text`.
    fn says(start: &PlannedStart, text: &str) {
        assert!(
            start.lines.iter().any(|l| l.contains(text)),
            "{text:?} in {:?}",
            start.lines
        );
    }

    fn budget(gib: u64) -> Budget {
        Budget {
            ram_bytes: gib << 30,
            ram_source: format!("--budget-ram {gib}GiB"),
            gpu_bytes: None,
            on_gpu: false,
            ranks: 1,
            shard_optimizer: false,
            resident_bytes: 0,
        }
    }

    fn auto(
        c: &TrainConfig,
        m: &Value,
        b: &Budget,
        fixed: Fixed,
    ) -> Result<PlannedStart, PlanError> {
        planned_start(c, m, b, fixed, PolicyChoice::Auto, 16 << 30)
    }

    #[test]
    fn a_smaller_budget_plans_a_leaner_start_with_the_same_effective_batch() {
        let (c, m) = t5_small();
        let roomy = auto(&c, &m, &budget(64), Fixed::default()).unwrap();
        let tight = auto(&c, &m, &budget(3), Fixed::default()).unwrap();
        for p in [&roomy, &tight] {
            assert_eq!(p.config.batch * p.config.accum, 32);
            let budget = p.config.memory_budget_bytes.unwrap() as f64;
            assert!(p.predicted_peak_rss_bytes as f64 <= budget * c.guard_soft_fraction);
        }
        assert_eq!((roomy.config.batch, roomy.config.accum), (32, 1));
        let leaner = tight.config.batch < roomy.config.batch
            || tight.config.grad_ckpt && !roomy.config.grad_ckpt;
        assert!(leaner, "{:?} vs {:?}", tight.lines, roomy.lines);
        assert!(tight.predicted_peak_rss_bytes < roomy.predicted_peak_rss_bytes);
        assert_eq!(tight.config.memory_budget_bytes, Some(3 << 30));
        assert_eq!(tight.planning["policy"], "auto");
        assert!(tight.planning["considered"].as_u64().unwrap() > 4);
    }

    /// On a GPU the start is planned for the GPU budget as for RAM: a smaller card, a leaner
    /// start with the same effective batch, its predicted GPU peak (memfit's GPU model) under the
    /// guard's soft limit; a card too small for anything is refused naming the GPU need.
    #[test]
    fn on_a_gpu_the_start_is_planned_for_the_gpu_budget() {
        let (c, m) = t5_small();
        let on_gpu = |gib: f64| Budget {
            gpu_bytes: Some((gib * (1u64 << 30) as f64) as u64),
            on_gpu: true,
            ..budget(64)
        };
        let roomy = auto(&c, &m, &on_gpu(40.0), Fixed::default()).unwrap();
        let tight = auto(&c, &m, &on_gpu(2.5), Fixed::default()).unwrap();
        for (p, gib) in [(&roomy, 40.0), (&tight, 2.5)] {
            assert_eq!(p.config.batch * p.config.accum, 32);
            let gpu = p.planning["predicted_peak_gpu_bytes"].as_u64().unwrap();
            assert!(gpu as f64 <= gib * (1u64 << 30) as f64 * c.guard_soft_fraction);
            assert!(p.lines[0].contains("GPU"), "{:?}", p.lines);
        }
        assert_eq!((roomy.config.batch, roomy.config.accum), (32, 1));
        let leaner = tight.config.batch < roomy.config.batch
            || tight.config.grad_ckpt && !roomy.config.grad_ckpt;
        assert!(leaner, "{:?} vs {:?}", tight.lines, roomy.lines);
        // the same budgets on the CPU: no GPU figure, planned for RAM
        let cpu = auto(
            &c,
            &m,
            &Budget {
                on_gpu: false,
                ..on_gpu(2.5)
            },
            Fixed::default(),
        )
        .unwrap();
        assert!(cpu.planning.get("predicted_peak_gpu_bytes").is_none());
        assert_eq!((cpu.config.batch, cpu.config.accum), (32, 1));
        let Err(PlanError::DoesNotFit(why)) = auto(&c, &m, &on_gpu(0.5), Fixed::default()) else {
            panic!("a 0.5 GiB card fits t5-small training");
        };
        assert!(why.contains("per GPU"), "{why}");
        // a policy table sets its setup; on a GPU it is checked against the GPU budget and said
        let v8 = PolicyChoice::parse("chatlm-v8").unwrap();
        let table = planned_start(&c, &m, &on_gpu(0.5), Fixed::default(), v8, 16 << 30).unwrap();
        assert!(
            table.planning["chosen"]["predicted_peak_gpu_bytes"]
                .as_u64()
                .unwrap()
                > 1 << 29
        );
        says(&table, "GPU budget");
    }

    /// Several ranks: on GPUs the other ranks' host copies of the weights come out of the RAM
    /// budget (a budget that holds one rank's plan but not three copies is refused); on the CPU
    /// each rank is planned within an equal share.
    #[test]
    fn several_ranks_share_the_ram_budget() {
        let (c, m) = t5_small();
        let weights = 4 * arch_of(&c, &m).unwrap().params_total();
        let gpus = |ram: u64, ranks| Budget {
            ram_bytes: ram,
            gpu_bytes: Some(40 << 30),
            on_gpu: true,
            ranks,
            ..budget(1)
        };
        let one = auto(&c, &m, &gpus(1 << 30, 1), Fixed::default()).unwrap();
        let host = one.predicted_peak_rss_bytes;
        assert!(host > weights, "one rank holds its host copy: {host}");
        let three = auto(&c, &m, &gpus(3 * host, 3), Fixed::default()).unwrap();
        says(&three, "3 GPU ranks");
        let short = auto(&c, &m, &gpus(host + weights, 3), Fixed::default());
        assert!(
            matches!(short, Err(PlanError::DoesNotFit(_))),
            "two more copies do not fit"
        );
        let cpu = Budget {
            ranks: 2,
            ..budget(8)
        };
        let p = auto(&c, &m, &cpu, Fixed::default()).unwrap();
        assert!(
            p.predicted_peak_rss_bytes <= 4 << 30,
            "planned within half of 8 GiB"
        );
        says(&p, "2 ranks on the CPU");
    }

    /// `--shard-optimizer` on GPU ranks: each rank is planned with its share of the optimizer
    /// state (ZeRO-1), less GPU memory than the whole state at the same setup; said on a line.
    #[test]
    fn sharded_optimizer_states_are_planned_per_rank() {
        let (c, m) = t5_small();
        let fixed = Fixed {
            batch: Some(32),
            accum: Some(1),
            grad_ckpt: Some(false),
            ..Fixed::default()
        };
        let peak = |shard_optimizer| {
            let b = Budget {
                gpu_bytes: Some(40 << 30),
                on_gpu: true,
                ranks: 3,
                shard_optimizer,
                ..budget(64)
            };
            let p = auto(&c, &m, &b, fixed).unwrap();
            let gpu = p.planning["predicted_peak_gpu_bytes"].as_u64().unwrap();
            (gpu, p)
        };
        let (whole, _) = peak(false);
        let (shared, p) = peak(true);
        let adamw = 8 * arch_of(&c, &m).unwrap().params_total();
        let saved = whole - shared;
        assert!(
            saved > adamw / 4 && saved < adamw * 2 / 3,
            "saved {saved} of AdamW's {adamw}"
        );
        says(&p, "ZeRO-1 over 3 ranks");
    }

    /// Evaluation is planned as its own phase: where it alone would pass the guard's soft limit at
    /// the training micro-batch, the start halves the evaluation batch until it fits and says so.
    #[test]
    fn evaluation_over_the_budget_gets_a_smaller_batch_of_its_own() {
        let (c, m) = t5_small();
        let v8 = PolicyChoice::parse("chatlm-v8").unwrap();
        let start = |b: &Budget| planned_start(&c, &m, b, Fixed::default(), v8, 12 << 30).unwrap();
        let roomy = start(&budget(64));
        assert_eq!(roomy.config.batch, 16);
        assert_eq!(roomy.config.eval_batch, None);
        let eval = &roomy.planning["evaluation"];
        assert_eq!(eval["batch"], 16);
        let arch = arch_of(&c, &m).unwrap();
        let setup = setup_of(&roomy.config, &arch, 0);
        let at = |batch: u64| memory::memfit_host::eval::eval_phase(&arch, &setup, batch);
        assert_eq!(eval["predicted_peak_rss_bytes"], at(16));
        assert!(
            at(4) < at(8) && at(8) < at(16),
            "the phase grows with its batch"
        );
        // a budget whose soft limit holds evaluation at 4 rows, not at 8
        let tight = Budget {
            ram_bytes: (at(4) as f64 / c.guard_soft_fraction).ceil() as u64,
            ..budget(1)
        };
        let p = start(&tight);
        assert_eq!(p.config.eval_batch, Some(4), "{:?}", p.lines);
        assert_eq!(p.planning["evaluation"]["batch"], 4);
        let line = p
            .lines
            .iter()
            .find(|l| l.contains("evaluation alone"))
            .unwrap();
        assert!(
            line.contains("at micro-batch 16") && line.contains("evaluation batch 4"),
            "{line}"
        );
    }

    #[test]
    fn explicit_flags_are_constraints_and_nothing_fitting_is_an_error() {
        let (c, m) = t5_small();
        let fixed = Fixed {
            batch: Some(8),
            ..Fixed::default()
        };
        let p = auto(&c, &m, &budget(64), fixed).unwrap();
        assert_eq!((p.config.batch, p.config.accum), (8, 4));
        let err = auto(&c, &m, &budget(1), Fixed::default()).unwrap_err();
        assert!(matches!(err, PlanError::DoesNotFit(_)), "{err}");
        assert!(err.to_string().contains("--budget-ram"), "{err}");
    }

    #[test]
    fn chatlm_v8_sets_accumulation_below_10_gib_only() {
        let (c, m) = t5_small();
        let v8 = PolicyChoice::parse("chatlm-v8").unwrap();
        let low = planned_start(&c, &m, &budget(64), Fixed::default(), v8, 6 << 30).unwrap();
        assert_eq!((low.config.batch, low.config.accum), (16, 4));
        assert_eq!(low.planning["policy"], "chatlm-v8");
        assert!(low.planning["decision"]["rule"].is_object());
        let high = planned_start(&c, &m, &budget(64), Fixed::default(), v8, 12 << 30).unwrap();
        assert_eq!((high.config.batch, high.config.accum), (16, 2));
        assert!(high.planning["decision"]["rule"].is_null());
        assert!(
            PolicyChoice::parse("chatlm-v9")
                .unwrap_err()
                .contains("auto, chatlm-v8, chatlm-v3")
        );
    }

    #[test]
    fn chatlm_v3_sets_micro_batch_and_accumulation_on_both_sides_of_13_gib() {
        let (c, m) = t5_small();
        let v3 = PolicyChoice::parse("chatlm-v3").unwrap();
        let low = planned_start(&c, &m, &budget(64), Fixed::default(), v3, 12 << 30).unwrap();
        assert_eq!((low.config.batch, low.config.accum), (1, 8));
        assert_eq!(low.planning["policy"], "chatlm-v3");
        assert!(
            low.lines
                .iter()
                .any(|l| l.contains("effective batch changes from 32 to 8")),
            "{:?}",
            low.lines
        );
        // configured 16 × 2: micro-batch lowered to 2, accumulation raised to 16
        let high = planned_start(&c, &m, &budget(64), Fixed::default(), v3, 20 << 30).unwrap();
        assert_eq!((high.config.batch, high.config.accum), (2, 16));
        // a flag the user gave wins, and the plan says so
        let given = TrainConfig { batch: 4, ..c };
        let fixed = Fixed {
            batch: Some(4),
            ..Fixed::default()
        };
        let kept = planned_start(&given, &m, &budget(64), fixed, v3, 20 << 30).unwrap();
        assert_eq!((kept.config.batch, kept.config.accum), (4, 16));
        assert!(
            kept.lines
                .iter()
                .any(|l| l.contains("micro-batch stays 4 (set by --batch)")),
            "{:?}",
            kept.lines
        );
    }

    fn demo_classifier() -> (TrainConfig, Value) {
        let model = crate::demo::classification::model_config(40);
        let c = TrainConfig {
            task: TaskKind::Classification,
            batch: 32,
            seq: 32,
            ..TrainConfig::default()
        };
        (c, model)
    }

    #[test]
    fn bert_ultra_low_sets_every_knob_of_a_classification_run() {
        let (c, m) = demo_classifier();
        let ultra = PolicyChoice::parse("bert-ultra-low").unwrap();
        let p = planned_start(&c, &m, &budget(64), Fixed::default(), ultra, 64 << 30).unwrap();
        let got = (
            p.config.batch,
            p.config.accum,
            p.config.precision,
            p.config.grad_ckpt,
        );
        assert_eq!(got, (1, 16, Precision::Bf16, true));
        // 128 tokens do not fit the demo's 64 positions: cut there, and said
        assert_eq!(p.config.seq, 64);
        let text = p.lines.join("\n");
        assert!(text.contains("bert-ultra-low (a fixed preset) → micro-batch 1, max length 128, accumulation 16, bf16 mixed precision, gradient checkpointing, 0 loader workers"), "{text}");
        assert!(text.contains("cut to the model's 64 positions"), "{text}");
        assert_eq!(p.planning["policy"], "bert-ultra-low");
        assert!(
            p.planning["policy_source"]
                .as_str()
                .unwrap()
                .contains("8 GB RAM")
        );
        assert_eq!(p.planning["chosen"]["settings"]["seq"], 64);
        // bert-safe keeps the configured precision and checkpointing
        let safe = PolicyChoice::parse("bert-safe").unwrap();
        let p = planned_start(&c, &m, &budget(64), Fixed::default(), safe, 1 << 30).unwrap();
        let got = (
            p.config.batch,
            p.config.accum,
            p.config.precision,
            p.config.grad_ckpt,
        );
        assert_eq!(got, (4, 4, Precision::Fp32, false));
    }

    #[test]
    fn a_bert_policy_on_another_task_and_a_pytorch_preset_are_refused_by_name() {
        let (c, m) = t5_small();
        let safe = PolicyChoice::parse("bert-safe").unwrap();
        let err = planned_start(&c, &m, &budget(64), Fixed::default(), safe, 1 << 30).unwrap_err();
        assert!(matches!(err, PlanError::Input(_)), "{err}");
        let err = err.to_string();
        assert!(
            err.contains("bert-safe") && err.contains("seq2seq") && err.contains("classification"),
            "{err}"
        );
        let err = PolicyChoice::parse("qwen-minimal").unwrap_err();
        assert!(
            err.contains("qwen-minimal") && err.contains("memfit plan --policy qwen-minimal"),
            "{err}"
        );
    }
}
