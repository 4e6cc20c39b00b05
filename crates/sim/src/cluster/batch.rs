//! Batch (offline) training jobs on a shared cluster, under one scheduling policy.
//!
//! A discrete-event loop over arrivals, failures, checkpoints and the control cycle
//! (every `control_s`, when the masters observe their jobs and the autoscalers act);
//! between events each job trains at its true throughput, so a job's end is found exactly
//! inside a cycle. Under the `elastrec` policy the jobs run the live policies:
//! the brain's warm start (Algorithm 1) at submission, the master's [`Autoscaler`] on the
//! measured windows, the brain's NNLS fit and NSGA-II front ([`planner::fit_front`]), the
//! cluster-wide weighted greedy with OOM prevention ([`planner::replan_shared`]) and CPR's
//! recovery choice and checkpoint interval. The baselines are in [`super::baselines`].

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use elastrec_brain::alloc::Range;
use elastrec_brain::oom::MemorySample;
use elastrec_brain::planner::{self, BrainConfig, PlanAsk, FIT_WINDOW};
use elastrec_brain::shared::ActiveJobs;
use elastrec_brain::throughput::ProfileSample;
use elastrec_brain::warm_start::{HistoricalJob, JobFeatures};
use elastrec_brain::{Allocation, Bounds, JobSpec, TableSpec};
use elastrec_control::autoscale::{
    Autoscaler, Decision, ProfileReport, Proposal, Round, Settings, View,
};
use elastrec_control::checkpoint::{CheckpointPolicy, Commit, RecoveryRecord};
use elastrec_control::cpr::{CprCosts, RecoveryMode};
use elastrec_control::memory_limits::MemoryLimits;
use rand::rngs::StdRng;
use rand::Rng;
use rayon::prelude::*;

use super::baselines::{Es, Optimus};
use super::nodes::{Nodes, Pod};
use super::trace::JobRecord;
use super::truth::{Truth, WORKER_MEM_GB};
use super::{job_rng, BatchPolicy, SimSettings};

mod elastrec;

/// What one finished (or unfinished) job went through.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct JobOutcome {
    /// Job id.
    pub job_id: String,
    /// Submitted, seconds.
    pub submit_s: f64,
    /// Started (placed), seconds.
    pub start_s: Option<f64>,
    /// Finished, seconds (`None`: still running or queued when the simulation ended).
    pub end_s: Option<f64>,
    /// Failures (node losses) and OOMs it suffered.
    pub failures: u32,
    /// See `failures`.
    pub ooms: u32,
    /// Executed scaling actions.
    pub scalings: u32,
    /// Samples trained again after a rewind to a checkpoint.
    pub retrained: f64,
    /// The allocation it ended with.
    pub last: Option<Allocation>,
    /// Core-hours it held.
    pub core_hours: f64,
}

/// Totals of one policy's run.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct BatchTotals {
    /// Core-seconds allocated, used, and the cluster's, over the run.
    pub cpu_alloc_s: f64,
    /// See `cpu_alloc_s`.
    pub cpu_used_s: f64,
    /// See `cpu_alloc_s`.
    pub cpu_capacity_s: f64,
    /// GiB-seconds allocated and used.
    pub mem_alloc_s: f64,
    /// See `mem_alloc_s`.
    pub mem_used_s: f64,
    /// Simulated events and brain plans.
    pub events: u64,
    /// See `events`.
    pub plans: u64,
    /// Partial recoveries (CPR) and their total portion of lost samples.
    pub partial_recoveries: u32,
    /// See `partial_recoveries`.
    pub pls: f64,
}

#[derive(Debug)]
enum Ctl {
    Elastrec(Box<ElastrecCtl>),
    Es(Es),
    Optimus(Optimus),
    Static,
}

