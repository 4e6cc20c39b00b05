//! The closed loop: observes the running job, feeds the autoscaler, talks to the brain and
//! executes the decisions (worker count through the job state machine, so the change is
//! persisted and survives a master restart). Brain trouble never stops training: the job
//! keeps its last allocation, the error shows in `status`, and the next round tries again.

use std::sync::Arc;
use std::time::Duration;

use elastrec_brain::planner::BrainConfig;
use elastrec_job::config::JobConfig;
use elastrec_proto::brain as pb;

use elastrec_brain::service::{ask_to, profile_to};
use elastrec_control::autoscale::{Autoscaler, Decision, ProfileReport, Round, Settings, View};
use elastrec_control::memory_limits::MemoryLimits;

use crate::brain_link::BrainLink;
use crate::core::{monotonic_ms, MasterCore};
use crate::events::event;
use crate::job::{Phase, Role};
use crate::wire::proposal_from;

/// Observations per second: windows close within 100 ms of their length.
const TICK: Duration = Duration::from_millis(100);

/// The policy settings of a job.
pub fn settings(cfg: &JobConfig) -> Settings {
    let a = &cfg.autoscale;
    let host_cpu = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    Settings {
        workers: a.workers,
        ps: a.ps_bounds(cfg.cluster.ps),
        interval_ms: (a.interval_s * 1000.0) as u64,
        sample_ms: (a.sample_s * 1000.0) as u64,
        min_gain: a.min_gain,
        batch_size: cfg.train.batch_size as u32,
        // A worker's cores are its compute threads on the local backend, so whole ones.
        worker_cpu: a.worker_cpu.round().max(1.0),
        worker_cpu_max: a.worker_cpu_max.round().max(a.worker_cpu.round()).max(1.0),
        ps_cpu: a.ps_cpu,
        // Lowered to `ps_cpu` by the loop where the engine cannot resize a running PS.
        ps_cpu_max: a.ps_cpu_max.max(a.ps_cpu),
        worker_mem_gb: a.worker_mem_gb,
        ps_mem_gb: ps_mem_gb(cfg),
        cluster_cpu: if a.cluster_cpu > 0.0 {
            a.cluster_cpu
        } else {
            host_cpu
        },
        cluster_mem_gb: if a.cluster_mem_gb > 0.0 {
            a.cluster_mem_gb
        } else {
            host_mem_gb()
        },
        worker_start_s: a.worker_start_s,
        ps_migration_s: a.ps_migration_s,
        // Online re-sharding moves the servers' state between layouts; synchronous
        // steps would straddle them, so it is for asynchronous jobs.
        ps_scaling: cfg.cluster.mode == elastrec_job::distributed::SyncMode::Async,
        hot_ratio: a.hot_ps_ratio,
        send_capacity: a.brain.is_empty(),
        // Set by the loop: only a new job without a warm start explores.
        explore: false,
        explore_efficiency: a.explore_efficiency,
        explore_linear: a.explore_linear,
        growth_efficiency: a.growth_efficiency,
    }
}

/// Sizes the nodes an autoscaled job starts: a worker's cores are its compute threads,
/// and both roles take the allotment of `[autoscale]` (cores, memory, and the most an
/// out-of-memory kill may grow it to) instead of `[resources]`.
pub fn size_nodes(template: &crate::launch::LaunchTemplate, cfg: &JobConfig) {
    if !cfg.autoscale.enabled {
        return;
    }
    let s = settings(cfg);
    let a = &cfg.autoscale;
    let mib = |gb: f64| (gb * 1024.0).ceil() as u64;
    // A job autoscaled by default shares the machine as a pinned one does: its workers
    // keep every core (local) or their role's (elsewhere).
    if cfg.autoscale.holds_nodes() {
        template.set_worker_threads(s.worker_cpu as usize);
    }
    template.set_role_size(
        Role::Worker,
        s.worker_cpu,
        mib(s.worker_mem_gb),
        mib(a.worker_mem_gb_max.max(s.worker_mem_gb)),
    );
    template.set_role_size(
        Role::Ps,
        s.ps_cpu,
        mib(s.ps_mem_gb),
        mib(a.ps_mem_gb_max.max(s.ps_mem_gb)),
    );
}

