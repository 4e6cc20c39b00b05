//! KALE streaming planning: the fewest workers that keep up with forecast traffic (Eq. 10),
//! the stabilization of Algorithm 1 (rho, tau), and the threshold fallback (§3.4.3).

use serde::{Deserialize, Serialize};

use crate::alloc::Range;
use crate::error::{check_non_negative, check_positive, BrainError, Result};

/// Eq. 10: the smallest `w` in `workers` with `F(w) > load`, or `None` when even the
/// largest allowed count falls short. `F` need not be monotone (KALE's models bend down
/// for large `w`), so every count is tried from the bottom.
pub fn fewest_workers(f: impl Fn(u32) -> f64, load: f64, workers: Range<u32>) -> Option<u32> {
    (workers.min..=workers.max).find(|&w| f(w) > load)
}

/// Eq. 10 over a forecast: one worker count per interval. Intervals whose load cannot be
/// met get the count with the highest throughput (and are reported by the caller).
pub fn plan_series(
    f: impl Fn(u32) -> f64,
    loads: &[f64],
    workers: Range<u32>,
) -> Result<(Vec<u32>, Vec<usize>)> {
    let best = (workers.min..=workers.max)
        .max_by(|a, b| f(*a).total_cmp(&f(*b)))
        .ok_or_else(|| BrainError::invalid("bounds.workers", "empty range"))?;
    let mut out = Vec::with_capacity(loads.len());
    let mut short = Vec::new();
    for (i, &l) in loads.iter().enumerate() {
        check_non_negative(&format!("load[{i}]"), l)?;
        match fewest_workers(&f, l, workers) {
            Some(w) => out.push(w),
            None => {
                short.push(i);
                out.push(best);
            }
        }
    }
    Ok((out, short))
}

/// Parameters of KALE's Algorithm 1.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stabilization {
    /// Smallest change between successive intervals that is examined (`rho`, default 1).
    pub rho: u32,
    /// A new level lasting less than this many seconds is calibrated away (`tau`,
    /// default 600 s).
    pub tau_s: f64,
}

impl Default for Stabilization {
    fn default() -> Self {
        Self {
            rho: 1,
            tau_s: 600.0,
        }
    }
}

/// KALE Algorithm 1 over a plan sampled every `interval_s` seconds.
///
/// Walking the plan, a change of at least `rho` between `r_i` and `r_{i+1}` opens a run of
/// equal values starting at `i+1` (CALCDURATION). If the run lasts less than `tau` and has
/// a neighbour on both sides, it is set to the larger neighbour (CALIBRATE with
/// `max(r_start, r_end)`), so a short dip or step never scales the job down too early.
/// A run that reaches the end of the plan has unknown duration and is left alone.
pub fn stabilize(plan: &[u32], interval_s: f64, params: Stabilization) -> Result<Vec<u32>> {
    check_positive("interval_s", interval_s)?;
    check_non_negative("tau_s", params.tau_s)?;
    let mut r = plan.to_vec();
    let n = r.len();
    let mut i = 0;
    while i + 1 < n {
        if r[i].abs_diff(r[i + 1]) >= params.rho.max(1) {
            let start = i + 1;
            let mut end = start;
            while end < n && r[end] == r[start] {
                end += 1;
            }
            // The run is r[start..end]; its neighbours are r[i] and r[end].
            let duration = (end - start) as f64 * interval_s;
            if end < n && duration < params.tau_s {
                let smooth = r[i].max(r[end]);
                r[start..end].iter_mut().for_each(|v| *v = smooth);
            }
        }
        i += 1;
    }
    Ok(r)
}

/// Threshold fallback (KALE §3.4.3): when measured lag or utilization says the plan is
/// wrong (bad forecast, degraded hardware), step the workers regardless of the forecast.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Fallback {
    /// Scale up when the stream lag exceeds this many samples.
    pub lag_high: f64,
    /// Scale up when utilization (0..1) exceeds this.
    pub util_high: f64,
    /// Scale down when utilization is below this and there is no lag.
    pub util_low: f64,
    /// Workers added or removed per step.
    pub step: u32,
}

impl Default for Fallback {
    fn default() -> Self {
        Self {
            lag_high: 1_000_000.0,
            util_high: 0.9,
            util_low: 0.3,
            step: 1,
        }
    }
}

/// What the fallback rule decided.
#[derive(Debug, Clone, PartialEq)]
pub struct FallbackDecision {
    /// Worker count to use now.
    pub workers: u32,
    /// Why (empty when the plan stands).
    pub reason: Option<String>,
}

