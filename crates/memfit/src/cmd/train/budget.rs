//! The planned start of `memfit train`: the RAM budget (`--budget-ram SIZE|PCT`, default 80% of the
//! effective available memory memfit-sys reports), the policy (`--policy`), and the plan
//! `memfit_train::plan_file::planned_start` makes from them. Parsing and printing only.

use super::args::Args;
use super::setup::Available;
use crate::exit::{bad_input, does_not_fit};
use memfit_plan::search::Fixed;
use memfit_sys::units::{SizeOrPercent, parse_size};
use memfit_train::config::{ConfigLayer, Precision, TrainConfig};
use memfit_train::plan_file::{self, Budget, PlanError, PlannedStart, PolicyChoice};
use serde_json::Value;

/// The default share of the effective available memory a run plans for.
const DEFAULT_SHARE: f64 = 0.80;

const GIB: f64 = (1u64 << 30) as f64;

/// `--budget-ram` as typed → bytes; exit 2 naming the value when it is not a size or a percentage.
pub fn parse_ram(
    text: &str,
    available: &dyn Fn() -> anyhow::Result<u64>,
) -> anyhow::Result<Budget> {
    let amount =
        SizeOrPercent::parse(text).map_err(|e| bad_input(format!("--budget-ram {text:?}: {e}")))?;
    let (bytes, source) = match amount {
        SizeOrPercent::Bytes(b) => (b, format!("--budget-ram {text}")),
        SizeOrPercent::Fraction(f) => {
            let avail = available()?;
            (
                (avail as f64 * f) as u64,
                format!(
                    "--budget-ram {text} of {:.2} GiB effective available",
                    avail as f64 / GIB
                ),
            )
        }
    };
    if bytes == 0 {
        return Err(bad_input(format!(
            "--budget-ram {text:?}: the budget must be more than 0 bytes"
        )));
    }
    Ok(Budget {
        ram_bytes: bytes,
        ram_source: source,
        gpu_bytes: None,
        on_gpu: false,
        ranks: 1,
        shard_optimizer: false,
        resident_bytes: 0,
    })
}

/// What the run computes on, as its start is planned.
pub struct Compute {
    /// `--budget-gpu`, or on a GPU its default.
    pub gpu_bytes: Option<u64>,
    pub on_gpu: bool,
    /// Data-parallel ranks (1 without data parallelism).
    pub ranks: usize,
    /// `--shard-optimizer`: the ranks divide the optimizer state (ZeRO-1).
    pub shard_optimizer: bool,
}

impl Compute {
    /// One process on the CPU.
    pub fn cpu() -> Self {
        Self {
            gpu_bytes: None,
            on_gpu: false,
            ranks: 1,
            shard_optimizer: false,
        }
    }
}

/// The budget of a run: the flag (`ram`, already parsed), else the `--config` file's
/// `memory_budget_bytes`, else 80% of the effective available memory; with what it computes on.
pub fn resolve(
    ram: Option<Budget>,
    from_config_file: Option<u64>,
    compute: Compute,
    available: &Available,
) -> anyhow::Result<Budget> {
    let supervisor = supervised()?;
    let (ram_bytes, ram_source) = match (ram, from_config_file, supervisor) {
        (Some(b), ..) => (b.ram_bytes, b.ram_source),
        (None, Some(bytes), _) => (bytes, "memory_budget_bytes of the --config file".into()),
        (None, None, Some(bytes)) => (bytes, SUPERVISED.into()),
        (None, None, None) => {
            let avail = available.bytes()?;
            (
                (avail as f64 * DEFAULT_SHARE) as u64,
                format!(
                    "default: 80% of {:.2} GiB effective available (MemAvailable, cgroup limits)",
                    avail as f64 / GIB
                ),
            )
        }
    };
    let (ram_bytes, ram_source) = capped_by_supervisor(ram_bytes, ram_source, supervisor);
    Ok(Budget {
        ram_bytes,
        ram_source,
        gpu_bytes: compute.gpu_bytes,
        on_gpu: compute.on_gpu,
        ranks: compute.ranks,
        shard_optimizer: compute.shard_optimizer,
        resident_bytes: 0,
    })
}

/// Where a budget `memfit run` handed over came from, as the start line says it.
const SUPERVISED: &str = "memfit run's budget up to its soft limit, MEMFIT_RUN_BUDGET_BYTES";

/// The budget `memfit run` hands its job ([`memfit_sys::supervise::BUDGET_ENV`]), if this process
/// runs under one; a value that is not a byte count is exit 2 naming the variable.
pub fn supervised() -> anyhow::Result<Option<u64>> {
    let name = memfit_sys::supervise::BUDGET_ENV;
    match std::env::var(name) {
        Err(_) => Ok(None),
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(bytes) if bytes > 0 => Ok(Some(bytes)),
            _ => Err(bad_input(format!("{name}={text:?}: not a number of bytes"))),
        },
    }
}