#[derive(Debug)]
struct ElastrecCtl {
    scaler: Autoscaler,
    spec: JobSpec,
    samples: Vec<ProfileSample>,
    memory: Vec<MemorySample>,
    /// The workers' and the PS's memory limits, following their use (the live master's
    /// vertical scaling, `autoscale.*_mem_gb_max`).
    limits: MemoryLimits,
    /// The live checkpoint coordinator's policy: CPR's interval from the checkpoints and
    /// recoveries it saw, and the recovery mode of a lost PS.
    checkpoints: CheckpointPolicy,
}

/// Node ids of the two roles in [`ElastrecCtl::limits`]: every node of a role uses the
/// same memory in the simulation, so one limit stands for all of them.
const WORKERS_NODE: (u32, bool, u32) = (0, false, 0);
/// See [`WORKERS_NODE`].
const PS_NODE: (u32, bool, u32) = (1, true, 0);

struct Job<'a> {
    rec: &'a JobRecord,
    truth: Truth,
    rng: StdRng,
    alloc: Allocation,
    pods: Vec<Pod>,
    done: f64,
    last_s: f64,
    rate: f64,
    /// Trains nothing before this time (restart, migration, checkpoint save).
    paused_until: f64,
    /// The rate switches to `.1` at `.0` (new workers joining while the others train).
    switch: Option<(f64, f64)>,
    ckpt_done: f64,
    ckpt_every_s: f64,
    version: u64,
    straggler: bool,
    ps_mem_limit: f64,
    ctl: Ctl,
    /// Samples done and time at the last baseline decision.
    mark: (f64, f64),
    next_decision_s: f64,
    out: JobOutcome,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Tick,
    Arrive(usize),
    Fail(usize, u64),
    Checkpoint(usize, u64),
}

fn ms(s: f64) -> u64 {
    (s * 1000.0).round() as u64
}

/// Seconds a checkpoint of the job's state takes to reach storage.
fn disk_save_s(j: &Job<'_>) -> f64 {
    10.0 + 2.0 * j.truth.state_gb
}

/// Most cores a plan may give one worker or PS.
const MAX_NODE_CPU: f64 = 16.0;
/// Share of [`WORKER_MEM_GB`] a worker uses.
const WORKER_MEM_USE: f64 = 0.5;

/// The brain's description of a job.
pub fn spec_of(rec: &JobRecord) -> JobSpec {
    JobSpec {
        job_id: rec.job_id.clone(),
        model_type: rec.model.clone(),
        tables: vec![
            TableSpec {
                rows: rec.rows_per_table,
                dim: rec.emb_dim,
            };
            rec.tables as usize
        ],
        dense_params: rec.dense_params,
        dataset_samples: rec.samples,
        batch_size: rec.batch_size,
        scenario: String::new(),
        user: rec.user.clone(),
        // The master's own limits (`autoscale_settings`), as a live master registers them.
        bounds: Bounds {
            worker_cpu: Range::new(1.0, MAX_NODE_CPU),
            ps_cpu: Range::new(1.0, MAX_NODE_CPU),
            ..Bounds::default()
        },
        requested: Some(rec.requested),
    }
}

struct Sim<'a> {
    s: &'a SimSettings,
    policy: BatchPolicy,
    jobs: Vec<Option<Job<'a>>>,
    recs: &'a [JobRecord],
    queue: VecDeque<usize>,
    running: Vec<usize>,
    nodes: Nodes,
    heap: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    brain: BrainConfig,
    active: ActiveJobs,
    history: Vec<HistoricalJob>,
    outcomes: Vec<JobOutcome>,
    totals: BatchTotals,
    last_tick_s: f64,
    tick_pending: bool,
}

