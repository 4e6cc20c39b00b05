//! The autoscaler's policy: turns what the master observes into profile samples, asks the
//! brain for plans and decides whether a plan is executed. Pure (no clock, no I/O, no
//! locks): the master's control loop (`autoscale_loop`) feeds it [`View`]s and brain
//! replies and executes its [`Decision`]s, and the cluster simulator drives the same code.
//!
//! A profile sample is one window of `sample_s` seconds in which the allocation stood
//! still (every planned worker running, no pause, no warm-up, no recovery): the job's
//! throughput over the window, as DLRover-RM's `T_iter = w m / throughput` (Eq. 1), at
//! that allocation. The throughput model (Eq. 2-6) needs samples at more than one
//! allocation; until the profile has two worker counts the autoscaler *probes* one worker
//! more (within bounds), then it follows the brain's plans (NNLS fit, NSGA-II, greedy).

use elastrec_brain::oom::MemorySample;
use elastrec_brain::planner::PlanAsk;
use elastrec_brain::throughput::dlrover::DLROVER_MIN_SAMPLES;
use elastrec_brain::throughput::ProfileSample;
use elastrec_brain::{Allocation, Plan, PlanKind};
use serde::{Deserialize, Serialize};

mod observe;
mod review;
mod rounds;
mod undo;

pub use observe::{hot_ps, memory_verdict, PsLoad};
#[cfg(test)]
use undo::halfway;

/// Profile samples (and memory readings) kept while the brain cannot be reached.
pub const MAX_UNREPORTED: usize = 5_000;

/// On a shared brain a job probes (gives cores back to measure) only while it has more
/// than this many planning intervals of training left at its measured speed (the cluster
/// simulator: short jobs lost more to probing than their plans won back).
pub const PROBE_MIN_INTERVALS_LEFT: f64 = 4.0;

/// Settings of the policy (from `[autoscale]` and the job).
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Inclusive worker bounds.
    pub workers: [u32; 2],
    /// Inclusive PS bounds.
    pub ps: [u32; 2],
    /// Milliseconds between plans.
    pub interval_ms: u64,
    /// Milliseconds of one profile window.
    pub sample_ms: u64,
    /// Smallest relative change of predicted throughput worth executing.
    pub min_gain: f64,
    /// Rows per worker batch (`m`).
    pub batch_size: u32,
    /// CPU cores of one worker now (its compute threads on the local backend) and the
    /// most a plan may give it (vertical scaling when above `worker_cpu`).
    pub worker_cpu: f64,
    /// See `worker_cpu`.
    pub worker_cpu_max: f64,
    /// Cores of one PS now and the most a plan may give it (vertical scaling in place,
    /// where the engine can resize a running node; otherwise equal).
    pub ps_cpu: f64,
    /// See `ps_cpu`.
    pub ps_cpu_max: f64,
    /// See `worker_cpu`.
    pub worker_mem_gb: f64,
    /// See `worker_cpu`.
    pub ps_mem_gb: f64,
    /// CPU cores and memory the job may use in all.
    pub cluster_cpu: f64,
    /// See `cluster_cpu`.
    pub cluster_mem_gb: f64,
    /// Scaling overheads measured for this backend (Eq. 8).
    pub worker_start_s: f64,
    /// See `worker_start_s`.
    pub ps_migration_s: f64,
    /// PS count changes can be executed (online re-sharding available).
    pub ps_scaling: bool,
    /// A PS whose mean time per request exceeds this multiple of its peers' median is hot.
    pub hot_ratio: f64,
    /// The job's own free capacity goes with each plan request (a brain of this job
    /// alone). A shared brain service knows the cluster's capacity and plans every job that
    /// shares it together, so none is sent to it.
    pub send_capacity: bool,
    /// The job starts without a plan (no warm start from the brain's history): its probes
    /// double the workers while throughput rises nearly in proportion
    /// (`explore_efficiency`; quadruple while it is linear, `explore_linear`), so that a
    /// cold job reaches its scale in a few windows and its profile spans the curve the fit
    /// needs.
    pub explore: bool,
    /// While exploring, the workers grow again only if the last growth raised throughput
    /// by at least this share of proportional (`autoscale.explore_efficiency`, 0.75: 2x
    /// workers gave 1.5x samples/s or more).
    pub explore_efficiency: f64,
    /// At or above this share of proportional, exploring quadruples the workers instead of
    /// doubling them (`autoscale.explore_linear`, 0.9).
    pub explore_linear: f64,
    /// A plan that adds cores is kept only if the first window after it raised throughput
    /// by at least this share of the cores it added (`autoscale.growth_efficiency`, 0.3:
    /// twice the cores gave 1.3 times the samples/s or more). Otherwise the job goes back
    /// and its plans stay within the workers it had (the brain's model has no term for
    /// what makes the last workers idle: contention, stragglers), or within its cores when
    /// the growth added no worker. `0` keeps every growth.
    pub growth_efficiency: f64,
}

