//! What a simulated job really does, which no policy sees: its iteration time at every
//! allocation, how busy its nodes are and how its parameter servers' memory grows.
//!
//! The iteration time has the form of DLRover-RM's Eq. 1-5 with coefficients drawn per job
//! (log-normal around base values scaled by the model's size), times a contention factor
//! `1 + c·w` the brain's model does not have (more workers wait longer on each other and on
//! the PS), so the fitted model is close but never exact. Each profile window measures the
//! throughput with multiplicative noise. The PS memory grows with the ids seen:
//! `state · (0.3 + 0.7·sqrt(progress))`, with `state` the table rows times the dimension in
//! fp32 with row-wise optimizer state and hash-table overhead (2.5x the weights), which
//! the brain estimates (3.75x) but does not know.

use elastrec_brain::throughput::dlrover::{DlroverCoefficients, DlroverConstants, DlroverModel};
use elastrec_brain::Allocation;
use rand::Rng;

use super::trace::JobRecord;

/// Worker counts the well-tuned search tries.
const TUNE_WORKERS: [u32; 17] = [1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64];
/// Cores per worker the well-tuned search tries.
const TUNE_WORKER_CPU: [f64; 4] = [2.0, 4.0, 8.0, 16.0];
/// Cores per PS the well-tuned search tries.
const TUNE_PS_CPU: [f64; 3] = [2.0, 4.0, 8.0];
/// Memory of one worker, GiB (every policy asks for it).
pub const WORKER_MEM_GB: f64 = 8.0;

/// The hidden performance of one job.
#[derive(Debug, Clone)]
pub struct Truth {
    /// Eq. 1-5 with the job's true coefficients.
    pub model: DlroverModel,
    /// Contention (`c` of `1 + c·w²`).
    pub contention: f64,
    /// PS memory the whole model state takes at the end, GiB.
    pub state_gb: f64,
    /// Relative noise of one measured window.
    pub noise: f64,
}

fn log_normal(rng: &mut impl Rng, sigma: f64) -> f64 {
    // Sum of 4 uniforms: close enough to normal for a spread of coefficients.
    let z: f64 = (0..4).map(|_| rng.random_range(-1.0..1.0)).sum::<f64>() * 0.75f64.sqrt();
    (z * sigma).exp()
}

impl Truth {
    /// The truth of `rec`, drawn from `rng` (seeded per job: the same job has the same
    /// truth under every policy).
    pub fn of(rec: &JobRecord, rng: &mut impl Rng) -> Self {
        let constants = DlroverConstants {
            batch_size: rec.batch_size,
            model_size_mb: (rec.dense_params as f64 * 4.0 / 1e6).max(1e-3),
            bandwidth_mb_s: 1250.0,
            emb_dim: f64::from(rec.tables) * f64::from(rec.emb_dim),
        };
        let dense = (rec.dense_params as f64 / 1e6).max(0.05).sqrt();
        let coef = DlroverCoefficients {
            alpha_grad: 3e-4 * dense * log_normal(rng, 0.3),
            alpha_upd: 4e-3 * log_normal(rng, 0.3),
            alpha_sync: 1.0 * log_normal(rng, 0.3),
            alpha_emb: 1.5e-7 * log_normal(rng, 0.3),
            beta: 5e-3 * log_normal(rng, 0.3),
        };
        let weights = f64::from(rec.tables) * rec.rows_per_table as f64 * f64::from(rec.emb_dim)
            + rec.dense_params as f64;
        let state_gb = weights * 4.0 * 2.5 / f64::from(1u32 << 30) * log_normal(rng, 0.25);
        Self {
            model: DlroverModel::new(constants, coef),
            contention: 1e-3 * log_normal(rng, 0.5),
            state_gb: state_gb.max(0.5),
            noise: 0.03,
        }
    }

    /// Seconds of one iteration at `a`.
    pub fn iter_time(&self, a: &Allocation) -> f64 {
        self.model.iter_time(a) * (1.0 + self.contention * f64::from(a.workers).powi(2))
    }

    /// Samples per second at `a`.
    pub fn throughput(&self, a: &Allocation) -> f64 {
        f64::from(a.workers) * f64::from(self.model.constants.batch_size) / self.iter_time(a)
    }

    /// Share of the time a worker's and a PS's cores compute at `a` (the rest they wait).
    pub fn busy(&self, a: &Allocation) -> (f64, f64) {
        let c = &self.model.coef;
        let k = &self.model.constants;
        let m = f64::from(k.batch_size);
        let (w, p) = (f64::from(a.workers), f64::from(a.ps));
        let t = self.iter_time(a);
        let grad = c.alpha_grad * m / a.worker_cpu;
        let ps = c.alpha_upd * w / (p * a.ps_cpu) + c.alpha_emb * m * k.emb_dim / p;
        ((grad / t).min(1.0), (ps / t).min(1.0))
    }

    /// PS memory all servers hold together at `progress` (0..1), GiB.
    pub fn ps_mem_gb(&self, progress: f64) -> f64 {
        self.state_gb * (0.3 + 0.7 * progress.clamp(0.0, 1.0).sqrt())
    }

    /// The well-tuned static configuration, as a person finds it by re-running the job:
    /// the cheapest allocation (fewest cores) within 5% of the best throughput over a grid
    /// of worker and PS counts and cores, with PS memory for the final state plus 30%.
    pub fn tuned(&self) -> Allocation {
        let mut all = Vec::with_capacity(TUNE_WORKERS.len() * 32 * 12);
        for &workers in &TUNE_WORKERS {
            for ps in 1..=32u32 {
                let ps_mem_gb = ((self.state_gb * 1.3 / f64::from(ps)).ceil()).max(2.0);
                // Too few PS to hold the model (the largest count always counts, capped).
                if ps_mem_gb > 256.0 && ps < 32 {
                    continue;
                }
                let ps_mem_gb = ps_mem_gb.min(256.0);
                for &worker_cpu in &TUNE_WORKER_CPU {
                    for &ps_cpu in &TUNE_PS_CPU {
                        let a = Allocation {
                            workers,
                            ps,
                            worker_cpu,
                            ps_cpu,
                            worker_mem_gb: WORKER_MEM_GB,
                            ps_mem_gb,
                        };
                        all.push((self.throughput(&a), a));
                    }
                }
            }
        }
        let best = all.iter().map(|x| x.0).fold(0.0, f64::max);
        all.into_iter()
            .filter(|x| x.0 >= 0.95 * best)
            .min_by(|x, y| {
                x.1.total_cpu()
                    .total_cmp(&y.1.total_cpu())
                    .then(y.0.total_cmp(&x.0))
            })
            .map(|x| x.1)
            .expect("the grid always holds the best allocation")
    }
}
