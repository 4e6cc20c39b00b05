//! `elastrec simulate cluster`: many jobs on a simulated cluster, scheduled by elastrec's
//! live policies and by the baselines the papers compare with, on the same trace.
//!
//! - [`trace`]: jobs generated from documented distributions or read from a CSV;
//! - [`truth`]: what a job really does (throughput, busy cores, memory growth), hidden
//!   from every policy;
//! - [`nodes`]: nodes and best-fit placement of pods;
//! - [`batch`]: batch jobs (JCT, utilization) under elastrec (the brain's and master's
//!   policy code) or a baseline ([`baselines`]);
//! - [`online`]: streams under KALE or the HPA-like rule (the master's `OnlineScaler`), or
//!   static worker counts;
//! - [`report`]: the tables in the papers' layout, JSON and CSV.

pub mod baselines;
pub mod batch;
pub mod nodes;
pub mod online;
pub mod report;
pub mod trace;
pub mod truth;

use rand::SeedableRng;
use serde::Serialize;

pub use report::{run_cluster, ClusterReport};

/// What is wrong with a simulation's input.
#[derive(Debug, thiserror::Error)]
pub enum SimSetupError {
    /// A trace file (or line) is malformed.
    #[error("trace {at}: {reason}")]
    Trace {
        /// `file:line`.
        at: String,
        /// What is wrong.
        reason: String,
    },
    /// A setting is out of range.
    #[error("`--{field}`: {reason}")]
    Setting {
        /// The flag.
        field: &'static str,
        /// What is allowed.
        reason: String,
    },
}

/// How batch jobs get their resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum BatchPolicy {
    /// elastrec: warm start, the master's autoscaler, the brain's NNLS fit, NSGA-II,
    /// shared greedy and OOM prevention, CPR recovery and intervals, dynamic sharding.
    Elastrec,
    /// Elastic scheduling: a fixed step of workers at a time while it pays.
    Es,
    /// Optimus: its own speed model, one worker or PS at a time.
    Optimus,
    /// The configuration each user asked for, unchanged.
    StaticUser,
    /// The well-tuned configuration (found by re-running the job; an oracle).
    StaticTuned,
    /// The well-tuned configuration with a quarter of the workers and half the PS.
    StaticUnder,
    /// The well-tuned configuration with 3x the workers and 2x the PS.
    StaticOver,
}

impl BatchPolicy {
    /// The name used on the command line and in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Self::Elastrec => "elastrec",
            Self::Es => "es",
            Self::Optimus => "optimus",
            Self::StaticUser => "static-user",
            Self::StaticTuned => "static-tuned",
            Self::StaticUnder => "static-under",
            Self::StaticOver => "static-over",
        }
    }
}

/// How online jobs get their workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum OnlinePolicy {
    /// KALE: forecast, throughput model, fewest workers, stabilization, fallback.
    Kale,
    /// Reactive: one worker more above 80% utilization or half the SLO's lag, one less
    /// when idle twice.
    Hpa,
    /// Enough workers for the peak, always (KALE's "adequate resources").
    Adequate,
    /// The workers each user asked for, unchanged.
    StaticUser,
}

impl OnlinePolicy {
    /// The name used on the command line and in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Self::Kale => "kale",
            Self::Hpa => "hpa",
            Self::Adequate => "adequate",
            Self::StaticUser => "static-user",
        }
    }
}