/// Memory of one PS: configured, or its share of the model state as the brain sizes it
/// (weights and two optimizer slots, x1.25) with 20% more and 0.5 GiB for the process.
fn ps_mem_gb(cfg: &JobConfig) -> f64 {
    if cfg.autoscale.ps_mem_gb > 0.0 {
        return cfg.autoscale.ps_mem_gb;
    }
    let rows: f64 = elastrec_job::prepare::resolve_table_rows(cfg)
        .iter()
        .map(|&r| r as f64 * cfg.model.row_width() as f64)
        .sum();
    let floats = rows + dense_params(cfg) as f64;
    let gb = floats * 4.0 * 3.0 * 1.25 * 1.2 / f64::from(cfg.cluster.ps) / (1u64 << 30) as f64;
    gb + 0.5
}

fn dense_params(cfg: &JobConfig) -> u64 {
    elastrec_job::prepare::dense_model(cfg)
        .map(|d| d.num_params() as u64)
        .unwrap_or(0)
}

fn host_mem_gb() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))?
                .split_whitespace()
                .nth(1)?
                .parse::<f64>()
                .ok()
        })
        .map_or(8.0, |kb| kb / (1u64 << 20) as f64)
}

/// The job as the brain sees it: tables, dense size, data, batch and bounds.
pub fn job_spec(cfg: &JobConfig, brain_job_id: &str, samples_total: u64) -> pb::JobSpec {
    let a = &cfg.autoscale;
    let s = settings_bounds(cfg);
    let dense = dense_params(cfg);
    let ps_mem = ps_mem_gb(cfg);
    let range = |lo: f64, hi: f64| Some(pb::Range { min: lo, max: hi });
    pb::JobSpec {
        job_id: brain_job_id.to_string(),
        model_type: model_family(cfg),
        tables: elastrec_job::prepare::resolve_table_rows(cfg)
            .into_iter()
            .map(|rows| pb::Table {
                rows,
                dim: cfg.model.row_width() as u32,
            })
            .collect(),
        dense_params: dense,
        dataset_samples: samples_total,
        batch_size: cfg.train.batch_size as u32,
        scenario: cfg.autoscale.scenario(),
        user: cfg.autoscale.user(),
        bounds: Some(pb::Bounds {
            workers: range(f64::from(s.0[0]), f64::from(s.0[1])),
            ps: range(f64::from(s.1[0]), f64::from(s.1[1])),
            worker_cpu: range(
                cfg.autoscale.worker_cpu.round().max(1.0),
                cfg.autoscale
                    .worker_cpu_max
                    .round()
                    .max(cfg.autoscale.worker_cpu.round())
                    .max(1.0),
            ),
            ps_cpu: range(a.ps_cpu, a.ps_cpu_max.max(a.ps_cpu)),
            worker_mem_gb: range(a.worker_mem_gb, a.worker_mem_gb),
            ps_mem_gb: range(ps_mem, ps_mem),
        }),
        // What the job file asks for: warm start's plan while the brain knows no
        // similar job.
        requested: Some(pb::Allocation {
            workers: cfg.cluster.workers.max(1),
            ps: cfg.cluster.ps.max(1),
            worker_cpu: a.worker_cpu.max(1.0),
            ps_cpu: a.ps_cpu,
            worker_mem_gb: a.worker_mem_gb,
            ps_mem_gb: ps_mem,
        }),
    }
}

