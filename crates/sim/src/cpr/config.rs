//! Settings of the CPR emulation, with defaults projected from the CPR paper.

use std::path::PathBuf;

use elastrec_control::cpr::CprCosts;
use elastrec_job::config::{GenerateConfig, JobConfig};
use serde::{Deserialize, Serialize};

use crate::error::{Result, SimError};

/// A way of handling parameter-server failures, compared side by side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// The reference: no failure is injected and nothing is saved.
    NoFailures,
    /// Full recovery at the interval minimizing Eq. 1, `sqrt(2·O_save·T_fail)`.
    Full,
    /// Partial recovery at full recovery's interval (the naive baseline).
    Partial,
    /// CPR: the interval from the target PLS (Eq. 4), partial recovery when Eq. 2 beats Eq. 1
    /// by the required margin, else full recovery.
    CprVanilla,
    /// CPR with the most-frequently-used `r·N` rows of the large tables saved every
    /// `r·T_save` (access counters).
    CprMfu,
    /// CPR with a sub-sampled list of used rows of the large tables (at most `r·N`) saved
    /// every `r·T_save`.
    CprSsu,
}

impl Strategy {
    /// Every strategy with failures, in the paper's order.
    pub const WITH_FAILURES: [Strategy; 5] = [
        Strategy::Full,
        Strategy::Partial,
        Strategy::CprVanilla,
        Strategy::CprMfu,
        Strategy::CprSsu,
    ];

    /// The name used in tables.
    pub fn label(self) -> &'static str {
        match self {
            Self::NoFailures => "no failures",
            Self::Full => "full recovery",
            Self::Partial => "partial recovery",
            Self::CprVanilla => "CPR-vanilla",
            Self::CprMfu => "CPR-MFU",
            Self::CprSsu => "CPR-SSU",
        }
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// Everything the CPR emulation needs. Times are *emulated* seconds: the real run lasts
/// seconds to minutes, and every sample stands for `job_hours·3600 / S_total` seconds of the
/// emulated job, the way the paper projects its production cluster onto a small run.
///
/// The default costs are derived from the paper's emulation results for Criteo Kaggle
/// (§6.1: full recovery 8.5% overhead, partial recovery at the same interval 4.4%, 2
/// failures in a 56-hour job): solving Eq. 1 and Eq. 2 at the optimal interval gives
/// `T_save,full ≈ 2.3 h`, hence `O_save ≈ 340 s`, and `O_load + O_res ≈ 300 s`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CprEmulationConfig {
    /// The training job: data (generated when missing and `[data.generate]` is set),
    /// model, optimizers and batch size. One pass over the training files is emulated
    /// (`train.epochs` is ignored); `train.max_samples` is honoured.
    pub job: JobConfig,
    /// Length of the emulated job, hours (the paper: 56).
    pub job_hours: f64,
    /// Failures injected at seeded random sample positions, one uniform in each of
    /// `failures` equal segments of the epoch (the paper: 2 in 56 h).
    /// `T_fail = job_hours / failures`.
    pub failures: u32,
    /// Virtual embedding parameter servers `N_emb`; row `r` of table `t` lives on
    /// `elastrec_embedding::shard_of(t, r, N_emb)`.
    pub n_emb: u32,
    /// Servers lost per failure (a failure clears `failed_ps / n_emb` of the embeddings).
    pub failed_ps: u32,
    /// Emulated seconds to save one full checkpoint (`O_save`); a partial save costs its
    /// share of the rows.
    pub o_save_s: f64,
    /// Emulated seconds to load a checkpoint after a failure (`O_load`).
    pub o_load_s: f64,
    /// Emulated seconds to reschedule the failed servers (`O_res`).
    pub o_res_s: f64,
    /// The PLS CPR may lose (the paper: 0.1).
    pub target_pls: f64,
    /// CPR recovers partially only when that saves more than this fraction of full
    /// recovery's expected overhead.
    pub min_benefit: f64,
    /// `r` of CPR-MFU/SSU: `r·N` rows of each large table every `r·T_save`; `1/r` must be
    /// a whole number (the paper: 0.125).
    pub priority_ratio: f64,
    /// Large tables are the fewest largest that hold this share of all rows; the others are
    /// saved whole every `T_save`. The paper's 7 of Criteo's 26 tables hold 99.6%; on the
    /// quickstart-shaped data (small tables padded to 1024 rows) the default 0.98 selects
    /// the same number, 7.
    pub large_table_coverage: f64,
    /// CPR-SSU records every this-many-th training step's rows (the paper: 2).
    pub ssu_sample_period: u32,
    /// Seed of the failure positions, the failed servers and SSU's evictions.
    pub seed: u64,
    /// Strategies run after the failure-free reference, in this order.
    pub strategies: Vec<Strategy>,
    /// Show progress bars on stderr.
    pub progress: bool,
}

impl Default for CprEmulationConfig {
    fn default() -> Self {
        Self {
            job: Self::generated_job(200_000, "data/cpr-200000".into()),
            job_hours: 56.0,
            failures: 2,
            n_emb: 8,
            failed_ps: 1,
            o_save_s: 340.0,
            o_load_s: 150.0,
            o_res_s: 150.0,
            target_pls: 0.1,
            min_benefit: 0.1,
            priority_ratio: 0.125,
            large_table_coverage: 0.98,
            ssu_sample_period: 2,
            seed: 7,
            strategies: Strategy::WITH_FAILURES.to_vec(),
            progress: true,
        }
    }
}

