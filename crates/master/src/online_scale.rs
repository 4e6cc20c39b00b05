//! Worker counts for online jobs from their traffic (KALE §3.2-3.4), and the reactive
//! HPA-like rule it is measured against. Pure policy: the loop in
//! [`crate::online_scale_loop`] measures and applies.
//!
//! KALE, every `interval_s`:
//! 1. the arrival rate joins its history; a window in which every worker was measured
//!    busy joins the throughput samples `(w, F)`;
//! 2. `F(w)` is KALE's model fitted on those samples (Eq. 9 asynchronous, Eq. 6
//!    synchronous) once they span two worker counts, else the measured per-worker capacity
//!    times `w`;
//! 3. the traffic is forecast `horizon_s` ahead (Holt-Winters; a damped trend without a
//!    season), plus the backlog to drain within the SLO;
//! 4. the plan is the fewest workers with `F(w)` above each forecast value (Eq. 10), and
//!    Algorithm 1 stabilizes it (with the current count in front, so a short dip or peak
//!    does not move the job);
//! 5. the fallback (§3.4.3) adds a worker when the lag stays above the SLO for two checks
//!    however the forecast looks, never shrinks a job above its SLO, and refuses to grow
//!    an idle one.

use elastrec_brain::alloc::Range;
use elastrec_brain::forecast::{Forecaster, HoltWinters};
use elastrec_brain::streaming::{plan_series, stabilize, Stabilization};
use elastrec_brain::throughput::kale::{KaleModel, KaleSample, KaleVariant};
use elastrec_job::stream::{StreamConfig, StreamScaling};
use serde::Serialize;

/// Throughput samples kept (the most recent).
const MAX_SAMPLES: usize = 240;
/// Traffic history kept, intervals.
const MAX_HISTORY: usize = 4096;
/// Utilization below which a job counts as idle.
const UTIL_LOW: f64 = 0.3;
/// Utilization above which the HPA rule adds a worker.
const UTIL_HIGH: f64 = 0.8;
/// Checks in a row a condition must hold before a fallback step or an HPA scale-down.
const PERSIST: u32 = 2;

/// What the loop measured over one interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// Workers the job runs now (its target).
    pub workers: u32,
    /// Messages per second arriving.
    pub arrival_rate: f64,
    /// Messages waiting.
    pub backlog: f64,
    /// Age of the oldest waiting message, seconds.
    pub lag_s: f64,
    /// Mean fraction of the interval the workers spent training (0..1).
    pub utilization: f64,
    /// `(workers, samples/s they can train)`: present when every worker was measured
    /// over the whole interval.
    pub capacity: Option<(u32, f64)>,
}

/// One decision.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// Workers before.
    pub workers: u32,
    /// The raw plan's count for the next interval (before stabilization and fallback).
    pub raw: u32,
    /// Workers to run.
    pub target: u32,
    /// The load planned for, messages/s (forecast plus backlog drain).
    pub load: f64,
    /// Why.
    pub reason: String,
}

/// The online autoscaler's state.
#[derive(Debug, Clone)]
pub struct OnlineScaler {
    kind: StreamScaling,
    bounds: Range<u32>,
    interval_s: f64,
    slo_lag_s: f64,
    horizon: usize,
    season: usize,
    stab: Stabilization,
    sync: bool,
    history: Vec<f64>,
    samples: Vec<KaleSample>,
    over_slo: u32,
    idle: u32,
    last_raw: Option<u32>,
    /// Changes of the raw plan between decisions.
    pub raw_changes: u32,
    /// Changes of the worker count applied.
    pub changes: u32,
}

impl OnlineScaler {
    /// A scaler for `cfg` (`sync`: synchronous training, KALE's Eq. 6 instead of Eq. 9).
    pub fn new(cfg: &StreamConfig, sync: bool) -> Self {
        let steps = |s: f64| (s / cfg.interval_s).ceil().max(1.0) as usize;
        Self {
            kind: cfg.autoscale,
            bounds: Range {
                min: cfg.workers[0],
                max: cfg.workers[1],
            },
            interval_s: cfg.interval_s,
            slo_lag_s: cfg.slo_lag_s,
            horizon: steps(cfg.horizon_s),
            season: if cfg.season_s > 0.0 {
                steps(cfg.season_s)
            } else {
                1
            },
            stab: Stabilization {
                rho: cfg.rho,
                tau_s: cfg.tau_s,
            },
            sync,
            history: Vec::new(),
            samples: Vec::new(),
            over_slo: 0,
            idle: 0,
            last_raw: None,
            raw_changes: 0,
            changes: 0,
        }
    }