/// The brain's job file for a training job, as its master would plan at start without
/// history: the job's spec ([`job_spec`]: tables, dense size, bounds, the allocation the
/// file asks for) and the cluster it must fit in (`autoscale.cluster_cpu` and
/// `cluster_mem_gb`, or this host's). What `elastrec brain plan --job` plans for a job
/// file users run.
pub fn brain_job_file(
    cfg: &JobConfig,
    job_id: &str,
    samples_total: u64,
) -> elastrec_brain::Result<elastrec_brain::JobFile> {
    let s = settings(cfg);
    Ok(elastrec_brain::JobFile {
        job: elastrec_brain::spec_from_proto(job_spec(cfg, job_id, samples_total))?,
        remaining_samples: None,
        current: None,
        cluster: elastrec_brain::job::ClusterFile {
            cpu: s.cluster_cpu,
            mem_gb: s.cluster_mem_gb,
            ..Default::default()
        },
        profile: Vec::new(),
        memory: Vec::new(),
        steps: None,
    })
}

/// The model family warm start compares: `model.type`, marked with each learned pooling
/// of a behaviour sequence (attention, a transformer: a different cost per sample).
fn model_family(cfg: &JobConfig) -> String {
    let mut name = cfg.model.model_type.name().to_string();
    let units = cfg
        .data
        .schema()
        .map(|s| s.attention_slots())
        .unwrap_or_default();
    let mut poolings: Vec<&str> = units.iter().map(|u| u.3.name()).collect();
    poolings.dedup();
    for p in poolings {
        name = format!("{name}+{p}");
    }
    name
}

/// The warm-start plan, applied to the job before any node starts: its worker and PS
/// counts and each role's cores and memory. The brain keeps them within the bounds the
/// job sent; a plan from the wire is held to them again here (a value outside, or not a
/// number, becomes the nearest bound). A PS memory the job leaves to the model's size is
/// sized again for the new PS count.
pub fn apply_warm_plan(cfg: &mut JobConfig, a: &pb::Allocation) {
    let within = |v: f64, lo: f64, hi: f64| {
        if v.is_finite() {
            v.clamp(lo, hi.max(lo))
        } else {
            lo
        }
    };
    let s = &mut cfg.autoscale;
    cfg.cluster.workers = a
        .workers
        .clamp(s.workers[0], s.workers[1].max(s.workers[0]));
    // Bounds `[0, 0]` are `cluster.ps` itself: the count stays.
    if s.ps != [0, 0] {
        cfg.cluster.ps = a.ps.clamp(s.ps[0].max(1), s.ps[1].max(s.ps[0]).max(1));
    }
    s.worker_cpu = within(a.worker_cpu, s.worker_cpu, s.worker_cpu_max);
    s.ps_cpu = within(a.ps_cpu, s.ps_cpu, s.ps_cpu_max);
    s.worker_mem_gb = within(a.worker_mem_gb, s.worker_mem_gb, s.worker_mem_gb_max);
    if s.ps_mem_gb > 0.0 {
        s.ps_mem_gb = within(a.ps_mem_gb, s.ps_mem_gb, s.ps_mem_gb_max);
    }
}

fn settings_bounds(cfg: &JobConfig) -> ([u32; 2], [u32; 2]) {
    (
        cfg.autoscale.workers,
        cfg.autoscale.ps_bounds(cfg.cluster.ps),
    )
}

/// The brain's policy settings for an in-process brain of this job.
pub fn brain_config(cfg: &JobConfig) -> BrainConfig {
    let s = settings(cfg);
    let mut b = BrainConfig::default();
    b.capacity.cpu = s.cluster_cpu;
    b.capacity.mem_gb = s.cluster_mem_gb;
    b.overhead.worker_start_s = s.worker_start_s;
    b.overhead.ps_migration_s = s.ps_migration_s;
    b
}

