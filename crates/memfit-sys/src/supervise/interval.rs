//! How often to sample: seldom far from the limit, often near it or while memory grows fast.

use std::time::{Duration, Instant};

/// Sampling period when far from every limit (the "about 1 s").
pub const FAR_INTERVAL: Duration = Duration::from_secs(1);
/// Sampling period once usage passes `NEAR_FRACTION` of the limit or the guard has left `Normal`.
pub const NEAR_INTERVAL: Duration = Duration::from_millis(100);
/// The shortest period, used when memory grows fast: reading /proc/PID/status of a few processes costs
/// tens of microseconds, so 10 ms stays well under 1% of a core.
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);
/// "Near a limit": half of it.
const NEAR_FRACTION: f64 = 0.5;
/// Sample this many times before the soft level is reached at the current growth rate.
const SAMPLES_BEFORE_SOFT: f64 = 4.0;
/// The fastest growth assumed for memory that looks idle, bytes/s: fresh anonymous pages fault in at
/// about 0.8 GiB/s per thread on the development VM (memfit-memhog: 8 MiB touched in ~10 ms); 4 GiB/s
/// covers a burst from several threads. It only shortens the period when the soft level is less than
/// 4 GiB/s × 4 samples × 1 s = 16 GiB away.
const WORST_CASE_GROWTH: f64 = 4.0 * (1u64 << 30) as f64;

/// Growth of the job's memory, smoothed over samples.
pub(super) struct Growth {
    pub(super) last: Option<(Instant, u64)>,
    pub(super) bytes_per_s: f64,
}

impl Growth {
    pub(super) fn update(&mut self, now: Instant, used: u64) -> Option<f64> {
        let known = self.last.is_some();
        if let Some((t, u)) = self.last {
            let dt = now.duration_since(t).as_secs_f64();
            if dt > 0.0 {
                let rate = (used as f64 - u as f64) / dt;
                // Half-life of one sample; the larger of the two so a sudden climb is not averaged away.
                self.bytes_per_s = (0.5 * self.bytes_per_s + 0.5 * rate).max(rate);
            }
        }
        self.last = Some((now, used));
        known.then_some(self.bytes_per_s)
    }
}

/// The next sampling period: 1 s far from limits, 100 ms near them, shorter when the soft level would be
/// reached sooner at the current growth rate.
/// `growth` is `None` until two samples give a rate: a job that just started is watched closely.
pub fn next_interval(
    used: u64,
    limit: u64,
    soft: f64,
    stage_normal: bool,
    growth: Option<f64>,
) -> Duration {
    let fraction = if limit == 0 {
        1.0
    } else {
        used as f64 / limit as f64
    };
    let Some(growth) = growth else {
        return NEAR_INTERVAL;
    };
    let mut period = if fraction >= NEAR_FRACTION || !stage_normal {
        NEAR_INTERVAL
    } else {
        FAR_INTERVAL
    };
    let to_soft = soft * limit as f64 - used as f64;
    // Even memory that looks idle cannot reach the soft level faster than the fastest plausible growth:
    // with a small budget this keeps the period short enough to see a sudden burst coming.
    // A tiny growth rate gives an ETA too long for a Duration: then it does not shorten the period.
    for rate in [growth, WORST_CASE_GROWTH] {
        if rate > 0.0
            && to_soft > 0.0
            && let Ok(eta) = Duration::try_from_secs_f64(to_soft / rate / SAMPLES_BEFORE_SOFT)
        {
            period = period.min(eta);
        }
    }
    period.max(MIN_INTERVAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_adapts() {
        let gib = 1u64 << 30;
        let big = 100 * gib;
        let ms = |p: Duration| p.as_millis() as i64;
        assert_eq!(next_interval(big / 10, big, 0.9, true, None), NEAR_INTERVAL);
        assert_eq!(
            next_interval(big / 10, big, 0.9, true, Some(0.0)),
            FAR_INTERVAL
        );
        assert_eq!(
            next_interval(big * 6 / 10, big, 0.9, true, Some(0.0)),
            NEAR_INTERVAL
        );
        assert_eq!(
            next_interval(big / 10, big, 0.9, false, Some(0.0)),
            NEAR_INTERVAL
        );
        assert_eq!(
            next_interval(big / 10, big, 0.9, true, Some(1e-300)),
            FAR_INTERVAL
        );
        // 80 GiB to the soft level at 80 GiB/s: 1 s away, so sample every 250 ms.
        let p = next_interval(big / 10, big, 0.9, true, Some(80.0 * gib as f64));
        assert!((ms(p) - 250).abs() <= 1, "{p:?}");
        assert_eq!(
            next_interval(big * 89 / 100, big, 0.9, true, Some(1e12)),
            MIN_INTERVAL
        );
        // A small budget is watched closely even when idle: 0.8 GiB to soft at 4 GiB/s → 50 ms.
        let p = next_interval(gib / 10, gib, 0.9, true, Some(0.0));
        assert!((ms(p) - 50).abs() <= 1, "{p:?}");
    }

    proptest::proptest! {
        #[test]
        fn interval_is_always_bounded(
            used: u64, limit: u64, soft in 0.01f64..1.0, normal: bool,
            growth in proptest::option::of(proptest::num::f64::ANY),
        ) {
            let p = next_interval(used, limit, soft, normal, growth);
            proptest::prop_assert!((MIN_INTERVAL..=FAR_INTERVAL).contains(&p));
        }
    }
}
