//! Where `elastrec train` runs a job's `[[preprocess]]` plan (RAP §7's mapping, on CPU):
//! on the reader thread, beside parsing, overlapped with the training step; or on the
//! training threads between steps, in parallel, not overlapped. Pure: the trainer feeds
//! it measured costs.
//!
//! Cost model per batch: `r` the reader's parse time, `p` the plan's time on one thread,
//! `s` the training step, `c` the training threads. A pipeline runs at the pace of its
//! slowest stage:
//! - on the reader thread: `max(r + p, s)`;
//! - on the training threads: `max(r, s + p / c)`.
//!
//! The plan moves only when the other placement is predicted at least [`HYSTERESIS`]
//! faster, so noise does not make it flip back and forth.

use serde::{Deserialize, Serialize};

/// How much faster the other placement must be predicted to be before the plan moves.
pub const HYSTERESIS: f64 = 0.05;

/// Where the plan runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// On the reader thread, overlapped with the step.
    ReaderThread,
    /// On the training threads, between steps.
    TrainingThreads,
}

/// Measured costs per batch, seconds (exponential averages).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Costs {
    /// Parsing one batch (reader thread).
    pub read_s: f64,
    /// The plan over one batch on one thread.
    pub plan_s: f64,
    /// One training step.
    pub step_s: f64,
}

impl Costs {
    /// Predicted time per batch with the plan at `at`, on `threads` training threads.
    pub fn period(&self, at: Placement, threads: usize) -> f64 {
        match at {
            Placement::ReaderThread => (self.read_s + self.plan_s).max(self.step_s),
            Placement::TrainingThreads => self
                .read_s
                .max(self.step_s + self.plan_s / threads.max(1) as f64),
        }
    }

    /// Where the plan should run, given where it runs now.
    pub fn choose(&self, now: Placement, threads: usize) -> Placement {
        let other = match now {
            Placement::ReaderThread => Placement::TrainingThreads,
            Placement::TrainingThreads => Placement::ReaderThread,
        };
        if self.period(other, threads) < self.period(now, threads) * (1.0 - HYSTERESIS) {
            other
        } else {
            now
        }
    }
}

/// An exponential moving average that starts at its first sample.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ewma(Option<f64>);

impl Ewma {
    /// Weight of a new sample.
    const ALPHA: f64 = 0.2;

    /// Adds a sample.
    pub fn add(&mut self, x: f64) {
        self.0 = Some(match self.0 {
            Some(v) => v + Self::ALPHA * (x - v),
            None => x,
        });
    }

    /// The average, 0 before any sample.
    pub fn get(&self) -> f64 {
        self.0.unwrap_or(0.0)
    }

    /// True once a sample was added.
    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cheap_plan_stays_on_the_reader_thread() {
        // The measured case (docs/preprocess.md): parse 1 ms, plan 0.4 ms, step 46 ms.
        let c = Costs {
            read_s: 0.001,
            plan_s: 0.0004,
            step_s: 0.046,
        };
        assert_eq!(c.period(Placement::ReaderThread, 2), 0.046);
        assert_eq!(
            c.choose(Placement::ReaderThread, 2),
            Placement::ReaderThread
        );
        // Between steps it adds p / c = 0.2 ms to a 46 ms step: a gain of 0.4% back on
        // the reader thread, within the hysteresis, so it does not move back either.
        assert_eq!(
            c.choose(Placement::TrainingThreads, 2),
            Placement::TrainingThreads
        );
        // A plan of 20 ms adds 10 ms a step between steps: it moves to the reader.
        let heavy = Costs { plan_s: 0.020, ..c };
        assert_eq!(
            heavy.choose(Placement::TrainingThreads, 2),
            Placement::ReaderThread
        );
    }

    #[test]
    fn a_plan_that_makes_the_reader_the_bottleneck_moves_to_the_training_threads() {
        // Reader: 10 + 40 = 50 ms a batch against a 30 ms step; on 4 training threads the
        // plan adds 10 ms to the step: 40 ms.
        let c = Costs {
            read_s: 0.010,
            plan_s: 0.040,
            step_s: 0.030,
        };
        assert!((c.period(Placement::TrainingThreads, 4) - 0.040).abs() < 1e-12);
        assert_eq!(
            c.choose(Placement::ReaderThread, 4),
            Placement::TrainingThreads
        );
        // On one training thread nothing is gained (max(10, 70) > 50): it stays.
        assert_eq!(
            c.choose(Placement::ReaderThread, 1),
            Placement::ReaderThread
        );
    }

    #[test]
    fn a_gain_within_the_hysteresis_does_not_move_the_plan() {
        // Reader: max(10 + 31, 40) = 41 ms; trainer: max(10, 40 + 31/32) ≈ 40.97 ms.
        let c = Costs {
            read_s: 0.010,
            plan_s: 0.031,
            step_s: 0.040,
        };
        assert!(c.period(Placement::TrainingThreads, 32) < c.period(Placement::ReaderThread, 32));
        assert_eq!(
            c.choose(Placement::ReaderThread, 32),
            Placement::ReaderThread
        );
    }

    #[test]
    fn the_average_starts_at_its_first_sample() {
        let mut e = Ewma::default();
        assert!(!e.is_set());
        e.add(10.0);
        assert_eq!(e.get(), 10.0);
        e.add(20.0);
        assert!((e.get() - 12.0).abs() < 1e-12);
    }
}