/// Registers the job with the brain and returns its start-up plan. A brain that cannot be
/// reached, or a plan without an allocation or with a worker count outside
/// `autoscale.workers`, is an error naming it (the caller then starts the job with
/// `cluster.workers`).
pub async fn warm_start(
    brain: &dyn BrainLink,
    cfg: &JobConfig,
    brain_job_id: &str,
    samples_total: u64,
) -> Result<pb::PlanResponse, String> {
    let plan = brain
        .warm_start(pb::WarmStartRequest {
            job: Some(job_spec(cfg, brain_job_id, samples_total)),
        })
        .await
        .map_err(|s| format!("{}: {}", brain.describe(), s.message()))?;
    let a = plan
        .allocation
        .ok_or_else(|| format!("{}: warm-start plan without allocation", brain.describe()))?;
    let [lo, hi] = cfg.autoscale.workers;
    if !(lo..=hi).contains(&a.workers) {
        return Err(format!(
            "{}: warm-start plan of {} workers is outside autoscale.workers [{lo}, {hi}]",
            brain.describe(),
            a.workers
        ));
    }
    Ok(plan)
}

/// Runs the loop until the job leaves training. Spawned by the master's `serve`.
pub async fn run(
    core: Arc<MasterCore>,
    brain: Arc<dyn BrainLink>,
    cfg: JobConfig,
    brain_job_id: String,
    samples_total: u64,
    mut registered: bool,
    explore: bool,
) {
    let mut settings = settings(&cfg);
    settings.explore = explore;
    if settings.ps_cpu_max > settings.ps_cpu && !core.backend().resizes_in_place() {
        event!(warn, "ps_cores_fixed", ps_cpu = settings.ps_cpu,
            "autoscale: a PS keeps {} cores: this backend cannot change a running node's cores (autoscale.ps_cpu_max needs the local backend with control groups)",
            settings.ps_cpu
        );
        settings.ps_cpu_max = settings.ps_cpu;
    }
    let m = u64::from(settings.batch_size.max(1));
    let range = |lo: f64, hi: f64| elastrec_brain::Range::new(lo, hi.max(lo));
    let mut limits = MemoryLimits::new(
        range(settings.worker_mem_gb, cfg.autoscale.worker_mem_gb_max),
        range(settings.ps_mem_gb, cfg.autoscale.ps_mem_gb_max),
    );
    let started = monotonic_ms();
    let mut auto = Autoscaler::new(settings, started);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let workers = core.job.lock().target_workers();
    event!(
        "autoscale_started",
        workers,
        ps = cfg.cluster.ps,
        "autoscale: {} workers in [{}, {}], {} PS in [{}, {}], planning every {:.1} s with the {}",
        workers,
        cfg.autoscale.workers[0],
        cfg.autoscale.workers[1],
        cfg.cluster.ps,
        auto.settings().ps[0],
        auto.settings().ps[1],
        cfg.autoscale.interval_s,
        brain.describe()
    );
    loop {
        tick.tick().await;
        let (view, ps_nodes, phase) = view_of(&core, samples_total);
        if phase != Phase::Training {
            *core.autoscale_status.lock() = Some(status(&auto, &limits));
            return;
        }
        if !core.backend().enforces_memory() {
            enforce_memory_limits(&core, &limits).await;
        }
        auto.observe(&view);
        let round = auto.next_round(&view);
        if round != Round::Idle {
            let profiles = core.profiles.lock().clone();
            follow_memory_use(&core, &mut limits, &profiles, started);
            // A hot PS is relieved before anything else is planned.
            let served: Vec<(u32, u32, u64, f64)> = ps_nodes
                .iter()
                .filter_map(|(id, index)| {
                    profiles
                        .get(id)
                        .map(|p| (*id, *index, p.requests, p.serve_s))
                })
                .collect();
            if let Some(d) = auto.check_hot_ps(&served, &view) {
                if let Round::Plan(report, _)
                | Round::Probe(report, _)
                | Round::Revert(report, _)
                | Round::Report(report) = round
                {
                    auto.requeue(report);
                }
                execute(&core, &mut auto, &d, &view, "hot-ps").await;
                *core.autoscale_status.lock() = Some(status(&auto, &limits));
                continue;
            }
            // PS memory readings go with the round's report (OOM prediction).
            for (id, index) in &ps_nodes {
                if let Some(p) = profiles.get(id) {
                    auto.observe_memory(
                        *index,
                        view.samples_done / m,
                        p.rss_bytes as f64 / (1u64 << 30) as f64,
                    );
                }
            }
        }
        // Every round reports first; then a probe is executed or a plan asked for.
        enum Next {
            Probe(Decision),
            Revert(Decision),
            Plan(elastrec_brain::planner::PlanAsk),
        }
        let (report, next) = match round {
            Round::Idle => (None, None),
            Round::Report(report) => (Some(report), None),
            Round::Probe(report, d) => (Some(report), Some(Next::Probe(d))),
            Round::Revert(report, d) => (Some(report), Some(Next::Revert(d))),
            Round::Plan(report, req) => (Some(report), Some(Next::Plan(req))),
        };
        if let Some(report) = report {
            report_profile(
                &*brain,
                &mut auto,
                report,
                &mut registered,
                &cfg,
                &brain_job_id,
                samples_total,
            )
            .await;
        }
        match next {
            None => {}
            Some(Next::Probe(d)) => execute(&core, &mut auto, &d, &view, "probe").await,
            Some(Next::Revert(d)) => execute(&core, &mut auto, &d, &view, "revert").await,
            Some(Next::Plan(ask)) => {
                let known = plan_round(&core, &*brain, &mut auto, &view, &ask, &brain_job_id);
                registered &= known.await;
            }
        }
        *core.autoscale_status.lock() = Some(status(&auto, &limits));
    }
}

