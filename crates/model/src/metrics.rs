//! Evaluation metrics: exact AUC, logloss, and a streaming accumulator.

/// Exact ROC AUC of `scores` against binary `labels` (`> 0.5` is positive), via the
/// Mann-Whitney statistic: sort once (O(n log n)), tied scores share their average rank.
/// `None` when either class is absent. NaN scores are ordered last (`f32::total_cmp`).
pub fn auc(scores: &[f32], labels: &[f32]) -> Option<f64> {
    elastrec_common::exact_auc(scores, labels, |y| y > 0.5)
}

pub use elastrec_common::{logloss_term, normalized_entropy, LOGLOSS_EPS};

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

/// ROC AUC of `scores` against binary `labels` (`> 0.5` is positive) with each sample
/// weighted by `weights` (empty: 1 each): the weighted share of (positive, negative) pairs
/// ordered right, a tie counting half, each pair weighing the product of its samples'
/// weights (scikit-learn's `roc_auc_score(..., sample_weight=w)`). `None` when either
/// class weighs nothing.
pub fn weighted_auc(scores: &[f32], labels: &[f32], weights: &[f32]) -> Option<f64> {
    if weights.is_empty() {
        return auc(scores, labels);
    }
    assert_eq!(scores.len(), labels.len());
    assert_eq!(scores.len(), weights.len());
    let mut order: Vec<(f32, bool, f32)> = scores
        .iter()
        .zip(labels)
        .zip(weights)
        .map(|((&s, &y), &w)| (s, y > 0.5, w))
        .collect();
    order.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    sorted_auc(&order).map(|(auc, _)| auc)
}

/// The weighted AUC of `(score, positive, weight)` samples sorted by score, and their
/// total weight: walking up the scores, each group of equal scores adds its positive
/// weight times the negative weight below it plus half its own.
fn sorted_auc(sorted: &[(f32, bool, f32)]) -> Option<(f64, f64)> {
    let (mut right, mut neg_below, mut pos_total) = (0.0f64, 0.0f64, 0.0f64);
    for group in sorted.chunk_by(|a, b| a.0.total_cmp(&b.0).is_eq()) {
        let (mut pos, mut neg) = (0.0f64, 0.0f64);
        for &(_, y, w) in group {
            if y {
                pos += f64::from(w);
            } else {
                neg += f64::from(w);
            }
        }
        right += pos * (neg_below + neg / 2.0);
        neg_below += neg;
        pos_total += pos;
    }
    (pos_total > 0.0 && neg_below > 0.0)
        .then(|| (right / (pos_total * neg_below), pos_total + neg_below))
}

/// Group AUC (the DIN paper's GAUC): the (weighted) AUC within each group's samples
/// (a user's rows), averaged over the groups weighted by their samples' total weight.
/// Groups with one class only have no AUC and are left out; `None` when none has both.
pub fn group_auc(scores: &[f32], labels: &[f32], weights: &[f32], groups: &[u64]) -> Option<f64> {
    assert_eq!(scores.len(), labels.len());
    assert_eq!(scores.len(), groups.len());
    assert!(weights.is_empty() || weights.len() == scores.len());
    let mut order: Vec<(u64, (f32, bool, f32))> = (0..scores.len())
        .map(|i| {
            let w = weights.get(i).copied().unwrap_or(1.0);
            (groups[i], (scores[i], labels[i] > 0.5, w))
        })
        .collect();
    order.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1 .0.total_cmp(&b.1 .0)));
    let mut samples = Vec::new();
    let (mut sum, mut total) = (0.0f64, 0.0f64);
    for group in order.chunk_by(|a, b| a.0 == b.0) {
        samples.clear();
        samples.extend(group.iter().map(|g| g.1));
        if let Some((auc, weight)) = sorted_auc(&samples) {
            sum += auc * weight;
            total += weight;
        }
    }
    (total > 0.0).then(|| sum / total)
}

/// Streaming evaluation: feed batches of probabilities and labels, read AUC / logloss /
/// accuracy over everything seen. Keeps all scores (exact AUC needs them: 8 bytes/sample).
#[derive(Clone, Debug, Default)]
pub struct EvalAccumulator {
    scores: Vec<f32>,
    labels: Vec<f32>,
    /// Each sample's weight; empty while every sample weighed 1.
    weights: Vec<f32>,
    /// Each sample's group (its user), for GAUC; empty when the data names no user.
    groups: Vec<u64>,
    /// Weighted sums: log loss, correct answers at 0.5, weight, labels, predictions.
    loss_sum: f64,
    correct: f64,
    weight_sum: f64,
    label_sum: f64,
    prob_sum: f64,
}

impl EvalAccumulator {
    /// Empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a batch of probabilities and labels, each sample weighing 1.
    pub fn push(&mut self, probs: &[f32], labels: &[f32]) {
        self.push_rows(probs, labels, &[], &[]);
    }

