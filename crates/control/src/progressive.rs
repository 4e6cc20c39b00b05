//! Progressive validation's window math: every sample is predicted by the model just
//! before it is trained on (the workers send those predictions with their progress), so
//! the AUC and logloss over the most recent samples measure the model on data it has not
//! seen, without holding any data out (`docs/online.md`). A multi-task model's tasks each
//! have a window of their own; with sample weights every figure is weighted, as `eval`'s
//! are. The master checks each report ([`check`]), keeps the window ([`ProgressiveEval`])
//! and records its figures.

use std::collections::VecDeque;

use elastrec_common::{exact_auc, logloss_term, normalized_entropy};
use elastrec_model::metrics::weighted_auc;
use serde::Serialize;

/// Most predictions one progress report may carry (a batch; batches are far smaller).
pub const MAX_PER_REPORT: usize = 1 << 20;

/// One report's predictions that passed [`check`]: the only thing
/// [`ProgressiveEval::push`] takes, so a report is checked once, before the master accepts
/// its progress, and never added unchecked.
#[derive(Debug, Clone, Copy)]
pub struct Checked<'a> {
    /// `samples × tasks`, row-major (task 0 first).
    probs: &'a [f32],
    labels: &'a [u8],
    /// One per sample, or empty (1 each).
    weights: &'a [f32],
    tasks: usize,
}

impl Checked<'_> {
    /// Samples in the report.
    pub fn len(&self) -> usize {
        self.probs.len() / self.tasks
    }

    /// True for a report without predictions (not an online job, or nothing trained).
    pub fn is_empty(&self) -> bool {
        self.probs.is_empty()
    }
}

/// Checks one report's predictions as read from the wire: lists of equal length, at most
/// [`MAX_PER_REPORT`], labels 0 or 1, probabilities in [0, 1], `tasks` per sample (0 on
/// the wire is 1) as many as the job's model has (`expected`), and no weights or one
/// finite weight of at least 0 per sample.
pub fn check<'a>(
    probs: &'a [f32],
    labels: &'a [u8],
    weights: &'a [f32],
    tasks: u32,
    expected: usize,
) -> Result<Checked<'a>, String> {
    let tasks = tasks.max(1) as usize;
    if !probs.is_empty() && tasks != expected {
        return Err(format!(
            "predictions of {tasks} task(s) per sample, but the job's model has {expected}"
        ));
    }
    if !probs.len().is_multiple_of(tasks) {
        return Err(format!(
            "{} predictions are not a whole number of samples of {tasks} tasks",
            probs.len()
        ));
    }
    if probs.len() != labels.len() {
        return Err(format!(
            "{} predictions but {} labels",
            probs.len(),
            labels.len()
        ));
    }
    if probs.len() > MAX_PER_REPORT {
        return Err(format!(
            "{} predictions in one report (at most {MAX_PER_REPORT})",
            probs.len()
        ));
    }
    if let Some(y) = labels.iter().find(|&&y| y > 1) {
        return Err(format!("label {y} (0 or 1 expected)"));
    }
    if let Some(p) = probs.iter().find(|p| !(0.0..=1.0).contains(*p)) {
        return Err(format!("probability {p} outside [0, 1]"));
    }
    let samples = probs.len() / tasks;
    if !weights.is_empty() && weights.len() != samples {
        return Err(format!(
            "{} weights for {samples} samples (one each, or none)",
            weights.len()
        ));
    }
    if let Some(w) = weights.iter().find(|w| !(w.is_finite() && **w >= 0.0)) {
        return Err(format!(
            "sample weight {w} (finite and at least 0 expected)"
        ));
    }
    Ok(Checked {
        probs,
        labels,
        weights,
        tasks,
    })
}