/// What the autoscaler sees of the job now, the live PS `(node id, index)`, and the phase.
fn view_of(core: &MasterCore, samples_total: u64) -> (View, Vec<(u32, u32)>, Phase) {
    let job = core.job.lock();
    let view = View {
        now_ms: monotonic_ms(),
        workers: job.running_workers(),
        target_workers: job.target_workers(),
        ps: job.policy().num_ps,
        steady: job.steady(),
        recovering: job.recovering(),
        samples_done: job.samples_done(),
        samples_total,
    };
    let ps: Vec<(u32, u32)> = job
        .nodes()
        .filter(|n| n.role == Role::Ps && n.state.is_live())
        .map(|n| (n.id, n.index))
        .collect();
    (view, ps, job.phase().clone())
}

/// Asks the brain for a plan, reviews it and executes what the review decides; a failed
/// call keeps the job as it is. False when the brain no longer knows the job (it must be
/// registered again).
async fn plan_round(
    core: &MasterCore,
    brain: &dyn BrainLink,
    auto: &mut Autoscaler,
    view: &View,
    ask: &elastrec_brain::planner::PlanAsk,
    brain_job_id: &str,
) -> bool {
    let answer = brain.plan(ask_to(brain_job_id, ask)).await;
    let known = !answer
        .as_ref()
        .is_err_and(|s| s.code() == tonic::Code::NotFound);
    // A refused call and an answer no brain of this version sends end alike.
    let plan = answer
        .map_err(|s| s.message().to_string())
        .and_then(|p| proposal_from(&p));
    match plan {
        Ok(plan) => {
            let d = auto.review(&plan, view);
            execute(core, auto, &d, view, "plan").await;
        }
        Err(e) => {
            let msg = format!("{}: {e}", brain.describe());
            event!(warn, "no_plan", error = %msg, workers = view.workers,
                "autoscale: no plan this round ({msg}); keeping {} workers",
                view.workers
            );
            auto.brain_failed(msg);
        }
    }
    known
}

