//! DLRover-RM resource-performance model (Eq. 1-6).
//!
//! `T_iter = a_grad m/l_w + a_upd w/(p l_p) + a_sync (M/p)/(B/w) + a_emb m D/p + beta`
//! with all coefficients non-negative and throughput `w m / T_iter`. The four betas of
//! Eq. 2-5 are constants that add up, so only their sum is identifiable; it is reported as
//! `beta` (the paper reports the same sum).

use serde::{Deserialize, Serialize};

use super::{
    errors, fit_time_model, holdout_split, validate_profile, FitReport, ProfileSample,
    ThroughputModel,
};
use crate::alloc::Allocation;
use crate::error::{check_positive, Result};

/// Job constants of the model: they do not change with the allocation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DlroverConstants {
    /// Mini-batch size per worker, `m`.
    pub batch_size: u32,
    /// Dense model size synchronized each step, MB (`M`).
    pub model_size_mb: f64,
    /// Network bandwidth, MB/s (`B`).
    pub bandwidth_mb_s: f64,
    /// Embedding dimensions looked up per sample, summed over tables (`D`).
    pub emb_dim: f64,
}

impl DlroverConstants {
    /// Checks every constant is finite and positive.
    pub fn validate(&self) -> Result<()> {
        check_positive("batch_size", f64::from(self.batch_size))?;
        check_positive("model_size_mb", self.model_size_mb)?;
        check_positive("bandwidth_mb_s", self.bandwidth_mb_s)?;
        check_positive("emb_dim", self.emb_dim)
    }
}

/// Fitted coefficients of Eq. 2-5.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DlroverCoefficients {
    /// Gradient computation (Eq. 2).
    pub alpha_grad: f64,
    /// Parameter update on the PS (Eq. 3).
    pub alpha_upd: f64,
    /// Dense synchronization (Eq. 4).
    pub alpha_sync: f64,
    /// Embedding lookups (Eq. 5).
    pub alpha_emb: f64,
    /// Sum of the four betas.
    pub beta: f64,
}

/// The fitted DLRover-RM throughput model `F` (Eq. 6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DlroverModel {
    /// Job constants.
    pub constants: DlroverConstants,
    /// Fitted coefficients.
    pub coef: DlroverCoefficients,
}

/// Fewest samples [`DlroverModel::fit`] accepts (5 coefficients plus held-out samples).
pub const DLROVER_MIN_SAMPLES: usize = 8;

fn features(c: &DlroverConstants, a: &Allocation, batch: u32) -> Vec<f64> {
    let m = f64::from(batch);
    let w = f64::from(a.workers);
    let p = f64::from(a.ps);
    vec![
        m / a.worker_cpu,
        w / (p * a.ps_cpu),
        (c.model_size_mb / p) / (c.bandwidth_mb_s / w),
        m * c.emb_dim / p,
        1.0,
    ]
}

impl DlroverModel {
    /// Model with given coefficients.
    pub fn new(constants: DlroverConstants, coef: DlroverCoefficients) -> Self {
        Self { constants, coef }
    }

    /// Predicted iteration time, seconds.
    pub fn iter_time(&self, a: &Allocation) -> f64 {
        let f = features(&self.constants, a, self.constants.batch_size);
        let c = &self.coef;
        f[0] * c.alpha_grad + f[1] * c.alpha_upd + f[2] * c.alpha_sync + f[3] * c.alpha_emb + c.beta
    }

    /// Fits the model on `samples` by NNLS under the RMSLE objective; the report's MAE and
    /// MAPE come from a fit on 80% of the samples scored on the other 20%, the returned
    /// model from a fit on all of them.
    pub fn fit(
        constants: DlroverConstants,
        samples: &[ProfileSample],
    ) -> Result<(Self, FitReport)> {
        constants.validate()?;
        validate_profile(samples, DLROVER_MIN_SAMPLES)?;
        let fit_on = |idx: &[usize]| -> Result<(Self, f64)> {
            let phi: Vec<Vec<f64>> = idx
                .iter()
                .map(|&i| features(&constants, &samples[i].alloc, samples[i].batch_size))
                .collect();
            let t: Vec<f64> = idx.iter().map(|&i| samples[i].iter_time_s).collect();
            let fit = fit_time_model(&phi, &t)?;
            let th = &fit.theta;
            let coef = DlroverCoefficients {
                alpha_grad: th[0],
                alpha_upd: th[1],
                alpha_sync: th[2],
                alpha_emb: th[3],
                beta: th[4],
            };
            Ok((Self::new(constants, coef), fit.rmsle))
        };
        let (train, hold) = holdout_split(samples.len());
        let (partial, _) = fit_on(&train)?;
        let pred: Vec<f64> = hold
            .iter()
            .map(|&i| partial.predict_sample(&samples[i]))
            .collect();
        let obs: Vec<f64> = hold.iter().map(|&i| samples[i].throughput()).collect();
        let (mae, mape) = errors(&pred, &obs);
        let all: Vec<usize> = (0..samples.len()).collect();
        let (model, rmsle) = fit_on(&all)?;
        let report = FitReport {
            model: "dlrover-rm".into(),
            mae,
            mape,
            rmsle,
            train_samples: train.len(),
            holdout_samples: hold.len(),
        };
        Ok((model, report))
    }