/// Runs `trace`'s batch jobs under `policy`; returns every job's outcome (in trace order)
/// and the totals.
pub fn run(
    trace: &[JobRecord],
    policy: BatchPolicy,
    s: &SimSettings,
    progress: &dyn Fn(f64),
) -> (Vec<JobOutcome>, BatchTotals) {
    let nodes = Nodes::new(s.nodes, s.node_cpu, s.node_mem_gb);
    let (cap_cpu, cap_mem) = nodes.capacity();
    let mut brain = BrainConfig::default();
    brain.capacity.cpu = cap_cpu;
    brain.capacity.mem_gb = cap_mem;
    let mut sim = Sim {
        s,
        policy,
        jobs: (0..trace.len()).map(|_| None).collect(),
        recs: trace,
        queue: VecDeque::new(),
        running: Vec::new(),
        nodes,
        heap: BinaryHeap::new(),
        seq: 0,
        brain,
        active: ActiveJobs::new(),
        history: Vec::new(),
        outcomes: trace
            .iter()
            .map(|r| JobOutcome {
                job_id: r.job_id.clone(),
                submit_s: r.submit_s,
                start_s: None,
                end_s: None,
                failures: 0,
                ooms: 0,
                scalings: 0,
                retrained: 0.0,
                last: None,
                core_hours: 0.0,
            })
            .collect(),
        totals: BatchTotals::default(),
        last_tick_s: 0.0,
        tick_pending: false,
    };
    for (i, r) in trace.iter().enumerate() {
        sim.push(r.submit_s, Event::Arrive(i));
    }
    let last_submit = trace.iter().map(|r| r.submit_s).fold(0.0, f64::max);
    let mut reported = 0.0;
    while let Some(Reverse((t_ms, _, ev))) = sim.heap.pop() {
        let t = t_ms as f64 / 1000.0;
        if t > s.max_hours * 3600.0 {
            break;
        }
        sim.totals.events += 1;
        match ev {
            Event::Tick => sim.tick(t),
            Event::Arrive(i) => sim.arrive(i, t),
            Event::Fail(i, v) => sim.fail(i, v, t),
            Event::Checkpoint(i, v) => sim.checkpoint(i, v, t),
        }
        let done = sim.outcomes.iter().filter(|o| o.end_s.is_some()).count() as f64;
        let frac = (done / trace.len().max(1) as f64).max(t / last_submit.max(1.0) * 0.5);
        if frac - reported >= 0.01 {
            reported = frac;
            progress(frac.min(1.0));
        }
    }
    // Jobs not finished at the end (running, or queued again after an OOM) keep what
    // they went through; those that never started keep no allocation.
    for (i, slot) in sim.jobs.iter_mut().enumerate() {
        if let Some(j) = slot.take() {
            let mut out = j.out;
            if out.start_s.is_some() {
                out.last = Some(j.alloc);
            }
            sim.outcomes[i] = out;
        }
    }
    (sim.outcomes, sim.totals)
}

impl<'a> Sim<'a> {
    fn push(&mut self, t: f64, ev: Event) {
        self.seq += 1;
        self.heap.push(Reverse((ms(t), self.seq, ev)));
    }

    fn ensure_tick(&mut self, t: f64) {
        if !self.tick_pending {
            let c = self.s.control_s;
            let next = ((t / c).floor() + 1.0) * c;
            self.tick_pending = true;
            self.push(next, Event::Tick);
        }
    }