/// Stops every live node whose resident memory is above its role's limit. The stop is a
/// death like any other, with the limit as its reason: a worker is replaced, a PS
/// recovered from its checkpoint (or the job fails naming it when checkpoints are off).
async fn enforce_memory_limits(core: &MasterCore, limits: &MemoryLimits) {
    let profiles = core.profiles.lock().clone();
    let over: Vec<(crate::job::Node, String)> = {
        let job = core.job.lock();
        job.nodes()
            .filter(|n| n.state.is_live())
            .filter_map(|n| {
                let p = profiles.get(&n.id)?;
                let is_ps = n.role == Role::Ps;
                let why = elastrec_control::autoscale::memory_verdict(
                    limits.limit_gb(n.id, is_ps),
                    is_ps,
                    p.rss_bytes,
                )?;
                Some((n.clone(), why))
            })
            .collect()
    };
    for (n, why) in over {
        event!(warn, "memory_watchdog_stop", node = n.id, role = ?n.role, reason = %why,
            "autoscale: stopping node {} ({:?} {}): {why}",
            n.id, n.role, n.index
        );
        // Not again for the same reading: the next heartbeat of a live node replaces it.
        core.profiles.lock().remove(&n.id);
        core.memory_kills
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let reason = format!("stopped by the memory watchdog: {why}");
        if let Err(s) = core.run(|job, cx| job.node_stopped(n.id, reason, cx)).await {
            event!(warn, "state_failed", error = %s, "autoscale: master state: {s}");
        }
    }
}

/// The autoscaler's state with the memory limits' changes, for status and result.json.
fn status(auto: &Autoscaler, limits: &MemoryLimits) -> elastrec_proto::master::AutoscaleStatus {
    crate::wire::autoscale_message(&auto.status(), limits.changes())
}

/// Vertical memory: each live node's limit follows its resident memory (Primus Eq. 2-3).
fn follow_memory_use(
    core: &MasterCore,
    limits: &mut MemoryLimits,
    profiles: &std::collections::BTreeMap<u32, elastrec_proto::master::NodeProfile>,
    started: u64,
) {
    let nodes: Vec<crate::job::Node> = core
        .job
        .lock()
        .nodes()
        .filter(|n| n.state.is_live())
        .cloned()
        .collect();
    let at_s = monotonic_ms().saturating_sub(started) as f64 / 1000.0;
    let backend = core.backend();
    for n in nodes {
        let Some(p) = profiles.get(&n.id) else {
            continue;
        };
        let gb = p.rss_bytes as f64 / (1u64 << 30) as f64;
        let start_gb = core
            .launch
            .get()
            .map_or(0.0, |l| l.memory_mib(n.role) as f64 / 1024.0);
        let node = (n.id, n.role == Role::Ps, n.index);
        let Some(c) = limits.observe(at_s, node, gb, start_gb) else {
            continue;
        };
        // Where the engine holds the node to a limit (its control group), the new one
        // is written there; a refusal (e.g. below what the node holds) keeps the old one.
        let change = crate::backend::Resize {
            cpu: None,
            memory_bytes: Some((c.to_gb * (1u64 << 30) as f64) as u64),
        };
        if let Err(e) = backend.resize(&n, change) {
            event!(
                warn,
                "memory_limit_unchanged",
                node = c.node,
                gb = c.from_gb,
                error = %format!("{e:#}",
            ),
                "autoscale: memory limit of node {} stays {:.3} GiB: {e:#}",
                c.node, c.from_gb
            );
            limits.undo(&c);
            continue;
        }
        event!(
            "memory_limit",
            node = c.node,
            from_gb = c.from_gb,
            to_gb = c.to_gb,
            reason = %c.reason,
            "autoscale: memory limit of node {} ({} {}) {:.3} -> {:.3} GiB: {}",
            c.node, c.role, c.index, c.from_gb, c.to_gb, c.reason
        );
    }
}