/// The figures over the window at one time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowFigures {
    /// Seconds since the stream watcher started (as `online.stream.observed_s`).
    pub at_s: f64,
    /// Samples in the window (fewer than the window until it has filled).
    pub samples: u64,
    /// AUC over the window; `None` while it holds only one class.
    pub auc: Option<f64>,
    /// Mean logloss over the window.
    pub logloss: f64,
    /// Share of positive labels in the window (the AUC's base rate).
    pub positive_rate: f64,
    /// Normalized entropy over the window (the log loss over the entropy of
    /// `positive_rate`); `None` while it holds only one class.
    pub ne: Option<f64>,
    /// Predicted over actual clicks in the window; `None` without a click.
    pub calibration: Option<f64>,
    /// A multi-task model's figures of every task over the same samples, task 0 first
    /// (whose are also the fields above); empty for one task.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskWindow>,
}

/// One task's figures over the window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TaskWindow {
    /// AUC; `None` while the window holds only one class of this task's label.
    pub auc: Option<f64>,
    /// Mean logloss.
    pub logloss: f64,
    /// Share of positive labels.
    pub positive_rate: f64,
    /// Normalized entropy; `None` while the window holds only one class.
    pub ne: Option<f64>,
    /// Predicted over actual positives; `None` without a positive.
    pub calibration: Option<f64>,
}

/// One task's last predictions with their labels and weights.
#[derive(Debug, Clone, Default)]
struct TaskSamples {
    probs: VecDeque<f32>,
    labels: VecDeque<u8>,
    weights: VecDeque<f32>,
    /// Weighted sums over the window, kept as samples enter and leave: the logloss
    /// terms, the weights, the positives' weights.
    loss_sum: f64,
    weight_sum: f64,
    positive_weight: f64,
    /// Samples in the window whose weight is not 1: while there are none, the AUC takes
    /// the unweighted path.
    weighted: usize,
}

impl TaskSamples {
    fn push(&mut self, p: f32, y: u8, w: f32, window: usize) {
        if self.probs.len() == window {
            let (old_p, old_y, old_w) = (
                self.probs.pop_front().expect("full"),
                self.labels.pop_front().expect("full"),
                self.weights.pop_front().expect("full"),
            );
            self.count(old_p, old_y, old_w, false);
        }
        self.probs.push_back(p);
        self.labels.push_back(y);
        self.weights.push_back(w);
        self.count(p, y, w, true);
    }

    /// Adds one sample's share to the running sums as it enters the window, or takes it
    /// away as it leaves.
    fn count(&mut self, p: f32, y: u8, w: f32, enters: bool) {
        let sign = if enters { 1.0 } else { -1.0 };
        let w64 = f64::from(w) * sign;
        self.loss_sum += w64 * logloss_term(p, f32::from(y));
        self.weight_sum += w64;
        self.positive_weight += w64 * f64::from(y);
        if w != 1.0 {
            if enters {
                self.weighted += 1;
            } else {
                self.weighted -= 1;
            }
        }
    }

    fn figures(&mut self) -> TaskWindow {
        // The running sums drift by rounding over billions of samples: never below 0.
        let total = self.weight_sum.max(0.0);
        let positives = self.positive_weight.max(0.0);
        let ratio = |x: f64| if total > 0.0 { x / total } else { 0.0 };
        let logloss = ratio(self.loss_sum).max(0.0);
        let positive_rate = ratio(positives).min(1.0);
        let predicted: f64 = self
            .probs
            .iter()
            .zip(&self.weights)
            .map(|(&p, &w)| f64::from(p) * f64::from(w))
            .sum();
        let auc = if self.weighted == 0 {
            exact_auc(
                self.probs.make_contiguous(),
                self.labels.make_contiguous(),
                |y| y == 1,
            )
        } else {
            let labels: Vec<f32> = self.labels.iter().map(|&y| f32::from(y)).collect();
            weighted_auc(
                self.probs.make_contiguous(),
                &labels,
                self.weights.make_contiguous(),
            )
        };
        TaskWindow {
            auc,
            logloss,
            positive_rate,
            ne: normalized_entropy(logloss, positive_rate),
            calibration: (positives > 0.0).then(|| predicted / positives),
        }
    }
}