    /// The throughput model `F(w)` from the samples so far (`None`: nothing measured).
    fn capacity_model(&self) -> Option<Box<dyn Fn(u32) -> f64>> {
        let distinct = {
            let mut w: Vec<u32> = self.samples.iter().map(|s| s.workers).collect();
            w.sort_unstable();
            w.dedup();
            w.len()
        };
        let variant = if self.sync {
            KaleVariant::SyncW
        } else {
            KaleVariant::AsyncW
        };
        if distinct >= 2 && self.samples.len() >= variant.len() + 3 {
            if let Ok((m, _)) = KaleModel::fit(variant, 1.0, &self.samples) {
                let m: KaleModel = m;
                return Some(Box::new(move |w| m.throughput(w, 1)));
            }
        }
        let mut per: Vec<f64> = self
            .samples
            .iter()
            .map(|s| s.throughput / f64::from(s.workers))
            .collect();
        if per.is_empty() {
            return None;
        }
        per.sort_by(f64::total_cmp);
        let c = per[per.len() / 2];
        Some(Box::new(move |w| c * f64::from(w)))
    }

    /// The traffic over the next `horizon` intervals.
    fn forecast(&self) -> Vec<f64> {
        let last = self.history.last().copied().unwrap_or(0.0);
        if self.history.len() < 4 {
            return vec![last; self.horizon];
        }
        let period = if self.history.len() >= 2 * self.season {
            self.season
        } else {
            1
        };
        let hw = HoltWinters {
            multiplicative: false,
            ..HoltWinters::new(period)
        };
        match hw.forecast(&self.history, self.horizon) {
            Ok(f) if f.iter().all(|v| v.is_finite()) => f.into_iter().map(|v| v.max(0.0)).collect(),
            _ => vec![last; self.horizon],
        }
    }

    /// Decides the worker count for the next interval.
    pub fn decide(&mut self, obs: &Observation) -> Decision {
        self.history.push(obs.arrival_rate.max(0.0));
        if self.history.len() > MAX_HISTORY {
            self.history.remove(0);
        }
        if let Some((w, f)) = obs.capacity {
            if w > 0 && f > 0.0 && f.is_finite() {
                self.samples.push(KaleSample {
                    workers: w,
                    ps: 1,
                    throughput: f,
                });
                if self.samples.len() > MAX_SAMPLES {
                    self.samples.remove(0);
                }
            }
        }
        self.over_slo = if obs.lag_s > self.slo_lag_s {
            self.over_slo + 1
        } else {
            0
        };
        self.idle = if obs.utilization < UTIL_LOW && obs.lag_s < 1.0 {
            self.idle + 1
        } else {
            0
        };
        let d = match self.kind {
            StreamScaling::Off => Decision {
                workers: obs.workers,
                raw: obs.workers,
                target: obs.workers,
                load: obs.arrival_rate,
                reason: "autoscaling off".into(),
            },
            StreamScaling::Hpa => self.hpa(obs),
            StreamScaling::Kale => self.kale(obs),
        };
        if self.last_raw.is_some_and(|r| r != d.raw) {
            self.raw_changes += 1;
        }
        self.last_raw = Some(d.raw);
        if d.target != obs.workers {
            self.changes += 1;
        }
        d
    }

    fn hpa(&mut self, obs: &Observation) -> Decision {
        let w = obs.workers;
        let (target, reason) = if obs.lag_s > self.slo_lag_s / 2.0 || obs.utilization > UTIL_HIGH {
            (
                w + 1,
                format!(
                    "lag {:.1} s / utilization {:.2} above threshold",
                    obs.lag_s, obs.utilization
                ),
            )
        } else if self.idle >= PERSIST {
            self.idle = 0;
            (
                w.saturating_sub(1),
                format!(
                    "utilization {:.2} below {UTIL_LOW} with no lag",
                    obs.utilization
                ),
            )
        } else {
            (w, "within thresholds".into())
        };
        let target = self.bounds.clamp(target);
        Decision {
            workers: w,
            raw: target,
            target,
            load: obs.arrival_rate,
            reason,
        }
    }

