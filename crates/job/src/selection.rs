//! Model selection and early stopping (`train.validation`, `train.early_stopping`): which
//! evaluation was the best, and when to stop. Pure: `elastrec train` judges its own
//! evaluations with it, the master of `elastrec run` those of its checkpoints.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The best evaluation seen.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Best {
    /// Training samples when it was taken.
    pub samples: u64,
    /// Epoch it was taken in (0-based).
    pub epoch: u32,
    /// The AUC that selected it.
    pub auc: f64,
}

/// What one evaluation means for the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A new best: keep this model.
    Better,
    /// Not better; go on.
    NotBetter,
    /// Not better for `early_stopping` evaluations in a row: stop.
    Stop,
}

/// Tracks the best AUC and the evaluations since (serializable: a resumed `run` master
/// goes on judging where it stopped).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Selection {
    best: Option<Best>,
    stale: u32,
    patience: u32,
}

impl Selection {
    /// Stops after `patience` evaluations without a better AUC (0: never).
    pub fn new(patience: u32) -> Self {
        Self {
            patience,
            ..Self::default()
        }
    }

    /// Records an evaluation. An AUC that is not a number (an evaluation of one class)
    /// is never better.
    pub fn observe(&mut self, auc: f64, samples: u64, epoch: u32) -> Verdict {
        let score = |x: f64| if x.is_nan() { f64::NEG_INFINITY } else { x };
        if self.best.is_none_or(|b| score(auc) > score(b.auc)) {
            self.best = Some(Best {
                samples,
                epoch,
                auc,
            });
            self.stale = 0;
            return Verdict::Better;
        }
        self.stale += 1;
        if self.patience > 0 && self.stale >= self.patience {
            Verdict::Stop
        } else {
            Verdict::NotBetter
        }
    }

    /// The best evaluation so far.
    pub fn best(&self) -> Option<Best> {
        self.best
    }
}

/// Files with the row each is read up to.
pub type FileEnds = Vec<(PathBuf, u64)>;
/// `(file, start row, end row)` ranges.
pub type RowRanges = Vec<(PathBuf, u64, u64)>;

/// Splits the training rows `counts` (per file, in order) into what is trained (each
/// file read up to its end row) and the validation slice: the last `share` of the rows,
/// as `(file, start row, end row)` ranges, taken from the end.
pub fn split_validation(counts: &[(PathBuf, u64)], share: f64) -> (FileEnds, RowRanges) {
    let total: u64 = counts.iter().map(|(_, r)| r).sum();
    let mut held = (total as f64 * share).round() as u64;
    let mut train: Vec<(PathBuf, u64)> = counts.to_vec();
    let mut slice = Vec::new();
    for (path, end) in train.iter_mut().rev() {
        if held == 0 {
            break;
        }
        let take = held.min(*end);
        slice.push((path.clone(), *end - take, *end));
        *end -= take;
        held -= take;
    }
    slice.reverse();
    (train, slice)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_is_kept_and_patience_runs_out() {
        let mut s = Selection::new(2);
        assert_eq!(s.observe(0.70, 100, 0), Verdict::Better);
        assert_eq!(s.observe(0.72, 200, 0), Verdict::Better);
        assert_eq!(s.observe(0.71, 300, 1), Verdict::NotBetter);
        assert_eq!(
            s.observe(0.72, 400, 1),
            Verdict::Stop,
            "equal is not better"
        );
        assert_eq!(
            s.best(),
            Some(Best {
                samples: 200,
                epoch: 0,
                auc: 0.72
            })
        );
        let mut never = Selection::new(0);
        never.observe(0.7, 1, 0);
        for i in 0..10 {
            assert_eq!(never.observe(0.6, i, 0), Verdict::NotBetter);
        }
        let mut nan = Selection::new(1);
        nan.observe(0.6, 1, 0);
        assert_eq!(nan.observe(f64::NAN, 2, 0), Verdict::Stop);
        let mut first_nan = Selection::new(1);
        first_nan.observe(f64::NAN, 1, 0);
        assert_eq!(first_nan.observe(0.55, 2, 0), Verdict::Better);
    }

    #[test]
    fn the_validation_slice_is_the_end_of_the_training_rows() {
        let f = |n: &str| PathBuf::from(n);
        let counts = vec![(f("a"), 100), (f("b"), 30), (f("c"), 20)];
        let (train, slice) = split_validation(&counts, 0.2);
        // 30 rows: all of c, the last 10 of b.
        assert_eq!(train, vec![(f("a"), 100), (f("b"), 20), (f("c"), 0)]);
        assert_eq!(slice, vec![(f("b"), 20, 30), (f("c"), 0, 20)]);
        let (train, slice) = split_validation(&counts, 0.0);
        assert_eq!(train, counts);
        assert!(slice.is_empty());
    }
}
