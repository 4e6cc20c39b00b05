//! The autoscaler's policy: turns what the master observes into profile samples, asks the
//! brain for plans and decides whether a plan is executed. Pure (no clock, no I/O, no
//! locks): the control loop in `autoscale_loop` feeds it [`View`]s and brain replies and
//! executes its [`Decision`]s, and a simulator can drive the same code.
//!
//! A profile sample is one window of `sample_s` seconds in which the allocation stood
//! still (every planned worker running, no pause, no warm-up, no recovery): the job's
//! throughput over the window, as DLRover-RM's `T_iter = w m / throughput` (Eq. 1), at
//! that allocation. The throughput model (Eq. 2-6) needs samples at more than one
//! allocation; until the profile has two worker counts the autoscaler *probes* one worker
//! more (within bounds), then it follows the brain's plans (NNLS fit, NSGA-II, greedy).

pub use elastrec_brain::service::alloc_to as alloc_to_pb;
use elastrec_brain::throughput::dlrover::DLROVER_MIN_SAMPLES;
use elastrec_brain::Allocation;
use elastrec_proto::brain as pb;
use serde::{Deserialize, Serialize};

/// Profile samples (and memory readings) kept while the brain cannot be reached.
pub const MAX_UNREPORTED: usize = 5_000;

/// On a shared brain a job probes (gives cores back to measure) only while it has more
/// than this many planning intervals of training left at its measured speed (the cluster
/// simulator: short jobs lost more to probing than their plans won back).
pub const PROBE_MIN_INTERVALS_LEFT: f64 = 4.0;

/// Settings of the policy (from `[autoscale]` and the job).
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Brain job id.
    pub job_id: String,
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

