//! Evaluation metrics: exact AUC, logloss, and a streaming accumulator.

/// Exact ROC AUC of `scores` against binary `labels` (`> 0.5` is positive), via the
/// Mann-Whitney statistic: sort once (O(n log n)), tied scores share their average rank.
/// `None` when either class is absent. NaN scores are ordered last (`f32::total_cmp`).
pub fn auc(scores: &[f32], labels: &[f32]) -> Option<f64> {
    elastrec_common::exact_auc(scores, labels, |y| y > 0.5)
}

pub use elastrec_common::{logloss_term, LOGLOSS_EPS};

/// Mean binary log-loss of probabilities `probs` against `labels` (clamped, see
/// [`LOGLOSS_EPS`]). 0 for empty input.
pub fn logloss(probs: &[f32], labels: &[f32]) -> f64 {
    assert_eq!(probs.len(), labels.len());
    if probs.is_empty() {
        return 0.0;
    }
    probs
        .iter()
        .zip(labels)
        .map(|(&p, &y)| logloss_term(p, y))
        .sum::<f64>()
        / probs.len() as f64
}

/// Streaming evaluation: feed batches of probabilities and labels, read AUC / logloss /
/// accuracy over everything seen. Keeps all scores (exact AUC needs them: 8 bytes/sample).
#[derive(Clone, Debug, Default)]
pub struct EvalAccumulator {
    scores: Vec<f32>,
    labels: Vec<f32>,
    loss_sum: f64,
    correct: u64,
}

impl EvalAccumulator {
    /// Empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a batch of probabilities and labels.
    pub fn push(&mut self, probs: &[f32], labels: &[f32]) {
        assert_eq!(probs.len(), labels.len());
        self.scores.extend_from_slice(probs);
        self.labels.extend_from_slice(labels);
        for (&p, &y) in probs.iter().zip(labels) {
            self.loss_sum += logloss_term(p, y);
            self.correct += u64::from((p > 0.5) == (y > 0.5));
        }
    }

    /// Merges another accumulator (e.g. from another eval thread).
    pub fn merge(&mut self, other: &EvalAccumulator) {
        self.scores.extend_from_slice(&other.scores);
        self.labels.extend_from_slice(&other.labels);
        self.loss_sum += other.loss_sum;
        self.correct += other.correct;
    }

    /// Samples seen.
    pub fn count(&self) -> usize {
        self.scores.len()
    }

    /// Mean logloss so far (0 if empty).
    pub fn logloss(&self) -> f64 {
        if self.scores.is_empty() {
            0.0
        } else {
            self.loss_sum / self.scores.len() as f64
        }
    }

    /// Exact AUC so far (`None` if a class is missing).
    pub fn auc(&self) -> Option<f64> {
        auc(&self.scores, &self.labels)
    }

    /// Accuracy at threshold 0.5 (0 if empty).
    pub fn accuracy(&self) -> f64 {
        if self.scores.is_empty() {
            0.0
        } else {
            self.correct as f64 / self.scores.len() as f64
        }
    }

    /// Forgets everything.
    pub fn reset(&mut self) {
        self.scores.clear();
        self.labels.clear();
        self.loss_sum = 0.0;
        self.correct = 0;
    }
}
