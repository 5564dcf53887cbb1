//! `memfit calibrate`'s arithmetic and decisions, pure (the binary runs the trials and prints):
//!
//! - [`Template`] — the user's command with `{batch}` (and optionally `{steps}`) in it;
//! - [`fit`] — least squares `peak = fixed + per_sample × batch` over the measured points, with the largest
//!   relative residual as the linearity check;
//! - [`Line::max_batch`] — the largest micro-batch whose predicted peak stays under a budget less headroom;
//! - [`next_trial`] — whether the next trial may run at all (its prediction must fit);
//! - [`profiles_toml`] — the `[[profile]]` list for `memfit run --profiles` at the batches that fit.

use std::fmt::Write as _;

use serde::Serialize;

mod fit;
mod malloc;
pub use fit::{Line, MaxBatch, fit, fit_points};
pub use malloc::{MALLOC_PINS, malloc_pins};

/// Where the batch size goes in the command.
pub const BATCH: &str = "{batch}";
/// Where the step count goes in the command, if the command takes one.
pub const STEPS: &str = "{steps}";
/// Steps per trial when the command has `{steps}` and `--steps` is not given.
pub const DEFAULT_STEPS: u64 = 5;
/// A fit whose largest residual exceeds this share of the measured peak is called not linear. Repeated
/// trials of the t5-small PyTorch baseline differed by up to 1.8% in peak (docs/benchmarks.md), so 5% is a
/// bend, not noise.
pub const LINEARITY_TOLERANCE: f64 = 0.05;
/// The first line of every profiles file calibrate writes; it overwrites only files that start with it.
pub const PROFILES_MARKER: &str = "# written by memfit calibrate";
/// Profiles written: the largest batch that fits, then halves of it, at most this many.
const MAX_PROFILES: usize = 4;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CalibrateError {
    #[error(
        "the command {0:?} has no {{batch}}: put {{batch}} where the micro-batch size goes, \
         e.g. -- python train.py --batch {{batch}}"
    )]
    NoBatch(String),
    #[error(
        "--steps {0} was given but the command has no {{steps}}: put {{steps}} where the step count \
         goes, or leave --steps out and give the command a short run yourself"
    )]
    StepsWithoutPlaceholder(u64),
    #[error("--batches {value:?}: {reason}")]
    Batches { value: String, reason: String },
    #[error("a fit needs two different batch sizes; measured: {0:?}")]
    TooFewPoints(Vec<u64>),
}

/// The user's command with its placeholders.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    argv: Vec<String>,
    steps: Option<u64>,
}

impl Template {
    /// Refuses a command without `{batch}`, and `steps` given for a command without `{steps}`.
    pub fn new(argv: Vec<String>, steps: Option<u64>) -> Result<Self, CalibrateError> {
        if !argv.iter().any(|a| a.contains(BATCH)) {
            return Err(CalibrateError::NoBatch(argv.join(" ")));
        }
        let has_steps = argv.iter().any(|a| a.contains(STEPS));
        let steps = match (steps, has_steps) {
            (Some(n), false) => return Err(CalibrateError::StepsWithoutPlaceholder(n)),
            (given, true) => Some(given.unwrap_or(DEFAULT_STEPS)),
            (None, false) => None,
        };
        Ok(Self { argv, steps })
    }

    /// The steps substituted for `{steps}`; `None` when the command has no `{steps}`.
    pub fn steps(&self) -> Option<u64> {
        self.steps
    }

    /// The command for one trial.
    pub fn render(&self, batch: u64) -> Vec<String> {
        let steps = self.steps.map(|s| s.to_string()).unwrap_or_default();
        self.argv
            .iter()
            .map(|a| a.replace(BATCH, &batch.to_string()).replace(STEPS, &steps))
            .collect()
    }

