//! Whether a finished run is worse than where it started, judged on its validation set: the headline
//! score before the first step against the last evaluation's, and (classification) whether every
//! validation row went to one class. `memfit train` says so and exits 1 unless told to accept it.
//!
//! A collapse is always named; it fails a fine-tune (`--init`) that has seen its training data at
//! least once. A smoke test of a step or two ends where an untrained head starts, at one class, and a
//! model trained from scratch may not have learned yet: named, not failed.

use crate::eval::EvalReport;

/// How much worse the end may score before it counts as worse: a hundredth of a score in [0, 1]
/// (one row in a hundred), 1% of a loss — below that it is evaluation noise (memfit's choice).
pub const SCORE_TOLERANCE: f64 = 0.01;
pub const LOSS_TOLERANCE: f64 = 0.01;

/// What went wrong, if anything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdict {
    /// "accuracy 0.8100 → 0.2675": the headline ended worse than it started.
    pub regressed: Option<String>,
    /// The one label every validation row was predicted as, where the set has several.
    pub collapsed_to: Option<String>,
    /// A collapse fails this run: a fine-tune that trained a whole epoch or more.
    pub collapse_fails: bool,
}

impl Verdict {
    pub fn failed(&self) -> bool {
        self.regressed.is_some() || (self.collapsed_to.is_some() && self.collapse_fails)
    }

    /// One line a person reads, or `None` when nothing went wrong (a collapse is said even when it
    /// does not fail the run).
    pub fn describe(&self) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(r) = &self.regressed {
            parts.push(format!("the run ended worse than it started ({r})"));
        }
        if let Some(label) = &self.collapsed_to {
            parts.push(format!(
                "the model collapsed to one class: it predicts {label:?} for every validation row"
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// The verdict on a run whose `headline` score was `before` at the start and `last` is its last
/// evaluation (either may be missing: then only what can be judged is); `collapse_fails`: a collapse
/// fails it (see the module's doc).
pub fn judge(
    headline: &str,
    before: Option<f64>,
    last: Option<&EvalReport>,
    collapse_fails: bool,
) -> Verdict {
    let Some(last) = last else {
        return Verdict::default();
    };
    let after = last.score(headline);
    let regressed = match (before, after) {
        (Some(b), Some(a)) if worse(headline, b, a) => Some(format!("{headline} {b:.4} → {a:.4}")),
        _ => None,
    };
    Verdict {
        regressed,
        collapsed_to: collapsed_to(last),
        collapse_fails,
    }
}

/// `after` is worse than `before` beyond the noise: lower for a score, higher for a loss or a
/// perplexity (causal-lm's headline).
fn worse(headline: &str, before: f64, after: f64) -> bool {
    if headline.ends_with("loss") || headline == "perplexity" {
        after > before * (1.0 + LOSS_TOLERANCE)
    } else {
        after < before - SCORE_TOLERANCE
    }
}

/// The label every row was predicted as, when the rows belong to two classes or more.
fn collapsed_to(report: &EvalReport) -> Option<String> {
    let classes_present = report.classes.iter().filter(|c| c.support > 0).count();
    let mut predicted = report.classes.iter().filter(|c| c.predicted > 0);
    let only = predicted.next()?;
    (classes_present >= 2 && predicted.next().is_none()).then(|| only.label.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::{ClassScore, Score};

    fn class(label: &str, support: usize, predicted: usize) -> ClassScore {
        ClassScore {
            label: label.into(),
            precision: 0.0,
            recall: 0.0,
            f1: 0.0,
            support,
            predicted,
        }
    }

    fn report(accuracy: f64, classes: Vec<ClassScore>) -> EvalReport {
        EvalReport {
            valid_loss: 1.0,
            scores: vec![Score {
                name: "accuracy".into(),
                value: accuracy,
            }],
            classes,
            ..EvalReport::default()
        }
    }

    #[test]
    fn one_class_for_every_row_is_a_collapse_and_named() {
        let r = report(0.2675, vec![class("a", 107, 400), class("b", 293, 0)]);
        let v = judge("accuracy", Some(0.25), Some(&r), true);
        assert_eq!(v.collapsed_to.as_deref(), Some("a"));
        assert!(v.regressed.is_none() && v.failed());
        assert!(v.describe().unwrap().contains("collapsed to one class"));
        // a step or two from an untrained head, or from scratch: named, not failed
        let smoke = judge("accuracy", Some(0.25), Some(&r), false);
        assert!(!smoke.failed() && smoke.describe().is_some());
    }

    #[test]
    fn a_lower_score_or_a_higher_loss_beyond_the_noise_is_a_regression() {
        let r = report(0.5, vec![class("a", 2, 1), class("b", 2, 3)]);
        let v = judge("accuracy", Some(0.8), Some(&r), false);
        assert_eq!(v.regressed.as_deref(), Some("accuracy 0.8000 → 0.5000"));
        assert!(v.collapsed_to.is_none());
        // within the tolerance: noise, not a regression
        assert!(!judge("accuracy", Some(0.505), Some(&r), true).failed());
        assert!(
            judge("valid_loss", Some(0.9), Some(&r), true)
                .regressed
                .is_some()
        );
        assert!(!judge("valid_loss", Some(0.995), Some(&r), true).failed());
        // perplexity: lower is better too
        let ppl = EvalReport {
            scores: vec![Score {
                name: "perplexity".into(),
                value: 2.17,
            }],
            ..r.clone()
        };
        assert!(!judge("perplexity", Some(2.21), Some(&ppl), true).failed());
        assert!(judge("perplexity", Some(2.0), Some(&ppl), true).failed());
    }

    #[test]
    fn nothing_to_compare_judges_nothing() {
        let r = report(0.1, vec![]);
        assert!(!judge("accuracy", None, Some(&r), true).failed());
        assert!(!judge("accuracy", Some(0.9), None, true).failed());
        // a validation set of one class cannot tell a collapse
        let one = report(1.0, vec![class("a", 5, 5), class("b", 0, 0)]);
        assert!(!judge("accuracy", Some(1.0), Some(&one), true).failed());
    }
}
