//! `memfit plan --policy NAME`: a fixed preset (memfit-plan's `search::policy`) instead of the
//! search. The preset's setup is estimated with the same memory model, checked against the budgets,
//! and its `--emit` files are written exactly as for a searched plan. Exit 3 when it does not fit
//! (no files), 2 when the preset is not made for this model, task, method or runtime.

use super::{Args, candidate_json, describe_candidate, gpu_budget, host_budget, write_files};
use crate::cmd::estimate::{out, write_stdout};
use crate::exit::{Outcome, bad_input, does_not_fit};
use memfit_plan::arch::Arch;
use memfit_plan::emit::Kind;
use memfit_plan::memory::{Device, Framework, Runtime, Setup, Zero, gib};
use memfit_plan::search::policy::{self, Policy, Settings};
use memfit_plan::search::{self, Budget, Candidate, Fixed};
use std::process::ExitCode;

/// The preset named by `--policy`, refused (exit 2, naming it) where it does not apply.
fn resolve(args: &Args, base: &Setup) -> anyhow::Result<(&'static Policy, &'static Settings)> {
    let name = args.policy.as_str();
    let policy = policy::find(name).ok_or_else(|| {
        bad_input(format!(
            "--policy {name:?}: known presets: {}",
            policy::preset_names_for(base.runtime)
        ))
    })?;
    policy.check_runtime(base.runtime).map_err(bad_input)?;
    let Some(set) = policy.preset() else {
        return Err(bad_input(format!(
            "--policy {name} is a start-up table of memfit train that reads the machine's \
             available memory (memfit train --policy {name}); memfit plan estimates fixed presets: {}",
            policy::preset_names_for(base.runtime)
        )));
    };
    policy
        .check_run(base.task, base.method)
        .map_err(bad_input)?;
    if args.tiers {
        return Err(bad_input(format!(
            "--tiers searches every memory size; --policy {name} is one fixed setup (drop one of them)"
        )));
    }
    Ok((policy, set))
}

/// Where the preset runs: memfit's trainer on the CPU; a PyTorch process on the GPU when there is a
/// budget for one, and always for a ZeRO preset (DeepSpeed shards GPU memory: without a GPU budget
/// only the host side can be checked).
fn device(base: &Setup, set: &Settings, gpu_bytes: Option<u64>) -> Device {
    let zero = set.zero.is_some_and(|z| z != Zero::Z0);
    match base.runtime {
        Runtime::Memfit => Device::Cpu,
        Runtime::Pytorch if gpu_bytes.is_some() || zero => Device::Cuda,
        Runtime::Pytorch => Device::Cpu,
    }
}

pub(super) fn run(args: &Args, arch: &Arch, base: Setup, kinds: &[Kind]) -> Outcome {
    let (policy, set) = resolve(args, &base)?;
    let budget = Budget {
        gpu_bytes: gpu_budget(&args.gpu_mem)?,
        host_bytes: host_budget(&args.host_mem)?,
        headroom: args.headroom,
    };
    let mut setup = base;
    setup.device = device(&setup, set, budget.gpu_bytes);
    if setup.device == Device::Cpu {
        setup.gpus = 1;
        setup.nodes = 1;
    }
    // no flag of memfit plan fixes a knob a preset sets: the preset is the setup
    policy::apply(set, &mut setup, &Fixed::default());
    let c = search::evaluate(arch, setup, &budget, &Framework::default())
        .map_err(|e| bad_input(format!("--policy {}: {e}", policy.name)))?;
    let gpu_unchecked = c.setup.device == Device::Cuda && budget.gpu_bytes.is_none();
    let checked = if gpu_unchecked {
        "host only: no GPU budget (none found; give --gpu-mem SIZE to check the GPU)"
    } else if c.setup.device == Device::Cuda {
        "GPU and host"
    } else {
        "host (training on the CPU)"
    };
    let sets = set.describe();
    if args.json {
        let v = serde_json::json!({
            "policy": policy.name,
            "policy_source": policy.source,
            "policy_sets": sets,
            "model": {"name": arch.name, "family": arch.model_type, "params_total": arch.params_total()},
            "budget": {"gpu_bytes": budget.gpu_bytes, "host_bytes": budget.host_bytes, "headroom": budget.headroom},
            "effective_batch": c.setup.effective_batch(),
            "fits": c.rejected.is_none(),
            "checked": checked,
            "reason": c.rejected,
            "chosen": candidate_json(arch, &c),
        });
        write_stdout(&format!("{}\n", serde_json::to_string_pretty(&v)?))?;
    } else {
        write_stdout(&report(arch, policy, &sets, &budget, &c, checked))?;
    }
    if let Some(why) = &c.rejected {
        return Err(does_not_fit(format!(
            "--policy {} does not fit: {why} (a leaner preset, or --policy auto to search)",
            policy.name
        )));
    }
    write_files(args, kinds, arch, &c.setup)?;
    Ok(ExitCode::SUCCESS)
}

/// The human report: the preset and where it comes from, the budget, the estimate, the verdict.
fn report(
    arch: &Arch,
    policy: &Policy,
    sets: &str,
    budget: &Budget,
    c: &Candidate,
    checked: &str,
) -> String {
    let mut o = String::new();
    out!(
        o,
        "{}: policy {} (a fixed preset, not searched) → {sets}",
        arch.name,
        policy.name
    );
    out!(o, "  source: {}", policy.source);
    let gpu = budget
        .gpu_bytes
        .map_or("none".to_string(), |g| format!("{} GiB per GPU", gib(g)));
    out!(
        o,
        "budget GPU {gpu}, host {} GiB, {:.0}% headroom",
        gib(budget.host_bytes),
        budget.headroom * 100.0
    );
    out!(
        o,
        "\nsetup: {}, seq {}, effective batch {} (the preset's; --seq and --target-batch are not used) — {:.0} tokens/s (throughput model)",
        c.summary(),
        c.setup.seq,
        c.setup.effective_batch(),
        c.tokens_per_s
    );
    describe_candidate(&mut o, c);
    match &c.rejected {
        None => out!(o, "\nfits the budgets (checked: {checked})"),
        Some(why) => out!(o, "\ndoes not fit (checked: {checked}): {why}"),
    }
    o
}
