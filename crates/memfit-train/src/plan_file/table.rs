//! A start set by a named policy (`memfit train --policy NAME`): the seed's tables and the fixed
//! presets set their knobs over the configured setup, which is then estimated, not searched.

use super::{PlanError, gib, peaks, settings};
use memfit_plan::arch::Arch;
use memfit_plan::memory::{self, Framework, Setup};
use memfit_plan::search::{Fixed, policy};
use serde_json::{Value, json};

/// A start set by a policy table or preset (not planned: its settings are estimated and said).
pub(super) struct Table<'a> {
    pub policy: &'static policy::Policy,
    pub available_bytes: u64,
    pub budget_line: &'a str,
    pub soft_limit: u64,
    /// On a GPU: the guard's soft limit of the GPU budget, which the setup is checked against with
    /// memfit's GPU model.
    pub gpu_soft_limit: Option<u64>,
    pub guard_soft_fraction: f64,
}

impl Table<'_> {
    /// The setup the policy sets over `base`, the `planning` object and the predicted peak; its
    /// lines (the decision, the settings, notes) go to `lines`.
    pub(super) fn start(
        &self,
        arch: &Arch,
        base: &Setup,
        model_config: &Value,
        fixed: &Fixed,
        lines: &mut Vec<String>,
    ) -> Result<(Setup, Value, u64), PlanError> {
        let p = self.policy;
        let decision = policy::decide(p, self.available_bytes);
        let mut setup = base.clone();
        let mut notes = match &decision.rule {
            Some(rule) => policy::apply(&rule.set, &mut setup, fixed),
            None => Vec::new(),
        };
        // a length past the model's position table cannot run: cut it there
        let positions = model_config["max_position_embeddings"].as_u64();
        if let Some(max) = positions.filter(|m| setup.seq > *m && fixed.seq.is_none()) {
            notes.push(format!(
                "max length {} is cut to the model's {max} positions (max_position_embeddings)",
                setup.seq
            ));
            setup.seq = max;
        }
        if self.gpu_soft_limit.is_some() {
            setup.device = memory::Device::Cuda;
        }
        let estimate =
            memory::estimate(arch, &setup, &Framework::default()).map_err(PlanError::Input)?;
        let peak = estimate.host.peak_rss_bytes;
        let gpu_peak = estimate.gpu.as_ref().map(|g| g.nvml_used_bytes);
        lines.push(format!(
            "policy {}, {}: {}",
            p.name,
            self.budget_line,
            decision.describe()
        ));
        lines.push(format!(
            "  micro {} × accum {}, seq {}, {}{} → predicted peak {}",
            setup.batch,
            setup.accum,
            setup.seq,
            setup.precision,
            if setup.grad_ckpt { ", grad ckpt" } else { "" },
            peaks(gpu_peak, peak)
        ));
        let effective = base.batch * base.accum;
        if setup.batch * setup.accum != effective {
            notes.push(format!(
                "the effective batch changes from {effective} to {} (the policy sets its \
                 knobs without keeping the effective batch, as the seed did)",
                setup.batch * setup.accum
            ));
        }
        if peak > self.soft_limit {
            notes.push(format!(
                "the predicted peak {} exceeds the memory guard's soft limit {} ({:.0}% of the \
                 budget): a policy table does not plan (--policy auto does)",
                gib(peak),
                gib(self.soft_limit),
                100.0 * self.guard_soft_fraction
            ));
        }
        if let (Some(need), Some(limit)) = (gpu_peak, self.gpu_soft_limit)
            && need > limit
        {
            notes.push(format!(
                "the predicted GPU peak {} exceeds the memory guard's soft limit {} of the GPU \
                 budget: a policy table does not plan (--policy auto does); a CUDA out-of-memory \
                 halves the micro-batch",
                gib(need),
                gib(limit)
            ));
        }
        lines.extend(notes.iter().map(|n| format!("  note: {n}")));
        let planning = json!({
            "policy": p.name,
            "policy_source": p.source,
            "decision": decision,
            "decision_text": decision.describe(),
            "chosen": {
                "settings": settings(&setup),
                "predicted_peak_rss_bytes": peak,
                "predicted_peak_gpu_bytes": gpu_peak,
            },
            "notes": notes,
            "fixed_by_flags": fixed,
        });
        Ok((setup, planning, peak))
    }
}