    fn arrive(&mut self, i: usize, t: f64) {
        let rec = &self.recs[i];
        let mut rng = job_rng(self.s.seed, &rec.job_id);
        let truth = Truth::of(rec, &mut rng);
        let tuned = truth.tuned();
        let spec = spec_of(rec);
        let (alloc, ctl) = match self.policy {
            BatchPolicy::Elastrec => {
                // What the service's WarmStart does: Algorithm 1 over the jobs that ended.
                let plan = planner::warm_plan(&self.brain, &spec, &self.history)
                    .expect("a valid generated spec");
                let now = ms(t);
                self.active.update(
                    &spec.job_id,
                    vec![],
                    Some(plan.allocation),
                    spec.dataset_samples as f64,
                    now,
                );
                let a = plan.allocation;
                let settings = self.autoscale_settings(&spec, &a);
                let scaler = Autoscaler::new(settings, ms(t));
                // The job file's `[checkpoint]` defaults, with the simulation's PLS target.
                let checkpoint = elastrec_job::distributed::CheckpointConfig {
                    target_pls: self.s.target_pls,
                    ..Default::default()
                };
                let checkpoints = CheckpointPolicy::new(
                    checkpoint.policy_settings(),
                    a.ps,
                    rec.samples,
                    None,
                    ms(t),
                );
                (
                    a,
                    Ctl::Elastrec(Box::new(ElastrecCtl {
                        scaler,
                        spec,
                        samples: Vec::new(),
                        memory: Vec::new(),
                        limits: self.memory_limits(),
                        checkpoints,
                    })),
                )
            }
            BatchPolicy::Es => (rec.requested, Ctl::Es(Es::default())),
            BatchPolicy::Optimus => (rec.requested, Ctl::Optimus(Optimus::default())),
            BatchPolicy::StaticUser => (rec.requested, Ctl::Static),
            BatchPolicy::StaticTuned => (tuned, Ctl::Static),
            BatchPolicy::StaticUnder => (
                Allocation {
                    workers: (tuned.workers / 4).max(1),
                    ps: (tuned.ps / 2).max(1),
                    ps_mem_gb: (tuned.ps_mem_gb * f64::from(tuned.ps)
                        / f64::from((tuned.ps / 2).max(1)))
                    .min(256.0),
                    ..tuned
                },
                Ctl::Static,
            ),
            BatchPolicy::StaticOver => (
                Allocation {
                    workers: (tuned.workers * 3).min(64),
                    ps: (tuned.ps * 2).min(32),
                    ..tuned
                },
                Ctl::Static,
            ),
        };
        let straggler = rng.random::<f64>() < self.s.straggler_prob;
        self.jobs[i] = Some(Job {
            rec,
            truth,
            rng,
            alloc,
            pods: Vec::new(),
            done: 0.0,
            last_s: t,
            rate: 0.0,
            paused_until: t,
            switch: None,
            ckpt_done: 0.0,
            ckpt_every_s: self.s.baseline_ckpt_s,
            version: 0,
            straggler,
            ps_mem_limit: alloc.ps_mem_gb,
            ctl,
            mark: (0.0, t),
            next_decision_s: t,
            out: self.outcomes[i].clone(),
        });
        self.queue.push_back(i);
        self.schedule(t);
        self.ensure_tick(t);
    }

    /// Places queued jobs in submission order; one that does not fit waits and later ones
    /// may pass it (backfill).
    fn schedule(&mut self, t: f64) {
        let mut still = VecDeque::new();
        while let Some(i) = self.queue.pop_front() {
            let job = self.jobs[i].as_mut().expect("queued job");
            let a = job.alloc;
            let pods = [
                (a.worker_cpu, a.worker_mem_gb, a.workers),
                (a.ps_cpu, job.ps_mem_limit, a.ps),
            ];
            match self.nodes.place_all(&pods) {
                Some(p) => {
                    job.pods = p;
                    job.out.start_s = Some(t);
                    job.last_s = t;
                    job.mark = (0.0, t);
                    job.next_decision_s = t + self.s.plan_interval_s;
                    self.running.push(i);
                    self.after_change(i, t, false);
                }
                None => still.push_back(i),
            }
        }
        self.queue = still;
    }

    fn rate_of(&self, j: &Job<'_>, a: &Allocation) -> f64 {
        let full = j.truth.throughput(a);
        if !j.straggler {
            return full;
        }
        let s = self.s.straggler_factor;
        match self.policy {
            // Dynamic sharding: the slow worker takes smaller shards.
            BatchPolicy::Elastrec => full * (f64::from(a.workers) - 1.0 + s) / f64::from(a.workers),
            // Static shards: the job ends when the slowest worker's shard does.
            _ => full * s,
        }
    }

