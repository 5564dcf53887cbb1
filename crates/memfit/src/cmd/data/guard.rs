//! `memfit data prepare` under train's in-process memory guard (memfit_train::memory_guard): the same
//! budget flag (`--budget-ram`, default 80% of the effective available memory), the same reading
//! (this process's anonymous + shared + swapped pages) and the same hard limit (95%). The prepare
//! asks it after every chunk; past the hard limit it stops, exit 75, its partial store removed. There
//! is no micro-batch to halve here: the remedy named is a smaller `--chunk-rows` or `--max-row-bytes`.

use crate::cmd::train::budget;
use crate::cmd::train::setup::Available;
use crate::exit::Exit;
use anyhow::Context;
use memfit_sys::units::human_bytes;
use memfit_train::memory_guard::{
    DEFAULT_HARD_FRACTION, DEFAULT_SOFT_FRACTION, GuardSettings, MemoryGuard, ProcessMemory,
    SAMPLE_PERIOD, Verdict,
};

/// The guard of one prepare.
pub struct PrepareGuard {
    guard: MemoryGuard,
    budget_source: String,
    budget_bytes: u64,
}

/// Starts the guard for `--budget-ram` (`None`: the default share of the available memory).
pub fn start(budget_ram: Option<&str>) -> anyhow::Result<PrepareGuard> {
    let available = Available::new();
    let ram = budget_ram
        .map(|t| budget::parse_ram(t, &|| available.bytes()))
        .transpose()?;
    let budget = budget::resolve(ram, None, budget::Compute::cpu(), &available)?;
    budget::check_within_machine(budget.ram_bytes, &budget.ram_source, &available)?;
    let settings = GuardSettings {
        budget_bytes: Some(budget.ram_bytes),
        gpu_budget_bytes: None,
        soft_fraction: DEFAULT_SOFT_FRACTION,
        hard_fraction: DEFAULT_HARD_FRACTION,
        period: SAMPLE_PERIOD,
        override_file: None,
    };
    let guard = MemoryGuard::start(settings, ProcessMemory::new())
        .context("starting the memory guard thread")?;
    Ok(PrepareGuard {
        guard,
        budget_source: budget.ram_source,
        budget_bytes: budget.ram_bytes,
    })
}

impl PrepareGuard {
    /// The row limit a prepare can keep within the budget: `asked` (`--max-row-bytes`), lowered
    /// (with a note) to what tokenizing one row may cost under the hard limit. The guard is asked
    /// between chunks only, so a row that would pass the budget while it is tokenized is refused
    /// unread instead, as any row over the limit (exit 2 naming it, or left out under
    /// `--on-invalid skip`).
    pub fn row_limit(&self, asked: u64, flag: &str) -> u64 {
        let per_byte = memfit_data::encode::TOKENIZE_BYTES_PER_TEXT_BYTE;
        let fits = (self.budget_bytes as f64 * DEFAULT_HARD_FRACTION) as u64 / per_byte;
        if asked <= fits {
            return asked;
        }
        eprintln!(
            "note: --max-row-bytes {flag} lowered to {}: tokenizing a row may take {per_byte} B a \
             byte of it, and the budget is {} ({}); a longer row is refused unread",
            human_bytes(fits),
            human_bytes(self.budget_bytes),
            self.budget_source
        );
        fits.max(1)
    }

    /// Why the prepare must stop now (the hard limit crossed since the guard started), if it must.
    pub fn stop_reason(&self) -> Option<String> {
        let status = self.guard.check_now();
        if status.verdict != Verdict::Hard {
            return None;
        }
        let limits = status.limits?;
        Some(format!(
            "memory guard: the prepare reached {} (hard limit {} = 95% of the {} budget, {}); \
             nothing was written — retry with a smaller --chunk-rows or --max-row-bytes, or a \
             larger --budget-ram",
            human_bytes(status.peak.host_bytes),
            human_bytes(limits.hard_bytes),
            human_bytes(limits.budget_bytes),
            self.budget_source
        ))
    }
}

/// A guard stop: exit 75 (docs/architecture.md §3), as a training run's.
pub fn stopped(reason: String) -> anyhow::Error {
    Exit {
        code: 75,
        message: reason,
    }
    .into()
}