impl Settings {
    /// Cores per worker and thousandths of cores per PS now: what, beside the node
    /// counts, tells one profiled allocation from another.
    fn cores_key(&self) -> (u64, u64) {
        (
            self.worker_cpu as u64,
            (self.ps_cpu * 1000.0).round() as u64,
        )
    }

    /// The allocation of `workers` workers and `ps` PS with this job's node sizes.
    pub fn allocation(&self, workers: u32, ps: u32) -> Allocation {
        Allocation {
            workers,
            ps,
            worker_cpu: self.worker_cpu,
            ps_cpu: self.ps_cpu,
            worker_mem_gb: self.worker_mem_gb,
            ps_mem_gb: self.ps_mem_gb,
        }
    }
}

/// What the master sees now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct View {
    /// Master clock, ms.
    pub now_ms: u64,
    /// Workers registered and training (not stopping).
    pub workers: u32,
    /// Workers the job is meant to run.
    pub target_workers: u32,
    /// Parameter servers.
    pub ps: u32,
    /// Nothing is in flux: every planned node runs, the job trains, no pause, warm-up or
    /// recovery.
    pub steady: bool,
    /// A parameter server is being recovered.
    pub recovering: bool,
    /// Samples trained (ledger).
    pub samples_done: u64,
    /// Samples of the whole job.
    pub samples_total: u64,
}

/// The autoscaler's state, as `elastrec status` and `result.json` show it.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoscaleState {
    /// Worker and PS bounds, `[lowest, highest]`.
    pub workers: [u32; 2],
    /// See `workers`.
    pub ps: [u32; 2],
    /// Profile samples taken.
    pub profile_samples: u64,
    /// The throughput measured last, samples/s.
    pub measured_samples_per_s: Option<f64>,
    /// The brain's last plan.
    pub last_plan: Option<Proposal>,
    /// What the autoscaler made of it.
    pub last_verdict: Option<String>,
    /// The caps on plans.
    pub limits: PlanLimits,
    /// Why the brain could not be asked.
    pub brain_error: Option<String>,
    /// Every executed scaling action, oldest first.
    pub scaling: Vec<ScalingRecord>,
}

/// The caps the machine and the job put on plans.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlanLimits {
    /// Most workers.
    pub max_workers: Option<u32>,
    /// Most cores in all.
    pub max_cpu: Option<f64>,
    /// Most cores per PS.
    pub max_ps_cpu: Option<f64>,
    /// Why the caps are what they are.
    pub why: Option<String>,
}

/// One executed scaling action, for `status` and `result.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScalingRecord {
    /// Seconds since the job started (master clock).
    pub at_s: f64,
    /// Workers and PS before and after.
    pub before: (u32, u32),
    /// See `before`.
    pub after: (u32, u32),
    /// Cores per worker before and after.
    #[serde(default)]
    pub worker_cpu: (f64, f64),
    /// Cores per PS before and after.
    #[serde(default)]
    pub ps_cpu: (f64, f64),
    /// `probe` (measuring the scaling curve) or `plan` (the brain's plan).
    pub source: String,
    /// Throughput measured before the change, samples/s.
    pub measured_before: Option<f64>,
    /// Throughput the plan predicted.
    pub predicted: Option<f64>,
    /// Throughput measured in the first steady window after the change.
    pub measured_after: Option<f64>,
    /// Why.
    pub reasons: Vec<String>,
}

/// Profile windows and PS memory readings for the brain, oldest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProfileReport {
    /// One sample per steady window.
    pub samples: Vec<ProfileSample>,
    /// PS memory readings.
    pub memory: Vec<MemorySample>,
}

/// What the loop should do now.
#[derive(Debug, Clone, PartialEq)]
pub enum Round {
    /// Nothing due.
    Idle,
    /// Report these samples (may be empty) and then ask for a plan.
    Plan(ProfileReport, PlanAsk),
    /// Report these samples, then execute the probe.
    Probe(ProfileReport, Decision),
    /// Report these samples, then undo the last plan's growth: it did not pay
    /// ([`Settings::growth_efficiency`]).
    Revert(ProfileReport, Decision),
    /// Only report these samples (too few for a plan yet).
    Report(ProfileReport),
}