    /// After a change of allocation: new rate, failure clock, checkpoint interval.
    fn after_change(&mut self, i: usize, t: f64, keep_rate: bool) {
        let rate = {
            let j = self.jobs[i].as_ref().expect("job");
            self.rate_of(j, &j.alloc)
        };
        let lambda = {
            let j = self.jobs[i].as_ref().expect("job");
            let pods = f64::from(j.alloc.workers + j.alloc.ps);
            self.s.failures_per_pod_hour * pods / 3600.0
        };
        let baseline_ckpt = self.s.baseline_ckpt_s;
        let j = self.jobs[i].as_mut().expect("job");
        if !keep_rate {
            j.rate = rate;
        }
        j.version += 1;
        j.ckpt_every_s = match &mut j.ctl {
            // The live policy: CPR's interval from what the job's checkpoints and
            // recoveries measured; a new PS count writes a full checkpoint next.
            Ctl::Elastrec(ctl) => {
                if ctl.checkpoints.num_ps() != j.alloc.ps {
                    ctl.checkpoints.layout_changed(j.alloc.ps);
                }
                ctl.checkpoints.interval_s(ms(t), j.done as u64)
            }
            _ => baseline_ckpt,
        };
        let v = j.version;
        let next_fail = (lambda > 0.0).then(|| t - (1.0 - j.rng.random::<f64>()).ln() / lambda);
        let next_ckpt = t + j.ckpt_every_s;
        if let Some(f) = next_fail {
            self.push(f, Event::Fail(i, v));
        }
        self.push(next_ckpt, Event::Checkpoint(i, v));
    }

    fn costs(&self, j: &Job<'_>) -> CprCosts {
        let disk_save = disk_save_s(j);
        let pods = f64::from(j.alloc.workers + j.alloc.ps);
        CprCosts {
            // Flash checkpoints: memory first, disk in the background.
            o_save_s: if self.policy == BatchPolicy::Elastrec {
                0.1 * disk_save
            } else {
                disk_save
            },
            o_load_s: 10.0 + j.truth.state_gb,
            o_res_s: self.s.worker_start_s,
            t_fail_s: if self.s.failures_per_pod_hour > 0.0 {
                3600.0 / (self.s.failures_per_pod_hour * pods)
            } else {
                f64::INFINITY
            },
        }
    }

    /// Trains job `i` up to `t`; `Some(end)` when it reached its samples on the way.
    fn advance(&mut self, i: usize, t: f64) -> Option<f64> {
        let j = self.jobs[i].as_mut().expect("job");
        let total = j.rec.samples as f64;
        let mut from = j.last_s.max(j.paused_until).min(t.max(j.last_s));
        let mut end = None;
        let mut step = |from: f64, to: f64, rate: f64, done: &mut f64| {
            if to <= from || end.is_some() {
                return;
            }
            let gain = rate * (to - from);
            if *done + gain >= total && rate > 0.0 {
                end = Some(from + (total - *done) / rate);
                *done = total;
            } else {
                *done += gain;
            }
        };
        if let Some((at, new_rate)) = j.switch {
            if at <= t {
                step(from, at, j.rate, &mut j.done);
                from = from.max(at);
                j.rate = new_rate;
                j.switch = None;
            }
        }
        step(from, t, j.rate, &mut j.done);
        let held = t - j.last_s;
        j.out.core_hours += j.alloc.total_cpu() * held.max(0.0) / 3600.0;
        j.last_s = t;
        end
    }

    fn finish(&mut self, i: usize, end: f64) {
        let j = self.jobs[i].take().expect("job");
        self.nodes.release(&j.pods);
        self.running.retain(|&k| k != i);
        let mut out = j.out;
        out.end_s = Some(end);
        out.last = Some(j.alloc);
        self.outcomes[i] = out;
        if self.policy == BatchPolicy::Elastrec {
            self.active.remove(&j.rec.job_id);
            // What the config DB keeps: the configuration it ended with.
            self.history.push(HistoricalJob {
                job_id: j.rec.job_id.clone(),
                features: JobFeatures::of(&spec_of(j.rec)),
                config: j.alloc,
            });
        }
    }

