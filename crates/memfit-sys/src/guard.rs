//! The guard's state machine: pure, driven by readings, so its properties can be tested without processes.
//!
//! Levels are fractions of the hard limit: `warn` < `soft` < 1. Reaching `warn` logs a warning; reaching
//! `soft` sends the graceful signal (the job checkpoints and exits); 1 (the hard limit) or the end of the
//! grace period after the graceful signal sends SIGKILL. Hysteresis: a warning clears only once usage falls
//! `hysteresis` below the level that raised it, and the same stage is not entered again within `cooldown`.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GuardConfig {
    /// Fraction of the hard limit that raises a warning.
    pub warn: f64,
    /// Fraction of the hard limit that sends the graceful signal.
    pub soft: f64,
    /// How far below a level usage must fall to leave it (a fraction of the hard limit).
    pub hysteresis: f64,
    /// How long the job has to exit after the graceful signal before SIGKILL.
    pub grace: Duration,
    /// The minimum time between two warnings, or between two graceful signals.
    pub cooldown: Duration,
    /// Whether the graceful signal asks the job to exit (TERM, INT). With a signal that only asks it to
    /// shed memory (USR1), a job back below `soft − hysteresis` at the end of the grace period is kept.
    pub expect_exit: bool,
}

impl Default for GuardConfig {
    fn default() -> Self {
        Self {
            warn: 0.75,
            soft: 0.90,
            hysteresis: 0.05,
            grace: Duration::from_secs(30),
            cooldown: Duration::from_secs(10),
            expect_exit: true,
        }
    }
}

/// One observation: the job's memory and the hard limit it must stay under, at a time since start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub at: Duration,
    pub used: u64,
    /// Where `used` will be at the next reading if it keeps growing at its current rate (≥ `used`).
    /// The warn and soft levels compare this, so a fast climb is stopped before it crosses them
    /// between two readings; the hard limit compares `used`, what is actually there.
    pub projected: u64,
    pub limit: u64,
}

impl Reading {
    /// A reading of memory that is not growing.
    pub fn steady(at: Duration, used: u64, limit: u64) -> Self {
        Self {
            at,
            used,
            projected: used,
            limit,
        }
    }

    fn share(&self, bytes: u64) -> f64 {
        if self.limit == 0 {
            f64::INFINITY
        } else {
            bytes as f64 / self.limit as f64
        }
    }

    /// `used` as a fraction of the limit.
    pub fn fraction(&self) -> f64 {
        self.share(self.used)
    }

    /// `projected` (never below `used`) as a fraction of the limit.
    pub fn projected_fraction(&self) -> f64 {
        self.share(self.projected.max(self.used))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "stage")]
pub enum Stage {
    Normal,
    Warned,
    /// The graceful signal went out at `since`.
    Stopping {
        since: Duration,
    },
    Killed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KillReason {
    HardLimit,
    GraceExpired,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "action")]
pub enum Action {
    Warn,
    /// Usage fell back below a level (no signal is sent).
    Recover,
    GracefulStop,
    Kill {
        reason: KillReason,
    },
}

#[derive(Debug, Clone)]
pub struct Guard {
    cfg: GuardConfig,
    stage: Stage,
    last_warn: Option<Duration>,
    last_stop: Option<Duration>,
}

impl Guard {
    pub fn new(cfg: GuardConfig) -> Self {
        Self {
            cfg,
            stage: Stage::Normal,
            last_warn: None,
            last_stop: None,
        }
    }

    pub fn stage(&self) -> Stage {
        self.stage
    }

    pub fn config(&self) -> &GuardConfig {
        &self.cfg
    }

    fn cooled(&self, last: Option<Duration>, now: Duration) -> bool {
        last.is_none_or(|t| now.saturating_sub(t) >= self.cfg.cooldown)
    }