impl CprEmulationConfig {
    /// A job on Criteo-shaped data of `rows` rows in 7 day files under `dir` (generated
    /// with seed 42 and the quickstart's cardinality scale when missing): days 0-5 train,
    /// day 6 is held out; default model and optimizers, no model file.
    pub fn generated_job(rows: u64, dir: PathBuf) -> JobConfig {
        let mut job = JobConfig::default();
        job.data.dir = dir;
        job.data.generate = Some(GenerateConfig {
            rows,
            ..GenerateConfig::default()
        });
        job.output.save_model = false;
        job
    }

    /// Length of the emulated job, seconds.
    pub fn job_s(&self) -> f64 {
        self.job_hours * 3600.0
    }

    /// The costs handed to the CPR policy: `T_fail = job / failures` (infinite without
    /// failures).
    pub fn costs(&self) -> CprCosts {
        CprCosts {
            o_save_s: self.o_save_s,
            o_load_s: self.o_load_s,
            o_res_s: self.o_res_s,
            t_fail_s: if self.failures == 0 {
                f64::INFINITY
            } else {
                self.job_s() / f64::from(self.failures)
            },
        }
    }

    /// `1/r`: prioritized saves per `T_save`.
    pub fn priority_ticks(&self) -> u64 {
        (1.0 / self.priority_ratio).round().max(1.0) as u64
    }

    /// Range checks; the error names the setting.
    pub fn validate(&self) -> Result<()> {
        let bad = |field, reason: String| Err(SimError::Config { field, reason });
        let positive = |v: f64| v.is_finite() && v > 0.0;
        let non_negative = |v: f64| v.is_finite() && v >= 0.0;
        if !positive(self.job_hours) {
            return bad(
                "job_hours",
                format!("must be positive, got {}", self.job_hours),
            );
        }
        if self.n_emb == 0 {
            return bad("n_emb", "needs at least one parameter server".into());
        }
        if self.failed_ps == 0 || self.failed_ps > self.n_emb {
            return bad(
                "failed_ps",
                format!(
                    "must be between 1 and n_emb ({}), got {}",
                    self.n_emb, self.failed_ps
                ),
            );
        }
        for (field, v) in [
            ("o_save_s", self.o_save_s),
            ("o_load_s", self.o_load_s),
            ("o_res_s", self.o_res_s),
        ] {
            if !non_negative(v) {
                return bad(field, format!("must be a non-negative number, got {v}"));
            }
        }
        if !positive(self.o_save_s) {
            return bad("o_save_s", "must be positive (it sets the interval)".into());
        }
        if !positive(self.target_pls) {
            return bad(
                "target_pls",
                format!("must be positive, got {}", self.target_pls),
            );
        }
        if !non_negative(self.min_benefit) || self.min_benefit >= 1.0 {
            return bad(
                "min_benefit",
                format!("must be in [0, 1), got {}", self.min_benefit),
            );
        }
        let r = self.priority_ratio;
        let inv = 1.0 / r;
        if !(positive(r) && r <= 1.0 && (inv - inv.round()).abs() < 1e-6) {
            return bad(
                "priority_ratio",
                format!("must be 1/m for a whole m ≥ 1 (e.g. 0.125), got {r}"),
            );
        }
        if !positive(self.large_table_coverage) || self.large_table_coverage > 1.0 {
            return bad(
                "large_table_coverage",
                format!("must be in (0, 1], got {}", self.large_table_coverage),
            );
        }
        if self.ssu_sample_period == 0 {
            return bad("ssu_sample_period", "must be at least 1".into());
        }
        if self.job.data.eval.is_empty() {
            return bad(
                "job.data.eval",
                "names no held-out file: the emulation reports the final AUC".into(),
            );
        }
        if self.strategies.contains(&Strategy::NoFailures) {
            return bad(
                "strategies",
                "the failure-free reference always runs first; list only strategies with failures"
                    .into(),
            );
        }
        self.job
            .validate(std::path::Path::new("<emulation job>"))
            .map_err(|e| SimError::Config {
                field: "job",
                reason: e.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use elastrec_control::cpr::{interval_full, overhead_full, overhead_partial};

    #[test]
    fn defaults_reproduce_the_papers_overheads() {
        let c = CprEmulationConfig::default();
        c.validate().unwrap();
        let costs = c.costs();
        assert_eq!(costs.t_fail_s, 28.0 * 3600.0);
        let t = interval_full(costs.o_save_s, costs.t_fail_s);
        assert!((t / 3600.0 - 2.3).abs() < 0.05, "T_save,full {t}");
        // Kaggle in Fig. 7: 8.5% (full) and 4.4% (partial at the same interval).
        let full = overhead_full(&costs, c.job_s(), t) / c.job_s();
        let part = overhead_partial(&costs, c.job_s(), t) / c.job_s();
        assert!((full - 0.085).abs() < 0.002, "{full}");
        assert!((part - 0.044).abs() < 0.002, "{part}");
        assert_eq!(c.priority_ticks(), 8);
    }

    #[test]
    fn validation_names_the_setting() {
        let check = |f: fn(&mut CprEmulationConfig), field: &str| {
            let mut c = CprEmulationConfig::default();
            f(&mut c);
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        };
        check(|c| c.n_emb = 0, "n_emb");
        check(|c| c.failed_ps = 9, "failed_ps");
        check(|c| c.priority_ratio = 0.3, "priority_ratio");
        check(|c| c.target_pls = 0.0, "target_pls");
        check(|c| c.o_load_s = -1.0, "o_load_s");
        check(|c| c.job.data.eval.clear(), "job.data.eval");
        check(|c| c.strategies.push(Strategy::NoFailures), "strategies");
    }
}
