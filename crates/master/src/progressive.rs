//! Progressive validation of an online job: every sample is predicted by the model just
//! before it is trained on (the workers send those predictions with their progress), so
//! the AUC and logloss over the most recent samples measure the model on data it has not
//! seen, without holding any data out (`docs/online.md`). A batch job in `run` does the
//! same over every batch (`train.progressive_window`): its loss and AUC curves.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use elastrec_common::{exact_auc, logloss_term};
use serde::Serialize;

use crate::core::MasterCore;
use crate::events::event;
use crate::job::Phase;

/// Records the progressive-validation figures (log line, `/metrics`, history).
pub fn record(core: &MasterCore, at_s: f64) {
    let figures = core
        .progressive
        .lock()
        .as_mut()
        .and_then(|p| p.record(at_s));
    let Some(f) = figures else { return };
    core.metrics.observe_progressive(&f);
    event!("progressive_eval", samples = f.samples, auc = ?f.auc, logloss = f.logloss,
        "master: progressive validation over the last {} samples: AUC {}, logloss {:.4}",
        f.samples,
        f.auc
            .map_or("- (one class)".to_string(), |a| format!("{a:.4}")),
        f.logloss
    );
}

/// A batch job's recorder: the figures every `every` while the job trains (an online
/// job's stream watcher records its own).
pub async fn run_batch(core: Arc<MasterCore>, every: Duration) {
    let started = Instant::now();
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        record(&core, started.elapsed().as_secs_f64());
        if !matches!(core.job.lock().phase(), Phase::Training) {
            return;
        }
    }
}

/// Most predictions one progress report may carry (a batch; batches are far smaller).
pub const MAX_PER_REPORT: usize = 1 << 20;

/// One report's predictions that passed [`check`]: the only thing
/// [`ProgressiveEval::push`] takes, so a report is checked once, before the master accepts
/// its progress, and never added unchecked.
#[derive(Debug, Clone, Copy)]
pub struct Checked<'a> {
    probs: &'a [f32],
    labels: &'a [u8],
}

impl Checked<'_> {
    /// Predictions in the report.
    pub fn len(&self) -> usize {
        self.probs.len()
    }

    /// True for a report without predictions (not an online job, or nothing trained).
    pub fn is_empty(&self) -> bool {
        self.probs.is_empty()
    }
}

/// Checks one report's predictions as read from the wire: lists of equal length, at most
/// [`MAX_PER_REPORT`], labels 0 or 1, probabilities in [0, 1].
pub fn check<'a>(probs: &'a [f32], labels: &'a [u8]) -> Result<Checked<'a>, String> {
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
    Ok(Checked { probs, labels })
}

/// The figures over the window at one time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
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
}

/// The last `window` predictions with their labels, and the figures recorded so far.
#[derive(Debug, Clone)]
pub struct ProgressiveEval {
    window: usize,
    probs: VecDeque<f32>,
    labels: VecDeque<u8>,
    /// Sum of the window's logloss terms, kept as samples enter and leave.
    loss_sum: f64,
    positives: u64,
    /// Every prediction received, window or not.
    seen: u64,
    history: Vec<WindowFigures>,
}

/// Figures kept in the history: the oldest are dropped beyond this (a job runs for weeks).
const MAX_HISTORY: usize = 10_000;

impl ProgressiveEval {
    /// An empty window of `window` samples.
    pub fn new(window: usize) -> Self {
        Self {
            window: window.max(1),
            probs: VecDeque::new(),
            labels: VecDeque::new(),
            loss_sum: 0.0,
            positives: 0,
            seen: 0,
            history: Vec::new(),
        }
    }

    /// Adds one checked report's predictions.
    pub fn push(&mut self, report: Checked<'_>) {
        for (&p, &y) in report.probs.iter().zip(report.labels) {
            if self.probs.len() == self.window {
                let (old_p, old_y) = (
                    self.probs.pop_front().expect("full"),
                    self.labels.pop_front().expect("full"),
                );
                self.loss_sum -= logloss_term(old_p, f32::from(old_y));
                self.positives -= u64::from(old_y);
            }
            self.probs.push_back(p);
            self.labels.push_back(y);
            self.loss_sum += logloss_term(p, f32::from(y));
            self.positives += u64::from(y);
        }
        self.seen += report.len() as u64;
    }

    /// The figures over the window now (`None` while it is empty).
    pub fn figures(&mut self, at_s: f64) -> Option<WindowFigures> {
        let n = self.probs.len();
        if n == 0 {
            return None;
        }
        let auc = exact_auc(
            self.probs.make_contiguous(),
            self.labels.make_contiguous(),
            |y| y == 1,
        );
        Some(WindowFigures {
            at_s,
            samples: n as u64,
            auc,
            // The running sum drifts by rounding over billions of samples: never below 0.
            logloss: (self.loss_sum / n as f64).max(0.0),
            positive_rate: self.positives as f64 / n as f64,
        })
    }

    /// Computes the figures now (`at_s` seconds into the job) and keeps them in the
    /// history.
    pub fn record(&mut self, at_s: f64) -> Option<WindowFigures> {
        let f = self.figures(at_s)?;
        if self.history.len() == MAX_HISTORY {
            self.history.remove(0);
        }
        self.history.push(f);
        Some(f)
    }

    /// The figures recorded last.
    pub fn latest(&self) -> Option<WindowFigures> {
        self.history.last().copied()
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
        e.push(check(probs, labels).unwrap());
    }

    #[test]
    fn the_window_keeps_only_the_most_recent_samples() {
        let mut e = ProgressiveEval::new(4);
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
        assert_eq!(e.seen(), 6);
    }

    #[test]
    fn malformed_reports_are_refused_whole() {
        // Only a checked report can be pushed, so a refused one adds nothing.
        assert!(check(&[0.5, 0.5], &[1]).is_err());
        assert!(check(&[0.5], &[2]).is_err());
        assert!(check(&[1.5], &[1]).is_err());
        assert!(check(&[f32::NAN], &[1]).is_err());
        let n = MAX_PER_REPORT + 1;
        assert!(check(&vec![0.5; n], &vec![0; n]).is_err());
        assert_eq!(check(&[0.5, 1.0], &[0, 1]).unwrap().len(), 2);
    }

    #[test]
    fn one_class_has_no_auc_and_the_history_is_recorded() {
        let mut e = ProgressiveEval::new(10);
        assert!(e.record(0.0).is_none());
        push(&mut e, &[0.3, 0.4], &[0, 0]);
        let f = e.record(5.0).unwrap();
        assert_eq!(f.auc, None);
        assert_eq!(e.summary()["history"].as_array().unwrap().len(), 1);
        assert_eq!(e.summary()["latest"]["at_s"], 5.0);
    }
}
