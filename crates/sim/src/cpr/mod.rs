//! The CPR emulation (Maeng et al., MLSys 2021, §5.1), on elastrec's own trainer and
//! policies.
//!
//! One process trains the job's DLRM for one pass over its training files, once per
//! strategy, from the same initial model on the same data in the same order. `N_emb`
//! virtual embedding parameter servers are emulated by the stable routing
//! `shard_of(table, row, N_emb)`; the same failures (seeded sample positions and servers)
//! strike every run:
//!
//! * **full recovery** rewinds the embeddings, the dense parameters, the dense optimizer
//!   state and the data position to the last checkpoint and re-trains the lost samples
//!   (counted as lost computation);
//! * **partial recovery** resets only the failed servers' rows (weights and optimizer state)
//!   to their last saved values and carries on (the lost updates count in the PLS).
//!
//! Time is emulated as in the paper: each training sample stands for
//! `job_hours·3600 / S_total` seconds, and the save, load and rescheduling costs are given
//! in emulated seconds, so the overhead of a run is
//! `O_save·(checkpoints, in full-checkpoint units) + (O_load + O_res)·failures +
//! re-trained samples · seconds per sample`, reported as a share of the failure-free job.
//! Intervals come from `elastrec_control::cpr` (Eq. 1-4, the decision) and the rows of
//! CPR-MFU/SSU from `elastrec_checkpoint::priority`, the code the live master and
//! parameter servers run.
//!
//! Simplifications (documented in `docs/cpr.md`): failures strike at fixed *progress*
//! positions, so full recovery's re-training does not bring the next failure closer; every
//! checkpoint is global (all servers save together); MFU/SSU select rows per table, not per
//! server; a failed server's MFU counters and SSU list survive; the dense part is not
//! counted in checkpoint sizes (it is under 2% of the bytes).

mod config;
mod report;
mod run;
mod state;

use std::time::Instant;

use elastrec_control::cpr::decide;
use elastrec_data::{Batch, ReadStats};
use elastrec_job::config::JobConfig;
use elastrec_job::prepare::{ensure_data, resolve_table_rows};
use elastrec_worker::trainer::load_eval_set;
use elastrec_worker::WorkerError;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub use config::{CprEmulationConfig, Strategy};
pub use report::{CprReport, InjectedFailure, Overhead, StrategyResult};

use crate::error::{Result, SimError};
use run::{Plan, Priority, Setup};