    fn tick(&mut self, t: f64) {
        self.tick_pending = false;
        let dt = t - self.last_tick_s;
        self.last_tick_s = t;
        // 1. Train up to now; jobs that reached their samples end.
        for i in self.running.clone() {
            if let Some(end) = self.advance(i, t) {
                self.finish(i, end);
            }
        }
        // 2. Utilization over the cycle that ended (at the state it ends with).
        let (cap_cpu, _) = self.nodes.capacity();
        self.totals.cpu_capacity_s += cap_cpu * dt;
        for &i in &self.running {
            let j = self.jobs[i].as_ref().expect("running");
            let a = &j.alloc;
            self.totals.cpu_alloc_s += a.total_cpu() * dt;
            self.totals.mem_alloc_s +=
                (f64::from(a.workers) * a.worker_mem_gb + f64::from(a.ps) * j.ps_mem_limit) * dt;
            let training = j.paused_until <= t;
            if training {
                let (wb, pb) = j.truth.busy(a);
                self.totals.cpu_used_s += (f64::from(a.workers) * a.worker_cpu * wb
                    + f64::from(a.ps) * a.ps_cpu * pb)
                    * dt;
            }
            let progress = j.done / j.rec.samples as f64;
            self.totals.mem_used_s += (f64::from(a.workers) * WORKER_MEM_GB * WORKER_MEM_USE
                + j.truth
                    .ps_mem_gb(progress)
                    .min(f64::from(a.ps) * j.ps_mem_limit))
                * dt;
        }
        // 3. OOM: a PS whose share of the state outgrew its memory dies.
        for i in self.running.clone() {
            let oom = {
                let j = self.jobs[i].as_ref().expect("running");
                let per_ps =
                    j.truth.ps_mem_gb(j.done / j.rec.samples as f64) / f64::from(j.alloc.ps);
                per_ps > j.ps_mem_limit
            };
            if oom {
                self.oom(i, t);
            }
        }
        // 4. Controllers.
        match self.policy {
            BatchPolicy::Elastrec => self.elastrec_round(t),
            BatchPolicy::Es | BatchPolicy::Optimus => self.baseline_round(t),
            _ => {}
        }
        self.schedule(t);
        if !self.running.is_empty() || !self.queue.is_empty() {
            self.ensure_tick(t);
        }
    }

    /// Moves job `i` to `new`, paying the policy's transition cost; false when the
    /// cluster has no room (nothing changes).
    fn resize(&mut self, i: usize, new: Allocation, t: f64) -> bool {
        let (old, old_pods, mut ps_mem) = {
            let j = self.jobs[i].as_mut().expect("running");
            (j.alloc, std::mem::take(&mut j.pods), j.ps_mem_limit)
        };
        // Re-sharded servers start at the PS memory of the plan (or the limit in force, if
        // higher) and follow their use from there.
        let resharded = self.policy == BatchPolicy::Elastrec && new.ps != old.ps;
        if resharded {
            ps_mem = ps_mem.max(old.ps_mem_gb);
        }
        if old == new {
            self.jobs[i].as_mut().expect("running").pods = old_pods;
            return false;
        }
        self.nodes.release(&old_pods);
        let pods = [
            (new.worker_cpu, new.worker_mem_gb, new.workers),
            (new.ps_cpu, ps_mem, new.ps),
        ];
        let Some(p) = self.nodes.place_all(&pods) else {
            self.nodes.restore(&old_pods);
            self.jobs[i].as_mut().expect("running").pods = old_pods;
            return false;
        };
        self.advance(i, t);
        let new_rate = {
            let j = self.jobs[i].as_ref().expect("running");
            self.rate_of(j, &new)
        };
        let policy = self.policy;
        let s = self.s;
        let fresh_limits = resharded.then(|| self.memory_limits());
        let j = self.jobs[i].as_mut().expect("running");
        j.pods = p;
        j.alloc = new;
        j.out.scalings += 1;
        j.ps_mem_limit = ps_mem;
        if let (Some(l), Ctl::Elastrec(ctl)) = (fresh_limits, &mut j.ctl) {
            ctl.limits = l;
        }
        let more_workers = new.workers > old.workers || new.worker_cpu != old.worker_cpu;
        match policy {
            BatchPolicy::Elastrec | BatchPolicy::Es => {
                if new.ps != old.ps {
                    // Re-sharding the PS pauses training.
                    j.paused_until = j.paused_until.max(t + s.ps_migration_s);
                    j.rate = new_rate;
                } else if more_workers {
                    // Seamless: the old workers train until the new ones are up.
                    j.switch = Some((t + s.worker_start_s, new_rate));
                } else {
                    j.rate = new_rate;
                }
            }
            _ => {
                // Checkpoint and restart with the new configuration.
                j.paused_until = j.paused_until.max(t + s.restart_s);
                j.ckpt_done = j.done;
                j.rate = new_rate;
            }
        }
        self.after_change(i, t, true);
        true
    }

