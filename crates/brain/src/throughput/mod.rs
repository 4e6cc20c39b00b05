//! Throughput models fitted online from runtime samples.
//!
//! Every model here writes the time of one step as a non-negative combination of features
//! of the allocation, `T = theta . phi(A)`, and the throughput as `scale(A) / T`. They are
//! fitted the same way ([`fit_time_model`]): NNLS on relative errors for a start, then
//! projected Gauss-Newton steps (each an NNLS) on the RMSLE objective, which is what
//! DLRover-RM asks for. Each fit is scored on held-out samples (MAE, MAPE).

pub mod dlrover;
pub mod kale;

use serde::{Deserialize, Serialize};

use crate::alloc::Allocation;
use crate::error::{check_positive, BrainError, Result};
use crate::nnls::{nnls, Matrix};

/// One runtime measurement of a job: the allocation it ran with and its step time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ProfileSample {
    /// Allocation during the measurement.
    pub alloc: Allocation,
    /// Mini-batch size per worker, `m`.
    pub batch_size: u32,
    /// Mean time of one iteration, seconds (`T_iter`).
    pub iter_time_s: f64,
}

impl ProfileSample {
    /// Samples per second of the whole job, `w m / T_iter` (Eq. 1).
    pub fn throughput(&self) -> f64 {
        f64::from(self.alloc.workers) * f64::from(self.batch_size) / self.iter_time_s
    }

    /// Rejects NaN, negative or zero times and sizes, naming the field.
    pub fn validate(&self, index: usize) -> Result<()> {
        let f = format!("samples[{index}]");
        self.alloc.validate(&f)?;
        if self.batch_size == 0 {
            return Err(BrainError::invalid(
                format!("{f}.batch_size"),
                "must be >= 1",
            ));
        }
        check_positive(&format!("{f}.iter_time_s"), self.iter_time_s)?;
        if self.iter_time_s > 86_400.0 {
            return Err(BrainError::invalid(
                format!("{f}.iter_time_s"),
                format!("{} s per iteration is absurd (> 1 day)", self.iter_time_s),
            ));
        }
        Ok(())
    }
}

/// Validates a profile and checks it has at least `min` samples.
pub fn validate_profile(samples: &[ProfileSample], min: usize) -> Result<()> {
    for (i, s) in samples.iter().enumerate() {
        s.validate(i)?;
    }
    if samples.len() < min {
        return Err(BrainError::Profile(format!(
            "too few samples: {} given, at least {min} needed to fit and hold out",
            samples.len()
        )));
    }
    Ok(())
}

/// Quality of a fit, measured on samples the fit did not see.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct FitReport {
    /// Which model.
    pub model: String,
    /// Mean absolute error of predicted throughput on the held-out samples (samples/s).
    pub mae: f64,
    /// Mean absolute percentage error on the held-out samples (percent).
    pub mape: f64,
    /// RMSLE of the final fit on all samples.
    pub rmsle: f64,
    /// Samples used for the held-out fit.
    pub train_samples: usize,
    /// Samples held out.
    pub holdout_samples: usize,
}

/// Result of [`fit_time_model`].
#[derive(Debug, Clone, PartialEq)]
pub struct TimeFit {
    /// Non-negative coefficients.
    pub theta: Vec<f64>,
    /// RMSLE of `theta . phi` against the observed times.
    pub rmsle: f64,
}

fn rmsle(theta: &[f64], phi: &[Vec<f64>], t: &[f64]) -> f64 {
    let n = t.len().max(1) as f64;
    let s: f64 = phi
        .iter()
        .zip(t)
        .map(|(f, ti)| {
            let p: f64 = f.iter().zip(theta).map(|(a, b)| a * b).sum();
            (p.max(1e-300).ln() - ti.ln()).powi(2)
        })
        .sum();
    (s / n).sqrt()
}

