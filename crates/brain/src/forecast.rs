//! Traffic forecasters for streaming jobs (KALE §3.2 is pluggable: any forecaster works).
//!
//! [`HoltWinters`] (additive, seasonal; the default, with a daily period) and
//! [`SeasonalNaive`] (repeat the last season; the baseline) implement [`Forecaster`].

use serde::{Deserialize, Serialize};

use crate::error::{BrainError, Result};

/// Predicts the next values of a series from its history.
pub trait Forecaster: Send + Sync {
    /// Forecasts `horizon` values following `history` (oldest first).
    fn forecast(&self, history: &[f64], horizon: usize) -> Result<Vec<f64>>;
    /// Short name for reports.
    fn name(&self) -> &'static str;
}

fn check_history(history: &[f64], period: usize) -> Result<()> {
    if period == 0 {
        return Err(BrainError::invalid("period", "must be >= 1"));
    }
    if let Some((i, v)) = history
        .iter()
        .enumerate()
        .find(|(_, v)| !v.is_finite() || **v < 0.0)
    {
        return Err(BrainError::invalid(
            format!("traffic_history[{i}]"),
            format!("must be finite and >= 0, got {v}"),
        ));
    }
    Ok(())
}

/// Repeats the value one season earlier: `y(t+h) = y(t+h-k*period)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SeasonalNaive {
    /// Season length in samples.
    pub period: usize,
}

impl Forecaster for SeasonalNaive {
    fn forecast(&self, history: &[f64], horizon: usize) -> Result<Vec<f64>> {
        check_history(history, self.period)?;
        if history.len() < self.period {
            return Err(BrainError::Profile(format!(
                "seasonal-naive needs one full season ({} samples), got {}",
                self.period,
                history.len()
            )));
        }
        let last = &history[history.len() - self.period..];
        Ok((0..horizon).map(|h| last[h % self.period]).collect())
    }
    fn name(&self) -> &'static str {
        "seasonal-naive"
    }
}

/// Holt-Winters (multiplicative by default, or additive) with a damped trend (Gardner):
/// level, trend damped by `phi` per step, and seasonal terms, with smoothing factors chosen by a grid search on the
/// one-step-ahead squared error over the history. Damping keeps a day-long horizon from
/// extrapolating a short-lived slope (e.g. the drop into a weekend) without bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HoltWinters {
    /// Season length in samples (288 = one day of 5-minute samples).
    pub period: usize,
    /// Fixed (alpha, beta, gamma, phi); `None` searches a grid.
    pub params: Option<(f64, f64, f64, f64)>,
    /// Multiplicative seasonality (default: traffic swings scale with its level);
    /// `false` for additive.
    pub multiplicative: bool,
}

impl HoltWinters {
    /// Holt-Winters with a searched grid of smoothing factors.
    pub fn new(period: usize) -> Self {
        Self {
            period,
            params: None,
            multiplicative: true,
        }
    }

    /// Runs the recursions; returns (sse, level, trend, seasonal) at the end of history.
    fn run(
        &self,
        y: &[f64],
        (a, b, g, phi): (f64, f64, f64, f64),
        mult: bool,
    ) -> (f64, f64, f64, Vec<f64>) {
        let s = self.period;
        let first: f64 = y[..s].iter().sum::<f64>() / s as f64;
        let second: f64 = y[s..2 * s].iter().sum::<f64>() / s as f64;
        let mut level = first;
        let mut trend = (second - first) / s as f64;
        let mut season: Vec<f64> = if mult {
            y[..s].iter().map(|v| v / first.max(1e-9)).collect()
        } else {
            y[..s].iter().map(|v| v - first).collect()
        };
        let mut sse = 0.0;
        for (t, &v) in y.iter().enumerate().skip(s) {
            let si = t % s;
            let base = level + phi * trend;
            let pred = if mult {
                base * season[si]
            } else {
                base + season[si]
            };
            sse += (v - pred).powi(2);
            let prev_level = level;
            let deseason = if mult {
                v / season[si].max(1e-9)
            } else {
                v - season[si]
            };
            level = a * deseason + (1.0 - a) * base;
            trend = b * (level - prev_level) + (1.0 - b) * phi * trend;
            season[si] = if mult {
                g * (v / level.max(1e-9)) + (1.0 - g) * season[si]
            } else {
                g * (v - level) + (1.0 - g) * season[si]
            };
        }
        (sse, level, trend, season)
    }
}