    fn baseline_round(&mut self, t: f64) {
        for i in self.running.clone() {
            let (due, steady) = {
                let j = self.jobs[i].as_ref().expect("running");
                (
                    t >= j.next_decision_s,
                    j.paused_until <= j.mark.1 && j.switch.is_none(),
                )
            };
            if !due {
                continue;
            }
            let j = self.jobs[i].as_mut().expect("running");
            let (d0, t0) = j.mark;
            j.mark = (j.done, t);
            j.next_decision_s = t + self.s.plan_interval_s;
            if !steady || t <= t0 {
                continue;
            }
            let noise = 1.0 + j.truth.noise * (j.rng.random::<f64>() * 2.0 - 1.0);
            let tp = (j.done - d0) / (t - t0) * noise;
            if tp <= 0.0 {
                continue;
            }
            let a = j.alloc;
            let target = match &mut j.ctl {
                Ctl::Es(es) => es
                    .decide(a.workers, tp, 64)
                    .map(|w| Allocation { workers: w, ..a }),
                Ctl::Optimus(o) => {
                    let m = f64::from(j.rec.batch_size);
                    o.observe(a.workers, a.ps, f64::from(a.workers) * m / tp);
                    o.decide(a.workers, a.ps, a.worker_cpu, a.ps_cpu, (64, 32))
                        .map(|(w, p)| Allocation {
                            workers: w,
                            ps: p,
                            ..a
                        })
                }
                _ => None,
            };
            if let Some(new) = target {
                self.resize(i, new, t);
            }
        }
    }

    /// Whether an event of job `i` scheduled at allocation version `v` still applies at
    /// `t`: the job runs, has not changed since, and has not ended on the way (it is
    /// trained up to `t`, and finished if it reached its samples).
    fn still_running(&mut self, i: usize, v: u64, t: f64) -> bool {
        let Some(j) = self.jobs[i].as_ref() else {
            return false;
        };
        if j.version != v || !self.running.contains(&i) {
            return false;
        }
        if let Some(end) = self.advance(i, t) {
            self.finish(i, end);
            return false;
        }
        true
    }