/// What the loop should do now.
#[derive(Debug, Clone, PartialEq)]
pub enum Round {
    /// Nothing due.
    Idle,
    /// Report these samples (may be empty) and then ask for a plan.
    Plan(pb::ReportProfileRequest, pb::PlanRequest),
    /// Report these samples, then execute the probe.
    Probe(pb::ReportProfileRequest, Decision),
    /// Report these samples, then undo the last plan's growth: it did not pay
    /// ([`Settings::growth_efficiency`]).
    Revert(pb::ReportProfileRequest, Decision),
    /// Only report these samples (too few for a plan yet).
    Report(pb::ReportProfileRequest),
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

/// Halfway from one allocation to another: the geometric mean of their workers, with
/// `to`'s PS count and cores per worker, and the fewer cores per PS of the two. Only
/// the workers are halved: the brain's model lacks the terms that grow with them
/// (contention, stragglers). Halving the cores too was measured on the cluster
/// simulator's default trace: 1.5% less mean JCT for 8% more core-hours, more cores than
/// the well-tuned configurations held. A raise of the PS's cores is not kept into the
/// halfway step: judged with the workers, it could not be told apart from them, and
/// without it the trace's mean JCT fell 0.5% for 1.3% fewer core-hours
/// (`docs/simulator.md`).
fn halfway(from: &Allocation, to: &Allocation) -> Allocation {
    Allocation {
        workers: (f64::from(from.workers) * f64::from(to.workers))
            .sqrt()
            .round() as u32,
        ps_cpu: from.ps_cpu.min(to.ps_cpu),
        ..*to
    }
}

/// The autoscaler's state.
#[derive(Debug, Clone)]
pub struct Autoscaler {
    settings: Settings,
    started_ms: u64,
    window: Option<Window>,
    /// Samples not yet reported to the brain.
    unreported: Vec<pb::ProfileSample>,
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
    last_plan: Option<pb::PlanResponse>,
    last_verdict: Option<String>,
    brain_error: Option<String>,
    /// PS memory readings not yet reported: (ps index, step, GiB).
    memory: Vec<pb::MemorySample>,
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

/// What one PS served between two checks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PsLoad {
    /// PS index.
    pub index: u32,
    /// Requests (pulls and pushes) served.
    pub requests: u64,
    /// Seconds spent serving them.
    pub serve_s: f64,
}

/// Steps whose PS memory readings the autoscaler keeps for its own OOM check.
const MEMORY_STEPS_KEPT: usize = 64;

/// Fewest requests of a PS in a window for its mean time per request to count.
const HOT_MIN_REQUESTS: u64 = 20;
/// Checks in a row a PS must be hot before load is moved off it.
const HOT_STREAK: u32 = 2;

/// DLRover-RM §6's hot PS: the server whose mean time per request is above `ratio` times
/// the median of its peers (and above 1 ms). Returns (index, its ms, peers' median ms).
pub fn hot_ps(loads: &[PsLoad], ratio: f64) -> Option<(u32, f64, f64)> {
    let ms: Vec<(u32, f64)> = loads
        .iter()
        .filter(|l| l.requests >= HOT_MIN_REQUESTS)
        .map(|l| (l.index, l.serve_s * 1e3 / l.requests as f64))
        .collect();
    if ms.len() < 2 {
        return None;
    }
    let (index, worst) = ms.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1))?;
    let mut peers: Vec<f64> = ms.iter().filter(|m| m.0 != index).map(|m| m.1).collect();
    peers.sort_by(f64::total_cmp);
    let median = peers[peers.len() / 2];
    (worst > 1.0 && worst > ratio * median).then_some((index, worst, median))
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

    /// Checks the PS for a hot one, from each live PS node's cumulative
    /// `(node id, index, requests, seconds serving)`. Once the same PS was hot in
    /// [`HOT_STREAK`] checks in a row, returns a decision that spreads its load over one
    /// more PS (every PS then holds fewer rows, the hot one included).
    pub fn check_hot_ps(&mut self, served: &[(u32, u32, u64, f64)], v: &View) -> Option<Decision> {
        let loads: Vec<PsLoad> = served
            .iter()
            .filter_map(|&(id, index, requests, serve_s)| {
                let (r0, s0) = self.served.get(&id).copied().unwrap_or((requests, serve_s));
                (requests >= r0).then(|| PsLoad {
                    index,
                    requests: requests - r0,
                    serve_s: (serve_s - s0).max(0.0),
                })
            })
            .collect();
        self.served = served.iter().map(|&(id, _, r, s)| (id, (r, s))).collect();
        let Some((index, ms, median)) = hot_ps(&loads, self.settings.hot_ratio) else {
            self.hot_streak = None;
            return None;
        };
        let streak = match self.hot_streak {
            Some((i, n)) if i == index => n + 1,
            _ => 1,
        };
        self.hot_streak = Some((index, streak));
        let [_, pmax] = self.settings.ps;
        if streak < HOT_STREAK || !self.settings.ps_scaling || v.ps >= pmax || v.recovering {
            return None;
        }
        self.hot_streak = None;
        Some(Decision::Apply {
            workers: v.workers,
            worker_cpu: self.settings.worker_cpu,
            ps: v.ps + 1,
            ps_cpu: self.settings.ps_cpu,
            predicted: None,
            reasons: vec![format!(
                "hot PS {index}: {ms:.2} ms per request vs its peers' median {median:.2} ms in {HOT_STREAK} checks in a row; one more PS takes rows off it"
            )],
        })
    }

    /// Settings in force.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Scaling actions so far.
    pub fn history(&self) -> &[ScalingRecord] {
        &self.history
    }

    /// Feeds one observation: closes a profile window when one is complete.
    pub fn observe(&mut self, v: &View) {
        if !v.steady || v.workers != v.target_workers || v.workers == 0 {
            self.window = None;
            return;
        }
        let (cpu, ps_cpu) = self.settings.cores_key();
        let w = match self.window {
            Some(w)
                if w.workers == v.workers && w.ps == v.ps && w.cpu == cpu && w.ps_cpu == ps_cpu =>
            {
                w
            }
            _ => {
                self.window = Some(Window {
                    start_ms: v.now_ms,
                    samples: v.samples_done,
                    workers: v.workers,
                    ps: v.ps,
                    cpu,
                    ps_cpu,
                });
                return;
            }
        };
        let dt = v.now_ms.saturating_sub(w.start_ms);
        if dt < self.settings.sample_ms {
            return;
        }
        self.window = Some(Window {
            start_ms: v.now_ms,
            samples: v.samples_done,
            ..w
        });
        let trained = v.samples_done.saturating_sub(w.samples);
        if trained == 0 {
            return; // a stalled window says nothing about the allocation's speed
        }
        let throughput = trained as f64 * 1000.0 / dt as f64;
        let m = f64::from(self.settings.batch_size);
        self.unreported.push(pb::ProfileSample {
            allocation: Some(alloc_to_pb(&self.settings.allocation(w.workers, w.ps))),
            batch_size: self.settings.batch_size,
            iter_time_s: f64::from(w.workers) * m / throughput,
        });
        self.seen_workers.insert(w.workers);
        self.seen_ps.insert(w.ps);
        self.seen_cpu.insert(w.cpu);
        self.seen_ps_cpu.insert(w.ps_cpu);
        self.samples_taken += 1;
        self.measured = Some((throughput, w.workers, w.ps));
        self.throughput_at
            .insert((w.ps, w.cpu, w.ps_cpu, w.workers), throughput);
        if let Some(last) = self.history.last_mut() {
            if last.after == (w.workers, w.ps)
                && last.worker_cpu.1 as u64 == w.cpu
                && (last.ps_cpu.1 * 1000.0).round() as u64 == w.ps_cpu
                && last.measured_after.is_none()
            {
                last.measured_after = Some(throughput);
            }
        }
    }

    /// A PS memory reading (resident memory of PS `index` at global step `step`).
    pub fn observe_memory(&mut self, index: u32, step: u64, mem_gb: f64) {
        if !(mem_gb.is_finite() && mem_gb > 0.0) {
            return;
        }
        self.memory.push(pb::MemorySample {
            ps_index: index,
            step,
            mem_gb,
        });
        match self.memory_by_step.back_mut() {
            Some((s, by_ps)) if *s == step => {
                by_ps.insert(index, mem_gb);
            }
            Some((s, _)) if *s > step => {}
            _ => {
                self.memory_by_step
                    .push_back((step, [(index, mem_gb)].into_iter().collect()));
                if self.memory_by_step.len() > MEMORY_STEPS_KEPT {
                    self.memory_by_step.pop_front();
                }
            }
        }
    }

    /// The PS count the servers' memory needs by the job's end: their total memory
    /// (DLRover-RM's growth model, `a + b s + c sqrt(s)`, fitted to the summed readings)
    /// predicted at the last step, over [`OomPolicy::trigger_fraction`] of a PS's limit;
    /// with why. `None` until enough steps are read.
    ///
    /// [`OomPolicy::trigger_fraction`]: elastrec_brain::oom::OomPolicy
    fn ps_needed_for_memory(&self, v: &View) -> Option<(u32, String)> {
        let totals: Vec<elastrec_brain::oom::MemorySample> = self
            .memory_by_step
            .iter()
            .map(|(step, by_ps)| elastrec_brain::oom::MemorySample {
                ps_index: 0,
                step: *step,
                mem_gb: by_ps.values().sum(),
            })
            .collect();
        let growth = elastrec_brain::oom::fit_growth(&totals).ok()?;
        let m = u64::from(self.settings.batch_size.max(1));
        let last_step = v.samples_total.div_ceil(m);
        let peak = growth.at(last_step);
        let per_ps =
            elastrec_brain::oom::OomPolicy::default().trigger_fraction * self.settings.ps_mem_gb;
        if per_ps <= 0.0 {
            return None;
        }
        let need = (peak / per_ps).ceil().max(1.0) as u32;
        Some((
            need,
            format!(
                "PS memory: the servers' memory grows to {peak:.2} GiB in total by step {last_step} (OOM prediction over {} readings); {need} PS of {:.2} GiB hold it",
                totals.len(),
                self.settings.ps_mem_gb
            ),
        ))
    }

    /// Throughput of the latest window, samples/s.
    pub fn measured(&self) -> Option<f64> {
        self.measured.map(|m| m.0)
    }

    /// What to do now: nothing, a plan round, or a probe.
    pub fn next_round(&mut self, v: &View) -> Round {
        let fresh = self.samples_taken > self.samples_at_last_plan;
        // Exploring, a probe needs one window at the allocation in force, not a whole
        // planning interval: a cold job reaches its scale in a few windows.
        let measured_here = self
            .measured
            .is_some_and(|(_, w, p)| (w, p) == (v.workers, v.ps));
        // A probe (or an undone growth) is measured by one window too, and a plan's growth
        // is judged by its first.
        let plan_due = v.now_ms.saturating_sub(self.last_plan_ms) >= self.settings.interval_ms
            || (self.exploring && measured_here)
            || self.measure_next;
        if !fresh || !v.steady || !(plan_due || self.growth.is_some()) {
            return Round::Idle;
        }
        self.samples_at_last_plan = self.samples_taken;
        let report = pb::ReportProfileRequest {
            job_id: self.settings.job_id.clone(),
            samples: std::mem::take(&mut self.unreported),
            memory: std::mem::take(&mut self.memory),
        };
        if let Some(d) = self.undo_unpaid_plan(v) {
            return Round::Revert(report, d);
        }
        if !plan_due {
            return Round::Report(report);
        }
        self.last_plan_ms = v.now_ms;
        let [wmin, wmax] = self.settings.workers;
        // A probe takes a worker without asking: only where the job plans its own
        // capacity, and only when the capacity has room for it. On a shared brain service
        // every worker comes from the cluster's plan.
        let room = self.settings.allocation(v.workers + 1, v.ps).total_cpu()
            <= self.settings.cluster_cpu + 1e-9;
        if self.settings.send_capacity && self.seen_workers.len() < 2 {
            // Up when there is room; otherwise (a warm start that filled the capacity) down
            // by a quarter. A fit from one allocation predicted 1 worker as fast as 15 and
            // the job dropped to 1: the second allocation must be measured, not guessed.
            let to = if room && v.workers < wmax {
                Some(if self.exploring {
                    self.grown(v, 2)
                } else {
                    v.workers + 1
                })
            } else if v.workers > wmin {
                Some((v.workers * 3 / 4).clamp(wmin, v.workers - 1))
            } else {
                None
            };
            if let Some(to) = to {
                let d = self.worker_probe(v, to, format!(
                    "probe: the profile holds only {} worker(s); {to} workers measure how throughput scales (the fit needs two allocations)",
                    v.workers
                ));
                return Round::Probe(report, d);
            }
        }
        // A give-back probe costs throughput now for plans that repay it over the rest of
        // the job: one that ends within a few planning intervals keeps what it has.
        let remaining_s = self
            .measured()
            .filter(|t| *t > 0.0)
            .map_or(f64::INFINITY, |t| {
                v.samples_total.saturating_sub(v.samples_done) as f64 / t
            });
        let worth_probing =
            remaining_s * 1000.0 > PROBE_MIN_INTERVALS_LEFT * self.settings.interval_ms as f64;
        if !self.settings.send_capacity && worth_probing {
            if let Some(d) = self.shared_probe(v) {
                return Round::Probe(report, d);
            }
        }
        if self.exploring {
            match self.keep_growing(v) {
                Some((to, why)) => return Round::Probe(report, self.worker_probe(v, to, why)),
                // Scaling flattened (or a bound was reached): the brain plans from here.
                None => self.exploring = false,
            }
        }
        // Vertical: the cores of a worker (Eq. 2's `l_w`) are identified only once the profile
        // holds two values; probe one core more when the bounds allow it.
        let cpu = self.settings.worker_cpu;
        let room = f64::from(v.workers) * (cpu + 1.0) + f64::from(v.ps) * self.settings.ps_cpu
            <= self.settings.cluster_cpu + 1e-9;
        if self.settings.send_capacity
            && room
            && (self.seen_workers.len() >= 2 || v.workers >= wmax)
            && self.seen_cpu.len() < 2
            && cpu + 1.0 <= self.settings.worker_cpu_max
        {
            let d = Decision::Apply {
                workers: v.workers,
                worker_cpu: cpu + 1.0,
                ps: v.ps,
                ps_cpu: self.settings.ps_cpu,
                predicted: None,
                reasons: vec![format!(
                    "probe: the profile holds only {cpu} core(s) per worker; one more measures what a worker's cores are worth (Eq. 2)"
                )],
            };
            return Round::Probe(report, d);
        }
        // A PS's cores enter Eq. 2 only as `w / (p * ps_cpu)`: from one PS count and one
        // value of them, the fit cannot tell that term from the workers' own; one core
        // more per PS (in place, no restart) measures it.
        let ps_cpu = self.settings.ps_cpu;
        let room = self.settings.allocation(v.workers, v.ps).total_cpu() + f64::from(v.ps)
            <= self.settings.cluster_cpu + 1e-9;
        if self.settings.send_capacity
            && room
            && (self.seen_workers.len() >= 2 || v.workers >= wmax)
            && (self.seen_cpu.len() >= 2 || cpu + 1.0 > self.settings.worker_cpu_max)
            && self.seen_ps_cpu.len() < 2
            && self.seen_ps.len() < 2
            && ps_cpu + 1.0 <= self.settings.ps_cpu_max + 1e-9
        {
            let d = Decision::Apply {
                workers: v.workers,
                worker_cpu: cpu,
                ps: v.ps,
                ps_cpu: ps_cpu + 1.0,
                predicted: None,
                reasons: vec![format!(
                    "probe: the profile holds only {ps_cpu} core(s) per PS; one more measures what a server's cores are worth (Eq. 2, changed in place)"
                )],
            };
            return Round::Probe(report, d);
        }
        // A plan that wanted more PS for speed was refused while the profile held one PS
        // count (and a PS's cores could not vary: fixed, or no room for one more): a
        // second PS count identifies the PS term, so one more PS (an online re-sharding)
        // measures what a server is worth. Without it a job that may grow its PS for
        // speed never does. Only on the brain's word: a probe before it would pre-empt the
        // memory and hot-PS changes with one that has no reason of its own.
        let [_, pmax] = self.settings.ps;
        let room = self.settings.allocation(v.workers, v.ps + 1).total_cpu()
            <= self.settings.cluster_cpu + 1e-9;
        if self.ps_probe_wanted
            && self.settings.send_capacity
            && self.settings.ps_scaling
            && room
            && v.ps < pmax
            && !v.recovering
            && (self.seen_workers.len() >= 2 || v.workers >= wmax)
            && (self.seen_cpu.len() >= 2 || cpu + 1.0 > self.settings.worker_cpu_max)
            && self.seen_ps_cpu.len() < 2
            && self.seen_ps.len() < 2
        {
            self.ps_probe_wanted = false;
            let d = Decision::Apply {
                workers: v.workers,
                worker_cpu: cpu,
                ps: v.ps + 1,
                ps_cpu,
                predicted: None,
                reasons: vec![format!(
                    "probe: the profile holds only {} PS; {} measure what a server is worth (Eq. 2's w / (p ps_cpu), through online re-sharding)",
                    v.ps,
                    v.ps + 1
                )],
            };
            return Round::Probe(report, d);
        }
        if self.samples_taken < DLROVER_MIN_SAMPLES as u64 {
            // Too few windows for a fit with a held-out check: report them and wait.
            return Round::Report(report);
        }
        let remaining = v.samples_total.saturating_sub(v.samples_done);
        let current = self.settings.allocation(v.workers, v.ps);
        let horizon_s = self
            .measured()
            .filter(|t| *t > 0.0)
            .map_or(0.0, |t| remaining as f64 / t);
        let m = u64::from(self.settings.batch_size.max(1));
        let plan = pb::PlanRequest {
            job_id: self.settings.job_id.clone(),
            current: Some(alloc_to_pb(&current)),
            remaining_samples: remaining.max(1),
            current_step: v.samples_done / m,
            total_steps: v.samples_total.div_ceil(m).max(v.samples_done / m + 1),
            worker_start_s: self.settings.worker_start_s,
            ps_migration_s: self.settings.ps_migration_s,
            horizon_s,
            free_cpu: self
                .settings
                .send_capacity
                .then(|| (self.settings.cluster_cpu - current.total_cpu()).max(0.0)),
            free_mem_gb: self
                .settings
                .send_capacity
                .then(|| (self.settings.cluster_mem_gb - current.total_mem_gb()).max(0.0)),
            max_cpu: self.max_cpu,
            max_workers: self.max_workers,
        };
        self.measure_next = false;
        Round::Plan(report, plan)
    }

    /// On a shared brain service a job measures by giving back, never by taking (every
    /// core it takes comes from the cluster's plan): a quarter fewer workers, then cores
    /// per worker, then cores per PS (in place; the PS term of Eq. 2 is `w / (p ps_cpu)`,
    /// so this also tells what a PS is worth), each while the profile holds one value of
    /// it. Without them a fit over one allocation can say nothing about a dimension, the
    /// plans' changes in it are refused, and a job that started with one PS stayed
    /// PS-bound (the cluster simulator: 4x the JCT of the users' own configurations).
    fn shared_probe(&self, v: &View) -> Option<Decision> {
        let [wmin, _] = self.settings.workers;
        let quarter_off = |x: f64| x - (x / 4.0).floor().max(1.0);
        if self.seen_workers.len() < 2 && v.workers > wmin {
            let to = (v.workers * 3 / 4).clamp(wmin, v.workers - 1);
            return Some(self.worker_probe(v, to, format!(
                "probe: the profile holds only {} worker(s); {to} workers measure how throughput scales (on a shared brain a probe gives back, never takes)",
                v.workers
            )));
        }
        let cpu = self.settings.worker_cpu;
        if self.seen_cpu.len() < 2 && cpu >= 2.0 {
            let to = quarter_off(cpu);
            return Some(Decision::Apply {
                workers: v.workers,
                worker_cpu: to,
                ps: v.ps,
                ps_cpu: self.settings.ps_cpu,
                predicted: None,
                reasons: vec![format!(
                    "probe: the profile holds only {cpu} core(s) per worker; {to} measure what a worker's cores are worth (Eq. 2; on a shared brain a probe gives back)"
                )],
            });
        }
        let ps_cpu = self.settings.ps_cpu;
        if self.seen_ps_cpu.len() < 2 && self.seen_ps.len() < 2 && ps_cpu >= 2.0 {
            let to = quarter_off(ps_cpu);
            return Some(Decision::Apply {
                workers: v.workers,
                worker_cpu: cpu,
                ps: v.ps,
                ps_cpu: to,
                predicted: None,
                reasons: vec![format!(
                    "probe: the profile holds only {ps_cpu} core(s) per PS and one PS count; {to} measure what a server is worth (Eq. 2's w / (p ps_cpu), changed in place)"
                )],
            });
        }
        None
    }

    /// `factor` times the workers of `v`, within the worker bound and the capacity (at
    /// least one more).
    fn grown(&self, v: &View, factor: u32) -> u32 {
        let [_, wmax] = self.settings.workers;
        let fits = |n: u32| {
            self.settings.allocation(n, v.ps).total_cpu() <= self.settings.cluster_cpu + 1e-9
        };
        let mut to = (factor * v.workers).min(wmax).max(v.workers + 1);
        while to > v.workers + 1 && !fits(to) {
            to -= 1;
        }
        to
    }

    /// While exploring: the next growth, if the last one paid (throughput at the current
    /// workers against the largest smaller count measured at the same PS and cores is at
    /// least `explore_efficiency` of proportional; four times the workers at
    /// `explore_linear`, else twice) and the bounds and capacity leave room.
    fn keep_growing(&self, v: &View) -> Option<(u32, String)> {
        let (now, w, p) = self.measured?;
        if (w, p) != (v.workers, v.ps) {
            return None;
        }
        let (cpu, ps_cpu) = self.settings.cores_key();
        let (&(.., w0), &before) = self
            .throughput_at
            .range((p, cpu, ps_cpu, 0)..(p, cpu, ps_cpu, w))
            .next_back()?;
        let efficiency = (now / before) / (f64::from(w) / f64::from(w0));
        let linear = efficiency >= self.settings.explore_linear;
        let to = self.grown(v, if linear { 4 } else { 2 });
        let room = self.settings.allocation(to, p).total_cpu() <= self.settings.cluster_cpu + 1e-9;
        let [_, wmax] = self.settings.workers;
        (efficiency >= self.settings.explore_efficiency && w < wmax && room).then(|| {
            (
                to,
                format!(
                    "probe: {w0} -> {w} workers raised throughput {:.2}x ({:.0}% of proportional); {to} while it scales (a cold start explores before the fit)",
                    now / before,
                    100.0 * efficiency
                ),
            )
        })
    }

    /// The decision that undoes the last plan, when its first window says it did not pay:
    /// a growth that raised throughput by less than [`Settings::growth_efficiency`] of the
    /// cores it added, or any other change that lost more throughput than the cores it gave
    /// back (and `min_gain` of noise).
    ///
    /// A growth that added workers is first halved: the job goes to the geometric mean of
    /// the workers before and after it, with the plan's cores and PS ([`halfway`]), judged
    /// at its first window against the same allocation before the growth. The brain's model lacks the
    /// terms that make the last workers and cores idle (contention, stragglers), so a plan
    /// too big to pay may still hold a smaller growth that does; undoing it whole left
    /// jobs at half the speed their cluster had room for. When the halfway step pays, the
    /// plans stay below the workers and cores of the growth that did not; when it does
    /// not either, the job goes back and its plans stay within the workers (or, without a
    /// change of workers, the cores) it had.
    fn undo_unpaid_plan(&mut self, v: &View) -> Option<Decision> {
        self.halfway = None;
        let g = self.growth.take()?;
        let (now, w, p) = self.measured?;
        let after = self.settings.allocation(v.workers, v.ps);
        // Judged only at the allocation the plan made (a failure or a refused change in
        // between leaves nothing to judge).
        if (w, p) != (v.workers, v.ps) || self.settings.growth_efficiency <= 0.0 {
            return None;
        }
        let b = g.before;
        let (cores_before, cores_after) = (b.total_cpu(), after.total_cpu());
        if g.give_back {
            // What the cores given back were worth: the growth from here back to them.
            let added = cores_before / cores_after - 1.0;
            let gained = g.measured_before / now - 1.0;
            if b.workers > after.workers && gained < self.settings.growth_efficiency * added {
                self.max_workers = Some(
                    self.max_workers
                        .map_or(after.workers, |m| m.min(after.workers)),
                );
                self.cap_reason = Some(format!(
                    "probe: {} -> {} workers ({cores_after} -> {cores_before} cores, {:+.0}%) is worth {:+.1}% throughput ({:.0} -> {:.0} samples/s), {:.0}% of proportional, below autoscale.growth_efficiency ({:.0}%): plans stay within {} workers",
                    after.workers,
                    b.workers,
                    added * 100.0,
                    gained * 100.0,
                    now,
                    g.measured_before,
                    gained / added * 100.0,
                    self.settings.growth_efficiency * 100.0,
                    after.workers
                ));
            }
            return None;
        }
        let cores = cores_after / cores_before;
        let speed = now / g.measured_before;
        let grew = cores > 1.0 + 1e-9;
        let paid = if grew {
            speed - 1.0 >= self.settings.growth_efficiency * (cores - 1.0)
        } else {
            // The brain plans a change that keeps or saves cores only for a gain.
            speed >= 1.0 - self.settings.min_gain
        };
        if paid {
            if let Some(planned) = g.halfway_of {
                // Below the growth that did not pay: a later plan may search between.
                let mut limits = Vec::new();
                if planned.workers > after.workers {
                    let below = planned.workers - 1;
                    self.max_workers = Some(self.max_workers.map_or(below, |m| m.min(below)));
                    limits.push(format!("{below} workers"));
                }
                let below = planned.total_cpu() - 1.0;
                self.max_cpu = Some(self.max_cpu.map_or(below, |m| m.min(below)));
                limits.push(format!("{below} cores"));
                self.cap_reason = Some(format!(
                    "the halfway step to {} workers x {} cores and {} PS x {} cores ({cores_before} -> {cores_after} cores) raised throughput {:.0} -> {now:.0} samples/s ({:+.1}%), at least autoscale.growth_efficiency ({:.0}%) of proportional, where {} workers and {} cores did not: plans stay within {}",
                    after.workers,
                    after.worker_cpu,
                    after.ps,
                    after.ps_cpu,
                    g.measured_before,
                    (speed - 1.0) * 100.0,
                    self.settings.growth_efficiency * 100.0,
                    planned.workers,
                    planned.total_cpu(),
                    limits.join(" and ")
                ));
            }
            return None;
        }
        let mut reasons = vec![format!(
            "measured: the plan's {} workers x {} cores and {} PS x {} cores ({cores_before} -> {cores_after} cores, {:+.0}%) changed throughput {:.0} -> {now:.0} samples/s ({:+.1}%)",
            after.workers,
            after.worker_cpu,
            after.ps,
            after.ps_cpu,
            (cores - 1.0) * 100.0,
            g.measured_before,
            (speed - 1.0) * 100.0,
        )];
        if grew {
            reasons.push(format!(
                "{:.0}% of proportional, below autoscale.growth_efficiency ({:.0}%)",
                (speed - 1.0) / (cores - 1.0) * 100.0,
                self.settings.growth_efficiency * 100.0
            ));
            let mid = halfway(&b, &after);
            let mid_cpu = mid.total_cpu();
            if g.halfway_of.is_none()
                && !g.ps_probe
                && mid_cpu > cores_before + 0.5
                && mid_cpu < cores_after - 0.5
            {
                reasons.push(format!(
                    "halfway: {} workers x {} cores and {} PS x {} cores ({mid_cpu} cores), judged against the {:.0} samples/s before the plan",
                    mid.workers, mid.worker_cpu, mid.ps, mid.ps_cpu, g.measured_before
                ));
                let step = Growth {
                    halfway_of: Some(after),
                    ..g
                };
                self.halfway = Some((mid.workers, step));
                return Some(Decision::Apply {
                    workers: mid.workers,
                    worker_cpu: mid.worker_cpu,
                    ps: mid.ps,
                    ps_cpu: mid.ps_cpu,
                    predicted: None,
                    reasons,
                });
            }
        } else {
            reasons.push(format!(
                "slower by more than autoscale.min_gain ({:.0}%) for no more cores",
                self.settings.min_gain * 100.0
            ));
        }
        // Back to the allocation before the plan, or to a larger one this job measured
        // to pay against it: on a shared brain the plan may have left a probe that gave a
        // quarter of the job's warm start back, and capping the job there would keep it
        // below an allocation it already ran well.
        let (b, back_to) = match self.best_paid_below(&b, g.measured_before, &after, g.for_memory) {
            Some((a, tp)) => {
                reasons.push(format!(
                    "{} workers x {} cores and {} PS x {} cores ({} cores) were measured at {tp:.0} samples/s, {:+.1}% for {:+.0}% cores: paid",
                    a.workers,
                    a.worker_cpu,
                    a.ps,
                    a.ps_cpu,
                    a.total_cpu(),
                    (tp / g.measured_before - 1.0) * 100.0,
                    (a.total_cpu() / cores_before - 1.0) * 100.0,
                ));
                (a, tp)
            }
            None => (b, g.measured_before),
        };
        let capped = if g.ps_probe {
            None
        } else if after.workers > b.workers {
            self.max_workers = Some(self.max_workers.map_or(b.workers, |m| m.min(b.workers)));
            Some(format!("plans stay within {} workers", b.workers))
        } else if grew && after.ps_cpu > b.ps_cpu + 1e-9 {
            // A plan that moved cores onto the PS says what the PS's cores are worth,
            // not what more cores of the job's shape would be: a cap on the job's cores
            // kept such jobs below the cores their warm start ran well.
            self.max_ps_cpu = Some(self.max_ps_cpu.map_or(b.ps_cpu, |m| m.min(b.ps_cpu)));
            Some(format!("plans stay within {} cores per PS", b.ps_cpu))
        } else if grew {
            self.max_cpu = Some(self.max_cpu.map_or(cores_before, |m| m.min(cores_before)));
            Some(format!("plans stay within {cores_before} cores"))
        } else {
            None
        };
        if let Some(c) = capped {
            reasons.push(c);
            self.cap_reason = Some(reasons.join("; "));
        }
        // A PS count changed for memory stays, and so does one that grew for speed where
        // the servers' memory will need it by the job's end: only the rest is undone.
        let memory_need = (b.ps < after.ps && !g.for_memory)
            .then(|| self.ps_needed_for_memory(v))
            .flatten()
            .filter(|(need, _)| *need > b.ps);
        let ps = if g.for_memory {
            after.ps
        } else if let Some((need, _)) = &memory_need {
            after.ps.min(*need)
        } else {
            b.ps
        };
        let stays = if g.for_memory {
            " (the PS count, changed for memory, stays)".to_string()
        } else if let Some((_, why)) = &memory_need {
            format!(" (the PS count stays: {why})")
        } else {
            String::new()
        };
        if (b.workers, b.worker_cpu, ps, b.ps_cpu)
            == (after.workers, after.worker_cpu, after.ps, after.ps_cpu)
        {
            reasons.push(format!("kept{stays}"));
            return Some(Decision::Keep(reasons.join("; ")));
        }
        reasons.push(format!(
            "back to {} workers x {} cores and {ps} PS x {} cores{stays}",
            b.workers, b.worker_cpu, b.ps_cpu,
        ));
        Some(Decision::Apply {
            workers: b.workers,
            worker_cpu: b.worker_cpu,
            ps,
            ps_cpu: b.ps_cpu,
            predicted: Some(back_to),
            reasons,
        })
    }

    /// The allocation between `before` and the unpaid `after` (more cores than `before`,
    /// fewer workers and cores than `after`) that this job measured fastest among those
    /// that paid against `before`'s `measured_before` (at least
    /// [`Settings::growth_efficiency`] of proportional), within the bounds and limits;
    /// with its measured throughput. Only for a growth of workers that did not change
    /// the PS for memory.
    fn best_paid_below(
        &self,
        before: &Allocation,
        measured_before: f64,
        after: &Allocation,
        for_memory: bool,
    ) -> Option<(Allocation, f64)> {
        if for_memory || after.workers <= before.workers {
            return None;
        }
        let s = &self.settings;
        let (lo, hi) = (before.total_cpu(), after.total_cpu());
        self.throughput_at
            .iter()
            .map(|(&(ps, cpu, ps_cpu, workers), &tp)| {
                let a = Allocation {
                    workers,
                    ps,
                    worker_cpu: cpu as f64,
                    ps_cpu: ps_cpu as f64 / 1000.0,
                    ..*before
                };
                (a, tp)
            })
            .filter(|(a, tp)| {
                let cores = a.total_cpu();
                a.workers > before.workers
                    && a.workers < after.workers
                    && (s.workers[0]..=s.workers[1]).contains(&a.workers)
                    && (s.ps[0]..=s.ps[1]).contains(&a.ps)
                    && a.worker_cpu <= s.worker_cpu_max + 1e-9
                    && a.ps_cpu <= s.ps_cpu_max + 1e-9
                    && cores > lo + 1e-9
                    && cores < hi - 1e-9
                    && self.max_workers.is_none_or(|m| a.workers <= m)
                    && self.max_cpu.is_none_or(|m| cores <= m + 1e-9)
                    && self.max_ps_cpu.is_none_or(|m| a.ps_cpu <= m + 1e-9)
                    && tp / measured_before - 1.0 >= s.growth_efficiency * (cores / lo - 1.0)
            })
            .max_by(|x, y| x.1.total_cmp(&y.1))
    }

    /// A probe to `workers` workers at the current cores and PS.
    fn worker_probe(&self, v: &View, workers: u32, why: String) -> Decision {
        Decision::Apply {
            workers,
            worker_cpu: self.settings.worker_cpu,
            ps: v.ps,
            ps_cpu: self.settings.ps_cpu,
            predicted: None,
            reasons: vec![why],
        }
    }

    /// Samples a failed report must not lose: they go back in front of newer ones.
    pub fn requeue(&mut self, report: pb::ReportProfileRequest) {
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

    /// Judges a plan from the brain against the bounds and the state of the job.
    pub fn review(&mut self, plan: &pb::PlanResponse, v: &View) -> Decision {
        self.brain_error = None;
        self.last_plan = Some(plan.clone());
        self.plan_for_memory = plan.memory.iter().any(|m| m.step_at_limit > 0);
        let d = self.judge(plan, v);
        // The brain sees a gain in more servers that the fit cannot predict yet (one PS
        // count, one value of a PS's cores): the next round measures one more.
        self.ps_probe_wanted = !self.plan_for_memory
            && self.seen_ps.len() < 2
            && self.seen_ps_cpu.len() < 2
            && plan.allocation.is_some_and(|a| a.ps > v.ps);
        self.last_verdict = Some(match &d {
            Decision::Apply {
                workers,
                ps,
                worker_cpu,
                ps_cpu,
                ..
            } => format!("apply: {workers} workers x {worker_cpu} cores, {ps} PS x {ps_cpu} cores"),
            Decision::Keep(why) => format!("keep: {why}"),
            Decision::Refuse(why) => format!("refused: {why}"),
        });
        d
    }

    fn judge(&self, plan: &pb::PlanResponse, v: &View) -> Decision {
        let Some(a) = plan.allocation else {
            return Decision::Refuse("the brain's plan has no allocation".into());
        };
        let [wmin, wmax] = self.settings.workers;
        let [pmin, pmax] = self.settings.ps;
        let cpu_max = self.settings.worker_cpu_max;
        let cpu = a.worker_cpu.round();
        if !(a.worker_cpu.is_finite() && (1.0..=cpu_max + 1e-9).contains(&cpu)) {
            return Decision::Refuse(format!(
                "the plan's {} cores per worker are outside [1, {cpu_max}] (autoscale.worker_cpu_max)",
                a.worker_cpu
            ));
        }
        if !(wmin..=wmax).contains(&a.workers) {
            return Decision::Refuse(format!(
                "the plan's {} workers are outside autoscale.workers [{wmin}, {wmax}]",
                a.workers
            ));
        }
        let ps_cpu_max = self.settings.ps_cpu_max.max(self.settings.ps_cpu);
        if !(a.ps_cpu.is_finite() && a.ps_cpu > 0.0 && a.ps_cpu <= ps_cpu_max + 1e-9) {
            return Decision::Refuse(format!(
                "the plan's {} cores per PS are outside (0, {ps_cpu_max}] (autoscale.ps_cpu_max)",
                a.ps_cpu
            ));
        }
        if !(pmin..=pmax).contains(&a.ps) {
            return Decision::Refuse(format!(
                "the plan's {} PS are outside autoscale.ps [{pmin}, {pmax}]",
                a.ps
            ));
        }
        let tp = plan.predicted_throughput;
        if !(tp.is_finite() && tp >= 0.0) {
            return Decision::Refuse(format!(
                "the plan's predicted throughput {tp} is not a number of samples/s"
            ));
        }
        if v.recovering {
            return Decision::Refuse(
                "a parameter server is being recovered; scaling waits until it runs".into(),
            );
        }
        let (workers, guessed) = self.trusted_workers(a.workers);
        // A PS change for memory (a server would reach its limit before the job ends) is
        // always made. One for speed only once the profile spans two PS counts or two
        // values of a PS's cores (the PS term of Eq. 2 is `w / (p ps_cpu)`): from neither,
        // the fit cannot tell what a server is worth, and a re-sharding bought on a guess
        // costs a pause. At most twice (half) the counts measured, as for workers.
        let for_memory = plan.memory.iter().any(|m| m.step_at_limit > 0);
        let (planned_ps, ps_step) = if for_memory {
            (a.ps, None)
        } else {
            trusted(&self.seen_ps, a.ps, "PS")
        };
        let (ps, ps_note) = if planned_ps == v.ps {
            (a.ps, None)
        } else if !self.settings.ps_scaling {
            (
                v.ps,
                Some("needs online re-sharding, which this job cannot do (synchronous mode)"),
            )
        } else if !for_memory && self.seen_ps.len() < 2 && self.seen_ps_cpu.len() < 2 {
            (
                v.ps,
                Some("is for speed, and the profile holds one PS count and one value of a PS's cores: the fit cannot predict it"),
            )
        } else if planned_ps < v.ps && a.ps_mem_gb > self.settings.ps_mem_gb + 1e-9 {
            // Fewer PS hold more rows each: the plan sized them with more memory than
            // this job's PS have (memory is not changed in place), so they would run out.
            (
                v.ps,
                Some("needs more memory per PS than the job's PS have (the model state would not fit on fewer)"),
            )
        } else {
            (planned_ps, None)
        };
        // Cores per worker change only once the profile holds two values (as PS counts):
        // from one, the fit cannot tell what a core is worth, up or down (the cluster
        // simulator showed shared-brain plans cutting workers to one core on such a fit).
        let now_cpu = self.settings.worker_cpu;
        let cpu = if cpu != now_cpu && self.seen_cpu.len() < 2 {
            now_cpu
        } else {
            cpu
        };
        // Cores per PS once the fit can tell what they are worth: two values of them, or
        // two PS counts (the term is `w / (p * ps_cpu)`).
        let now_ps_cpu = self.settings.ps_cpu;
        let ps_cpu =
            if a.ps_cpu != now_ps_cpu && self.seen_ps_cpu.len() < 2 && self.seen_ps.len() < 2 {
                now_ps_cpu
            } else {
                a.ps_cpu
            };
        // Cores per PS above those of a plan that raised them and did not pay.
        let (ps_cpu, ps_cpu_capped) = match self.max_ps_cpu {
            Some(max) if ps_cpu > max + 1e-9 && !for_memory => (
                max,
                Some(format!(
                    "{ps_cpu} cores per PS are more than the {max} this job measured to pay (a plan that raised them did not): {max}"
                )),
            ),
            _ => (ps_cpu, None),
        };
        if (workers, ps) == (v.workers, v.ps) && cpu == now_cpu && ps_cpu == now_ps_cpu {
            return Decision::Keep(match ps_note {
                Some(why) => format!("the plan's PS change ({} -> {}) {why}", v.ps, a.ps),
                None => format!("the plan keeps {} workers and {} PS", v.workers, v.ps),
            });
        }
        let planned_cpu = f64::from(workers) * cpu + f64::from(ps) * ps_cpu;
        if let Some(max) = self
            .max_cpu
            .filter(|m| !for_memory && planned_cpu > m + 1e-9)
        {
            return Decision::Keep(format!(
                "the plan's {planned_cpu} cores are more than the {max} this job measured to pay (a growth beyond them raised throughput by less than autoscale.growth_efficiency of the cores it added)"
            ));
        }
        if let Some(max) = self.max_workers.filter(|m| !for_memory && workers > *m) {
            return Decision::Keep(format!(
                "the plan's {workers} workers are more than the {max} this job measured to pay (a growth beyond them raised throughput by less than autoscale.growth_efficiency of the cores it added)"
            ));
        }
        if let Some(now) = self.measured().filter(|t| *t > 0.0) {
            let change = (tp - now) / now;
            // Fewer nodes for the same speed is a saving; more nodes must be faster.
            let cheaper =
                workers <= v.workers && ps <= v.ps && cpu <= now_cpu && ps_cpu <= now_ps_cpu;
            if !cheaper && !for_memory && change < self.settings.min_gain {
                return Decision::Keep(format!(
                    "predicted {tp:.0} samples/s is {:+.1}% of the measured {now:.0}, below autoscale.min_gain ({:.0}%)",
                    change * 100.0,
                    self.settings.min_gain * 100.0
                ));
            }
            // A job that plans its own capacity saves nodes only at about the same speed:
            // a plan 10% slower for fewer workers made a warm job lose what it saved.
            // (A shared brain service shrinks a job for the others: its plan stands.)
            if cheaper && self.settings.send_capacity && change < -self.settings.min_gain {
                return Decision::Keep(format!(
                    "predicted {tp:.0} samples/s is {:+.1}% of the measured {now:.0}: fewer nodes only within autoscale.min_gain ({:.0}%) of the measured speed",
                    change * 100.0,
                    self.settings.min_gain * 100.0
                ));
            }
        }
        // The prediction was for the plan's count, not the trusted step towards it.
        let ps_step = ps_step.filter(|_| ps != v.ps);
        let steps = [guessed, ps_step, ps_cpu_capped];
        let predicted = steps.iter().all(Option::is_none).then_some(tp);
        let mut reasons = plan.reasons.clone();
        reasons.extend(steps.into_iter().flatten());
        Decision::Apply {
            workers,
            worker_cpu: cpu,
            ps,
            ps_cpu,
            predicted,
            reasons,
        }
    }

    /// The plan's worker count, or the nearest one the fit can be trusted with: within
    /// half the fewest and twice the most workers the profile measured (with a note why).
    /// A fit of throughput against workers extrapolates badly: one over 11 and 15 workers,
    /// where the job was bound by its PS, predicted 1 worker as fast, and a warm job went
    /// from 11 workers to 1 and back. Clamped, such a plan becomes a step that measures.
    fn trusted_workers(&self, planned: u32) -> (u32, Option<String>) {
        trusted(&self.seen_workers, planned, "workers")
    }

    /// Records an executed decision.
    pub fn applied(&mut self, d: &Decision, v: &View, source: &str) {
        if let Decision::Apply {
            workers,
            worker_cpu,
            ps,
            ps_cpu,
            predicted,
            reasons,
        } = d
        {
            let before = self.settings.allocation(v.workers, v.ps);
            let after = Allocation {
                workers: *workers,
                ps: *ps,
                worker_cpu: *worker_cpu,
                ps_cpu: *ps_cpu,
                ..before
            };
            // A plan's growth is judged at its first window, against the window before
            // it (measured at the allocation it leaves).
            let measured_here = self
                .measured
                .filter(|(_, w, p)| (*w, *p) == (v.workers, v.ps));
            let give_back = source == "probe" && after.total_cpu() < before.total_cpu() - 1e-9;
            let ps_probe = source == "probe" && after.ps > before.ps;
            let halfway = self
                .halfway
                .take()
                .filter(|(w, _)| source == "revert" && w == workers);
            self.growth = match halfway {
                // Judged against the allocation before the growth it halves.
                Some((_, step)) => Some(step),
                None => (source == "plan" || give_back || ps_probe)
                    .then_some(measured_here)
                    .flatten()
                    .map(|(tp, ..)| Growth {
                        before,
                        measured_before: tp,
                        give_back,
                        ps_probe,
                        for_memory: source == "plan" && self.plan_for_memory,
                        halfway_of: None,
                    }),
            };
            self.measure_next = source != "plan";
            self.history.push(ScalingRecord {
                at_s: v.now_ms.saturating_sub(self.started_ms) as f64 / 1000.0,
                before: (v.workers, v.ps),
                after: (*workers, *ps),
                worker_cpu: (self.settings.worker_cpu, *worker_cpu),
                ps_cpu: (self.settings.ps_cpu, *ps_cpu),
                source: source.to_string(),
                measured_before: self.measured(),
                predicted: *predicted,
                measured_after: None,
                reasons: reasons.clone(),
            });
            self.settings.worker_cpu = *worker_cpu;
            self.settings.ps_cpu = *ps_cpu;
            // The next window starts at the new allocation.
            self.window = None;
        }
    }

    /// The state for `elastrec status` and `result.json`.
    pub fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "bounds": {"workers": self.settings.workers, "ps": self.settings.ps},
            "profile_samples": self.samples_taken,
            "measured_samples_per_s": self.measured(),
            "last_plan": self.last_plan.as_ref().map(|p| serde_json::json!({
                "kind": p.kind,
                "workers": p.allocation.map(|a| a.workers),
                "ps": p.allocation.map(|a| a.ps),
                "predicted_samples_per_s": p.predicted_throughput,
                "fit_mape_percent": p.fit.as_ref().map(|f| f.mape),
                "reasons": p.reasons,
            })),
            "last_verdict": self.last_verdict,
            "limits": {
                "max_workers": self.max_workers,
                "max_cpu": self.max_cpu,
                "max_ps_cpu": self.max_ps_cpu,
                "why": self.cap_reason,
            },
            "brain_error": self.brain_error,
            "scaling": self.history,
        })
    }
}