/// Reports profile samples; on failure they are kept for the next round. A brain that
/// forgot the job (restarted on an empty database) gets it registered again.
async fn report_profile(
    brain: &dyn BrainLink,
    auto: &mut Autoscaler,
    report: ProfileReport,
    registered: &mut bool,
    cfg: &JobConfig,
    brain_job_id: &str,
    samples_total: u64,
) {
    if !*registered {
        match warm_start(brain, cfg, brain_job_id, samples_total).await {
            Ok(_) => *registered = true,
            Err(e) => {
                auto.brain_failed(e);
                auto.requeue(report);
                return;
            }
        }
    }
    if report.samples.is_empty() && report.memory.is_empty() {
        return;
    }
    let wire = profile_to(brain_job_id, &report.samples, &report.memory);
    match brain.report_profile(wire).await {
        Ok(_) => auto.brain_ok(),
        Err(s) => {
            if s.code() == tonic::Code::NotFound {
                *registered = false;
            }
            let msg = format!("{}: {}", brain.describe(), s.message());
            event!(
                warn,
                "profile_unreported",
                error = %msg,
                "autoscale: profile not reported ({msg}); kept for the next round",
            );
            auto.brain_failed(msg);
            auto.requeue(report);
        }
    }
}

/// Executes a decision through the job state machine and records it.
async fn execute(core: &MasterCore, auto: &mut Autoscaler, d: &Decision, v: &View, source: &str) {
    match d {
        Decision::Apply {
            workers,
            worker_cpu,
            ps,
            ps_cpu,
            predicted,
            reasons,
        } => {
            if (*ps_cpu - auto.settings().ps_cpu).abs() > 1e-9 {
                if let Err(e) = resize_ps(core, *ps_cpu) {
                    event!(
                        warn,
                        "not_scaling",
                        reason = %format!("{e:#}"),
                        "autoscale: not scaling: {e:#}",
                    );
                    return;
                }
            }
            if *ps != v.ps {
                let why = reasons.last().cloned().unwrap_or_default();
                // A probe's reasons already begin with "probe:".
                let why = if why.starts_with(&format!("{source}:")) {
                    why
                } else {
                    format!("{source}: {why}")
                };
                if let Err(e) = crate::reshard::change_ps(core, *ps, &why).await {
                    event!(warn, "reshard_failed", error = %format!("{e:#}"), "autoscale: {e:#}");
                    return;
                }
            }
            let target = *workers;
            let cpu_before = auto.settings().worker_cpu;
            // Vertical: every worker is replaced by one with the new cores (its remainder
            // goes back to the queue when it leaves, as on any scale-down).
            let vertical = (*worker_cpu - cpu_before).abs() > 0.5;
            if vertical {
                core.backend().set_worker_threads(*worker_cpu as usize);
            }
            let r = core
                .run(|job, cx| {
                    if job.phase() != &Phase::Training {
                        return Err("the job is no longer training".to_string());
                    }
                    if job.recovering() {
                        return Err("a parameter server is being recovered".to_string());
                    }
                    // Replaced first, so that no worker is started with the old cores only
                    // to be replaced at once.
                    if vertical {
                        job.replace_workers(cx);
                    }
                    Ok(job.scale(target, cx))
                })
                .await;
            if vertical && !matches!(r, Ok(Ok(_))) {
                core.backend().set_worker_threads(cpu_before as usize);
            }
            match r {
                Ok(Ok(previous)) => {
                    event!(
                        "autoscaled",
                        from = previous,
                        to = target,
                        worker_cpu = *worker_cpu,
                        ps = *ps,
                        ps_cpu = *ps_cpu,
                        source,
                        "autoscale: workers {previous} -> {target} x {worker_cpu} cores (was {cpu_before}), PS {} x {ps_cpu} cores ({source}{}): {}",
                        ps,
                        predicted.map_or(String::new(), |t| format!(
                            ", predicted {t:.0} samples/s vs measured {:.0}",
                            auto.measured().unwrap_or(0.0)
                        )),
                        reasons.last().map_or("", String::as_str)
                    );
                    auto.applied(d, v, source);
                }
                Ok(Err(why)) => {
                    event!(warn, "not_scaling", reason = %why, "autoscale: not scaling: {why}")
                }
                Err(s) => {
                    event!(
                        warn,
                        "not_scaling",
                        reason = %s,
                        "autoscale: not scaling: master state: {s}",
                    )
                }
            }
        }
        // An unpaid change kept (for the memory it will need) is a decision a user sees.
        Decision::Keep(why) if source == "revert" => {
            event!("change_kept", reason = %why, "autoscale: {why}")
        }
        Decision::Keep(why) => tracing::debug!(%why, "autoscale: keep"),
        Decision::Refuse(why) => {
            event!("plan_refused", reason = %why, "autoscale: plan refused: {why}")
        }
    }
}