impl Forecaster for HoltWinters {
    fn forecast(&self, history: &[f64], horizon: usize) -> Result<Vec<f64>> {
        check_history(history, self.period)?;
        let s = self.period;
        if history.len() < 2 * s {
            return Err(BrainError::Profile(format!(
                "Holt-Winters needs two full seasons ({} samples), got {}",
                2 * s,
                history.len()
            )));
        }
        let params = match self.params {
            Some(p) => p,
            None => {
                let mut best = (f64::INFINITY, (0.3, 0.01, 0.3, 0.95));
                let mult = self.multiplicative;
                for a in [0.02, 0.05, 0.1, 0.2, 0.4] {
                    for b in [0.0, 0.005, 0.02] {
                        for g in [0.05, 0.1, 0.2, 0.4] {
                            for phi in [0.9, 0.98] {
                                let (sse, ..) = self.run(history, (a, b, g, phi), mult);
                                if sse < best.0 {
                                    best = (sse, (a, b, g, phi));
                                }
                            }
                        }
                    }
                }
                best.1
            }
        };
        let phi = params.3;
        let (_, level, trend, season) = self.run(history, params, self.multiplicative);
        let n = history.len();
        let mut damp = 0.0;
        let mut pow = 1.0;
        Ok((1..=horizon)
            .map(|h| {
                pow *= phi;
                damp += pow;
                let base = level + damp * trend;
                let si = season[(n + h - 1) % s];
                (if self.multiplicative {
                    base * si
                } else {
                    base + si
                })
                .max(0.0)
            })
            .collect())
    }
    fn name(&self) -> &'static str {
        "holt-winters"
    }
}

/// Mean absolute percentage error (percent), skipping zero observations.
pub fn mape(pred: &[f64], obs: &[f64]) -> f64 {
    let pairs: Vec<(f64, f64)> = pred
        .iter()
        .zip(obs)
        .filter(|(_, o)| **o != 0.0)
        .map(|(p, o)| (*p, *o))
        .collect();
    let n = pairs.len().max(1) as f64;
    pairs.iter().map(|(p, o)| ((p - o) / o).abs()).sum::<f64>() / n * 100.0
}

/// A diurnal traffic trace: `days` days of `per_day` samples with a daily cycle, a weekend
/// dip, a slow trend and multiplicative Gaussian-like noise of relative size `noise`.
/// Used by tests and benchmarks.
pub fn diurnal_trace(days: usize, per_day: usize, base: f64, noise: f64, seed: u64) -> Vec<f64> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..days * per_day)
        .map(|i| {
            let day = i / per_day;
            let x = (i % per_day) as f64 / per_day as f64 * std::f64::consts::TAU;
            let daily = 1.0 + 0.6 * (x - 2.0).sin() + 0.15 * (2.0 * x).sin();
            let weekly = if day % 7 >= 5 { 0.85 } else { 1.0 };
            let trend = 1.0 + 0.01 * i as f64 / per_day as f64;
            // Sum of uniforms: roughly normal with standard deviation `noise`.
            let z: f64 =
                (0..4).map(|_| rng.random_range(-1.0..1.0)).sum::<f64>() * (0.75f64).sqrt() * noise;
            (base * daily * weekly * trend * (1.0 + z)).max(0.0)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seasonal_naive_repeats_last_season() {
        let f = SeasonalNaive { period: 3 }
            .forecast(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 4)
            .unwrap();
        assert_eq!(f, vec![4.0, 5.0, 6.0, 4.0]);
    }

    #[test]
    fn holt_winters_is_exact_on_a_clean_seasonal_series_with_trend() {
        let y: Vec<f64> = (0..60)
            .map(|t| 10.0 + 0.5 * t as f64 + [0.0, 3.0, -1.0, -2.0][t % 4])
            .collect();
        let hw = HoltWinters {
            period: 4,
            params: Some((0.3, 0.1, 0.2, 1.0)),
            multiplicative: false,
        };
        let f = hw.forecast(&y, 8).unwrap();
        for (h, v) in f.iter().enumerate() {
            let t = 60 + h;
            let truth = 10.0 + 0.5 * t as f64 + [0.0, 3.0, -1.0, -2.0][t % 4];
            assert!((v - truth).abs() < 0.5, "h={h}: {v} vs {truth}");
        }
    }

    #[test]
    fn holt_winters_beats_seasonal_naive_on_noisy_diurnal_week() {
        let per_day = 288;
        for (noise, seed) in [(0.05, 1), (0.08, 5), (0.15, 3)] {
            let y = diurnal_trace(7, per_day, 30_000.0, noise, seed);
            let (train, test) = y.split_at(6 * per_day);
            let hw = HoltWinters::new(per_day).forecast(train, per_day).unwrap();
            let sn = SeasonalNaive { period: per_day }
                .forecast(train, per_day)
                .unwrap();
            let (m_hw, m_sn) = (mape(&hw, test), mape(&sn, test));
            println!("7-day diurnal trace, noise {noise}: day-7 MAPE holt-winters {m_hw:.2}%, seasonal-naive {m_sn:.2}%");
            // Seasonal-naive carries two days of noise, Holt-Winters about one.
            assert!(
                m_hw < m_sn,
                "noise {noise}: holt-winters {m_hw} vs seasonal-naive {m_sn}"
            );
            assert!(m_hw < 100.0 * noise * 1.2, "noise {noise}: {m_hw}");
        }
    }

    #[test]
    fn rejects_nan_and_short_history() {
        assert!(HoltWinters::new(4)
            .forecast(&[1.0, f64::NAN, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], 2)
            .is_err());
        assert!(matches!(
            HoltWinters::new(4).forecast(&[1.0; 5], 2),
            Err(BrainError::Profile(_))
        ));
        assert!(SeasonalNaive { period: 4 }
            .forecast(&[1.0, -1.0, 1.0, 1.0], 2)
            .is_err());
    }
}
