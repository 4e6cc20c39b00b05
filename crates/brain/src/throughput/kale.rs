//! KALE resource-throughput models (Eq. 5, 6, 8, 9).
//!
//! Synchronous: `f(w, p) = M / (theta . phi)`, with `phi = [1, 1/w, 1/p, w/p, 1/(wp), p, w]`
//! (Eq. 5) or, at a fixed w/p ratio, `phi = [1, 1/w, 1/w^2, w]` (Eq. 6). The paper folds the
//! global batch `M` into theta in Eq. 5; its worked example multiplies by it, so `M` is
//! kept explicit here (`M = 1` gives the paper's form). Asynchronous: `f(w, p) = w / (theta
//! . phi)` with `phi = [1, 1/p, p, w]` (Eq. 8) or `[1, 1/w, w]` (Eq. 9).

use serde::{Deserialize, Serialize};

use super::{errors, fit_time_model, holdout_split, FitReport};
use crate::alloc::Allocation;
use crate::error::{check_positive, BrainError, Result};

/// Which of KALE's four models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KaleVariant {
    /// Eq. 5: synchronous, workers and PS.
    SyncWp,
    /// Eq. 6: synchronous, fixed w/p ratio.
    SyncW,
    /// Eq. 8: asynchronous, workers and PS.
    AsyncWp,
    /// Eq. 9: asynchronous, fixed w/p ratio.
    AsyncW,
}

impl KaleVariant {
    /// Number of coefficients.
    pub fn len(self) -> usize {
        match self {
            Self::SyncWp => 7,
            Self::SyncW | Self::AsyncWp => 4,
            Self::AsyncW => 3,
        }
    }

    /// Always false (every variant has coefficients); for clippy's `len` convention.
    pub fn is_empty(self) -> bool {
        false
    }

    fn features(self, w: f64, p: f64) -> Vec<f64> {
        match self {
            Self::SyncWp => vec![1.0, 1.0 / w, 1.0 / p, w / p, 1.0 / (w * p), p, w],
            Self::SyncW => vec![1.0, 1.0 / w, 1.0 / (w * w), w],
            Self::AsyncWp => vec![1.0, 1.0 / p, p, w],
            Self::AsyncW => vec![1.0, 1.0 / w, w],
        }
    }

    fn is_sync(self) -> bool {
        matches!(self, Self::SyncWp | Self::SyncW)
    }
}

/// One observation `(w, p, throughput)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct KaleSample {
    /// Workers.
    pub workers: u32,
    /// Parameter servers.
    pub ps: u32,
    /// Observed samples per second.
    pub throughput: f64,
}

/// A KALE model with its coefficients.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KaleModel {
    /// Which equation.
    pub variant: KaleVariant,
    /// Non-negative coefficients theta_0..
    pub theta: Vec<f64>,
    /// Global batch size `M` (synchronous models only).
    pub global_batch: f64,
}

impl KaleModel {
    /// A model with given coefficients.
    pub fn new(variant: KaleVariant, theta: Vec<f64>, global_batch: f64) -> Result<Self> {
        if theta.len() != variant.len() {
            return Err(BrainError::invalid(
                "theta",
                format!(
                    "{variant:?} needs {} coefficients, got {}",
                    variant.len(),
                    theta.len()
                ),
            ));
        }
        for (i, t) in theta.iter().enumerate() {
            crate::error::check_non_negative(&format!("theta[{i}]"), *t)?;
        }
        check_positive("global_batch", global_batch)?;
        Ok(Self {
            variant,
            theta,
            global_batch,
        })
    }

    /// Throughput with `w` workers and `p` PS (p ignored by the fixed-ratio variants).
    pub fn throughput(&self, w: u32, p: u32) -> f64 {
        let (wf, pf) = (f64::from(w.max(1)), f64::from(p.max(1)));
        let denom: f64 = self
            .variant
            .features(wf, pf)
            .iter()
            .zip(&self.theta)
            .map(|(a, b)| a * b)
            .sum();
        let num = if self.variant.is_sync() {
            self.global_batch
        } else {
            wf
        };
        if denom <= 0.0 {
            return f64::INFINITY;
        }
        num / denom
    }