    /// The flag `{batch}` is the value of (`--batch {batch}` or `--batch={batch}`), which a profile can
    /// override; `None` when `{batch}` sits elsewhere (inside a shell string, say).
    pub fn batch_flag(&self) -> Option<String> {
        let at = self.argv.iter().position(|a| a.contains(BATCH))?;
        let token = &self.argv[at];
        if let Some(flag) = token.strip_suffix(&format!("={BATCH}")) {
            return (flag.starts_with('-') && !flag.contains('=')).then(|| flag.to_owned());
        }
        let prev = at.checked_sub(1).map(|p| &self.argv[p])?;
        (token == BATCH && at >= 2 && prev.starts_with('-') && !prev.contains('='))
            .then(|| prev.clone())
    }
}

/// Parses `1,2,4`: positive, at least two different sizes; returned sorted and without repeats.
pub fn parse_batches(text: &str) -> Result<Vec<u64>, CalibrateError> {
    let err = |reason: String| CalibrateError::Batches {
        value: text.into(),
        reason,
    };
    let mut out = Vec::new();
    for part in text.split(',') {
        match part.trim().parse::<u64>() {
            Ok(b) if b >= 1 => out.push(b),
            _ => return Err(err(format!("{part:?} is not a batch size of 1 or more"))),
        }
    }
    out.sort_unstable();
    out.dedup();
    if out.len() < 2 {
        return Err(err(
            "give at least two different batch sizes, e.g. 1,2,4".into()
        ));
    }
    Ok(out)
}

/// One trial's measurement: peaks of the whole process tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Point {
    pub batch: u64,
    /// What the guard counts: RssAnon + RssShmem + VmSwap summed over the tree, its largest sample.
    pub peak_rss_bytes: u64,
    /// NVML memory of the tree's processes, its largest sample; `None` without NVML.
    pub peak_gpu_bytes: Option<u64>,
}

/// A budget with its headroom: what the peak may reach.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    pub budget: u64,
    pub headroom: f64,
}

impl Limit {
    /// `budget × (1 − headroom)`, as `memfit plan` reads a budget.
    pub fn usable(&self) -> u64 {
        (self.budget as f64 * (1.0 - self.headroom)) as u64
    }
}

/// Why a trial is not run: its prediction does not fit.
#[derive(Debug, Clone, PartialEq)]
pub struct Skip {
    pub batch: u64,
    /// "host" or "gpu".
    pub memory: &'static str,
    pub predicted: u64,
    pub usable: u64,
}

/// Whether a trial at `batch` may run, from the lines fitted so far: `Err` when either prediction is over
/// its usable limit.
pub fn next_trial(
    batch: u64,
    host: (&Line, Limit),
    gpu: Option<(&Line, Limit)>,
) -> Result<(), Skip> {
    for (memory, line, limit) in [("host", host.0, host.1)]
        .into_iter()
        .chain(gpu.map(|(l, m)| ("gpu", l, m)))
    {
        let predicted = line.predict(batch);
        if predicted > limit.usable() {
            return Err(Skip {
                batch,
                memory,
                predicted,
                usable: limit.usable(),
            });
        }
    }
    Ok(())
}

/// The JSON `memfit calibrate --json` prints (keys are a contract, README "memfit calibrate").
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub points: Vec<Point>,
    pub host: Line,
    pub gpu: Option<Line>,
    pub at: Option<Point>,
    pub max_batch: MaxBatches,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MaxBatches {
    /// The largest batch under the host budget less headroom; 0 when none fits, null when unbounded.
    pub host: Option<u64>,
    /// As `host` for the GPU budget; null without GPU figures.
    pub gpu: Option<u64>,
}

impl Report {
    pub fn new(
        points: Vec<Point>,
        (host, gpu): (Line, Option<Line>),
        at: Option<u64>,
        (host_max, gpu_max): (MaxBatch, Option<MaxBatch>),
    ) -> Self {
        Self {
            at: at.map(|batch| Point {
                batch,
                peak_rss_bytes: host.predict(batch),
                peak_gpu_bytes: gpu.map(|g| g.predict(batch)),
            }),
            points,
            host,
            gpu,
            max_batch: MaxBatches {
                host: host_max.as_json(),
                gpu: gpu_max.and_then(MaxBatch::as_json),
            },
        }
    }
}