    /// Feeds one reading; returns what to do now, if anything.
    pub fn step(&mut self, r: Reading) -> Option<Action> {
        let f = r.projected_fraction();
        let c = &self.cfg;
        match self.stage {
            Stage::Killed => None,
            _ if r.fraction() >= 1.0 => {
                self.stage = Stage::Killed;
                Some(Action::Kill {
                    reason: KillReason::HardLimit,
                })
            }
            Stage::Stopping { since } => {
                if r.at.saturating_sub(since) < c.grace {
                    None
                } else if c.expect_exit || f >= c.soft - c.hysteresis {
                    self.stage = Stage::Killed;
                    Some(Action::Kill {
                        reason: KillReason::GraceExpired,
                    })
                } else {
                    // The cooldown before another graceful signal runs from the recovery.
                    self.stage = Stage::Normal;
                    self.last_stop = Some(r.at);
                    Some(Action::Recover)
                }
            }
            Stage::Normal | Stage::Warned if f >= c.soft && self.cooled(self.last_stop, r.at) => {
                self.stage = Stage::Stopping { since: r.at };
                self.last_stop = Some(r.at);
                Some(Action::GracefulStop)
            }
            Stage::Normal if f >= c.warn && self.cooled(self.last_warn, r.at) => {
                self.stage = Stage::Warned;
                self.last_warn = Some(r.at);
                Some(Action::Warn)
            }
            Stage::Warned if f < c.warn - c.hysteresis => {
                self.stage = Stage::Normal;
                Some(Action::Recover)
            }
            Stage::Normal | Stage::Warned => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMIT: u64 = 1000;

    fn run(cfg: GuardConfig, trace: &[(u64, u64)]) -> Vec<(Reading, Option<Action>)> {
        let mut guard = Guard::new(cfg);
        let mut at = Duration::ZERO;
        trace
            .iter()
            .map(|&(dt_ms, used)| {
                at += Duration::from_millis(dt_ms);
                let r = Reading::steady(at, used, LIMIT);
                (r, guard.step(r))
            })
            .collect()
    }

    fn cfg(expect_exit: bool) -> GuardConfig {
        GuardConfig {
            grace: Duration::from_millis(500),
            cooldown: Duration::from_millis(300),
            expect_exit,
            ..GuardConfig::default()
        }
    }

    #[test]
    fn climbs_through_every_stage() {
        let out = run(
            cfg(true),
            &[(100, 100), (100, 800), (100, 910), (100, 950), (600, 950)],
        );
        let actions: Vec<_> = out.iter().map(|(_, a)| *a).collect();
        assert_eq!(
            actions,
            [
                None,
                Some(Action::Warn),
                Some(Action::GracefulStop),
                None,
                Some(Action::Kill {
                    reason: KillReason::GraceExpired
                })
            ]
        );
    }

    #[test]
    fn hard_limit_kills_at_once() {
        let out = run(cfg(true), &[(100, 500), (100, 1000)]);
        assert_eq!(
            out[1].1,
            Some(Action::Kill {
                reason: KillReason::HardLimit
            })
        );
    }

    #[test]
    fn usr1_style_job_that_shed_memory_is_kept() {
        let out = run(
            cfg(false),
            &[(100, 920), (600, 500), (100, 920), (400, 920)],
        );
        let actions: Vec<_> = out.iter().map(|(_, a)| *a).collect();
        // Recovers; back above the soft level within the cooldown (300 ms after the recovery) it only
        // warns, and the second graceful signal waits for the cooldown to end.
        assert_eq!(
            actions,
            [
                Some(Action::GracefulStop),
                Some(Action::Recover),
                Some(Action::Warn),
                Some(Action::GracefulStop)
            ]
        );
    }

    proptest! {
        #[test]
        fn invariants_hold(
            trace in proptest::collection::vec((1u64..400, 0u64..1100, 0u64..200), 1..80),
            expect_exit: bool,
        ) {
            let cfg = cfg(expect_exit);
            let mut guard = Guard::new(cfg.clone());
            let mut at = Duration::ZERO;
            let mut graceful_sent = false;
            let mut stopping = false;
            let mut killed = false;
            let mut warned = false;
            let mut last_warn: Option<Duration> = None;
            let mut last_stop: Option<Duration> = None;
            for &(dt_ms, used, growth) in &trace {
                at += Duration::from_millis(dt_ms);
                let r = Reading { at, used, projected: used + growth, limit: LIMIT };
                let action = guard.step(r);
                let (f, p) = (r.fraction(), r.projected_fraction());
                if killed {
                    prop_assert_eq!(action, None, "nothing after a kill");
                    continue;
                }
                if f >= 1.0 {
                    prop_assert!(matches!(action, Some(Action::Kill { .. })), "hard limit must kill");
                }
                match action {
                    Some(Action::Kill { .. }) => {
                        // Never SIGKILL before the graceful signal unless the hard limit is crossed.
                        prop_assert!(graceful_sent || f >= 1.0);
                        killed = true;
                    }
                    Some(Action::GracefulStop) => {
                        prop_assert!(p >= cfg.soft);
                        prop_assert!(last_stop.is_none_or(|t| r.at - t >= cfg.cooldown));
                        graceful_sent = true;
                        stopping = true;
                        last_stop = Some(r.at);
                    }
                    Some(Action::Warn) => {
                        // Hysteresis: a second warning only after a recovery, and not within cooldown.
                        prop_assert!(!warned);
                        prop_assert!(p >= cfg.warn);
                        prop_assert!(last_warn.is_none_or(|t| r.at - t >= cfg.cooldown));
                        warned = true;
                        last_warn = Some(r.at);
                    }
                    Some(Action::Recover) => {
                        prop_assert!(
                            p < cfg.warn - cfg.hysteresis
                                || (!cfg.expect_exit && p < cfg.soft - cfg.hysteresis)
                        );
                        // A recovery from the graceful stage restarts its cooldown.
                        if stopping {
                            last_stop = Some(r.at);
                            stopping = false;
                        }
                        warned = false;
                    }
                    None => {}
                }
            }
        }
    }

    #[test]
    fn a_fast_climb_is_stopped_before_it_crosses_soft() {
        let mut guard = Guard::new(cfg(true));
        let r = Reading {
            at: Duration::from_millis(10),
            used: 850,
            projected: 905,
            limit: LIMIT,
        };
        assert_eq!(guard.step(r), Some(Action::GracefulStop));
        // …but only the real usage can trigger the hard limit.
        let mut guard = Guard::new(cfg(true));
        let r = Reading {
            at: Duration::from_millis(10),
            used: 950,
            projected: 5000,
            limit: LIMIT,
        };
        assert_eq!(guard.step(r), Some(Action::GracefulStop));
    }
}