/// Settings of one simulation (the CLI's flags; defaults documented there and in
/// `docs/simulator.md`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimSettings {
    /// Nodes, their cores and memory.
    pub nodes: u32,
    /// See `nodes`.
    pub node_cpu: f64,
    /// See `nodes`.
    pub node_mem_gb: f64,
    /// Seconds between two control cycles (masters observe, autoscalers act).
    pub control_s: f64,
    /// Seconds between two plans of one job (elastrec's `autoscale.interval_s`; the
    /// baselines decide as often).
    pub plan_interval_s: f64,
    /// Node failures per pod-hour.
    pub failures_per_pod_hour: f64,
    /// Share of jobs with one slow worker, and its speed relative to the others.
    pub straggler_prob: f64,
    /// See `straggler_prob`.
    pub straggler_factor: f64,
    /// Seconds a new worker needs before it trains.
    pub worker_start_s: f64,
    /// Seconds a change of the PS set pauses training (elastrec, ES).
    pub ps_migration_s: f64,
    /// Seconds a checkpoint-restart takes (baselines' scaling, every failure without
    /// elastrec's recovery, OOM).
    pub restart_s: f64,
    /// Checkpoint interval of the baselines, seconds.
    pub baseline_ckpt_s: f64,
    /// CPR's target portion of lost samples.
    pub target_pls: f64,
    /// Online: lag SLO and the downtime of one scaling, seconds.
    pub slo_lag_s: f64,
    /// See `slo_lag_s`.
    pub rescale_s: f64,
    /// Stop simulating after this many hours.
    pub max_hours: f64,
    /// Seed of everything random.
    pub seed: u64,
    /// elastrec's `autoscale.growth_efficiency` (its default: the live master's).
    pub growth_efficiency: f64,
}

impl Default for SimSettings {
    fn default() -> Self {
        Self {
            nodes: 100,
            node_cpu: 64.0,
            node_mem_gb: 256.0,
            control_s: 60.0,
            plan_interval_s: 300.0,
            failures_per_pod_hour: 0.001,
            straggler_prob: 0.05,
            straggler_factor: 0.4,
            worker_start_s: 60.0,
            ps_migration_s: 60.0,
            restart_s: 300.0,
            baseline_ckpt_s: 3600.0,
            target_pls: 0.02,
            slo_lag_s: 1200.0,
            rescale_s: 300.0,
            max_hours: 24.0 * 30.0,
            seed: 7,
            growth_efficiency: elastrec_job::autoscale::AutoscaleConfig::default()
                .growth_efficiency,
        }
    }
}

impl SimSettings {
    /// Checks every setting, naming the flag.
    pub fn validate(&self) -> Result<(), SimSetupError> {
        let bad = |field: &'static str, reason: &str| {
            Err(SimSetupError::Setting {
                field,
                reason: reason.into(),
            })
        };
        if self.nodes == 0 || self.nodes > 1_000_000 {
            return bad("nodes", "must be 1..=1000000");
        }
        for (field, v) in [
            ("node-cpu", self.node_cpu),
            ("node-mem-gb", self.node_mem_gb),
            ("control-s", self.control_s),
            ("plan-interval-s", self.plan_interval_s),
            ("max-hours", self.max_hours),
            ("slo-lag-s", self.slo_lag_s),
            ("baseline-ckpt-s", self.baseline_ckpt_s),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return bad(field, "must be finite and > 0");
            }
        }
        for (field, v) in [
            ("failures-per-pod-hour", self.failures_per_pod_hour),
            ("worker-start-s", self.worker_start_s),
            ("ps-migration-s", self.ps_migration_s),
            ("restart-s", self.restart_s),
            ("rescale-s", self.rescale_s),
            ("target-pls", self.target_pls),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(field, "must be finite and >= 0");
            }
        }
        if !(0.0..=1.0).contains(&self.straggler_prob) {
            return bad("straggler-prob", "must be within 0..=1");
        }
        if !(self.straggler_factor > 0.0 && self.straggler_factor <= 1.0) {
            return bad("straggler-factor", "must be within (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.growth_efficiency) {
            return bad("growth-efficiency", "must be within 0..=1");
        }
        if self.node_cpu < 16.0 || self.node_mem_gb < 64.0 {
            return bad(
                "node-cpu",
                "nodes need at least 16 cores and 64 GiB (`--node-mem-gb`): the largest pods must fit",
            );
        }
        Ok(())
    }
}

/// The random stream of one job: the same job draws the same truth and noise under every
/// policy, whatever the order jobs are simulated in.
pub fn job_rng(seed: u64, job_id: &str) -> rand::rngs::StdRng {
    let h = job_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    rand::rngs::StdRng::seed_from_u64(elastrec_common::splitmix::mix64(seed ^ h))
}
