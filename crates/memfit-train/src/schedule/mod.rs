//! Learning-rate schedules: pure functions of the optimizer step, so a resumed run needs only the step
//! number to continue exactly (no scheduler state beyond the config).

mod cosine;
mod one_cycle;

pub use cosine::WarmupCosine;
pub use one_cycle::OneCycle;

use serde::{Deserialize, Serialize};

/// Which schedule a run uses (`--schedule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScheduleKind {
    /// torch `OneCycleLR` (cosine annealing, two phases), as the seed ran it.
    Onecycle,
    /// Linear warm-up then cosine decay to zero (transformers' `get_cosine_schedule_with_warmup`).
    Cosine,
}

impl std::str::FromStr for ScheduleKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "onecycle" | "one-cycle" => Ok(Self::Onecycle),
            "cosine" => Ok(Self::Cosine),
            other => Err(format!(
                "unknown schedule {other:?} (expected onecycle or cosine)"
            )),
        }
    }
}

/// A schedule resolved for one run: knows its total step count.
#[derive(Debug, Clone, PartialEq)]
pub enum Schedule {
    OneCycle(OneCycle),
    WarmupCosine(WarmupCosine),
}

impl Schedule {
    /// The learning rate of the optimizer step that follows `completed` finished steps (0-based),
    /// which is what torch's scheduler holds after `completed` calls of `scheduler.step()`.
    pub fn lr_at(&self, completed: u64) -> f64 {
        match self {
            Schedule::OneCycle(s) => s.lr_at(completed),
            Schedule::WarmupCosine(s) => s.lr_at(completed),
        }
    }

    pub fn total_steps(&self) -> u64 {
        match self {
            Schedule::OneCycle(s) => s.total_steps,
            Schedule::WarmupCosine(s) => s.total_steps,
        }
    }
}

/// Cosine interpolation from `start` (at pct 0) to `end` (at pct 1), torch's `_annealing_cos`.
fn anneal_cos(start: f64, end: f64, pct: f64) -> f64 {
    let cos_out = (std::f64::consts::PI * pct).cos() + 1.0;
    end + (start - end) / 2.0 * cos_out
}
