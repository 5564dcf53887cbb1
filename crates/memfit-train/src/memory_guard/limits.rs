//! Limits of one budget, the verdict they give, and the ratchet that re-arms the soft trigger.

use super::REARM_HYSTERESIS;

/// The soft and hard limits of one budget, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Limits {
    pub budget_bytes: u64,
    pub soft_bytes: u64,
    pub hard_bytes: u64,
}

impl Limits {
    pub fn new(budget_bytes: u64, soft_fraction: f64, hard_fraction: f64) -> Self {
        let at = |f: f64| (budget_bytes as f64 * f) as u64;
        Self {
            budget_bytes,
            soft_bytes: at(soft_fraction),
            hard_bytes: at(hard_fraction),
        }
    }
}

/// What the loop should do, worst last (the atomic holds the worst seen since the loop last acted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Verdict {
    Fine = 0,
    /// Finish the step, checkpoint, halve the micro-batch.
    Soft = 1,
    /// Stop: checkpoint and exit 75 (the current step is abandoned if it has not finished).
    Hard = 2,
}

impl Verdict {
    pub(super) fn from_u8(v: u8) -> Self {
        match v {
            0 => Verdict::Fine,
            1 => Verdict::Soft,
            _ => Verdict::Hard,
        }
    }
}

/// One watched quantity (host or device memory) and its soft trigger.
///
/// The ratchet: after a downgrade, usage does not fall right away — glibc's malloc and burn's memory
/// pools keep freed pages, so RSS stays near its high-water mark. Re-arming at the soft limit would
/// trigger the next downgrade on the very next reading without new information, cascading to a
/// micro-batch of 1 and a stop. So a downgrade moves the trigger to halfway between the usage it saw
/// and the hard limit: another downgrade follows only if memory keeps growing at the smaller
/// micro-batch. Once usage falls [`REARM_HYSTERESIS`] below the soft limit (memory really returned, or a
/// new budget), the trigger goes back to the soft limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watch {
    pub limits: Limits,
    /// Usage at or above this raises [`Verdict::Soft`].
    pub trigger_bytes: u64,
}

impl Watch {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            trigger_bytes: limits.soft_bytes,
        }
    }

    pub fn observe(&mut self, used: u64) -> Verdict {
        let rearm_below = self
            .limits
            .soft_bytes
            .saturating_sub((self.limits.budget_bytes as f64 * REARM_HYSTERESIS) as u64);
        if used < rearm_below {
            self.trigger_bytes = self.limits.soft_bytes;
        }
        if used >= self.limits.hard_bytes {
            Verdict::Hard
        } else if used >= self.trigger_bytes {
            Verdict::Soft
        } else {
            Verdict::Fine
        }
    }

    /// The loop halved the micro-batch while usage was `used`.
    pub fn downgraded(&mut self, used: u64) {
        let from = used.max(self.limits.soft_bytes);
        self.trigger_bytes = from + self.limits.hard_bytes.saturating_sub(from) / 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn limits_are_fractions_of_the_budget() {
        let l = Limits::new(1000 * MIB, 0.85, 0.95);
        assert_eq!((l.soft_bytes, l.hard_bytes), (850 * MIB, 950 * MIB));
    }

    #[test]
    fn watch_ratchets_after_a_downgrade_and_rearms_below_the_soft_limit() {
        let mut w = Watch::new(Limits::new(1000, 0.85, 0.95));
        assert_eq!(w.observe(800), Verdict::Fine);
        assert_eq!(w.observe(860), Verdict::Soft);
        w.downgraded(860);
        // Halfway from 860 to 950: RSS that stays where it was does not trigger again.
        assert_eq!(w.trigger_bytes, 905);
        assert_eq!(w.observe(860), Verdict::Fine);
        assert_eq!(w.observe(904), Verdict::Fine);
        assert_eq!(w.observe(905), Verdict::Soft);
        // Back under soft − 5 % of the budget (800): the trigger returns to the soft limit.
        assert_eq!(w.observe(799), Verdict::Fine);
        assert_eq!(w.trigger_bytes, 850);
        assert_eq!(w.observe(850), Verdict::Soft);
        assert_eq!(w.observe(950), Verdict::Hard);
    }
}