/// The part of a brain's plan the autoscaler judges.
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    /// What produced it.
    pub kind: PlanKind,
    /// The allocation planned (absent: the brain sent none, and the plan is refused).
    pub allocation: Option<Allocation>,
    /// Predicted samples/s (0 without a fitted model).
    pub predicted_throughput: f64,
    /// Held-out error of the fit behind the plan, percent.
    pub fit_mape_percent: Option<f64>,
    /// Why, in order.
    pub reasons: Vec<String>,
    /// A PS would reach its memory limit before the job ends: the plan's PS count is for
    /// memory, not speed.
    pub for_memory: bool,
}

impl From<&Plan> for Proposal {
    fn from(p: &Plan) -> Self {
        Self {
            kind: p.kind,
            allocation: Some(p.allocation),
            predicted_throughput: p.predicted_throughput.unwrap_or(0.0),
            fit_mape_percent: p.fit.as_ref().map(|f| f.mape),
            reasons: p.reasons.clone(),
            for_memory: p
                .memory
                .iter()
                .any(|m| m.step_at_limit.is_some_and(|s| s > 0)),
        }
    }
}

/// The verdict on a plan.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Change to this many workers and PS, with this many cores per worker.
    Apply {
        /// Target workers.
        workers: u32,
        /// Target cores per worker (a change restarts every worker with them).
        worker_cpu: f64,
        /// Target PS.
        ps: u32,
        /// Target cores per PS (changed in place).
        ps_cpu: f64,
        /// Predicted throughput (plans) or none (probes).
        predicted: Option<f64>,
        /// Why, in order.
        reasons: Vec<String>,
    },
    /// Keep the allocation.
    Keep(String),
    /// The plan is unusable; nothing changes.
    Refuse(String),
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Window {
    start_ms: u64,
    samples: u64,
    workers: u32,
    ps: u32,
    cpu: u64,
    /// Cores per PS, thousandths.
    ps_cpu: u64,
}

/// A plan's change waiting for its first window: what the job had and measured before.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Growth {
    before: Allocation,
    measured_before: f64,
    /// A probe that gave cores back (judged, never undone), not a plan.
    give_back: bool,
    /// The plan changed the PS for memory: an undo keeps its PS.
    for_memory: bool,
    /// A probe of one PS more: judged as a plan, and one that does not pay is undone
    /// without capping later plans (it measured the PS term, which the fit now has).
    ps_probe: bool,
    /// This change is the halfway step of a growth that did not pay: the allocation that
    /// growth planned. Judged against the same allocation as the growth, it is undone
    /// for good when it does not pay either.
    halfway_of: Option<Allocation>,
}

/// The autoscaler's state.
#[derive(Debug, Clone)]
pub struct Autoscaler {
    settings: Settings,
    started_ms: u64,
    window: Option<Window>,
    /// Samples not yet reported to the brain.
    unreported: Vec<ProfileSample>,
    /// Worker and PS counts the profile holds samples of.
    seen_workers: std::collections::BTreeSet<u32>,
    /// See `seen_workers`.
    seen_ps: std::collections::BTreeSet<u32>,
    /// A plan wanted more PS for speed while the profile held one PS count: the next
    /// round probes one PS more.
    ps_probe_wanted: bool,
    /// Cores per worker the profile holds samples of.
    seen_cpu: std::collections::BTreeSet<u64>,
    /// Cores per PS (thousandths) the profile holds samples of.
    seen_ps_cpu: std::collections::BTreeSet<u64>,
    samples_taken: u64,
    samples_at_last_plan: u64,
    last_plan_ms: u64,
    /// Last measured throughput and the allocation it was measured at.
    measured: Option<(f64, u32, u32)>,
    /// The latest throughput measured at each allocation (PS, cores per worker,
    /// thousandths of cores per PS, workers: the worker counts of one PS and core setting
    /// are adjacent).
    throughput_at: std::collections::BTreeMap<(u32, u64, u64, u32), f64>,
    /// Still doubling the workers (see [`Settings::explore`]).
    exploring: bool,
    /// Samples trained at each allocation's last window (for the measured column).
    history: Vec<ScalingRecord>,
    last_plan: Option<Proposal>,
    last_verdict: Option<String>,
    brain_error: Option<String>,
    /// PS memory readings not yet reported: (ps index, step, GiB).
    memory: Vec<MemorySample>,
    /// Every PS's latest reading at each of the last [`MEMORY_STEPS_KEPT`] steps (PS
    /// index -> GiB): the servers' total, which re-sharding does not change, says how
    /// many PS the job's state will need by its end.
    memory_by_step: std::collections::VecDeque<(u64, std::collections::BTreeMap<u32, f64>)>,
    /// Each PS node's cumulative (requests, seconds serving) at the last hot-PS check.
    served: std::collections::BTreeMap<u32, (u64, f64)>,
    /// The PS index found hot at the last check and how many checks in a row.
    hot_streak: Option<(u32, u32)>,
    /// The last plan's change, judged at the next window ([`Settings::growth_efficiency`]).
    growth: Option<Growth>,
    /// The halfway step of an unpaid growth, with its workers, until it is applied: then
    /// it is judged like the growth.
    halfway: Option<(u32, Growth)>,
    /// Most cores the job's plans may hold: a growth beyond them was measured not to pay.
    max_cpu: Option<f64>,
    /// Most workers the job's plans may hold: a growth beyond them was measured not to pay.
    max_workers: Option<u32>,
    /// Most cores per PS the job's plans may hold: a plan that raised them without adding
    /// workers was measured not to pay (the master clamps; the brain does not know it).
    max_ps_cpu: Option<f64>,
    /// Why the last of `max_cpu` / `max_workers` / `max_ps_cpu` was set (for `status`).
    cap_reason: Option<String>,
    /// A probe or a revert ran: the next window (not the next plan interval) ends it.
    measure_next: bool,
    /// The plan under review changes the PS for memory (never undone, never capped).
    plan_for_memory: bool,
}

