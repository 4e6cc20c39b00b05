//! An online job's traffic history for KALE's forecaster, bounded whatever the season.
//!
//! A seasonal forecast needs two whole seasons of history: a daily season at 5 s intervals
//! is 2 × 17,280 intervals. Kept at full resolution that grows memory, persistence and
//! every forecast's fit with the season; cut to a fixed length it silently drops the
//! season. So the history is two-tier: the latest [`RECENT`] intervals as measured (short
//! seasons and the non-seasonal forecast use them), and everything older than the bucket
//! being filled averaged into buckets of `k` intervals, chosen so that a season spans at
//! most [`SEASON_BUCKETS`] of them; three seasons of buckets are kept. A long season is
//! forecast on the buckets and expanded back to intervals.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::forecast::{Forecaster, HoltWinters};

/// Intervals kept at full resolution.
pub const RECENT: usize = 4096;
/// Buckets a season spans at most.
pub const SEASON_BUCKETS: usize = 1024;
/// Seasons of buckets kept.
const SEASONS_KEPT: usize = 3;

/// The traffic (messages/s per interval) seen so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrafficHistory {
    /// The season, intervals (1: none).
    season: usize,
    /// Intervals per bucket.
    k: usize,
    /// The latest intervals, oldest first.
    recent: VecDeque<f64>,
    /// Whole buckets (means of `k` intervals), oldest first.
    buckets: VecDeque<f64>,
    /// The intervals of the bucket being filled (fewer than `k`).
    partial: Vec<f64>,
}

impl TrafficHistory {
    /// An empty history for a season of `season` intervals (0 or 1: none).
    pub fn new(season: usize) -> Self {
        let season = season.max(1);
        Self {
            season,
            k: bucket_width(season),
            recent: VecDeque::new(),
            buckets: VecDeque::new(),
            partial: Vec::new(),
        }
    }

    /// The season it was built for, intervals.
    pub fn season(&self) -> usize {
        self.season
    }

    /// Intervals recorded (those averaged into buckets included).
    pub fn len(&self) -> usize {
        self.buckets.len() * self.k + self.partial.len()
    }

    /// True before the first interval.
    pub fn is_empty(&self) -> bool {
        self.recent.is_empty()
    }

    /// The latest interval's traffic.
    pub fn last(&self) -> Option<f64> {
        self.recent.back().copied()
    }

    /// Floats held: bounded by [`RECENT`] plus three seasons of buckets.
    pub fn held(&self) -> usize {
        self.recent.len() + self.buckets.len() + self.partial.len()
    }

    /// Records one interval.
    pub fn push(&mut self, rate: f64) {
        let rate = if rate.is_finite() { rate.max(0.0) } else { 0.0 };
        self.recent.push_back(rate);
        if self.recent.len() > RECENT {
            self.recent.pop_front();
        }
        self.partial.push(rate);
        if self.partial.len() == self.k {
            let mean = self.partial.iter().sum::<f64>() / self.k as f64;
            self.partial.clear();
            self.buckets.push_back(mean);
            if self.buckets.len() > SEASONS_KEPT * self.season_buckets() {
                self.buckets.pop_front();
            }
        }
    }

    /// Buckets per season.
    fn season_buckets(&self) -> usize {
        self.season.div_ceil(self.k)
    }

    /// The traffic of the next `n` intervals: Holt-Winters with the season once two whole
    /// seasons are recorded (on the intervals when they fit in the recent ones, else on the
    /// buckets), a damped trend without it; the last value while fewer than 4 intervals
    /// are known or the fit fails. Never negative.
    pub fn forecast(&self, n: usize) -> Vec<f64> {
        let last = self.last().unwrap_or(0.0);
        if self.recent.len() < 4 {
            return vec![last; n];
        }
        let recent: Vec<f64> = self.recent.iter().copied().collect();
        let seasonal = self.season > 1 && self.len() >= 2 * self.season;
        let out = if seasonal && recent.len() >= 2 * self.season {
            holt_winters(&recent, self.season, n)
        } else if seasonal && self.buckets.len() >= 2 * self.season_buckets() {
            let buckets: Vec<f64> = self.buckets.iter().copied().collect();
            // Interval j from now falls in bucket (partial + j) / k after the last whole one.
            let ahead = (self.partial.len() + n).div_ceil(self.k);
            holt_winters(&buckets, self.season_buckets(), ahead).map(|b| {
                (0..n)
                    .map(|j| b[(self.partial.len() + j) / self.k])
                    .collect()
            })
        } else {
            holt_winters(&recent, 1, n)
        };
        match out {
            Some(f) => f.into_iter().map(|v| v.max(0.0)).collect(),
            None => vec![last; n],
        }
    }
}