    fn kale(&mut self, obs: &Observation) -> Decision {
        let w = obs.workers;
        let Some(f) = self.capacity_model() else {
            return Decision {
                workers: w,
                raw: w,
                target: w,
                load: obs.arrival_rate,
                reason: "measuring the workers' throughput".into(),
            };
        };
        // Drain the backlog within the SLO, on top of the forecast traffic.
        let drain = obs.backlog / self.slo_lag_s;
        let drain_steps = (self.slo_lag_s / self.interval_s).ceil().max(1.0) as usize;
        let loads: Vec<f64> = self
            .forecast()
            .into_iter()
            .enumerate()
            .map(|(i, l)| if i < drain_steps { l + drain } else { l })
            .collect();
        let (plan, short) = match plan_series(&f, &loads, self.bounds) {
            Ok(p) => p,
            Err(e) => {
                return Decision {
                    workers: w,
                    raw: w,
                    target: w,
                    load: obs.arrival_rate,
                    reason: format!("no plan: {e}"),
                }
            }
        };
        let raw = plan[0];
        let mut with_now = Vec::with_capacity(plan.len() + 1);
        with_now.push(w);
        with_now.extend_from_slice(&plan);
        let stable = stabilize(&with_now, self.interval_s, self.stab).unwrap_or(with_now);
        let mut target = stable[1];
        let mut reason = format!(
            "forecast {:.0}/s + backlog {:.0}/s: F({target}) = {:.0}/s",
            loads[0] - drain,
            drain,
            f(target)
        );
        if !short.is_empty() {
            reason.push_str(&format!(
                "; {} of {} intervals exceed F({}) even at the largest count",
                short.len(),
                plan.len(),
                self.bounds.max
            ));
        }
        if self.over_slo >= PERSIST && target <= w {
            target = self.bounds.clamp(w + 1);
            reason = format!(
                "fallback: lag {:.1} s above the SLO ({} s) for {} checks",
                obs.lag_s, self.slo_lag_s, self.over_slo
            );
        } else if obs.lag_s > self.slo_lag_s && target < w {
            target = w;
            reason = format!(
                "fallback: lag {:.1} s above the SLO ({} s), not shrinking",
                obs.lag_s, self.slo_lag_s
            );
        } else if self.idle >= PERSIST && target > w {
            target = w;
            reason = format!(
                "fallback: utilization {:.2} with no lag, not growing",
                obs.utilization
            );
        }
        Decision {
            workers: w,
            raw,
            target,
            load: loads[0],
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(kind: StreamScaling) -> StreamConfig {
        StreamConfig {
            topics: vec!["t".into()],
            autoscale: kind,
            workers: [1, 6],
            interval_s: 5.0,
            horizon_s: 15.0,
            tau_s: 12.0,
            slo_lag_s: 10.0,
            ..StreamConfig::default()
        }
    }

    /// A job whose workers each train 1000 samples/s, fed `rate`: what it measures.
    fn obs(w: u32, rate: f64, backlog: f64) -> Observation {
        let capacity = 1000.0 * f64::from(w);
        Observation {
            workers: w,
            arrival_rate: rate,
            backlog,
            lag_s: if backlog > 0.0 {
                backlog / rate.max(1.0)
            } else {
                0.0
            },
            utilization: (rate / capacity).min(1.0),
            capacity: Some((w, capacity)),
        }
    }

    #[test]
    fn kale_runs_the_fewest_workers_that_keep_up_with_the_traffic() {
        let mut s = OnlineScaler::new(&cfg(StreamScaling::Kale), false);
        let mut w = 1;
        for _ in 0..6 {
            w = s.decide(&obs(w, 2500.0, 0.0)).target;
        }
        assert_eq!(w, 3, "F(3) = 3000/s is the first above 2500/s");
        for _ in 0..8 {
            w = s.decide(&obs(w, 800.0, 0.0)).target;
        }
        assert_eq!(w, 1, "back to one worker once the traffic falls");
    }

    #[test]
    fn a_one_interval_spike_does_not_move_a_stabilized_plan() {
        let mut s = OnlineScaler::new(&cfg(StreamScaling::Kale), false);
        let mut w = 2;
        let mut targets = Vec::new();
        for i in 0..12 {
            // Steady 1500/s (two workers: F(2) = 2000/s) with a one-interval burst to
            // 2600/s: the raw plan jumps, the stabilized one never drops below 2.
            let rate = if i == 6 { 2600.0 } else { 1500.0 };
            let d = s.decide(&obs(w, rate, 0.0));
            w = d.target;
            targets.push(w);
        }
        assert!(targets.iter().all(|&t| t >= 2), "{targets:?}");
        assert!(
            s.changes <= s.raw_changes,
            "stabilized changes {} vs raw {}",
            s.changes,
            s.raw_changes
        );
    }

    #[test]
    fn lag_above_the_slo_adds_a_worker_whatever_the_forecast() {
        let mut s = OnlineScaler::new(&cfg(StreamScaling::Kale), false);
        // The measured capacity looks ample (a wrong model), but the lag grows.
        let o = Observation {
            workers: 2,
            arrival_rate: 500.0,
            backlog: 0.0,
            lag_s: 30.0,
            utilization: 1.0,
            capacity: Some((2, 5000.0)),
        };
        let first = s.decide(&o);
        let second = s.decide(&o);
        assert_eq!(first.target, 2);
        assert_eq!(second.target, 3, "{}", second.reason);
        assert!(second.reason.starts_with("fallback"), "{}", second.reason);
    }

    #[test]
    fn hpa_reacts_to_utilization_after_the_fact() {
        let mut s = OnlineScaler::new(&cfg(StreamScaling::Hpa), false);
        assert_eq!(s.decide(&obs(1, 2500.0, 5000.0)).target, 2);
        assert_eq!(s.decide(&obs(2, 2500.0, 2000.0)).target, 3);
        // Idle: one step down only after two idle checks.
        assert_eq!(s.decide(&obs(3, 100.0, 0.0)).target, 3);
        assert_eq!(s.decide(&obs(3, 100.0, 0.0)).target, 2);
    }
}