/// `planned`, or the nearest count a fit over the `seen` ones can be trusted with: half
/// the fewest to twice the most (with a note why).
fn trusted(
    seen: &std::collections::BTreeSet<u32>,
    planned: u32,
    what: &str,
) -> (u32, Option<String>) {
    let (Some(&lo), Some(&hi)) = (seen.first(), seen.last()) else {
        return (planned, None);
    };
    let trusted = planned.clamp((lo / 2).max(1), hi.saturating_mul(2));
    if trusted == planned {
        return (planned, None);
    }
    (
        trusted,
        Some(format!(
            "{planned} {what} is outside what the fit can be trusted with (the profile measured {lo} to {hi}; half to twice that): {trusted} {what} first, measured before going further"
        )),
    )
}

/// The memory watchdog's verdict on one node: `Some(reason)` when its resident memory is
/// above its limit (the local backend's stand-in for a cgroup memory limit: the node is
/// stopped as the kernel's OOM killer would, and the master's failure handling takes over).
pub fn memory_verdict(limit_gb: f64, is_ps: bool, rss_bytes: u64) -> Option<String> {
    let rss_gb = rss_bytes as f64 / (1u64 << 30) as f64;
    (rss_gb > limit_gb).then(|| {
        format!(
            "resident memory {rss_gb:.2} GiB is above its limit of {limit_gb:.2} GiB (autoscale.{}_mem_gb)",
            if is_ps { "ps" } else { "worker" }
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            job_id: "j".into(),
            workers: [1, 4],
            ps: [1, 1],
            interval_ms: 3000,
            sample_ms: 1000,
            min_gain: 0.05,
            batch_size: 100,
            worker_cpu: 1.0,
            worker_cpu_max: 1.0,
            ps_cpu: 1.0,
            ps_cpu_max: 1.0,
            worker_mem_gb: 2.0,
            ps_mem_gb: 2.0,
            cluster_cpu: 16.0,
            cluster_mem_gb: 64.0,
            worker_start_s: 2.0,
            ps_migration_s: 1.0,
            ps_scaling: false,
            hot_ratio: 3.0,
            send_capacity: true,
            explore: false,
            explore_efficiency: 0.75,
            explore_linear: 0.9,
            growth_efficiency: 0.5,
        }
    }

    fn view(now_ms: u64, workers: u32, samples_done: u64) -> View {
        View {
            now_ms,
            workers,
            target_workers: workers,
            ps: 1,
            steady: true,
            recovering: false,
            samples_done,
            samples_total: 1_000_000,
        }
    }

    fn plan(workers: u32, ps: u32, tp: f64) -> pb::PlanResponse {
        pb::PlanResponse {
            kind: "replan".into(),
            allocation: Some(alloc_to_pb(&settings().allocation(workers, ps))),
            predicted_throughput: tp,
            reasons: vec!["because".into()],
            ..Default::default()
        }
    }

    /// Runs `secs` seconds at `workers` workers and `rate` samples/s, one observation
    /// every 100 ms; returns the clock and samples after.
    fn run(a: &mut Autoscaler, t: &mut u64, s: &mut u64, workers: u32, rate: u64, secs: u64) {
        for _ in 0..secs * 10 {
            *t += 100;
            *s += rate / 10;
            a.observe(&view(*t, workers, *s));
        }
    }

    /// Halfway keeps the plan's cores per worker and PS count, and not a raise of the
    /// PS's cores, which the halfway step could not tell apart from its workers.
    #[test]
    fn halfway_halves_the_workers_and_keeps_the_fewer_ps_cores() {
        let from = Allocation {
            ps_cpu: 2.0,
            ..settings().allocation(6, 2)
        };
        let to = Allocation {
            worker_cpu: 8.0,
            ps_cpu: 6.0,
            ..settings().allocation(24, 4)
        };
        let mid = halfway(&from, &to);
        assert_eq!(
            (mid.workers, mid.worker_cpu, mid.ps, mid.ps_cpu),
            (12, 8.0, 4, 2.0)
        );
        let fewer = Allocation { ps_cpu: 1.0, ..to };
        assert_eq!(halfway(&from, &fewer).ps_cpu, 1.0);
    }

    /// [`settings`] for the tests of a plan's growth judged at its first window: up to 32
    /// workers, plans a minute apart (so windows, not plan rounds, decide), room for all.
    fn growth_settings() -> Settings {
        Settings {
            workers: [1, 32],
            interval_ms: 60_000,
            cluster_cpu: 64.0,
            ..settings()
        }
    }

    /// Runs 2 s at `from`'s workers and samples/s, then a probe to `to`'s workers, run 2 s
    /// at its samples/s.
    fn probed(a: &mut Autoscaler, t: &mut u64, s: &mut u64, from: (u32, u64), to: (u32, u64)) {
        run(a, t, s, from.0, from.1, 2);
        let probe = a.worker_probe(&view(*t, from.0, *s), to.0, "probe".into());
        a.applied(&probe, &view(*t, from.0, *s), "probe");
        run(a, t, s, to.0, to.1, 2);
    }

    /// On a shared brain nothing probes, so the profile holds one core count and one PS
    /// count: a plan that cuts cores per worker, or PS for speed, is a guess of the fit
    /// and is not made; fewer PS for a plan that sized them with more memory than the
    /// job's PS have would run them out of memory.
    #[test]
    fn a_profile_of_one_core_and_ps_count_changes_neither() {
        let shared = Settings {
            workers: [1, 8],
            ps: [1, 4],
            worker_cpu: 4.0,
            worker_cpu_max: 8.0,
            ps_mem_gb: 8.0,
            ps_scaling: true,
            send_capacity: false,
            ..settings()
        };
        let mut a = Autoscaler::new(shared.clone(), 0);
        let (mut t, mut s) = (0, 0);
        run(&mut a, &mut t, &mut s, 2, 1000, 3);
        let mut v = view(t, 2, s);
        v.ps = 2;
        let mut p = plan(3, 2, 2000.0);
        let mut fewer_cores = shared.allocation(3, 2);
        fewer_cores.worker_cpu = 1.0;
        p.allocation = Some(alloc_to_pb(&fewer_cores));
        match a.review(&p, &v) {
            Decision::Apply {
                workers,
                worker_cpu,
                ..
            } => assert_eq!((workers, worker_cpu), (3, 4.0)),
            d => panic!("{d:?}"),
        }
        let mut fewer_ps = shared.allocation(2, 1);
        fewer_ps.ps_mem_gb = 16.0;
        p.allocation = Some(alloc_to_pb(&fewer_ps));
        match a.review(&p, &v) {
            Decision::Keep(why) => assert!(why.contains("one PS count"), "{why}"),
            d => panic!("{d:?}"),
        }
        // With two PS counts measured, a cut for speed is made, unless the fewer PS need
        // more memory than the job's have.
        a.seen_ps.insert(2);
        match a.review(&p, &v) {
            Decision::Keep(why) => assert!(why.contains("more memory per PS"), "{why}"),
            d => panic!("{d:?}"),
        }
        fewer_ps.ps_mem_gb = 8.0;
        p.allocation = Some(alloc_to_pb(&fewer_ps));
        assert!(matches!(a.review(&p, &v), Decision::Apply { ps: 1, .. }));
    }

    #[test]
    fn windows_become_samples_with_the_iteration_time_of_eq_1() {
        let mut a = Autoscaler::new(settings(), 0);
        let (mut t, mut s) = (0, 0);
        run(&mut a, &mut t, &mut s, 2, 1000, 3);
        // 2 workers x 100 rows at 1000 samples/s: one iteration takes 0.2 s.
        assert_eq!(
            a.unreported.len(),
            2,
            "the first observation only opens a window"
        );
        for p in &a.unreported {
            assert!((p.iter_time_s - 0.2).abs() < 1e-9, "{p:?}");
            assert_eq!(p.allocation.unwrap().workers, 2);
        }
        assert_eq!(a.measured(), Some(1000.0));
        // Not steady (a worker starting): no sample, the window restarts.
        let mut v = view(t + 1500, 2, s + 1500);
        v.steady = false;
        a.observe(&v);
        assert!(a.window.is_none());
    }

    /// A cold job (no warm start) grows its workers while each growth pays, four times
    /// while throughput keeps proportional, twice while it nearly does, and stops when a
    /// growth no longer pays: the brain then plans from a profile that spans the curve. A
    /// job that scales badly from the start stops after its first probe.
    /// The worker counts a cold job explores through, window after window, until the
    /// brain plans, when `w` workers train `rate(w)` samples/s.
    fn explored(cold: &Settings, rate: impl Fn(u32) -> u64) -> (Vec<u32>, Autoscaler) {
        let mut a = Autoscaler::new(cold.clone(), 0);
        let (mut t, mut s) = (0, 0);
        let mut workers = 1;
        let mut path = vec![workers];
        loop {
            // Two 1-s windows, within the 3-s planning interval: exploring does not wait
            // for it.
            run(&mut a, &mut t, &mut s, workers, rate(workers), 2);
            match a.next_round(&view(t, workers, s)) {
                Round::Probe(_, d) => {
                    let Decision::Apply { workers: to, .. } = d else {
                        panic!("{d:?}")
                    };
                    a.applied(&d, &view(t, workers, s), "probe");
                    workers = to;
                    path.push(workers);
                }
                Round::Plan(..) => break,
                Round::Revert(..) => panic!("a probe is never undone"),
                Round::Report(_) | Round::Idle => {}
            }
            assert!(path.len() < 8, "{path:?}");
        }
        (path, a)
    }

    #[test]
    fn a_cold_job_doubles_its_workers_while_throughput_keeps_up() {
        let cold = Settings {
            workers: [1, 32],
            explore: true,
            explore_efficiency: 0.75,
            explore_linear: 0.9,
            cluster_cpu: 64.0,
            ..settings()
        };
        let rate = |w: u32| match w {
            8 => 7_000,
            16 => 8_400,
            w => 1_000 * u64::from(w),
        };
        let (path, a) = explored(&cold, rate);
        // 1 -> 2 is proportional: four times the workers; 2 -> 8 gives 3.5x (88%): twice;
        // 8 -> 16 gives 1.2x (60%): the brain plans from here.
        assert_eq!(path, [1, 2, 8, 16]);
        let probes: Vec<&str> = a.history().iter().map(|h| h.reasons[0].as_str()).collect();
        assert!(
            probes[2].contains("2 -> 8 workers raised throughput 3.50x"),
            "{probes:?}"
        );

        // The thresholds are the job's (`autoscale.explore_linear`, `explore_efficiency`):
        // never quadrupling, the same curve is walked in doublings; a stricter efficiency
        // stops where 2 -> 8 gave 88% of proportional.
        let doubling = Settings {
            explore_linear: 2.0,
            ..cold.clone()
        };
        assert_eq!(explored(&doubling, rate).0, [1, 2, 4, 8, 16]);
        let strict = Settings {
            explore_efficiency: 0.9,
            ..cold.clone()
        };
        assert_eq!(explored(&strict, rate).0, [1, 2, 8]);
        let off = Settings {
            explore_efficiency: 0.0,
            ..cold.clone()
        };
        // Off: only the one probe a fit needs (a second allocation), then the brain.
        assert_eq!(explored(&off, rate).0, [1, 2]);

        // Compute-bound: 2 workers are barely faster than 1; no second doubling.
        let mut a = Autoscaler::new(cold, 0);
        let (mut t, mut s) = (0, 0);
        run(&mut a, &mut t, &mut s, 1, 1000, 4);
        let v = view(t, 1, s);
        let Round::Probe(_, d) = a.next_round(&v) else {
            panic!("expected the first probe")
        };
        a.applied(&d, &v, "probe");
        run(&mut a, &mut t, &mut s, 2, 1100, 12);
        assert!(
            matches!(a.next_round(&view(t, 2, s)), Round::Plan(..)),
            "the brain plans once doubling stops paying"
        );
    }

    #[test]
    fn a_single_allocation_is_probed_then_plans_follow_the_brain() {
        let mut a = Autoscaler::new(settings(), 0);
        let (mut t, mut s) = (0, 0);
        run(&mut a, &mut t, &mut s, 1, 1000, 4);
        let v = view(t, 1, s);
        let Round::Probe(report, d) = a.next_round(&v) else {
            panic!("expected a probe")
        };
        assert_eq!(report.samples.len(), 3);
        assert!(matches!(d, Decision::Apply { workers: 2, .. }), "{d:?}");
        a.applied(&d, &v, "probe");
        assert_eq!(
            a.next_round(&view(t + 100, 2, s)),
            Round::Idle,
            "not due yet"
        );
        run(&mut a, &mut t, &mut s, 2, 1800, 4);
        assert_eq!(a.history()[0].measured_after, Some(1800.0));
        // Six windows are too few for a fit with a held-out check: only a report.
        let Round::Report(report) = a.next_round(&view(t, 2, s)) else {
            panic!("expected a report round")
        };
        assert_eq!(report.samples.len(), 3);
        run(&mut a, &mut t, &mut s, 2, 1800, 3);
        let v = view(t, 2, s);
        let Round::Plan(report, req) = a.next_round(&v) else {
            panic!("expected a plan round")
        };
        assert_eq!(report.samples.len(), 3);
        assert_eq!(req.current.unwrap().workers, 2);
        assert_eq!(req.free_cpu, Some(16.0 - 3.0));
        assert!(req.horizon_s > 0.0);
        // A plan with enough gain is applied; one below min_gain is kept.
        let d = a.review(&plan(4, 1, 3000.0), &v);
        assert!(matches!(d, Decision::Apply { workers: 4, .. }), "{d:?}");
        let d = a.review(&plan(3, 1, 1850.0), &v);
        assert!(
            matches!(d, Decision::Keep(ref w) if w.contains("min_gain")),
            "{d:?}"
        );
        // Fewer workers for about the same speed is a saving: applied.
        let d = a.review(&plan(1, 1, 1790.0), &v);
        assert!(matches!(d, Decision::Apply { workers: 1, .. }), "{d:?}");
        // Fewer workers at a sixth less speed is not "about the same": kept.
        let d = a.review(&plan(1, 1, 1500.0), &v);
        assert!(
            matches!(d, Decision::Keep(ref w) if w.contains("-16.7%") && w.contains("fewer nodes")),
            "{d:?}"
        );
    }

    #[test]
    fn a_worker_count_at_its_bound_probes_one_core_more_then_keeps_it() {
        let mut a = Autoscaler::new(
            Settings {
                workers: [1, 1],
                worker_cpu_max: 2.0,
                ..settings()
            },
            0,
        );
        let (mut t, mut s) = (0, 0);
        run(&mut a, &mut t, &mut s, 1, 1000, 4);
        let v = view(t, 1, s);
        let Round::Probe(_, d) = a.next_round(&v) else {
            panic!("expected a probe of the cores")
        };
        assert!(
            matches!(d, Decision::Apply { workers: 1, worker_cpu, .. } if worker_cpu == 2.0),
            "{d:?}"
        );
        a.applied(&d, &v, "probe");
        assert_eq!(a.settings().worker_cpu, 2.0);
        assert_eq!(a.history()[0].worker_cpu, (1.0, 2.0));
        // A plan beyond the cores bound is refused.
        let mut p = plan(1, 1, 5000.0);
        p.allocation.as_mut().unwrap().worker_cpu = 3.0;
        let d = a.review(&p, &view(t + 100, 1, s));
        assert!(
            matches!(d, Decision::Refuse(ref w) if w.contains("worker_cpu_max")),
            "{d:?}"
        );
    }

    fn two_ps(t: u64, s: u64) -> View {
        View {
            ps: 2,
            ..view(t, 1, s)
        }
    }

    /// An autoscaler of one worker whose plan wanted a second PS for speed, after the
    /// probe that added it and a window at 60% of the throughput before; `during` sees
    /// each round of that window (time, samples).
    fn slower_ps_probe(
        settings: Settings,
        mut during: impl FnMut(&mut Autoscaler, u64),
    ) -> (Autoscaler, u64, u64) {
        let mut a = Autoscaler::new(settings, 0);
        let (mut t, mut s) = (0, 0);
        run(&mut a, &mut t, &mut s, 1, 1000, 4);
        a.next_round(&view(t, 1, s));
        a.review(&plan(1, 2, 1500.0), &view(t, 1, s));
        run(&mut a, &mut t, &mut s, 1, 1000, 4);
        let Round::Probe(_, d) = a.next_round(&view(t, 1, s)) else {
            panic!("expected the PS probe")
        };
        a.applied(&d, &view(t, 1, s), "probe");
        for _ in 0..20 {
            t += 100;
            s += 60;
            a.observe(&two_ps(t, s));
            during(&mut a, s);
        }
        (a, t, s)
    }

    /// The same PS probe that did not pay for speed stays where the servers' memory,
    /// growing, will need two PS by the job's end (DLRover-RM's OOM prediction on their
    /// total): undoing it would stop the job at its memory limit.
    #[test]
    fn an_unpaid_ps_probe_stays_when_the_memory_will_need_it() {
        let elastic_ps = Settings {
            workers: [1, 1],
            ps: [1, 2],
            ps_scaling: true,
            ..settings()
        };
        // 0.2 GiB + 0.3 GiB per 1,000 steps over both PS: 3.2 GiB at the last of 10,000
        // steps, above one PS's 0.9 x 2 GiB.
        let growing = |a: &mut Autoscaler, samples: u64| {
            let step = samples / 100;
            let total = 0.2 + 0.0003 * step as f64;
            a.observe_memory(0, step, total / 2.0);
            a.observe_memory(1, step, total / 2.0);
        };
        let (mut a, t, s) = slower_ps_probe(elastic_ps.clone(), growing);
        let Round::Revert(_, kept) = a.next_round(&two_ps(t, s)) else {
            panic!("the unpaid probe is judged")
        };
        assert!(
            matches!(&kept, Decision::Keep(why) if why.contains("PS count stays") && why.contains("2 PS of 2.00 GiB")),
            "{kept:?}"
        );
        // Flat memory needs one PS: the probe is undone.
        let flat = |a: &mut Autoscaler, samples: u64| {
            a.observe_memory(0, samples / 100, 0.3);
            a.observe_memory(1, samples / 100, 0.3);
        };
        let (mut a, t, s) = slower_ps_probe(elastic_ps, flat);
        let Round::Revert(_, back) = a.next_round(&two_ps(t, s)) else {
            panic!("the unpaid probe is judged")
        };
        assert!(matches!(back, Decision::Apply { ps: 1, .. }), "{back:?}");
    }

    /// A plan that wants more PS for speed while the profile holds one PS count (and a
    /// PS's cores cannot vary) is held to the PS the job has, and the next round probes
    /// one PS more so the fit can tell what a server is worth; without the plan's word,
    /// or without PS scaling (synchronous mode), no PS probe.
    #[test]
    fn a_plan_for_more_ps_on_one_ps_count_is_followed_by_a_probe_of_one_ps_more() {
        let elastic_ps = Settings {
            workers: [1, 1],
            ps: [1, 2],
            ps_scaling: true,
            ..settings()
        };
        let wants_ps = |mut a: Autoscaler| {
            let (mut t, mut s) = (0, 0);
            run(&mut a, &mut t, &mut s, 1, 1000, 4);
            let round = a.next_round(&view(t, 1, s));
            assert!(
                !matches!(round, Round::Probe(..)),
                "no probe before a plan asks: {round:?}"
            );
            let d = a.review(&plan(1, 2, 1500.0), &view(t, 1, s));
            assert!(
                !matches!(d, Decision::Apply { ps: 2, .. }),
                "a PS change the fit cannot predict is not executed: {d:?}"
            );
            run(&mut a, &mut t, &mut s, 1, 1000, 4);
            a.next_round(&view(t, 1, s))
        };
        let Round::Probe(_, d) = wants_ps(Autoscaler::new(elastic_ps.clone(), 0)) else {
            panic!("expected a probe of the PS count")
        };
        assert!(
            matches!(d, Decision::Apply { workers: 1, ps: 2, ref reasons, .. } if reasons[0].contains("only 1 PS")),
            "{d:?}"
        );
        // Judged as a plan: one more PS that slows the job down is undone at its first
        // window, and later plans are not capped for it.
        let (mut a, t, s) = slower_ps_probe(elastic_ps.clone(), |_, _| {});
        let Round::Revert(_, back) = a.next_round(&two_ps(t, s)) else {
            panic!("a PS probe that cost 40% is undone")
        };
        assert!(
            matches!(
                back,
                Decision::Apply {
                    workers: 1,
                    ps: 1,
                    ..
                }
            ),
            "{back:?}"
        );
        assert_eq!(
            (a.max_workers, a.max_cpu),
            (None, None),
            "no cap for a probe"
        );
        let sync = Autoscaler::new(
            Settings {
                ps_scaling: false,
                ..elastic_ps
            },
            0,
        );
        let round = wants_ps(sync);
        assert!(
            !matches!(round, Round::Probe(..)),
            "a job that cannot re-shard does not probe its PS count: {round:?}"
        );
    }

    /// A warm start that fills the capacity cannot probe upwards; it probes a quarter
    /// down instead of planning from one allocation.
    /// On a shared brain service a job gives back to measure: fewer workers, then fewer
    /// cores per worker, then per PS; the PS term so identified lets a plan add PS for
    /// speed, one doubling at a time.
    #[test]
    fn on_a_shared_brain_probes_give_back_and_then_the_ps_count_can_grow() {
        let shared = Settings {
            workers: [1, 16],
            ps: [1, 8],
            ps_scaling: true,
            worker_cpu: 4.0,
            worker_cpu_max: 16.0,
            ps_cpu: 4.0,
            ps_cpu_max: 16.0,
            send_capacity: false,
            ..settings()
        };
        let mut a = Autoscaler::new(shared, 0);
        let (mut t, mut s) = (0, 0);
        let mut probes = Vec::new();
        let mut workers = 8;
        for _ in 0..3 {
            run(&mut a, &mut t, &mut s, workers, 40_000, 4);
            let v = view(t, workers, s);
            let Round::Probe(_, d) = a.next_round(&v) else {
                panic!("expected a probe after {probes:?}")
            };
            let Decision::Apply {
                workers: w,
                worker_cpu,
                ps_cpu,
                ..
            } = d
            else {
                unreachable!()
            };
            probes.push((w, worker_cpu, ps_cpu));
            a.applied(&d, &v, "probe");
            workers = w;
        }
        assert_eq!(probes, vec![(6, 4.0, 4.0), (6, 3.0, 4.0), (6, 3.0, 3.0)]);
        run(&mut a, &mut t, &mut s, workers, 30_000, 4);
        let v = view(t, workers, s);
        let mut p = plan(6, 6, 60_000.0);
        if let Some(al) = p.allocation.as_mut() {
            al.worker_cpu = 3.0;
            al.ps_cpu = 3.0;
        }
        let d = a.review(&p, &v);
        assert!(
            matches!(d, Decision::Apply { ps: 2, predicted: None, ref reasons, .. }
                if reasons.iter().any(|r| r.contains("6 PS is outside"))),
            "{d:?}"
        );
    }

    /// A plan that doubles the workers for 10% more samples/s is halved at its first
    /// window; when the halfway step does not pay either it is undone, the next plan
    /// request carries the limit, and a plan beyond it is kept out; a growth that pays
    /// stays.
    #[test]
    fn a_growth_that_does_not_pay_is_undone_and_the_workers_stay_within_the_last_that_did() {
        let s4 = Settings {
            workers: [1, 16],
            interval_ms: 60_000,
            ..settings()
        };
        let grow = |rate_after: u64| {
            let mut a = Autoscaler::new(s4.clone(), 0);
            let (mut t, mut s) = (0, 0);
            run(&mut a, &mut t, &mut s, 2, 1000, 3);
            let v = view(t, 2, s);
            let d = a.review(&plan(4, 1, 2000.0), &v);
            assert!(matches!(d, Decision::Apply { workers: 4, .. }), "{d:?}");
            a.applied(&d, &v, "plan");
            run(&mut a, &mut t, &mut s, 4, rate_after, 2);
            let round = a.next_round(&view(t, 4, s));
            (a, round, t, s)
        };
        // 4 workers at 1800/s: 80% of proportional. Judged, kept, no plan before the
        // interval.
        let (a, round, ..) = grow(1800);
        assert!(matches!(round, Round::Report(_)), "{round:?}");
        assert_eq!(a.status()["limits"]["max_workers"], serde_json::Value::Null);
        // 4 workers at 1100/s: 10% of proportional. Halfway first: 3 workers, no limit
        // yet.
        let (mut a, round, mut t, mut s) = grow(1100);
        let Round::Revert(_, d) = round else {
            panic!("{round:?}")
        };
        let Decision::Apply {
            workers: 3,
            ref reasons,
            ..
        } = d
        else {
            panic!("{d:?}")
        };
        assert!(
            reasons.last().unwrap().contains("halfway: 3 workers"),
            "{reasons:?}"
        );
        assert_eq!(a.status()["limits"]["max_workers"], serde_json::Value::Null);
        a.applied(&d, &view(t, 4, s), "revert");
        // 3 workers at 1050/s: 10% of proportional against the 2 workers before the plan.
        run(&mut a, &mut t, &mut s, 3, 1050, 2);
        let Round::Revert(_, d) = a.next_round(&view(t, 3, s)) else {
            panic!("the halfway step is judged at its first window")
        };
        let Decision::Apply {
            workers: 2,
            ref reasons,
            ..
        } = d
        else {
            panic!("{d:?}")
        };
        let why = reasons.join("; ");
        assert!(
            why.contains("below autoscale.growth_efficiency (50%)")
                && why.contains("plans stay within 2 workers")
                && !why.contains("halfway"),
            "{why}"
        );
        a.applied(&d, &view(t, 3, s), "revert");
        assert_eq!(a.history().last().unwrap().source, "revert");
        // The revert is measured by one window; from then on each window is a round
        // (reports while the profile is short of a fit) until a plan asks within the
        // limit, before the planning interval.
        let req = (0..20)
            .find_map(|_| {
                run(&mut a, &mut t, &mut s, 2, 1000, 1);
                match a.next_round(&view(t, 2, s)) {
                    Round::Plan(_, req) => Some(req),
                    Round::Report(_) | Round::Idle => None,
                    r => panic!("{r:?}"),
                }
            })
            .expect("a plan after the undone growth");
        assert_eq!((req.max_workers, req.max_cpu), (Some(2), None));
        let d = a.review(&plan(3, 1, 3000.0), &view(t, 2, s));
        assert!(
            matches!(d, Decision::Keep(ref why) if why.contains("more than the 2 this job measured to pay")),
            "{d:?}"
        );
        assert_eq!(a.status()["limits"]["max_workers"], 2);
    }

    /// A growth from 8 to 16 workers that pays 6% of proportional goes halfway, to 11;
    /// 11 workers paying 67% of proportional stay, and the plans stay below the 16 that
    /// did not pay.
    #[test]
    fn an_unpaid_growth_goes_halfway_and_keeps_the_half_that_pays() {
        let mut a = Autoscaler::new(growth_settings(), 0);
        let (mut t, mut s) = (0, 0);
        run(&mut a, &mut t, &mut s, 4, 1000, 3);
        let v = view(t, 4, s);
        let d = a.review(&plan(16, 1, 4000.0), &v);
        // The review trusts at most twice the workers measured: 8 here, so the job
        // measures 8 (80% of proportional: kept) and grows from there to 16.
        assert!(matches!(d, Decision::Apply { workers: 8, .. }), "{d:?}");
        a.applied(&d, &v, "plan");
        run(&mut a, &mut t, &mut s, 8, 1800, 2);
        let round = a.next_round(&view(t, 8, s));
        assert!(matches!(round, Round::Report(_)), "{round:?}");
        let v = view(t, 8, s);
        let d = a.review(&plan(16, 1, 3600.0), &v);
        assert!(matches!(d, Decision::Apply { workers: 16, .. }), "{d:?}");
        a.applied(&d, &v, "plan");
        // 16 workers at 1890/s: +5% for +100% cores.
        run(&mut a, &mut t, &mut s, 16, 1890, 2);
        let Round::Revert(_, d) = a.next_round(&view(t, 16, s)) else {
            panic!("an unpaid growth is halved")
        };
        assert!(matches!(d, Decision::Apply { workers: 11, .. }), "{d:?}");
        a.applied(&d, &view(t, 16, s), "revert");
        // 11 workers at 2200/s: +22% for +33% cores, 67% of proportional: kept.
        run(&mut a, &mut t, &mut s, 11, 2200, 2);
        let round = a.next_round(&view(t, 11, s));
        assert!(matches!(round, Round::Report(_)), "{round:?}");
        assert_eq!(a.status()["limits"]["max_workers"], 15);
        let why = a.status()["limits"]["why"].as_str().unwrap().to_string();
        assert!(
            why.contains("the halfway step to 11 workers")
                && why.contains("where 16 workers and 17 cores did not"),
            "{why}"
        );
    }

    /// A growth that did not pay, halfway included, goes back to the allocation this job
    /// measured fastest among those that paid, not to the smaller one a give-back probe
    /// left: 8 workers ran at 1,800 samples/s, the probe's 6 at 1,400; a plan from 6 to
    /// 16 workers and its halfway step to 10 pay too little, and the job returns to 8.
    #[test]
    fn an_unpaid_growth_goes_back_to_the_largest_allocation_measured_to_pay() {
        let mut a = Autoscaler::new(growth_settings(), 0);
        let (mut t, mut s) = (0, 0);
        probed(&mut a, &mut t, &mut s, (8, 1800), (6, 1400));
        let round = a.next_round(&view(t, 6, s));
        assert!(matches!(round, Round::Report(_)), "{round:?}");
        assert_eq!(a.status()["limits"]["max_workers"], serde_json::Value::Null);
        let v = view(t, 6, s);
        let d = a.review(&plan(16, 1, 4000.0), &v);
        assert!(matches!(d, Decision::Apply { workers: 16, .. }), "{d:?}");
        a.applied(&d, &v, "plan");
        run(&mut a, &mut t, &mut s, 16, 1500, 2);
        let Round::Revert(_, d) = a.next_round(&view(t, 16, s)) else {
            panic!("an unpaid growth is halved")
        };
        assert!(matches!(d, Decision::Apply { workers: 10, .. }), "{d:?}");
        a.applied(&d, &view(t, 16, s), "revert");
        run(&mut a, &mut t, &mut s, 10, 1450, 2);
        let Round::Revert(_, d) = a.next_round(&view(t, 10, s)) else {
            panic!("the halfway step is judged at its first window")
        };
        let Decision::Apply {
            workers: 8,
            predicted: Some(predicted),
            reasons,
            ..
        } = &d
        else {
            panic!("back to the 8 workers that paid: {d:?}")
        };
        assert!((predicted - 1800.0).abs() < 1.0, "{predicted}");
        assert!(
            reasons.iter().any(|r| r.contains(
                "8 workers x 1 cores and 1 PS x 1 cores (9 cores) were measured at 1800"
            )),
            "{reasons:?}"
        );
        a.applied(&d, &view(t, 10, s), "revert");
        assert_eq!(a.status()["limits"]["max_workers"], 8);
    }

    /// A plan that raised the cores per PS and did not pay limits the cores per PS, not
    /// the job's cores: a later plan may add workers, and its cores per PS are held to
    /// those measured to pay.
    #[test]
    fn an_unpaid_raise_of_the_ps_cores_limits_the_ps_cores_only() {
        let mut a = Autoscaler::new(
            Settings {
                workers: [1, 8],
                ps_cpu: 2.0,
                ps_cpu_max: 8.0,
                ..growth_settings()
            },
            0,
        );
        let (mut t, mut s) = (0, 0);
        probed(&mut a, &mut t, &mut s, (3, 800), (4, 1000));
        // A give-back probe of the PS's cores: 2 -> 1 costs nothing.
        let v = view(t, 4, s);
        let probe = Decision::Apply {
            workers: 4,
            worker_cpu: 1.0,
            ps: 1,
            ps_cpu: 1.0,
            predicted: None,
            reasons: vec!["probe".into()],
        };
        a.applied(&probe, &v, "probe");
        run(&mut a, &mut t, &mut s, 4, 1000, 2);
        let round = a.next_round(&view(t, 4, s));
        assert!(matches!(round, Round::Report(_)), "{round:?}");
        let v = view(t, 4, s);
        let mut raise = plan(4, 1, 2000.0);
        raise.allocation.as_mut().unwrap().ps_cpu = 6.0;
        let d = a.review(&raise, &v);
        assert!(matches!(d, Decision::Apply { ps_cpu: 6.0, .. }), "{d:?}");
        a.applied(&d, &v, "plan");
        // 5 -> 10 cores for +2%.
        run(&mut a, &mut t, &mut s, 4, 1020, 2);
        let Round::Revert(_, d) = a.next_round(&view(t, 4, s)) else {
            panic!("an unpaid plan is undone")
        };
        assert!(
            matches!(
                d,
                Decision::Apply {
                    workers: 4,
                    ps_cpu: 1.0,
                    ..
                }
            ),
            "{d:?}"
        );
        a.applied(&d, &view(t, 4, s), "revert");
        let limits = &a.status()["limits"];
        assert_eq!(limits["max_ps_cpu"], 1.0);
        assert_eq!(limits["max_cpu"], serde_json::Value::Null);
        assert_eq!(limits["max_workers"], serde_json::Value::Null);
        // More workers may come; their PS keep 1 core.
        run(&mut a, &mut t, &mut s, 4, 1000, 2);
        let v = view(t, 4, s);
        let mut grow = plan(8, 1, 2000.0);
        grow.allocation.as_mut().unwrap().ps_cpu = 4.0;
        let d = a.review(&grow, &v);
        let Decision::Apply {
            workers: 8,
            ps_cpu,
            predicted: None,
            reasons,
            ..
        } = &d
        else {
            panic!("the growth of workers is made: {d:?}")
        };
        assert_eq!(*ps_cpu, 1.0);
        assert!(
            reasons
                .iter()
                .any(|r| r.contains("4 cores per PS are more than the 1")),
            "{reasons:?}"
        );
    }

    /// On a shared brain the first probe gives a quarter of the workers back; when they
    /// were worth less than `growth_efficiency` of their cores, the plans stay within
    /// the workers probed. Each probe takes one window, not a planning interval.
    #[test]
    fn a_give_back_probe_that_loses_little_caps_the_workers() {
        let shared = Settings {
            workers: [1, 16],
            worker_cpu: 4.0,
            worker_cpu_max: 16.0,
            send_capacity: false,
            interval_ms: 10_000,
            ..settings()
        };
        let mut a = Autoscaler::new(shared, 0);
        let (mut t, mut s) = (0, 0);
        // 10^9 samples to train: hours at 40,000 samples/s.
        let view = |t, workers, s| View {
            samples_total: 1_000_000_000,
            ..view(t, workers, s)
        };
        // A new job's first round comes after a planning interval.
        run(&mut a, &mut t, &mut s, 8, 40_000, 9);
        assert_eq!(a.next_round(&view(t, 8, s)), Round::Idle);
        run(&mut a, &mut t, &mut s, 8, 40_000, 2);
        // A job that ends within 4 planning intervals does not probe.
        let mut ending = a.clone();
        let nearly_done = View {
            samples_total: s + 1_000_000,
            ..view(t, 8, s)
        };
        let round = ending.next_round(&nearly_done);
        assert!(
            matches!(round, Round::Plan(..)),
            "25 s left, 40 s of planning intervals: a plan, no probe: {round:?}"
        );
        let v = view(t, 8, s);
        let Round::Probe(_, d) = a.next_round(&v) else {
            panic!("expected the first probe")
        };
        assert!(matches!(d, Decision::Apply { workers: 6, .. }), "{d:?}");
        a.applied(&d, &v, "probe");
        // 6 workers lose only 2.5%: the 2 given back were worth 8% of proportional.
        run(&mut a, &mut t, &mut s, 6, 39_000, 2);
        let v = view(t, 6, s);
        let Round::Probe(_, d) = a.next_round(&v) else {
            panic!("the next probe follows one window later")
        };
        assert!(
            matches!(
                d,
                Decision::Apply {
                    workers: 6,
                    worker_cpu: 3.0,
                    ..
                }
            ),
            "{d:?}"
        );
        assert_eq!(a.status()["limits"]["max_workers"], 6);
        let why = a.status()["limits"]["why"].as_str().unwrap().to_string();
        assert!(why.contains("probe: 6 -> 8 workers"), "{why}");
    }

    #[test]
    fn a_full_single_allocation_is_probed_downwards() {
        let mut a = Autoscaler::new(
            Settings {
                workers: [1, 16],
                cluster_cpu: 16.0,
                ..settings()
            },
            0,
        );
        let (mut t, mut s) = (0, 0);
        run(&mut a, &mut t, &mut s, 15, 60_000, 4);
        let v = view(t, 15, s);
        let Round::Probe(_, d) = a.next_round(&v) else {
            panic!("expected a probe, not a plan from one allocation")
        };
        assert!(matches!(d, Decision::Apply { workers: 11, .. }), "{d:?}");
        a.applied(&d, &v, "probe");
        run(&mut a, &mut t, &mut s, 11, 57_000, 4);
        let v = view(t, 11, s);
        // A fit over 11 and 15 workers that calls 1 worker as fast is not trusted that far:
        // the plan becomes a step to half the fewest workers measured.
        let d = a.review(&plan(1, 1, 63_000.0), &v);
        assert!(
            matches!(d, Decision::Apply { workers: 5, predicted: None, ref reasons, .. }
                if reasons.iter().any(|r| r.contains("1 workers is outside"))),
            "{d:?}"
        );
        let d = a.review(&plan(16, 1, 70_000.0), &v);
        assert!(
            matches!(
                d,
                Decision::Apply {
                    workers: 16,
                    predicted: Some(_),
                    ..
                }
            ),
            "within twice the most measured: as planned: {d:?}"
        );
    }

    #[test]
    fn no_probe_beyond_the_capacity() {
        let mut a = Autoscaler::new(
            Settings {
                cluster_cpu: 2.0,
                ..settings()
            },
            0,
        );
        let (mut t, mut s) = (0, 0);
        run(&mut a, &mut t, &mut s, 1, 1000, 4);
        // 1 worker + 1 PS fill the 2 cores: the samples are reported, nothing is probed.
        assert!(matches!(a.next_round(&view(t, 1, s)), Round::Report(_)));
    }

    #[test]
    fn plans_outside_the_bounds_garbage_and_scaling_during_recovery_are_refused() {
        let mut a = Autoscaler::new(settings(), 0);
        let v = view(10_000, 2, 5000);
        let d = a.review(&plan(9, 1, 5000.0), &v);
        assert!(
            matches!(d, Decision::Refuse(ref w) if w.contains("autoscale.workers [1, 4]")),
            "{d:?}"
        );
        let d = a.review(&plan(2, 3, 5000.0), &v);
        assert!(
            matches!(d, Decision::Refuse(ref w) if w.contains("autoscale.ps")),
            "{d:?}"
        );
        let d = a.review(&plan(3, 1, f64::NAN), &v);
        assert!(
            matches!(d, Decision::Refuse(ref w) if w.contains("not a number")),
            "{d:?}"
        );
        let d = a.review(&pb::PlanResponse::default(), &v);
        assert!(
            matches!(d, Decision::Refuse(ref w) if w.contains("no allocation")),
            "{d:?}"
        );
        let mut r = v;
        r.recovering = true;
        let d = a.review(&plan(3, 1, 5000.0), &r);
        assert!(
            matches!(d, Decision::Refuse(ref w) if w.contains("recovered")),
            "{d:?}"
        );
        assert!(a.status()["last_verdict"]
            .as_str()
            .unwrap()
            .starts_with("refused"));
    }

    #[test]
    fn a_failed_report_keeps_its_samples_in_order() {
        let mut a = Autoscaler::new(settings(), 0);
        let (mut t, mut s) = (0, 0);
        run(&mut a, &mut t, &mut s, 1, 1000, 4);
        let Round::Probe(report, _) = a.next_round(&view(t, 1, s)) else {
            panic!()
        };
        let n = report.samples.len();
        run(&mut a, &mut t, &mut s, 1, 1000, 2);
        let newer = a.unreported.len();
        a.requeue(report);
        assert_eq!(a.unreported.len(), n + newer);
    }

    #[test]
    fn the_memory_watchdog_compares_resident_memory_with_the_role_limit() {
        let s = settings();
        assert_eq!(memory_verdict(s.worker_mem_gb, false, 1 << 30), None);
        let v = memory_verdict(s.ps_mem_gb, true, 3 << 30).unwrap();
        assert!(
            v.contains("3.00 GiB") && v.contains("autoscale.ps_mem_gb"),
            "{v}"
        );
    }

    #[test]
    fn more_ps_for_speed_needs_a_profile_of_two_ps_counts_more_for_memory_does_not() {
        let mut a = Autoscaler::new(
            Settings {
                ps: [1, 4],
                ps_scaling: true,
                ..settings()
            },
            0,
        );
        let (mut t, mut s) = (0, 0);
        run(&mut a, &mut t, &mut s, 2, 1000, 2);
        let v = view(t, 2, s);
        let d = a.review(&plan(2, 3, 5000.0), &v);
        assert!(
            matches!(d, Decision::Keep(ref w) if w.contains("one PS count")),
            "{d:?}"
        );
        let mut p = plan(2, 3, 1000.0);
        p.memory.push(pb::MemoryAction {
            ps_index: 0,
            step_at_limit: 900,
            ..Default::default()
        });
        let d = a.review(&p, &v);
        assert!(
            matches!(
                d,
                Decision::Apply {
                    workers: 2,
                    ps: 3,
                    ..
                }
            ),
            "{d:?}"
        );
    }

    #[test]
    fn a_ps_slower_than_its_peers_twice_in_a_row_gets_its_load_spread() {
        let load = |index, requests, serve_s| PsLoad {
            index,
            requests,
            serve_s,
        };
        // 10 ms per request against peers at 1 ms: hot; 2.5x is not; too few requests
        // do not count.
        let hot = hot_ps(
            &[load(0, 100, 0.1), load(1, 100, 1.0), load(2, 100, 0.1)],
            3.0,
        );
        assert_eq!(hot.map(|h| h.0), Some(1));
        assert_eq!(hot_ps(&[load(0, 100, 0.1), load(1, 100, 0.25)], 3.0), None);
        assert_eq!(hot_ps(&[load(0, 100, 0.1), load(1, 5, 1.0)], 3.0), None);
        let mut a = Autoscaler::new(
            Settings {
                ps: [2, 3],
                ps_scaling: true,
                ..settings()
            },
            0,
        );
        let mut v = view(1000, 2, 100);
        v.ps = 2;
        // Cumulative counters: the first check only sets the baseline.
        assert_eq!(a.check_hot_ps(&[(1, 0, 0, 0.0), (2, 1, 0, 0.0)], &v), None);
        assert_eq!(
            a.check_hot_ps(&[(1, 0, 100, 0.1), (2, 1, 100, 1.0)], &v),
            None
        );
        let d = a.check_hot_ps(&[(1, 0, 200, 0.2), (2, 1, 200, 2.0)], &v);
        assert!(
            matches!(d, Some(Decision::Apply { ps: 3, ref reasons, .. }) if reasons[0].contains("hot PS 1")),
            "{d:?}"
        );
        // At the PS bound nothing more can be done.
        v.ps = 3;
        a.check_hot_ps(&[(1, 0, 300, 0.3), (2, 1, 300, 3.0)], &v);
        assert_eq!(
            a.check_hot_ps(&[(1, 0, 400, 0.4), (2, 1, 400, 4.0)], &v),
            None
        );
    }

    #[test]
    fn a_ps_change_without_resharding_keeps_the_ps_count() {
        let mut a = Autoscaler::new(
            Settings {
                ps: [1, 4],
                ..settings()
            },
            0,
        );
        let v = view(10_000, 2, 5000);
        let d = a.review(&plan(2, 3, 5000.0), &v);
        assert!(
            matches!(d, Decision::Keep(ref w) if w.contains("re-sharding")),
            "{d:?}"
        );
        let d = a.review(&plan(3, 3, 5000.0), &v);
        assert!(
            matches!(
                d,
                Decision::Apply {
                    workers: 3,
                    ps: 1,
                    ..
                }
            ),
            "{d:?}"
        );
    }
}