/// Additive Holt-Winters (a damped trend when `period` is 1); `None` when the fit fails or
/// gives a non-finite value.
fn holt_winters(history: &[f64], period: usize, n: usize) -> Option<Vec<f64>> {
    let hw = HoltWinters {
        multiplicative: false,
        ..HoltWinters::new(period)
    };
    hw.forecast(history, n)
        .ok()
        .filter(|f| f.iter().all(|v| v.is_finite()))
}

/// Intervals per bucket for a season of `season` intervals: the smallest divisor of the
/// season that leaves at most [`SEASON_BUCKETS`] buckets per season (so that a bucket
/// boundary falls on every season boundary), or the plain quotient rounded up when the
/// season has no such divisor near it.
fn bucket_width(season: usize) -> usize {
    let least = season.div_ceil(SEASON_BUCKETS).max(1);
    (least..=least * 2)
        .find(|k| season.is_multiple_of(*k))
        .unwrap_or(least)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A daily cycle at 5 s intervals (17,280 per day) with a peak 4× the trough.
    fn daily(i: usize) -> f64 {
        let phase = i as f64 / 17_280.0 * std::f64::consts::TAU;
        1000.0 + 600.0 * phase.sin()
    }

    #[test]
    fn buckets_divide_the_season() {
        assert_eq!(bucket_width(17_280), 18);
        assert_eq!(bucket_width(1), 1);
        assert_eq!(bucket_width(1024), 1);
        assert_eq!(bucket_width(2048), 2);
    }

    /// KALE's daily season at the default 5 s interval: after two days the forecast follows
    /// the cycle (the capped history of before kept 4,096 intervals, a quarter of a day,
    /// and could never use the season), and memory stays bounded.
    #[test]
    fn a_daily_season_at_five_second_intervals_is_forecast() {
        let season = 17_280;
        let mut h = TrafficHistory::new(season);
        let days = 2 * season + season / 4;
        for i in 0..days {
            h.push(daily(i));
        }
        assert!(
            h.held() <= RECENT + 3 * SEASON_BUCKETS + SEASON_BUCKETS,
            "{}",
            h.held()
        );
        // Six hours ahead: the traffic climbs from the peak's quarter to the trough's.
        let n = season / 4;
        let f = h.forecast(n);
        let worst = (0..n)
            .map(|j| (f[j] - daily(days + j)).abs())
            .fold(0.0, f64::max);
        assert!(worst < 60.0, "largest error {worst} of a 1,200 swing");
        // A forecast without the season (the last value, or a trend) misses by far more.
        let flat = (0..n)
            .map(|j| (daily(days - 1) - daily(days + j)).abs())
            .fold(0.0, f64::max);
        assert!(flat > 500.0, "{flat}");
    }

    #[test]
    fn a_short_season_is_forecast_on_the_intervals() {
        let mut h = TrafficHistory::new(24);
        for i in 0..200 {
            h.push(if i % 24 < 12 { 100.0 } else { 300.0 });
        }
        let f = h.forecast(24);
        for (j, v) in f.iter().enumerate() {
            let want = if (200 + j) % 24 < 12 { 100.0 } else { 300.0 };
            assert!((v - want).abs() < 20.0, "step {j}: {v} against {want}");
        }
    }

    #[test]
    fn it_survives_a_round_trip_through_json() {
        let mut h = TrafficHistory::new(100);
        for i in 0..1000 {
            h.push(i as f64);
        }
        let back: TrafficHistory =
            serde_json::from_str(&serde_json::to_string(&h).unwrap()).unwrap();
        assert_eq!(back, h);
        assert_eq!(back.forecast(5), h.forecast(5));
    }
}