/// Fits `t_i ~ theta . phi_i` with `theta >= 0`, minimizing the RMSLE.
///
/// Start: NNLS on relative errors (rows divided by `t_i`), the first-order expansion of the
/// log error. Then projected Gauss-Newton: linearizing `ln(theta . phi_i)` around the
/// current prediction `y_i` gives the NNLS `min sum((phi_i . theta' / y_i) - (1 - ln(y_i /
/// t_i)))^2`, accepted with step halving only when the RMSLE drops.
pub fn fit_time_model(phi: &[Vec<f64>], t: &[f64]) -> Result<TimeFit> {
    if phi.is_empty() || phi.len() != t.len() {
        return Err(BrainError::Internal(format!(
            "fit_time_model: {} feature rows for {} targets",
            phi.len(),
            t.len()
        )));
    }
    if t.iter().any(|v| !(v.is_finite() && *v > 0.0)) {
        return Err(BrainError::Profile(
            "step times must be finite and > 0".into(),
        ));
    }
    let rows: Vec<Vec<f64>> = phi
        .iter()
        .zip(t)
        .map(|(f, ti)| f.iter().map(|v| v / ti).collect())
        .collect();
    let ones = vec![1.0; t.len()];
    let mut theta = nnls(&Matrix::from_rows(&rows)?, &ones)?.x;
    if theta.iter().all(|v| *v == 0.0) {
        return Err(BrainError::Profile(
            "the samples do not determine any model term (all features zero?)".into(),
        ));
    }
    let mut best = rmsle(&theta, phi, t);
    for _ in 0..30 {
        let y: Vec<f64> = phi
            .iter()
            .map(|f| {
                f.iter()
                    .zip(&theta)
                    .map(|(a, b)| a * b)
                    .sum::<f64>()
                    .max(1e-300)
            })
            .collect();
        let rows: Vec<Vec<f64>> = phi
            .iter()
            .zip(&y)
            .map(|(f, yi)| f.iter().map(|v| v / yi).collect())
            .collect();
        let rhs: Vec<f64> = y
            .iter()
            .zip(t)
            .map(|(yi, ti)| 1.0 - (yi / ti).ln())
            .collect();
        let target = nnls(&Matrix::from_rows(&rows)?, &rhs)?.x;
        let mut step = 1.0;
        let mut improved = false;
        while step > 1e-4 {
            let cand: Vec<f64> = theta
                .iter()
                .zip(&target)
                .map(|(a, b)| (a + step * (b - a)).max(0.0))
                .collect();
            let r = rmsle(&cand, phi, t);
            if r < best - 1e-12 {
                theta = cand;
                best = r;
                improved = true;
                break;
            }
            step *= 0.5;
        }
        if !improved {
            break;
        }
    }
    Ok(TimeFit { theta, rmsle: best })
}

/// Splits indices into (train, holdout): every 5th sample is held out.
pub(crate) fn holdout_split(n: usize) -> (Vec<usize>, Vec<usize>) {
    (0..n).partition(|i| i % 5 != 4)
}

/// MAE and MAPE (percent) of predictions against observations.
pub fn errors(pred: &[f64], obs: &[f64]) -> (f64, f64) {
    let n = pred.len().max(1) as f64;
    let mae = pred
        .iter()
        .zip(obs)
        .map(|(p, o)| (p - o).abs())
        .sum::<f64>()
        / n;
    let mape = pred
        .iter()
        .zip(obs)
        .map(|(p, o)| ((p - o) / o).abs())
        .sum::<f64>()
        / n
        * 100.0;
    (mae, mape)
}

/// A fitted model that predicts throughput (samples/s) of an allocation.
pub trait ThroughputModel: Send + Sync {
    /// Predicted samples per second for `alloc`.
    fn predict(&self, alloc: &Allocation) -> f64;
    /// Short name for reports.
    fn name(&self) -> &'static str;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_validation_names_the_field() {
        let good = ProfileSample {
            alloc: Allocation {
                workers: 2,
                ps: 1,
                worker_cpu: 4.0,
                ps_cpu: 4.0,
                worker_mem_gb: 8.0,
                ps_mem_gb: 8.0,
            },
            batch_size: 256,
            iter_time_s: 0.1,
        };
        assert!(validate_profile(&[good; 6], 6).is_ok());
        let mut nan = good;
        nan.iter_time_s = f64::NAN;
        let err = validate_profile(&[good, nan], 1).unwrap_err().to_string();
        assert!(err.contains("samples[1].iter_time_s"), "{err}");
        let mut neg = good;
        neg.iter_time_s = -0.5;
        assert!(validate_profile(&[neg], 1).is_err());
        let mut negcpu = good;
        negcpu.alloc.ps_cpu = -1.0;
        let err = validate_profile(&[negcpu], 1).unwrap_err().to_string();
        assert!(err.contains("ps_cpu"), "{err}");
        let err = validate_profile(&[good; 3], 8).unwrap_err();
        assert!(
            matches!(err, BrainError::Profile(ref m) if m.contains("too few")),
            "{err}"
        );
    }

    #[test]
    fn log_fit_beats_or_matches_relative_start() {
        // Exact data: the fit must reproduce it.
        let theta = [0.5, 2.0, 0.0];
        let phi: Vec<Vec<f64>> = (1..20)
            .map(|i| vec![1.0, 1.0 / f64::from(i), f64::from(i)])
            .collect();
        let t: Vec<f64> = phi
            .iter()
            .map(|f| f.iter().zip(&theta).map(|(a, b)| a * b).sum())
            .collect();
        let fit = fit_time_model(&phi, &t).unwrap();
        assert!(fit.rmsle < 1e-8, "{fit:?}");
        for (a, b) in fit.theta.iter().zip(theta) {
            assert!((a - b).abs() < 1e-6, "{:?}", fit.theta);
        }
    }
}