    fn predict_sample(&self, s: &ProfileSample) -> f64 {
        let f = features(&self.constants, &s.alloc, s.batch_size);
        let c = &self.coef;
        let t = f[0] * c.alpha_grad
            + f[1] * c.alpha_upd
            + f[2] * c.alpha_sync
            + f[3] * c.alpha_emb
            + c.beta;
        f64::from(s.alloc.workers) * f64::from(s.batch_size) / t.max(1e-12)
    }
}

impl ThroughputModel for DlroverModel {
    fn predict(&self, a: &Allocation) -> f64 {
        f64::from(a.workers) * f64::from(self.constants.batch_size) / self.iter_time(a).max(1e-12)
    }
    fn name(&self) -> &'static str {
        "dlrover-rm"
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    pub(crate) fn constants() -> DlroverConstants {
        DlroverConstants {
            batch_size: 512,
            model_size_mb: 40.0,
            bandwidth_mb_s: 1000.0,
            emb_dim: 26.0 * 16.0,
        }
    }

    pub(crate) fn truth() -> DlroverCoefficients {
        DlroverCoefficients {
            alpha_grad: 2.0e-3,
            alpha_upd: 0.02,
            alpha_sync: 0.6,
            alpha_emb: 4.0e-6,
            beta: 0.05,
        }
    }

    pub(crate) fn synthetic(n: usize, noise: f64, seed: u64) -> Vec<ProfileSample> {
        let model = DlroverModel::new(constants(), truth());
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n)
            .map(|_| {
                let alloc = Allocation {
                    workers: rng.random_range(1..=32),
                    ps: rng.random_range(1..=8),
                    worker_cpu: f64::from(rng.random_range(1..=16u32)),
                    ps_cpu: f64::from(rng.random_range(1..=16u32)),
                    worker_mem_gb: 8.0,
                    ps_mem_gb: 16.0,
                };
                let t = model.iter_time(&alloc) * (1.0 + noise * rng.random_range(-1.0..1.0));
                ProfileSample {
                    alloc,
                    batch_size: 512,
                    iter_time_s: t,
                }
            })
            .collect()
    }

    #[test]
    fn fit_recovers_parameters_from_noisy_synthetic_data() {
        let samples = synthetic(200, 0.03, 1);
        let (model, report) = DlroverModel::fit(constants(), &samples).unwrap();
        let t = truth();
        let got = model.coef;
        for (name, a, b) in [
            ("alpha_grad", got.alpha_grad, t.alpha_grad),
            ("alpha_upd", got.alpha_upd, t.alpha_upd),
            ("alpha_sync", got.alpha_sync, t.alpha_sync),
            ("alpha_emb", got.alpha_emb, t.alpha_emb),
            ("beta", got.beta, t.beta),
        ] {
            assert!((a - b).abs() / b < 0.15, "{name}: fitted {a}, true {b}");
        }
        assert!(report.mape < 3.0, "{report:?}");
        assert_eq!(report.holdout_samples, 40);
    }

    #[test]
    fn exact_data_gives_exact_fit() {
        let samples = synthetic(30, 0.0, 2);
        let (model, report) = DlroverModel::fit(constants(), &samples).unwrap();
        assert!(report.mape < 1e-6 && report.rmsle < 1e-8, "{report:?}");
        assert!((model.coef.alpha_sync - 0.6).abs() < 1e-6);
    }

    #[test]
    fn rejects_malformed_profiles() {
        let mut s = synthetic(20, 0.0, 3);
        s[4].iter_time_s = f64::NAN;
        assert!(DlroverModel::fit(constants(), &s).is_err());
        let s = synthetic(5, 0.0, 3);
        let err = DlroverModel::fit(constants(), &s).unwrap_err().to_string();
        assert!(err.contains("too few samples"), "{err}");
    }
}
