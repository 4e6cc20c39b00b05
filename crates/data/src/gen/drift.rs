//! Click behaviour that drifts over days (`gen-data --drift R`).
//!
//! A second teacher, drawn and calibrated like the first, is the taste the users move to.
//! Day `d`'s logit turns from the first teacher's signal towards the second's:
//! `cos θ_d · s₀ + sin θ_d · s₁ + b_d` with `θ_d = min(R·d, 1) · π/2`. The two signals are
//! nearly uncorrelated with equal spread, so the logit keeps its spread while the
//! correlation between days `a` and `b` falls as `cos(θ_a − θ_b)`: with `R = 0.25`, day 4
//! shares nothing with day 0. Each day's bias `b_d` is fitted for the same click rate.

use crate::criteo;
use crate::raw::RawRow;

use super::model::{bias_for_ctr, calibration_rows, Features, Teacher};

/// Seed offset of the second teacher.
const NEXT_TASTE: u64 = 0xD81F_7A57;

/// One day's mix of the two teachers.
#[derive(Debug, Clone, Copy)]
struct DayMix {
    first: f64,
    second: f64,
    bias: f64,
}

/// The per-day click model of a drifting data set.
#[derive(Debug, Clone)]
pub(crate) struct Drift {
    second: Teacher,
    days: Vec<DayMix>,
}

impl Drift {
    /// The drift of `rate` (a quarter turn per `1 / rate` days) over `days` days, around
    /// the calibrated `first` teacher.
    pub(crate) fn new(
        first: &Teacher,
        features: &Features,
        seed: u64,
        days: u32,
        rate: f64,
        calibration: (usize, f64, f64),
    ) -> Self {
        let (n, target_std, ctr) = calibration;
        let mut second = Teacher::new(seed ^ NEXT_TASTE);
        second.calibrate(features, seed, n, target_std, ctr);
        let rows = calibration_rows(features, seed, n);
        let signals: Vec<(f64, f64)> = rows
            .iter()
            .map(|(r, k)| (first.signal(r, k), second.signal(r, k)))
            .collect();
        let days = (0..days)
            .map(|d| {
                let theta = (rate * f64::from(d)).min(1.0) * std::f64::consts::FRAC_PI_2;
                let (sin, cos) = theta.sin_cos();
                let mixed: Vec<f64> = signals.iter().map(|(a, b)| cos * a + sin * b).collect();
                DayMix {
                    first: cos,
                    second: sin,
                    bias: bias_for_ctr(&mixed, ctr),
                }
            })
            .collect();
        Self { second, days }
    }

    /// Day `day`'s logit for a row.
    #[inline]
    pub(crate) fn logit(
        &self,
        first: &Teacher,
        day: u32,
        row: &RawRow,
        ranks: &[u32; criteo::CATEGORICAL],
    ) -> f64 {
        let m = self.days[day as usize];
        let mut logit = m.bias + m.first * first.signal(row, ranks);
        if m.second != 0.0 {
            logit += m.second * self.second.signal(row, ranks);
        }
        logit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::model::sigmoid;
    use crate::gen::rng::Rng;

    /// Labels drawn from day `day`'s model, and the AUC of the first teacher's and of the
    /// day's own probabilities against them.
    fn day_aucs(drift: &Drift, first: &Teacher, features: &Features, day: u32) -> (f64, f64, f64) {
        let mut rng = Rng::new(99 + u64::from(day));
        let (mut first_p, mut own_p, mut labels) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..20_000 {
            let mut row = RawRow::default();
            let mut ranks = [0u32; criteo::CATEGORICAL];
            features.sample(&mut rng, &mut row, &mut ranks);
            let p = sigmoid(drift.logit(first, day, &row, &ranks));
            labels.push(u8::from(rng.f64() < p));
            own_p.push(p as f32);
            first_p.push(sigmoid(first.logit(&row, &ranks)) as f32);
        }
        let ctr = labels.iter().map(|&l| f64::from(l)).sum::<f64>() / labels.len() as f64;
        let auc = |p: &[f32]| crate::gen::exact_auc(p, &labels).unwrap();
        (auc(&first_p), auc(&own_p), ctr)
    }

    /// Day 0 is the first teacher; by day 2 at rate 0.5 its model predicts nothing, while
    /// each day's own model stays as sharp, at the same click rate.
    #[test]
    fn the_click_model_turns_away_from_day_zero() {
        let features = Features::new(0.01);
        let mut first = Teacher::new(5);
        let cal = (
            20_000,
            super::super::TARGET_LOGIT_STD,
            super::super::TARGET_CTR,
        );
        first.calibrate(&features, 5, cal.0, cal.1, cal.2);
        let drift = Drift::new(&first, &features, 5, 3, 0.5, cal);
        let (d0_first, d0_own, d0_ctr) = day_aucs(&drift, &first, &features, 0);
        assert!(
            (d0_first - d0_own).abs() < 1e-9,
            "day 0 is the first teacher"
        );
        let (d1_first, d1_own, _) = day_aucs(&drift, &first, &features, 1);
        let (d2_first, d2_own, d2_ctr) = day_aucs(&drift, &first, &features, 2);
        assert!(d0_own > 0.75 && d2_own > 0.75, "{d0_own} {d2_own}");
        assert!(
            d1_first > 0.6 && d1_first < d0_first - 0.05,
            "half way: {d1_first} vs {d0_first}"
        );
        // Only the dense inputs both teachers read tie day 2 to day 0 (by chance).
        assert!(d2_first < 0.58, "day 2 is another model: {d2_first}");
        assert!((d0_ctr - d2_ctr).abs() < 0.02, "{d0_ctr} {d2_ctr}");
        assert!(d1_own > 0.75, "{d1_own}");
    }
}