/// Runs the failure-free reference and then every configured strategy; see the module
/// docs for what is emulated and how.
pub fn run_cpr_emulation(config: &CprEmulationConfig) -> Result<CprReport> {
    let started = Instant::now();
    config.validate()?;
    let job = &config.job;
    if job.model.dynamic_embeddings.is_some() {
        // The emulated servers' losses are counted over every row of a hashed table.
        return Err(SimError::Config {
            field: "job.model.dynamic_embeddings",
            reason: "the CPR emulation models hashed tables; remove [model.dynamic_embeddings] from the job file for it".into(),
        });
    }
    ensure_data(job, config.progress)?;
    for f in job.train_files().iter().chain(job.eval_files().iter()) {
        if !f.exists() {
            return Err(WorkerError::io(
                f,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "data file not found; check data.dir and data.train/data.eval, or add [data.generate]",
                ),
            )
            .into());
        }
    }
    let train = load_train_set(job)?;
    let mut stats = ReadStats::default();
    let eval = load_eval_set(&job.eval_files(), job, &mut stats)?;
    let table_rows = resolve_table_rows(job);
    let setup = Setup::new(config, train, eval, table_rows.clone());
    if setup.s_total == 0 {
        return Err(SimError::Config {
            field: "job.data.train",
            reason: "the training files hold no sample".into(),
        });
    }
    let injected = inject_failures(config, setup.s_total);
    let costs = config.costs();
    // Eq. 4 counts one server per failure; with several, the interval shrinks accordingly.
    let decision = decide(
        &costs,
        config.job_s(),
        config.n_emb,
        config.target_pls / f64::from(config.failed_ps),
        config.min_benefit,
    );
    let t_full = elastrec_control::cpr::interval_full(costs.o_save_s, costs.t_fail_s);
    let cpr = |priority| Plan {
        recovery: decision.mode,
        t_save_s: Some(decision.t_save_s()),
        priority: match decision.mode {
            elastrec_control::cpr::RecoveryMode::Partial => priority,
            elastrec_control::cpr::RecoveryMode::Full => None,
        },
        inject: true,
    };
    let mut results = Vec::new();
    let runs = std::iter::once(Strategy::NoFailures).chain(config.strategies.iter().copied());
    for strategy in runs {
        use elastrec_control::cpr::RecoveryMode::{Full, Partial};
        let plan = match strategy {
            Strategy::NoFailures => Plan {
                recovery: Full,
                t_save_s: None,
                priority: None,
                inject: false,
            },
            Strategy::Full => Plan {
                recovery: Full,
                t_save_s: Some(t_full),
                priority: None,
                inject: true,
            },
            Strategy::Partial => Plan {
                recovery: Partial,
                t_save_s: Some(t_full),
                priority: None,
                inject: true,
            },
            Strategy::CprVanilla => cpr(None),
            Strategy::CprMfu => cpr(Some(Priority::Mfu)),
            Strategy::CprSsu => cpr(Some(Priority::Ssu)),
        };
        results.push(setup.run(strategy, &plan, &injected)?);
    }
    let total_rows: u64 = table_rows.iter().sum();
    let large_rows: u64 = setup.large.iter().map(|&t| table_rows[t]).sum();
    Ok(CprReport {
        config: config.clone(),
        costs,
        decision,
        train_samples: setup.s_total,
        eval_samples: setup.eval.iter().map(|b| b.len() as u64).sum(),
        emulated_s_per_sample: setup.s_per_sample,
        large_tables: setup.large.clone(),
        large_table_share: large_rows as f64 / total_rows.max(1) as f64,
        table_rows,
        injected,
        teacher_auc: elastrec_data::gen::read_report(&job.data.dir)
            .ok()
            .map(|r| r.teacher_auc),
        results,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// The training files in memory, as batches of the job's batch size, cut at
/// `train.max_samples`.
fn load_train_set(job: &JobConfig) -> Result<Vec<Batch>> {
    let mut stats = ReadStats::default();
    let mut batches = load_eval_set(&job.train_files(), job, &mut stats)?;
    if job.train.max_samples > 0 {
        let mut left = job.train.max_samples;
        batches.retain_mut(|b| {
            let n = (b.len() as u64).min(left);
            left -= n;
            if (n as usize) < b.len() {
                let n = n as usize;
                b.labels.truncate(n);
                b.dense.truncate(n * elastrec_data::criteo::DENSE);
                b.sparse.truncate(n * elastrec_data::criteo::CATEGORICAL);
            }
            n > 0
        });
    }
    Ok(batches)
}

/// `failures` positions over the epoch, sorted, each taking `failed_ps` distinct servers,
/// from `seed`. Stratified: failure `i` of `K` is uniform in the `i`-th of `K` equal
/// segments, so a failure's position is still uniform over the epoch (the paper's nearly
/// constant failure probability) but a run cannot draw all its failures in one corner,
/// which makes one seed representative.
fn inject_failures(config: &CprEmulationConfig, s_total: u64) -> Vec<InjectedFailure> {
    let mut rng = StdRng::seed_from_u64(config.seed);
    let k = u64::from(config.failures);
    let span = s_total.saturating_sub(1).max(1);
    (0..k)
        .map(|i| {
            let lo = 1 + i * span / k;
            let hi = (1 + (i + 1) * span / k).max(lo + 1);
            let at_sample = rng.random_range(lo..hi);
            let mut servers: Vec<u32> = rand::seq::index::sample(
                &mut rng,
                config.n_emb as usize,
                config.failed_ps as usize,
            )
            .into_iter()
            .map(|s| s as u32)
            .collect();
            servers.sort_unstable();
            InjectedFailure { at_sample, servers }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_seeded_stratified_and_on_distinct_servers() {
        let c = CprEmulationConfig {
            failures: 5,
            failed_ps: 3,
            ..CprEmulationConfig::default()
        };
        let a = inject_failures(&c, 10_000);
        assert_eq!(a, inject_failures(&c, 10_000));
        assert_eq!(a.len(), 5);
        assert!(a.windows(2).all(|w| w[0].at_sample <= w[1].at_sample));
        for (i, f) in a.iter().enumerate() {
            // Stratified: the i-th failure lies in the i-th fifth of the epoch.
            let (lo, hi) = (1 + i as u64 * 9_999 / 5, 1 + (i as u64 + 1) * 9_999 / 5);
            assert!(
                f.at_sample >= lo && f.at_sample < hi,
                "{i}: {}",
                f.at_sample
            );
            assert_eq!(f.servers.len(), 3);
            assert!(f.servers.windows(2).all(|w| w[0] < w[1]));
            assert!(f.servers.iter().all(|&s| s < c.n_emb));
        }
    }
}