    /// Adds a batch of probabilities and labels with each sample's weight (`data.weight`;
    /// empty: 1 each) and group (its user, `data.user`; empty: none). Every figure is then
    /// the weighted one, and the groups give GAUC. Either every batch names groups or none.
    pub fn push_rows(&mut self, probs: &[f32], labels: &[f32], weights: &[f32], groups: &[u64]) {
        assert_eq!(probs.len(), labels.len());
        assert!(weights.is_empty() || weights.len() == probs.len());
        assert!(groups.is_empty() || groups.len() == probs.len());
        let consistent = if groups.is_empty() {
            self.groups.is_empty()
        } else {
            self.groups.len() == self.scores.len()
        };
        assert!(
            probs.is_empty() || consistent,
            "every batch names its groups, or none does"
        );
        self.append_weights(weights, probs.len());
        self.groups.extend_from_slice(groups);
        self.scores.extend_from_slice(probs);
        self.labels.extend_from_slice(labels);
        for (i, (&p, &y)) in probs.iter().zip(labels).enumerate() {
            let w = weights.get(i).map_or(1.0, |&w| f64::from(w));
            self.loss_sum += w * logloss_term(p, y);
            self.correct += if (p > 0.5) == (y > 0.5) { w } else { 0.0 };
            self.weight_sum += w;
            self.label_sum += w * f64::from(y);
            self.prob_sum += w * f64::from(p);
        }
    }

    /// Appends the weights of `n` samples about to be added (`weights` empty: 1 each).
    /// Weights are kept only once some sample weighs other than 1: the samples before
    /// then get 1 each.
    fn append_weights(&mut self, weights: &[f32], n: usize) {
        if weights.is_empty() && self.weights.is_empty() {
            return;
        }
        self.weights.resize(self.scores.len(), 1.0);
        if weights.is_empty() {
            self.weights.resize(self.scores.len() + n, 1.0);
        } else {
            self.weights.extend_from_slice(weights);
        }
    }

    /// Merges another accumulator (e.g. from another eval thread).
    pub fn merge(&mut self, other: &EvalAccumulator) {
        self.append_weights(&other.weights, other.scores.len());
        self.groups.extend_from_slice(&other.groups);
        self.scores.extend_from_slice(&other.scores);
        self.labels.extend_from_slice(&other.labels);
        self.loss_sum += other.loss_sum;
        self.correct += other.correct;
        self.weight_sum += other.weight_sum;
        self.label_sum += other.label_sum;
        self.prob_sum += other.prob_sum;
    }

    /// Samples seen.
    pub fn count(&self) -> usize {
        self.scores.len()
    }

    /// Mean (weighted) log loss so far (0 if empty).
    pub fn logloss(&self) -> f64 {
        if self.weight_sum > 0.0 {
            self.loss_sum / self.weight_sum
        } else {
            0.0
        }
    }

    /// Exact (weighted) AUC so far (`None` if a class is missing).
    pub fn auc(&self) -> Option<f64> {
        weighted_auc(&self.scores, &self.labels, &self.weights)
    }

    /// (Weighted) accuracy at threshold 0.5 (0 if empty).
    pub fn accuracy(&self) -> f64 {
        if self.weight_sum > 0.0 {
            self.correct / self.weight_sum
        } else {
            0.0
        }
    }

    /// Normalized entropy so far (see [`normalized_entropy`]).
    pub fn normalized_entropy(&self) -> Option<f64> {
        if self.weight_sum > 0.0 {
            normalized_entropy(self.logloss(), self.label_sum / self.weight_sum)
        } else {
            None
        }
    }

    /// GAUC so far (see [`group_auc`]); `None` without groups, or when no group holds
    /// both classes.
    pub fn group_auc(&self) -> Option<f64> {
        if self.groups.is_empty() {
            return None;
        }
        group_auc(&self.scores, &self.labels, &self.weights, &self.groups)
    }

    /// Calibration so far: predicted clicks over actual clicks (weighted), 1 for a model
    /// whose average prediction is the click rate. `None` without a click.
    pub fn calibration(&self) -> Option<f64> {
        (self.label_sum > 0.0).then(|| self.prob_sum / self.label_sum)
    }

    /// Every figure, as the roles report it.
    pub fn result(&self) -> elastrec_common::EvalResult {
        elastrec_common::EvalResult {
            auc: self.auc().unwrap_or(f64::NAN),
            logloss: self.logloss(),
            samples: self.count() as u64,
            ne: self.normalized_entropy(),
            calibration: self.calibration(),
            gauc: self.group_auc(),
        }
    }

    /// Forgets everything.
    pub fn reset(&mut self) {
        self.scores.clear();
        self.labels.clear();
        self.weights.clear();
        self.groups.clear();
        self.loss_sum = 0.0;
        self.correct = 0.0;
        self.weight_sum = 0.0;
        self.label_sum = 0.0;
        self.prob_sum = 0.0;
    }
}