/// A budget of its own above what `memfit run` allows gets `memfit run`'s, with a warning: a plan
/// for more would be stopped by the supervisor, at worst SIGKILLed mid-step.
pub fn within_supervisor(bytes: u64, source: String) -> anyhow::Result<(u64, String)> {
    Ok(capped_by_supervisor(bytes, source, supervised()?))
}

fn capped_by_supervisor(bytes: u64, source: String, supervisor: Option<u64>) -> (u64, String) {
    match supervisor {
        Some(allowed) if allowed < bytes => {
            eprintln!(
                "warning: {source} ({:.2} GiB) is above {SUPERVISED}, {:.2} GiB: planning for that",
                bytes as f64 / GIB,
                allowed as f64 / GIB
            );
            (allowed, SUPERVISED.into())
        }
        _ => (bytes, source),
    }
}

/// A budget past the machine's memory cannot be kept by a run here: refused (exit 2) before
/// anything is made. (`--plan-only` may plan for a larger machine.)
pub fn check_within_machine(
    ram_bytes: u64,
    source: &str,
    available: &Available,
) -> anyhow::Result<()> {
    let machine = available.machine_bytes()?;
    if ram_bytes <= machine {
        return Ok(());
    }
    Err(bad_input(format!(
        "{source}: a budget of {:.2} GiB is more than this machine's {:.2} GiB of memory \
         (MemTotal, capped by the cgroup limit); give at most that, or leave the budget out \
         (80% of the effective available)",
        ram_bytes as f64 / GIB,
        machine as f64 / GIB
    )))
}

/// `--budget-gpu` in bytes, if given; exit 2 naming the value when it is not a size.
pub fn gpu_budget(args: &Args) -> anyhow::Result<Option<u64>> {
    args.budget_gpu
        .as_deref()
        .map(|t| parse_size(t).map_err(|e| bad_input(format!("--budget-gpu {t:?}: {e}"))))
        .transpose()
}

/// The flags that fix part of the setup.
fn fixed(flags: &ConfigLayer) -> Fixed {
    Fixed {
        batch: flags.batch.map(|b| b as u64),
        accum: flags.accum.map(|a| a as u64),
        seq: flags.seq.map(|s| s as u64),
        precision: flags.precision.map(|p| match p {
            Precision::Bf16 => memfit_plan::memory::Precision::Bf16,
            Precision::Fp32 => memfit_plan::memory::Precision::Fp32,
        }),
        grad_ckpt: flags.grad_ckpt,
    }
}

/// The planned start of a new run; its lines are printed by the caller once the run has started
/// (or at once with --plan-only), so a start that fails later has printed no plan. Exit 3 when
/// nothing fits.
pub fn plan_start(
    policy: &str,
    flags: &ConfigLayer,
    config: &TrainConfig,
    model_json: &Value,
    budget: Budget,
    available: &Available,
) -> anyhow::Result<PlannedStart> {
    let choice = PolicyChoice::parse(policy).map_err(bad_input)?;
    // the policy tables read the machine's available memory, not the budget
    let avail = available.bytes()?;
    let planned =
        plan_file::planned_start(config, model_json, &budget, fixed(flags), choice, avail)
            .map_err(|e| match e {
                PlanError::Input(m) => bad_input(m),
                PlanError::DoesNotFit(m) => does_not_fit(m),
            })?;
    let mut planned = planned;
    // a policy sets bf16 itself (and says so); only the planner picks it to fit
    let planner = matches!(choice, PolicyChoice::Auto);
    if planner && planned.config.precision == Precision::Bf16 && config.precision != Precision::Bf16
    {
        let note = "  note: bf16 was chosen to fit the budget (burn's flex backend runs it slower)";
        planned.lines.push(note.into());
    }
    Ok(planned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_percentages() {
        let avail = || Ok(10u64 << 30);
        assert_eq!(parse_ram("2GiB", &avail).unwrap().ram_bytes, 2 << 30);
        let half = parse_ram("50%", &avail).unwrap();
        assert_eq!(half.ram_bytes, 5 << 30);
        assert!(half.ram_source.contains("10.00 GiB"), "{}", half.ram_source);
        for bad in ["lots", "150%", "0", "-1GiB", "2 parsecs"] {
            let err = parse_ram(bad, &avail).unwrap_err();
            let exit = err.downcast_ref::<crate::exit::Exit>().unwrap();
            assert_eq!(exit.code, 2);
            assert!(exit.message.contains(bad), "{}", exit.message);
        }
    }
}