    fn fail(&mut self, i: usize, v: u64, t: f64) {
        if !self.still_running(i, v, t) {
            return;
        }
        let costs = self.costs(self.jobs[i].as_ref().expect("running"));
        let policy = self.policy;
        let s = self.s;
        let degraded = {
            let j = self.jobs[i].as_ref().expect("running");
            let a = j.alloc;
            let fewer = Allocation {
                workers: a.workers.saturating_sub(1).max(1),
                ..a
            };
            self.rate_of(j, &fewer)
        };
        let j = self.jobs[i].as_mut().expect("running");
        j.out.failures += 1;
        let a = j.alloc;
        let ps_failed = j.rng.random::<f64>() < f64::from(a.ps) / f64::from(a.workers + a.ps);
        match (policy, ps_failed) {
            (BatchPolicy::Elastrec, false) => {
                // Its shard goes back to the queue; the others train on while a
                // replacement starts.
                let full = j.rate;
                j.rate = degraded;
                j.switch = Some((t + s.worker_start_s, full));
            }
            (BatchPolicy::Elastrec, true) => {
                let Ctl::Elastrec(ctl) = &mut j.ctl else {
                    unreachable!("an elastrec job has its controls")
                };
                let p = &mut ctl.checkpoints;
                let done = j.done as u64;
                let d = p.recovery_decision(ms(t), done, None);
                let back_s = t + costs.o_res_s + costs.o_load_s;
                j.paused_until = j.paused_until.max(back_s);
                let mut record = RecoveryRecord {
                    at_ms: ms(t),
                    ps: vec![0],
                    reason: "node lost".into(),
                    mode: d.mode,
                    checkpoint: None,
                    samples_at_failure: done,
                    samples_at_checkpoint: j.ckpt_done as u64,
                    pls_added: 0.0,
                    seconds: None,
                    load_s: None,
                    dense_rewound: false,
                    decision: d.reason.clone(),
                };
                if d.mode == RecoveryMode::Partial {
                    // Only the failed PS reloads: its updates since the checkpoint are lost.
                    self.totals.partial_recoveries += 1;
                    record.pls_added = p.partial_loss(done, 1);
                    self.totals.pls += record.pls_added;
                } else {
                    let again = j.done - j.ckpt_done;
                    j.out.retrained += again;
                    p.retrained(again as u64);
                    j.done = j.ckpt_done;
                }
                // The recovery's time is known here: the master measures it the same way.
                p.recovery_started(ms(t), record, d);
                p.loaded(costs.o_load_s);
                p.recovered(ms(back_s));
            }
            _ => {
                j.out.retrained += j.done - j.ckpt_done;
                j.done = j.ckpt_done;
                j.paused_until = j.paused_until.max(t + s.restart_s);
            }
        }
        self.after_change(i, t, true);
    }

    fn oom(&mut self, i: usize, t: f64) {
        self.advance(i, t);
        let s = self.s;
        let (ps_mem, a, pods) = {
            let j = self.jobs[i].as_mut().expect("running");
            j.out.ooms += 1;
            j.out.retrained += j.done - j.ckpt_done;
            j.done = j.ckpt_done;
            j.paused_until = j.paused_until.max(t + s.restart_s);
            // The job is resubmitted with half as much memory again per PS.
            j.ps_mem_limit = (j.ps_mem_limit * 1.5).min(s.node_mem_gb);
            (j.ps_mem_limit, j.alloc, std::mem::take(&mut j.pods))
        };
        self.nodes.release(&pods);
        let placed = self.nodes.place_all(&[
            (a.worker_cpu, a.worker_mem_gb, a.workers),
            (a.ps_cpu, ps_mem, a.ps),
        ]);
        match placed {
            Some(p) => {
                self.jobs[i].as_mut().expect("running").pods = p;
                self.after_change(i, t, true);
            }
            None => {
                // No room for the bigger PS now: back in the queue.
                self.running.retain(|&k| k != i);
                self.queue.push_back(i);
            }
        }
    }

    fn checkpoint(&mut self, i: usize, v: u64, t: f64) {
        if !self.still_running(i, v, t) {
            return;
        }
        let (save, persist_s, bytes) = {
            let j = self.jobs[i].as_ref().expect("running");
            let save = self.costs(j).o_save_s;
            (save, disk_save_s(j), (j.truth.state_gb * 1e9) as u64)
        };
        let j = self.jobs[i].as_mut().expect("running");
        j.ckpt_done = j.done;
        j.paused_until = j.paused_until.max(t + save);
        if let Ctl::Elastrec(ctl) = &mut j.ctl {
            // What the coordinator hears of a flash checkpoint: the training stall, then
            // the background persistence.
            let p = &mut ctl.checkpoints;
            let id = p.stats().last_id + 1;
            p.committed(
                ms(t),
                &Commit {
                    id,
                    created_ms: ms(t),
                    delta: false,
                    samples: j.done as u64,
                    stall_us: (save * 1e6) as u64,
                    memcpy_us: (save * 1e6) as u64,
                    persist_us: (persist_s * 1e6) as u64,
                    bytes,
                },
            );
            j.ckpt_every_s = p.interval_s(ms(t), j.done as u64);
        }
        let next = t + j.ckpt_every_s;
        self.push(next, Event::Checkpoint(i, v));
    }
}
