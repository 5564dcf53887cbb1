//! Classification scores from predictions: accuracy, macro-F1 and per-class precision, recall and
//! F1, as scikit-learn's `accuracy_score`, `f1_score(average="macro")` and
//! `precision_recall_fscore_support` compute them (what transformers' examples report): a class
//! with no predicted (or no true) rows has precision (or recall) 0, and the macro average runs
//! over the classes that occur among the true or the predicted labels.

use crate::eval::ClassScore;

/// Per-class counts of (true label, predicted label) pairs: what the scores need, in memory linear
/// in the number of labels (a full labels × labels table is 8 B × labels², 8 TB at a million).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confusion {
    /// Rows whose label is the class and predicted right.
    hits: Vec<u64>,
    /// Rows whose label is the class (support).
    truths: Vec<u64>,
    /// Rows predicted as the class.
    predictions: Vec<u64>,
}

impl Confusion {
    pub fn new(labels: usize) -> Self {
        Self {
            hits: vec![0; labels],
            truths: vec![0; labels],
            predictions: vec![0; labels],
        }
    }

    pub fn add(&mut self, truth: usize, predicted: usize) {
        self.truths[truth] += 1;
        self.predictions[predicted] += 1;
        if truth == predicted {
            self.hits[truth] += 1;
        }
    }

    /// Share of rows predicted right (0 for no rows).
    pub fn accuracy(&self) -> f64 {
        ratio(self.hits.iter().sum(), self.truths.iter().sum())
    }

    fn precision_recall(&self, class: usize) -> (f64, f64) {
        let hit = self.hits[class];
        (
            ratio(hit, self.predictions[class]),
            ratio(hit, self.truths[class]),
        )
    }

    /// Precision, recall, F1 and support of every class, named by `names`.
    pub fn per_class(&self, names: &[String]) -> Vec<ClassScore> {
        (0..self.hits.len())
            .map(|c| {
                let (precision, recall) = self.precision_recall(c);
                ClassScore {
                    label: names.get(c).cloned().unwrap_or_else(|| c.to_string()),
                    precision,
                    recall,
                    f1: f1(precision, recall),
                    support: self.truths[c] as usize,
                    predicted: self.predictions[c] as usize,
                }
            })
            .collect()
    }

    /// Mean F1 over the classes that occur as a true or a predicted label.
    pub fn macro_f1(&self) -> f64 {
        let present: Vec<usize> = (0..self.hits.len())
            .filter(|&c| self.truths[c] > 0 || self.predictions[c] > 0)
            .collect();
        if present.is_empty() {
            return 0.0;
        }
        let sum: f64 = present
            .iter()
            .map(|&c| {
                let (precision, recall) = self.precision_recall(c);
                f1(precision, recall)
            })
            .sum();
        sum / present.len() as f64
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

fn f1(precision: f64, recall: f64) -> f64 {
    if precision + recall == 0.0 {
        0.0
    } else {
        2.0 * precision * recall / (precision + recall)
    }
}

/// Cross-entropy of one row's logits against `label`, in f64 (log-sum-exp), and the argmax.
pub fn row_loss_and_prediction(logits: &[f32], label: usize) -> (f64, usize) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&z| f64::from(z - max).exp()).sum();
    let loss = f64::from(max) + sum.ln() - f64::from(logits[label]);
    (loss, memfit_nn::decoding::argmax(logits) as usize)
}

/// Probabilities (softmax) of one row's logits.
pub fn probabilities(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f64> = logits.iter().map(|&z| f64::from(z - max).exp()).collect();
    let sum: f64 = exp.iter().sum();
    exp.into_iter().map(|e| e / sum).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_match_scikit_learn() {
        // y_true = [0, 0, 1, 1, 2, 2], y_pred = [0, 1, 1, 1, 0, 0] with sklearn 1.x:
        // accuracy 0.5; precision [1/3, 2/3, 0], recall [0.5, 1, 0];
        // f1 [0.4, 0.8, 0]; macro-F1 (all three occur) 0.4.
        let mut c = Confusion::new(3);
        for (t, p) in [(0, 0), (0, 1), (1, 1), (1, 1), (2, 0), (2, 0)] {
            c.add(t, p);
        }
        assert!((c.accuracy() - 0.5).abs() < 1e-12);
        let names: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let per = c.per_class(&names);
        assert!((per[0].precision - 1.0 / 3.0).abs() < 1e-12);
        assert!((per[1].recall - 1.0).abs() < 1e-12);
        assert!((per[0].f1 - 0.4).abs() < 1e-12);
        assert!((per[1].f1 - 0.8).abs() < 1e-12);
        assert_eq!((per[2].f1, per[2].support), (0.0, 2));
        assert!((c.macro_f1() - 0.4).abs() < 1e-12);
    }

    #[test]
    fn macro_f1_skips_classes_that_never_occur() {
        // Class 2 is neither true nor predicted: the mean runs over classes 0 and 1.
        let mut c = Confusion::new(3);
        c.add(0, 0);
        c.add(1, 1);
        assert_eq!(c.macro_f1(), 1.0);
    }

    #[test]
    fn loss_is_log_softmax_of_the_label() {
        let (loss, pred) = row_loss_and_prediction(&[1.0, 2.0, 3.0], 0);
        let expected = -(1.0f64.exp() / (1.0f64.exp() + 2.0f64.exp() + 3.0f64.exp())).ln();
        assert!((loss - expected).abs() < 1e-9);
        assert_eq!(pred, 2);
        let p = probabilities(&[0.0, 0.0]);
        assert_eq!(p, vec![0.5, 0.5]);
    }
}