impl Fallback {
    /// Applies the rule to the planned count given measured `lag` (samples) and `util`.
    pub fn apply(
        &self,
        planned: u32,
        current: u32,
        lag: f64,
        util: f64,
        bounds: Range<u32>,
    ) -> Result<FallbackDecision> {
        check_non_negative("lag_samples", lag)?;
        check_non_negative("utilization", util)?;
        if util > 10.0 {
            return Err(BrainError::invalid(
                "utilization",
                format!("expected 0..1, got {util}"),
            ));
        }
        let up = current.saturating_add(self.step.max(1));
        if lag > self.lag_high || util > self.util_high {
            if planned < up {
                return Ok(FallbackDecision {
                    workers: bounds.clamp(up),
                    reason: Some(format!(
                        "fallback: lag {lag:.0} (limit {:.0}) / utilization {util:.2} (limit {:.2}) above threshold, scaling up from {current}",
                        self.lag_high, self.util_high
                    )),
                });
            }
        } else if util < self.util_low && lag == 0.0 && planned > current {
            return Ok(FallbackDecision {
                workers: bounds.clamp(current),
                reason: Some(format!(
                    "fallback: utilization {util:.2} below {:.2} with no lag, holding {current} instead of scaling up",
                    self.util_low
                )),
            });
        }
        Ok(FallbackDecision {
            workers: bounds.clamp(planned),
            reason: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::throughput::kale::{KaleModel, KaleVariant};

    #[test]
    fn paper_worked_example_ten_is_the_fewest_workers_for_30000() {
        let m = KaleModel::new(
            KaleVariant::SyncW,
            vec![0.00035, 2.5726, 0.9824, 0.02786],
            16_384.0,
        )
        .unwrap();
        let w = fewest_workers(|w| m.throughput(w, w), 30_000.0, Range::new(1, 64));
        assert_eq!(w, Some(10));
        // Beyond the model's peak no count suffices.
        assert_eq!(
            fewest_workers(|w| m.throughput(w, w), 1e9, Range::new(1, 64)),
            None
        );
    }

    #[test]
    fn paper_case_study_stabilization() {
        // KALE §3.4.2: [4,4,5,6,6,6] every 10 minutes with tau = 15 minutes.
        let out = stabilize(
            &[4, 4, 5, 6, 6, 6],
            600.0,
            Stabilization {
                rho: 1,
                tau_s: 900.0,
            },
        )
        .unwrap();
        assert_eq!(out, vec![4, 4, 6, 6, 6, 6]);
    }

    #[test]
    fn stabilization_keeps_long_runs_and_fills_short_dips() {
        let p = Stabilization {
            rho: 1,
            tau_s: 900.0,
        };
        // A run of 2 intervals (20 min) lasts longer than tau: kept.
        assert_eq!(
            stabilize(&[4, 5, 5, 6], 600.0, p).unwrap(),
            vec![4, 5, 5, 6]
        );
        // A short dip is lifted to the larger neighbour.
        assert_eq!(
            stabilize(&[6, 6, 3, 6, 6], 600.0, p).unwrap(),
            vec![6, 6, 6, 6, 6]
        );
        // A trailing change is not calibrated (its duration is unknown).
        assert_eq!(stabilize(&[6, 6, 3], 600.0, p).unwrap(), vec![6, 6, 3]);
        // Changes below rho are ignored.
        let big_rho = Stabilization {
            rho: 3,
            tau_s: 900.0,
        };
        assert_eq!(
            stabilize(&[4, 5, 4], 600.0, big_rho).unwrap(),
            vec![4, 5, 4]
        );
        assert!(stabilize(&[1, 2], 0.0, p).is_err());
    }

    #[test]
    fn plan_series_reports_unmet_intervals() {
        let (plan, short) = plan_series(
            |w| 100.0 * f64::from(w),
            &[50.0, 250.0, 5_000.0],
            Range::new(1, 10),
        )
        .unwrap();
        assert_eq!(plan, vec![1, 3, 10]);
        assert_eq!(short, vec![2]);
    }

    #[test]
    fn fallback_scales_up_on_lag_and_holds_when_idle() {
        let fb = Fallback::default();
        let b = Range::new(1, 20);
        let d = fb.apply(5, 5, 2e6, 0.5, b).unwrap();
        assert_eq!(d.workers, 6);
        assert!(d.reason.is_some());
        let d = fb.apply(8, 5, 0.0, 0.1, b).unwrap();
        assert_eq!(d.workers, 5);
        let d = fb.apply(7, 5, 10.0, 0.5, b).unwrap();
        assert_eq!((d.workers, d.reason), (7, None));
        assert!(fb.apply(5, 5, f64::NAN, 0.5, b).is_err());
    }
}