impl Autoscaler {
    /// A new autoscaler for a job that started at `now_ms`.
    pub fn new(settings: Settings, now_ms: u64) -> Self {
        // An efficiency of 0 turns exploration off (`autoscale.explore_efficiency`).
        let exploring = settings.explore && settings.explore_efficiency > 0.0;
        Self {
            settings,
            started_ms: now_ms,
            window: None,
            unreported: Vec::new(),
            seen_workers: Default::default(),
            seen_ps: Default::default(),
            ps_probe_wanted: false,
            seen_cpu: Default::default(),
            seen_ps_cpu: Default::default(),
            samples_taken: 0,
            samples_at_last_plan: 0,
            last_plan_ms: now_ms,
            measured: None,
            throughput_at: Default::default(),
            exploring,
            history: Vec::new(),
            last_plan: None,
            last_verdict: None,
            brain_error: None,
            memory: Vec::new(),
            memory_by_step: Default::default(),
            served: Default::default(),
            hot_streak: None,
            growth: None,
            halfway: None,
            max_cpu: None,
            max_workers: None,
            max_ps_cpu: None,
            cap_reason: None,
            // A new job's first round waits a planning interval: its windows at the
            // allocation it started with make the profile's base.
            measure_next: false,
            plan_for_memory: false,
        }
    }

    /// Settings in force.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Scaling actions so far.
    pub fn history(&self) -> &[ScalingRecord] {
        &self.history
    }

    /// Throughput of the latest window, samples/s.
    pub fn measured(&self) -> Option<f64> {
        self.measured.map(|m| m.0)
    }

    /// Samples a failed report must not lose: they go back in front of newer ones.
    pub fn requeue(&mut self, report: ProfileReport) {
        let mut samples = report.samples;
        samples.append(&mut self.unreported);
        self.unreported = samples;
        let mut memory = report.memory;
        memory.append(&mut self.memory);
        self.memory = memory;
        // A brain down for hours must not grow the master without bound: the newest
        // readings describe the job best.
        if self.unreported.len() > MAX_UNREPORTED {
            self.unreported
                .drain(..self.unreported.len() - MAX_UNREPORTED);
        }
        if self.memory.len() > MAX_UNREPORTED {
            self.memory.drain(..self.memory.len() - MAX_UNREPORTED);
        }
    }

    /// The brain answered again.
    pub fn brain_ok(&mut self) {
        self.brain_error = None;
    }

    /// The brain could not be reached or refused: the job keeps its allocation.
    pub fn brain_failed(&mut self, error: String) {
        self.brain_error = Some(error);
    }

    /// The state for `elastrec status` and `result.json`.
    pub fn status(&self) -> AutoscaleState {
        AutoscaleState {
            workers: self.settings.workers,
            ps: self.settings.ps,
            profile_samples: self.samples_taken,
            measured_samples_per_s: self.measured(),
            last_plan: self.last_plan.clone(),
            last_verdict: self.last_verdict.clone(),
            limits: PlanLimits {
                max_workers: self.max_workers,
                max_cpu: self.max_cpu,
                max_ps_cpu: self.max_ps_cpu,
                why: self.cap_reason.clone(),
            },
            brain_error: self.brain_error.clone(),
            scaling: self.history.clone(),
        }
    }
}

#[cfg(test)]
mod tests;