/// Gives every running PS `cpu` cores in place (their control groups' quota) and the PS
/// started from now on the same. Refused while a PS is recovered or the layout changes,
/// so that no server is left with the old cores.
fn resize_ps(core: &MasterCore, cpu: f64) -> anyhow::Result<()> {
    let servers: Vec<crate::job::Node> = {
        let job = core.job.lock();
        if job.recovering() {
            anyhow::bail!("a parameter server is being recovered");
        }
        job.nodes()
            .filter(|n| n.role == Role::Ps && n.state.is_live())
            .cloned()
            .collect()
    };
    let backend = core.backend();
    for n in &servers {
        let change = crate::backend::Resize {
            cpu: Some(cpu),
            memory_bytes: None,
        };
        if !backend.resize(n, change)? {
            anyhow::bail!(
                "this backend cannot change the cores of running PS {}",
                n.index
            );
        }
    }
    if let Some(launch) = core.launch.get() {
        launch.set_role_cpu(Role::Ps, cpu);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(workers: u32, ps: u32, cores: f64, mem_gb: f64) -> pb::Allocation {
        pb::Allocation {
            workers,
            ps,
            worker_cpu: cores,
            ps_cpu: cores,
            worker_mem_gb: mem_gb,
            ps_mem_gb: mem_gb,
        }
    }

    /// A warm plan sets every resource it names within the job's bounds; one from the
    /// wire outside them, or not a number, is held to the nearest bound; a fixed PS count
    /// (`autoscale.ps = [0, 0]`) stays.
    #[test]
    fn a_warm_plan_sizes_the_job_within_its_bounds() {
        let mut cfg = JobConfig::default();
        cfg.cluster.ps = 2;
        let a = &mut cfg.autoscale;
        (a.workers, a.ps) = ([1, 8], [1, 4]);
        (a.worker_cpu, a.worker_cpu_max, a.ps_cpu, a.ps_cpu_max) = (1.0, 4.0, 1.0, 2.0);
        (a.worker_mem_gb, a.worker_mem_gb_max) = (2.0, 8.0);
        let mut got = cfg.clone();
        apply_warm_plan(&mut got, &plan(3, 3, 2.0, 4.0));
        assert_eq!((got.cluster.workers, got.cluster.ps), (3, 3));
        let a = &got.autoscale;
        assert_eq!((a.worker_cpu, a.ps_cpu, a.worker_mem_gb), (2.0, 2.0, 4.0));
        assert_eq!(a.ps_mem_gb, 0.0, "left to the model's size");

        let mut got = cfg.clone();
        apply_warm_plan(&mut got, &plan(1000, 1000, 1e9, f64::NAN));
        assert_eq!((got.cluster.workers, got.cluster.ps), (8, 4));
        let a = &got.autoscale;
        assert_eq!((a.worker_cpu, a.ps_cpu, a.worker_mem_gb), (4.0, 2.0, 2.0));

        cfg.autoscale.ps = [0, 0];
        apply_warm_plan(&mut cfg, &plan(3, 3, 2.0, 4.0));
        assert_eq!(cfg.cluster.ps, 2);
    }
}