    /// Fits the variant on samples (NNLS, RMSLE objective), with held-out MAE/MAPE.
    pub fn fit(
        variant: KaleVariant,
        global_batch: f64,
        samples: &[KaleSample],
    ) -> Result<(Self, FitReport)> {
        check_positive("global_batch", global_batch)?;
        for (i, s) in samples.iter().enumerate() {
            if s.workers == 0 || s.ps == 0 {
                return Err(BrainError::invalid(
                    format!("samples[{i}]"),
                    "workers and ps must be >= 1",
                ));
            }
            check_positive(&format!("samples[{i}].throughput"), s.throughput)?;
        }
        let min = variant.len() + 3;
        if samples.len() < min {
            return Err(BrainError::Profile(format!(
                "too few samples: {} given, at least {min} needed for {variant:?}",
                samples.len()
            )));
        }
        let fit_on = |idx: &[usize]| -> Result<(Self, f64)> {
            let phi: Vec<Vec<f64>> = idx
                .iter()
                .map(|&i| variant.features(f64::from(samples[i].workers), f64::from(samples[i].ps)))
                .collect();
            let t: Vec<f64> = idx
                .iter()
                .map(|&i| {
                    let s = &samples[i];
                    let num = if variant.is_sync() {
                        global_batch
                    } else {
                        f64::from(s.workers)
                    };
                    num / s.throughput
                })
                .collect();
            let fit = fit_time_model(&phi, &t)?;
            Ok((Self::new(variant, fit.theta, global_batch)?, fit.rmsle))
        };
        let (train, hold) = holdout_split(samples.len());
        let (partial, _) = fit_on(&train)?;
        let pred: Vec<f64> = hold
            .iter()
            .map(|&i| partial.throughput(samples[i].workers, samples[i].ps))
            .collect();
        let obs: Vec<f64> = hold.iter().map(|&i| samples[i].throughput).collect();
        let (mae, mape) = errors(&pred, &obs);
        let all: Vec<usize> = (0..samples.len()).collect();
        let (model, rmsle) = fit_on(&all)?;
        Ok((
            model,
            FitReport {
                model: format!("kale-{variant:?}").to_lowercase(),
                mae,
                mape,
                rmsle,
                train_samples: train.len(),
                holdout_samples: hold.len(),
            },
        ))
    }
}

impl super::ThroughputModel for KaleModel {
    fn predict(&self, a: &Allocation) -> f64 {
        self.throughput(a.workers, a.ps)
    }
    fn name(&self) -> &'static str {
        "kale"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn paper_example() -> KaleModel {
        KaleModel::new(
            KaleVariant::SyncW,
            vec![0.00035, 2.5726, 0.9824, 0.02786],
            16_384.0,
        )
        .unwrap()
    }

    #[test]
    fn paper_worked_example_throughput_at_ten_workers() {
        // KALE §3.4.1: f_sync(10) = 30,007.3 samples/s.
        let f = paper_example().throughput(10, 10);
        assert!((f - 30_007.3).abs() / 30_007.3 < 5e-4, "f(10) = {f}");
        assert!(paper_example().throughput(9, 9) < 30_000.0);
    }

    fn recover(variant: KaleVariant, truth: &[f64], batch: f64) {
        let model = KaleModel::new(variant, truth.to_vec(), batch).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let samples: Vec<KaleSample> = (0..150)
            .map(|_| {
                let w = rng.random_range(1..=40);
                let p = rng.random_range(1..=20);
                let f = model.throughput(w, p) * (1.0 + 0.02 * rng.random_range(-1.0..1.0));
                KaleSample {
                    workers: w,
                    ps: p,
                    throughput: f,
                }
            })
            .collect();
        let (fit, report) = KaleModel::fit(variant, batch, &samples).unwrap();
        // A coefficient whose term is a sizeable part of the step time must be recovered
        // within 15%; a negligible one (e.g. the paper's theta_0 = 0.00035) only has to
        // stay negligible: its error may move the step time by at most 3%.
        let phi: Vec<Vec<f64>> = samples
            .iter()
            .map(|s| variant.features(f64::from(s.workers), f64::from(s.ps)))
            .collect();
        let mean_t = phi
            .iter()
            .map(|f| f.iter().zip(truth).map(|(a, b)| a * b).sum::<f64>())
            .sum::<f64>()
            / phi.len() as f64;
        for (i, (a, b)) in fit.theta.iter().zip(truth).enumerate() {
            let max_phi = phi.iter().map(|f| f[i]).fold(0.0, f64::max);
            if max_phi * b > 0.1 * mean_t {
                assert!(
                    (a - b).abs() <= 0.15 * b,
                    "{variant:?} theta[{i}]: {a} vs {b}"
                );
            } else {
                assert!(
                    (a - b).abs() * max_phi <= 0.03 * mean_t,
                    "{variant:?} theta[{i}]: {a} vs {b}"
                );
            }
        }
        for w in [1, 5, 10, 20, 40] {
            let (f, t) = (fit.throughput(w, w / 2 + 1), model.throughput(w, w / 2 + 1));
            assert!((f - t).abs() / t < 0.03, "{variant:?} w={w}: {f} vs {t}");
        }
        assert!(report.mape < 2.5, "{variant:?}: {report:?}");
    }

    #[test]
    fn fits_recover_all_four_variants() {
        recover(
            KaleVariant::SyncW,
            &[0.00035, 2.5726, 0.9824, 0.02786],
            16_384.0,
        );
        recover(
            KaleVariant::SyncWp,
            &[0.002, 3.0, 1.0, 0.05, 0.5, 0.01, 0.02],
            16_384.0,
        );
        recover(KaleVariant::AsyncWp, &[0.01, 0.05, 0.0005, 0.0004], 1.0);
        recover(KaleVariant::AsyncW, &[0.01, 0.004, 0.0003], 1.0);
    }

    #[test]
    fn rejects_bad_samples() {
        let s = vec![
            KaleSample {
                workers: 1,
                ps: 1,
                throughput: -3.0
            };
            10
        ];
        assert!(KaleModel::fit(KaleVariant::AsyncW, 1.0, &s).is_err());
        let s = vec![
            KaleSample {
                workers: 1,
                ps: 1,
                throughput: 3.0
            };
            3
        ];
        assert!(matches!(
            KaleModel::fit(KaleVariant::AsyncW, 1.0, &s),
            Err(BrainError::Profile(_))
        ));
    }
}