/// The batch every budget allows: the smaller of the limits; `None` when one of them allows none, or
/// when no budget bounds it.
pub fn batch_that_fits(host: MaxBatch, gpu: Option<MaxBatch>) -> Option<u64> {
    let bound = |m: MaxBatch| match m {
        MaxBatch::Batch(b) => Some(Some(b)),
        MaxBatch::NoneFits { .. } => None,
        MaxBatch::Unbounded => Some(None),
    };
    let h = bound(host)?;
    let g = match gpu {
        Some(m) => bound(m)?,
        None => None,
    };
    match (h, g) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `max`, then halves of it down to `smallest` (at most `MAX_PROFILES`, largest first).
pub fn profile_batches(max: u64, smallest: u64) -> Vec<u64> {
    let mut out = vec![max];
    let mut b = max / 2;
    while b >= smallest.max(1) && out.len() < MAX_PROFILES {
        out.push(b);
        b /= 2;
    }
    out
}

/// The profiles file for `memfit run --profiles`: one `[[profile]]` per batch, overriding `flag`.
/// `summary` lines become comments under the marker line.
/// `env`: variables every profile sets (the malloc pins the trials ran with).
pub fn profiles_toml(
    flag: &str,
    batches: &[u64],
    env: &[(String, String)],
    summary: &[String],
) -> String {
    let profile: Vec<toml::Value> = batches
        .iter()
        .map(|b| {
            let mut p = toml::Table::new();
            p.insert("name".into(), format!("calibrated-batch-{b}").into());
            let args = vec![toml::Value::from(flag), b.to_string().into()];
            p.insert("args".into(), toml::Value::Array(args));
            if !env.is_empty() {
                let vars: toml::Table = env
                    .iter()
                    .map(|(k, v)| (k.clone(), toml::Value::from(v.as_str())))
                    .collect();
                p.insert("env".into(), toml::Value::Table(vars));
            }
            toml::Value::Table(p)
        })
        .collect();
    let mut root = toml::Table::new();
    root.insert("profile".into(), toml::Value::Array(profile));
    let mut text = format!("{PROFILES_MARKER}; it rewrites this file on its next run.\n");
    for line in summary {
        let _ = writeln!(text, "# {line}");
    }
    text.push('\n');
    text.push_str(&toml::to_string(&root).unwrap_or_default());
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn template_placeholders_and_flag() {
        let t = Template::new(
            v(&["py", "t.py", "--batch", "{batch}", "--steps", "{steps}"]),
            None,
        );
        let t = t.unwrap();
        assert_eq!(t.steps(), Some(DEFAULT_STEPS));
        assert_eq!(
            t.render(8),
            v(&["py", "t.py", "--batch", "8", "--steps", "5"])
        );
        assert_eq!(t.batch_flag().as_deref(), Some("--batch"));
        let eq = Template::new(v(&["py", "--bs={batch}"]), None).unwrap();
        assert_eq!(
            (eq.batch_flag().as_deref(), eq.steps()),
            (Some("--bs"), None)
        );
        let shell = Template::new(v(&["sh", "-c", "run --batch {batch}"]), None).unwrap();
        assert_eq!(shell.batch_flag(), None);
        assert_eq!(shell.render(3), v(&["sh", "-c", "run --batch 3"]));
        assert!(matches!(
            Template::new(v(&["py", "t.py", "--batch", "4"]), None),
            Err(CalibrateError::NoBatch(c)) if c == "py t.py --batch 4"
        ));
        let e = Template::new(v(&["py", "{batch}"]), Some(3)).unwrap_err();
        assert_eq!(e, CalibrateError::StepsWithoutPlaceholder(3));
        assert!(e.to_string().contains("{steps}"), "{e}");
    }

    #[test]
    fn batches_parse_sorted_and_refuse_too_few() {
        assert_eq!(parse_batches("4,1,2,2"), Ok(vec![1, 2, 4]));
        for bad in ["1", "2,2", "0,1", "1,two", ""] {
            let e = parse_batches(bad).unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }

    #[test]
    fn fit_recovers_a_line_and_flags_a_bend() {
        let line = fit(&[(1, 1100), (2, 1200), (4, 1400)]).unwrap();
        assert!((line.fixed - 1000.0).abs() < 1e-6 && (line.per_sample - 100.0).abs() < 1e-6);
        assert_eq!(line.is_linear(), Some(true));
        assert_eq!(line.predict(16), 2600);
        // Two points: exact, and nothing checked linearity.
        assert_eq!(fit(&[(1, 1100), (2, 1200)]).unwrap().is_linear(), None);
        // peak = 100 + 10·b²: batch 4 lies 30% above the line through batches 1 and 2 (200), so the
        // fit is the line through 2 and 4, 20 + 60·b, which batch 1 lies 27% above.
        let bent = fit(&[(1, 110), (2, 140), (4, 260)]).unwrap();
        assert!(bent.bent);
        assert!((bent.fixed - 20.0).abs() < 1e-6 && (bent.per_sample - 60.0).abs() < 1e-6);
        let r = bent.max_rel_residual.unwrap();
        assert!((r - 30.0 / 110.0).abs() < 1e-4, "{r}");
        assert_eq!(bent.is_linear(), Some(false));
        // A bend within the tolerance is noise: least squares over all three.
        let slight = fit(&[(1, 1000), (2, 1100), (4, 1320)]).unwrap();
        assert!(!slight.bent);
        // t5-small under bench_t5.py with the mmap threshold pinned (MiB, README): the optimizer
        // step sets the peak at batch 1; the line through 2 and 4 is the activations' at 16.
        let t5 = fit(&[(1, 1465), (2, 1518), (4, 1819)]).unwrap();
        assert!(t5.bent && (t5.per_sample - 150.5).abs() < 1e-6);
        assert_eq!(t5.predict(16), 3625);
        assert_eq!(
            fit(&[(2, 10), (2, 12)]),
            Err(CalibrateError::TooFewPoints(vec![2, 2]))
        );
    }

    #[test]
    fn max_batch_under_a_limit() {
        let line = Line {
            fixed: 1000.0,
            per_sample: 100.0,
            max_rel_residual: None,
            bent: false,
        };
        assert_eq!(line.max_batch(1950), MaxBatch::Batch(9));
        assert_eq!(line.max_batch(2000), MaxBatch::Batch(10));
        assert_eq!(line.max_batch(1050), MaxBatch::NoneFits { shortfall: 50 });
        assert_eq!(line.max_batch(900), MaxBatch::NoneFits { shortfall: 200 });
        let flat = Line {
            per_sample: -1.0,
            ..line
        };
        assert_eq!(flat.max_batch(2000), MaxBatch::Unbounded);
        assert_eq!(MaxBatch::NoneFits { shortfall: 1 }.as_json(), Some(0));
        assert_eq!(MaxBatch::Unbounded.as_json(), None);
    }

    proptest::proptest! {
        #[test]
        fn max_batch_is_the_largest_that_fits(
            fixed in 0.0f64..1e11, per_sample in 1.0f64..1e10, limit in 0u64..1u64 << 40,
        ) {
            let line = Line { fixed, per_sample, max_rel_residual: None, bent: false };
            match line.max_batch(limit) {
                MaxBatch::Batch(b) => {
                    proptest::prop_assert!(line.predict(b) <= limit);
                    proptest::prop_assert!(line.predict(b + 1) > limit);
                }
                MaxBatch::NoneFits { shortfall } => {
                    proptest::prop_assert_eq!(line.predict(1), limit + shortfall)
                }
                MaxBatch::Unbounded => proptest::prop_assert!(false, "per_sample > 0"),
            }
        }
    }

    #[test]
    fn a_trial_runs_only_when_its_prediction_fits() {
        let line = |fixed, per_sample| Line {
            fixed,
            per_sample,
            max_rel_residual: None,
            bent: false,
        };
        let (host, gpu) = (line(500.0, 100.0), line(1000.0, 300.0));
        let limit = |budget| Limit {
            budget,
            headroom: 0.1,
        };
        assert_eq!(limit(2000).usable(), 1800);
        assert_eq!(next_trial(4, (&host, limit(2000)), None), Ok(()));
        assert_eq!(
            next_trial(4, (&host, limit(2000)), Some((&gpu, limit(2000)))),
            Err(Skip {
                batch: 4,
                memory: "gpu",
                predicted: 2200,
                usable: 1800
            })
        );
        assert_eq!(
            next_trial(16, (&host, limit(2000)), None)
                .unwrap_err()
                .memory,
            "host"
        );
    }

    #[test]
    fn report_json_has_the_contract_keys() {
        let points = vec![
            Point {
                batch: 1,
                peak_rss_bytes: 1100,
                peak_gpu_bytes: None,
            },
            Point {
                batch: 2,
                peak_rss_bytes: 1200,
                peak_gpu_bytes: None,
            },
        ];
        let lines = fit_points(&points).unwrap();
        assert_eq!(lines.1, None, "no GPU figures, no GPU line");
        let maxes = (lines.0.max_batch(1500), None);
        let r = Report::new(points, lines, Some(16), maxes);
        let j = serde_json::to_value(&r).unwrap();
        let keys =
            |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&j), v(&["at", "gpu", "host", "max_batch", "points"]));
        assert_eq!(
            keys(&j["points"][0]),
            v(&["batch", "peak_gpu_bytes", "peak_rss_bytes"])
        );
        assert_eq!(keys(&j["host"]), v(&["fixed_bytes", "per_sample_bytes"]));
        assert_eq!(j["host"]["fixed_bytes"], 1000);
        assert_eq!(j["at"]["peak_rss_bytes"], 2600);
        assert!(j["gpu"].is_null() && j["at"]["peak_gpu_bytes"].is_null());
        assert_eq!(j["max_batch"], serde_json::json!({"host": 5, "gpu": null}));
    }

    #[test]
    fn the_batch_every_budget_allows() {
        use MaxBatch::*;
        let none = NoneFits { shortfall: 1 };
        assert_eq!(batch_that_fits(Batch(8), Some(Batch(5))), Some(5));
        assert_eq!(batch_that_fits(Batch(8), Some(Unbounded)), Some(8));
        assert_eq!(batch_that_fits(Unbounded, None), None);
        assert_eq!(batch_that_fits(Batch(8), Some(none)), None);
        assert_eq!(batch_that_fits(none, None), None);
        assert_eq!(profile_batches(12, 1), vec![12, 6, 3, 1]);
        assert_eq!(profile_batches(12, 4), vec![12, 6]);
        assert_eq!(profile_batches(40, 1), vec![40, 20, 10, 5]);
    }

    #[test]
    fn profiles_file_drives_memfit_run() {
        let text = profiles_toml(
            "--batch",
            &[12, 6],
            &malloc_pins(|_| None),
            &["host: 1.00 GiB + 10.0 MiB per sample".into()],
        );
        assert!(text.starts_with(PROFILES_MARKER), "{text}");
        let profiles = crate::profiles::parse(&text).unwrap();
        assert_eq!(profiles.len(), 2);
        assert_eq!(profiles[1].name, "calibrated-batch-6");
        // every profile runs with the malloc the trials measured
        assert!(
            profiles
                .iter()
                .all(|p| p.env.get("MALLOC_MMAP_THRESHOLD_").map(String::as_str) == Some("131072"))
        );
        let argv = v(&["py", "train.py", "--batch", "64"]);
        assert_eq!(
            crate::profiles::apply_overrides(&argv, &profiles[0].args),
            v(&["py", "train.py", "--batch", "12"])
        );
    }
}