/// The last `window` predictions of every task with their labels, and the figures
/// recorded so far.
#[derive(Debug, Clone)]
pub struct ProgressiveEval {
    window: usize,
    /// One per task of the job's model, task 0 first.
    tasks: Vec<TaskSamples>,
    /// Every sample received, window or not.
    seen: u64,
    history: Vec<WindowFigures>,
}

/// Figures kept in the history: the oldest are dropped beyond this (a job runs for weeks).
const MAX_HISTORY: usize = 10_000;

impl ProgressiveEval {
    /// An empty window of `window` samples of a model of `tasks` tasks.
    pub fn new(window: usize, tasks: usize) -> Self {
        Self {
            window: window.max(1),
            tasks: vec![TaskSamples::default(); tasks.max(1)],
            seen: 0,
            history: Vec::new(),
        }
    }

    /// The tasks a report's predictions must carry per sample.
    pub fn tasks(&self) -> usize {
        self.tasks.len()
    }

    /// Adds one checked report's predictions (checked for [`ProgressiveEval::tasks`]).
    pub fn push(&mut self, report: Checked<'_>) {
        debug_assert!(report.is_empty() || report.tasks == self.tasks.len());
        let t = report.tasks;
        for (i, (probs, labels)) in report
            .probs
            .chunks_exact(t)
            .zip(report.labels.chunks_exact(t))
            .enumerate()
        {
            let w = report.weights.get(i).copied().unwrap_or(1.0);
            for ((task, &p), &y) in self.tasks.iter_mut().zip(probs).zip(labels) {
                task.push(p, y, w, self.window);
            }
        }
        self.seen += report.len() as u64;
    }

    /// The figures over the window now (`None` while it is empty).
    pub fn figures(&mut self, at_s: f64) -> Option<WindowFigures> {
        let n = self.tasks[0].probs.len();
        if n == 0 {
            return None;
        }
        let tasks: Vec<TaskWindow> = self.tasks.iter_mut().map(TaskSamples::figures).collect();
        let first = tasks[0];
        Some(WindowFigures {
            at_s,
            samples: n as u64,
            auc: first.auc,
            logloss: first.logloss,
            positive_rate: first.positive_rate,
            ne: first.ne,
            calibration: first.calibration,
            tasks: if tasks.len() > 1 { tasks } else { Vec::new() },
        })
    }

    /// Computes the figures now (`at_s` seconds into the job) and keeps them in the
    /// history.
    pub fn record(&mut self, at_s: f64) -> Option<WindowFigures> {
        let f = self.figures(at_s)?;
        if self.history.len() == MAX_HISTORY {
            self.history.remove(0);
        }
        self.history.push(f.clone());
        Some(f)
    }

    /// The figures recorded last.
    pub fn latest(&self) -> Option<WindowFigures> {
        self.history.last().cloned()
    }

    /// Predictions received so far.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// The `online.progressive` part of `result.json`.
    pub fn summary(&self) -> serde_json::Value {
        serde_json::json!({
            "window": self.window,
            "predictions": self.seen,
            "latest": self.latest(),
            "history": self.history,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(e: &mut ProgressiveEval, probs: &[f32], labels: &[u8]) {
        e.push(check(probs, labels, &[], 0, 1).unwrap());
    }

    #[test]
    fn the_window_keeps_only_the_most_recent_samples() {
        let mut e = ProgressiveEval::new(4, 1);
        // Old samples ranked backwards (AUC 0), then four ranked perfectly.
        push(&mut e, &[0.9, 0.1], &[0, 1]);
        assert_eq!(e.figures(0.0).unwrap().auc, Some(0.0));
        push(&mut e, &[0.2, 0.8, 0.3, 0.7], &[0, 1, 0, 1]);
        let f = e.figures(1.0).unwrap();
        assert_eq!(f.samples, 4);
        assert_eq!(f.auc, Some(1.0));
        assert_eq!(f.positive_rate, 0.5);
        let expected = [0.2f32, 0.8, 0.3, 0.7]
            .iter()
            .zip([0.0f32, 1.0, 0.0, 1.0])
            .map(|(&p, y)| logloss_term(p, y))
            .sum::<f64>()
            / 4.0;
        assert!(
            (f.logloss - expected).abs() < 1e-9,
            "{} vs {expected}",
            f.logloss
        );
        // The window's rate is 1/2, whose entropy is ln 2; 2.0 clicks predicted for 2.
        assert!((f.ne.unwrap() - expected / std::f64::consts::LN_2).abs() < 1e-9);
        assert!((f.calibration.unwrap() - 1.0).abs() < 1e-6);
        assert_eq!(e.seen(), 6);
    }

    /// A sample of weight `k` counts as `k` samples of weight 1 in every figure, and one
    /// of weight 0 not at all, as in `eval`.
    #[test]
    fn weights_count_as_repeated_samples() {
        let probs = [0.9f32, 0.2, 0.6, 0.4, 0.7, 0.1];
        let labels = [1u8, 0, 1, 0, 0, 1];
        let weights = [2.0f32, 1.0, 0.0, 3.0, 1.0, 1.0];
        let mut weighted = ProgressiveEval::new(100, 1);
        weighted.push(check(&probs, &labels, &weights, 1, 1).unwrap());
        let (mut p, mut y) = (Vec::new(), Vec::new());
        for i in 0..probs.len() {
            for _ in 0..weights[i] as usize {
                p.push(probs[i]);
                y.push(labels[i]);
            }
        }
        let mut repeated = ProgressiveEval::new(100, 1);
        push(&mut repeated, &p, &y);
        let (a, b) = (weighted.record(1.0).unwrap(), repeated.record(1.0).unwrap());
        let close = |x: f64, y: f64| (x - y).abs() < 1e-9;
        assert!(close(a.auc.unwrap(), b.auc.unwrap()), "{a:?} {b:?}");
        assert!(close(a.logloss, b.logloss), "{a:?} {b:?}");
        assert!(close(a.positive_rate, b.positive_rate), "{a:?} {b:?}");
        assert!(close(a.ne.unwrap(), b.ne.unwrap()), "{a:?} {b:?}");
        assert!(
            close(a.calibration.unwrap(), b.calibration.unwrap()),
            "{a:?} {b:?}"
        );
        // The weights matter: unweighted, the same samples give another AUC.
        let mut plain = ProgressiveEval::new(100, 1);
        push(&mut plain, &probs, &labels);
        assert!(!close(
            plain.record(1.0).unwrap().auc.unwrap(),
            a.auc.unwrap()
        ));
        // The window counts samples; as weighted ones leave, their weight leaves too.
        let mut sliding = ProgressiveEval::new(2, 1);
        sliding.push(check(&probs, &labels, &weights, 1, 1).unwrap());
        let last = sliding.record(1.0).unwrap();
        assert_eq!(last.samples, 2);
        assert!(close(last.positive_rate, 0.5), "{last:?}");
    }

    #[test]
    fn malformed_weights_are_refused() {
        assert!(check(&[0.5, 0.5], &[0, 1], &[1.0], 1, 1).is_err());
        assert!(check(&[0.5], &[1], &[-1.0], 1, 1).is_err());
        assert!(check(&[0.5], &[1], &[f32::NAN], 1, 1).is_err());
        assert!(check(&[0.5], &[1], &[f32::INFINITY], 1, 1).is_err());
        // A multi-task report has one weight per sample, not per task.
        assert!(check(&[0.5, 0.5], &[0, 1], &[2.0], 2, 2).is_ok());
        assert!(check(&[0.5, 0.5], &[0, 1], &[2.0, 2.0], 2, 2).is_err());
    }

    #[test]
    fn malformed_reports_are_refused_whole() {
        // Only a checked report can be pushed, so a refused one adds nothing.
        assert!(check(&[0.5, 0.5], &[1], &[], 1, 1).is_err());
        assert!(check(&[0.5], &[2], &[], 1, 1).is_err());
        assert!(check(&[1.5], &[1], &[], 1, 1).is_err());
        assert!(check(&[f32::NAN], &[1], &[], 1, 1).is_err());
        let n = MAX_PER_REPORT + 1;
        assert!(check(&vec![0.5; n], &vec![0; n], &[], 1, 1).is_err());
        assert_eq!(check(&[0.5, 1.0], &[0, 1], &[], 1, 1).unwrap().len(), 2);
        // A multi-task job's reports carry its task count, in whole samples.
        assert!(check(&[0.5, 1.0], &[0, 1], &[], 1, 2).is_err());
        assert!(check(&[0.5, 1.0], &[0, 1], &[], 0, 2).is_err());
        assert!(check(&[0.5, 1.0, 0.5], &[0, 1, 1], &[], 2, 2).is_err());
        assert!(check(&[0.5, 1.0], &[0, 1], &[], 2, 1).is_err());
        assert_eq!(check(&[0.5, 1.0], &[0, 1], &[], 2, 2).unwrap().len(), 1);
        assert!(check(&[], &[], &[], 0, 2).unwrap().is_empty());
    }

    /// Each task of a multi-task job has its own window over the same samples: task 0's
    /// figures are the window's, every task's are in `tasks`.
    #[test]
    fn every_task_of_a_multi_task_job_is_judged_on_its_own_labels() {
        let mut e = ProgressiveEval::new(3, 2);
        // Per sample: task 0's probability, task 1's; then the labels alike. Task 0 is
        // ranked perfectly, task 1 backwards; the first sample leaves the window.
        let probs = [0.5, 0.5, 0.9, 0.2, 0.1, 0.8, 0.8, 0.3];
        let labels = [1, 1, 1, 1, 0, 0, 1, 1];
        e.push(check(&probs, &labels, &[], 2, 2).unwrap());
        let f = e.record(1.0).unwrap();
        assert_eq!(f.samples, 3);
        assert_eq!(e.seen(), 4);
        assert_eq!(f.auc, Some(1.0));
        assert_eq!(f.tasks.len(), 2);
        assert_eq!(f.tasks[0].auc, f.auc);
        assert_eq!(f.tasks[1].auc, Some(0.0));
        assert!((f.tasks[1].positive_rate - 2.0 / 3.0).abs() < 1e-12);
        let want: f64 = [(0.2f32, 1.0f32), (0.8, 0.0), (0.3, 1.0)]
            .iter()
            .map(|&(p, y)| logloss_term(p, y))
            .sum::<f64>()
            / 3.0;
        assert!((f.tasks[1].logloss - want).abs() < 1e-9);
        assert_eq!(e.summary()["latest"]["tasks"][1]["auc"], 0.0);
        // A one-task job's figures have no task list.
        let mut one = ProgressiveEval::new(3, 1);
        push(&mut one, &[0.4, 0.6], &[0, 1]);
        assert!(one.record(0.0).unwrap().tasks.is_empty());
        assert!(one.summary()["latest"].get("tasks").is_none());
    }

    #[test]
    fn one_class_has_no_auc_and_the_history_is_recorded() {
        let mut e = ProgressiveEval::new(10, 1);
        assert!(e.record(0.0).is_none());
        push(&mut e, &[0.3, 0.4], &[0, 0]);
        let f = e.record(5.0).unwrap();
        assert_eq!(f.auc, None);
        assert_eq!(e.summary()["history"].as_array().unwrap().len(), 1);
        assert_eq!(e.summary()["latest"]["at_s"], 5.0);
    }
}
