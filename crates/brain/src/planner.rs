//! The plan logic that ties the policies together (still pure: no I/O). The service and
//! `plan_for_job_file` call these.

use serde::{Deserialize, Serialize};

use crate::alloc::{Allocation, Resources};
use crate::error::{check_non_negative, check_positive, BrainError, Result};
use crate::forecast::{Forecaster, HoltWinters, SeasonalNaive};
use crate::greedy::{weighted_greedy, GreedyParams, JobOptions};
use crate::job::JobSpec;
use crate::nsga2::{nsga2, Candidate, JobProblem, Nsga2Params, OverheadModel, Prices};
use crate::oom::{self, MemorySample, OomPolicy};
use crate::plan::{Plan, PlanKind, StreamPlan};
use crate::streaming::{plan_series, stabilize, Fallback, Stabilization};
use crate::throughput::dlrover::{DlroverConstants, DlroverModel, DLROVER_MIN_SAMPLES};
use crate::throughput::kale::{KaleModel, KaleSample, KaleVariant};
use crate::throughput::{validate_profile, FitReport, ProfileSample, ThroughputModel};
use crate::warm_start::{
    fit_memory, ps_mem_needed_gb, warm_start, HistoricalJob, JobFeatures, WarmStartParams,
};

/// Settings of every policy. Defaults are documented on each field's type.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct BrainConfig {
    /// Resource prices (Eq. 7).
    pub prices: Prices,
    /// Scaling overhead (Eq. 8).
    pub overhead: OverheadModel,
    /// NSGA-II settings.
    pub nsga: Nsga2Params,
    /// Greedy settings (Eq. 14).
    pub greedy: GreedyParams,
    /// Cluster resources. A re-plan of one job ([`replan`], or a service request carrying
    /// `free_cpu`/`free_mem_gb`) reads them as the free resources besides the job's current
    /// allocation; the service's shared planning ([`crate::shared`]) reads them as the whole
    /// cluster that every active job's allocation comes out of.
    pub capacity: CapacityConfig,
    /// Warm start (Algorithm 1).
    pub warm: WarmStartParams,
    /// OOM prevention.
    pub oom: OomPolicy,
    /// Worker-PS bandwidth, MB/s (`B` of Eq. 4).
    pub network: NetworkConfig,
    /// KALE stabilization.
    pub stabilization: Stabilization,
    /// KALE fallback thresholds.
    pub fallback: Fallback,
    /// Planning the jobs that share one brain service together.
    #[serde(default)]
    pub sharing: SharingConfig,
}

/// Settings of shared planning ([`crate::shared`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SharingConfig {
    /// A job that has not called `Plan` or `ReportProfile` for this many seconds is no
    /// longer active: its front and allocation leave the shared plan (default 600 s).
    pub inactive_after_s: f64,
}

impl Default for SharingConfig {
    fn default() -> Self {
        Self {
            inactive_after_s: DEFAULT_INACTIVE_AFTER_S,
        }
    }
}

/// Default of [`SharingConfig::inactive_after_s`].
pub const DEFAULT_INACTIVE_AFTER_S: f64 = 600.0;

impl SharingConfig {
    /// [`Self::inactive_after_s`] as a duration; a `Config` error unless it is finite and
    /// positive.
    pub fn inactive_after(&self) -> Result<std::time::Duration> {
        let s = self.inactive_after_s;
        if !(s.is_finite() && s > 0.0) {
            return Err(BrainError::Config(format!(
                "sharing.inactive_after_s must be finite and > 0, got {s}"
            )));
        }
        std::time::Duration::try_from_secs_f64(s)
            .map_err(|e| BrainError::Config(format!("sharing.inactive_after_s = {s}: {e}")))
    }
}

/// Free cluster resources.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CapacityConfig {
    /// CPU cores (default 1024).
    pub cpu: f64,
    /// Memory, GiB (default 4096).
    pub mem_gb: f64,
}

impl Default for CapacityConfig {
    fn default() -> Self {
        Self {
            cpu: 1024.0,
            mem_gb: 4096.0,
        }
    }
}

/// Network settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NetworkConfig {
    /// Worker-PS bandwidth, MB/s (default 1250 = 10 Gbit/s).
    pub bandwidth_mb_s: f64,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        Self {
            bandwidth_mb_s: 1250.0,
        }
    }
}

/// DLRover-RM constants of a job.
pub fn dlrover_constants(spec: &JobSpec, bandwidth_mb_s: f64) -> DlroverConstants {
    DlroverConstants {
        batch_size: spec.batch_size,
        // fp32 dense weights, pulled and pushed each step.
        model_size_mb: (spec.dense_params as f64 * 4.0 / 1e6).max(1e-3),
        bandwidth_mb_s,
        emb_dim: spec
            .tables
            .iter()
            .map(|t| f64::from(t.dim))
            .sum::<f64>()
            .max(1.0),
    }
}

/// Start-up plan (Algorithm 1 over `history`).
pub fn warm_plan(cfg: &BrainConfig, spec: &JobSpec, history: &[HistoricalJob]) -> Result<Plan> {
    spec.validate()?;
    let ws = warm_start(spec, history, &cfg.warm, &spec.bounds)?;
    let mut reasons = ws.reasons;
    for (id, s) in &ws.neighbours {
        reasons.push(format!("similar job {id}: similarity {s:.3}"));
    }
    Ok(Plan {
        job_id: spec.job_id.clone(),
        kind: PlanKind::WarmStart,
        allocation: ws.alloc,
        predicted_throughput: None,
        predicted_cost: cfg.prices.cost(&ws.alloc),
        predicted_gain: None,
        reasons,
        fit: None,
        memory: vec![],
        front: vec![],
    })
}

/// Input of [`replan`].
#[derive(Debug, Clone, Copy)]
pub struct ReplanInput<'a> {
    /// The job.
    pub spec: &'a JobSpec,
    /// Runtime profile.
    pub samples: &'a [ProfileSample],
    /// What the job runs with now.
    pub current: Option<Allocation>,
    /// Samples still to train (`Phi_sp` of Eq. 14).
    pub remaining_samples: f64,
    /// PS memory readings.
    pub memory: &'a [MemorySample],
    /// (current step, total steps), for OOM prediction.
    pub steps: Option<(u64, u64)>,
    /// Most cores a candidate may hold: the job measured that a growth beyond them did
    /// not pay (a model without a term for it would plan it again).
    pub max_cpu: Option<f64>,
    /// Most workers a candidate may hold, for the same reason.
    pub max_workers: Option<u32>,
}

/// Profile samples a re-plan fits on at most (the most recent).
pub const FIT_WINDOW: usize = 2_000;

/// What a job's master asks of a re-plan: where the job stands and what it measured. The
/// service reads it from the wire's `PlanRequest`; the simulator builds it directly.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanAsk {
    /// What the job runs with now (absent: the last allocation the brain recorded).
    pub current: Option<Allocation>,
    /// Samples still to train (0: the whole dataset).
    pub remaining_samples: u64,
    /// Global step now.
    pub current_step: u64,
    /// Steps of the whole job (0: unknown, no OOM prediction).
    pub total_steps: u64,
    /// Seconds a new worker took to start, as the job measured it (0: the configured
    /// default of Eq. 8).
    pub worker_start_s: f64,
    /// Seconds a PS migration paused the job (0: the configured default).
    pub ps_migration_s: f64,
    /// The job's expected remaining time, over which a plan's gain must repay its
    /// overhead (0: the configured default).
    pub horizon_s: f64,
    /// Free cores besides the job's allocation, when the job plans its own machine
    /// (absent: it shares the brain's cluster with the other active jobs).
    pub free_cpu: Option<f64>,
    /// Free memory besides the job's allocation, GiB (see `free_cpu`).
    pub free_mem_gb: Option<f64>,
    /// Most cores the job's plans may hold: a growth beyond them did not pay.
    pub max_cpu: Option<f64>,
    /// Most workers the job's plans may hold, for the same reason.
    pub max_workers: Option<u32>,
}

impl PlanAsk {
    /// Whether the job shares the cluster with the other active jobs (it sent no capacity
    /// of its own).
    pub fn shared(&self) -> bool {
        self.free_cpu.is_none() && self.free_mem_gb.is_none()
    }

    /// The settings this re-plan runs with: `base`, with the job's measured scaling
    /// overheads and horizon, and its free capacity when it sent one.
    pub fn settings(&self, base: &BrainConfig) -> Result<BrainConfig> {
        let mut cfg = *base;
        if self.total_steps < self.current_step {
            return Err(BrainError::invalid("total_steps", "is before current_step"));
        }
        for (field, v, slot) in [
            (
                "worker_start_s",
                self.worker_start_s,
                &mut cfg.overhead.worker_start_s,
            ),
            (
                "ps_migration_s",
                self.ps_migration_s,
                &mut cfg.overhead.ps_migration_s,
            ),
            ("horizon_s", self.horizon_s, &mut cfg.overhead.horizon_s),
        ] {
            check_non_negative(field, v)?;
            if v > 0.0 {
                *slot = v;
            }
        }
        for (field, v, slot) in [
            ("free_cpu", self.free_cpu, &mut cfg.capacity.cpu),
            ("free_mem_gb", self.free_mem_gb, &mut cfg.capacity.mem_gb),
        ] {
            if let Some(v) = v {
                check_non_negative(field, v)?;
                *slot = v;
            }
        }
        Ok(cfg)
    }

    /// The planner's input for `spec` with the job's stored profile and memory readings.
    pub fn input<'a>(
        &self,
        spec: &'a JobSpec,
        samples: &'a [ProfileSample],
        memory: &'a [MemorySample],
    ) -> ReplanInput<'a> {
        let remaining = if self.remaining_samples == 0 {
            spec.dataset_samples
        } else {
            self.remaining_samples
        };
        ReplanInput {
            spec,
            samples,
            current: self.current,
            remaining_samples: remaining as f64,
            memory,
            steps: (self.total_steps > 0).then_some((self.current_step, self.total_steps)),
            max_cpu: self.max_cpu,
            max_workers: self.max_workers,
        }
    }
}

/// What [`fit_front`] learns about one job: its fitted model and its NSGA-II front.
#[derive(Debug, Clone)]
pub struct JobFront {
    /// The fitted DLRover-RM model.
    pub model: DlroverModel,
    /// Its held-out fit quality.
    pub report: FitReport,
    /// Non-dominated allocations (cost vs 1/gain), gains relative to the current one.
    pub front: Vec<Candidate>,
    /// Memory the PS must hold together, GiB.
    pub ps_mem_needed_gb: f64,
    /// Why, in order (the fit and the front).
    pub reasons: Vec<String>,
}

/// The greedy's decision for the job being planned, with why.
#[derive(Debug, Clone, PartialEq)]
pub struct Pick {
    /// The chosen candidate, or `None` to keep the current allocation.
    pub chosen: Option<Candidate>,
    /// Resources the job could use besides its current allocation (for the error when it
    /// has neither a candidate nor a current allocation).
    pub free: Resources,
    /// Why, in order.
    pub reasons: Vec<String>,
}

/// Periodic re-plan of one job alone: [`fit_front`], [`pick_alone`] under the free
/// capacity `cfg.capacity`, then [`finish_plan`] (OOM prevention, bounds).
pub fn replan(cfg: &BrainConfig, input: ReplanInput<'_>) -> Result<Plan> {
    let fit = fit_front(cfg, &input)?;
    let pick = pick_alone(cfg, &input, &fit.front)?;
    finish_plan(cfg, &input, fit, pick)
}

/// The per-job half of a re-plan: validates the input, fits DLRover-RM's model on the
/// profile and generates the NSGA-II front relative to the current allocation.
pub fn fit_front(cfg: &BrainConfig, input: &ReplanInput<'_>) -> Result<JobFront> {
    let spec = input.spec;
    spec.validate()?;
    check_non_negative("remaining_samples", input.remaining_samples)?;
    check_positive("bandwidth_mb_s", cfg.network.bandwidth_mb_s)?;
    if let Some(c) = &input.current {
        c.validate("current")?;
    }
    validate_profile(input.samples, DLROVER_MIN_SAMPLES)?;
    let (model, report) = DlroverModel::fit(
        dlrover_constants(spec, cfg.network.bandwidth_mb_s),
        input.samples,
    )?;
    let need = ps_mem_needed_gb(&JobFeatures::of(spec), spec);
    let problem = JobProblem {
        model: &model,
        bounds: spec.bounds,
        current: input.current,
        prices: cfg.prices,
        overhead: cfg.overhead,
        ps_mem_needed_gb: need,
    };
    let mut front = nsga2(&problem, cfg.nsga)?;
    let mut capped = None;
    if input.max_cpu.is_some() || input.max_workers.is_some() {
        if let Some(m) = input.max_cpu {
            check_positive("max_cpu", m)?;
        }
        let max_cpu = input.max_cpu.unwrap_or(f64::INFINITY);
        let max_workers = input.max_workers.unwrap_or(u32::MAX);
        let before = front.len();
        front.retain(|c| c.alloc.total_cpu() <= max_cpu + 1e-9 && c.alloc.workers <= max_workers);
        let limits: Vec<String> = [
            input.max_workers.map(|m| format!("{m} workers")),
            input.max_cpu.map(|m| format!("{m} cores")),
        ]
        .into_iter()
        .flatten()
        .collect();
        capped = Some(format!(
            "{} of {before} front allocations hold more than the {} this job measured to pay (a growth beyond them did not): left out",
            before - front.len(),
            limits.join(" and ")
        ));
    }
    let mut reasons = vec![
        format!(
            "fitted DLRover-RM model on {} samples: alpha_grad {:.3e}, alpha_upd {:.3e}, alpha_sync {:.3e}, alpha_emb {:.3e}, beta {:.3e}; held-out MAPE {:.2}%",
            input.samples.len(),
            model.coef.alpha_grad,
            model.coef.alpha_upd,
            model.coef.alpha_sync,
            model.coef.alpha_emb,
            model.coef.beta,
            report.mape
        ),
        format!(
            "NSGA-II front: {} non-dominated allocations (cost vs 1/gain)",
            front.len()
        ),
    ];
    reasons.extend(capped);
    Ok(JobFront {
        model,
        report,
        front,
        ps_mem_needed_gb: need,
        reasons,
    })
}

/// The weighted greedy (Eq. 11-14) over one job's `front` alone: the best candidate
/// within the free capacity `cfg.capacity` besides the job's current allocation.
pub fn pick_alone(cfg: &BrainConfig, input: &ReplanInput<'_>, front: &[Candidate]) -> Result<Pick> {
    let capacity = {
        let cur = input
            .current
            .as_ref()
            .map(Resources::of)
            .unwrap_or_default();
        Resources {
            cpu: cfg.capacity.cpu + cur.cpu,
            mem_gb: cfg.capacity.mem_gb + cur.mem_gb,
        }
    };
    let g = weighted_greedy(
        &[JobOptions {
            job_id: input.spec.job_id.clone(),
            remaining_samples: input.remaining_samples,
            current: input.current,
            candidates: front.to_vec(),
        }],
        capacity,
        cfg.greedy,
    )?;
    let a = &g.assignments[0];
    let reasons = a.chosen.iter().map(|c| format!(
        "weighted greedy picked the candidate with the best RE x WG = {:.3e} (gain {:.1} samples/s for cost {:.2}/h) within free capacity {:.0} CPU / {:.0} GiB",
        a.score, c.gain, c.cost, cfg.capacity.cpu, cfg.capacity.mem_gb
    )).collect();
    Ok(Pick {
        chosen: a.chosen,
        free: Resources {
            cpu: cfg.capacity.cpu,
            mem_gb: cfg.capacity.mem_gb,
        },
        reasons,
    })
}

/// The second half of a re-plan: the allocation `pick` chose (or the current one), with
/// PS memory for the model state and OOM prevention folded in, checked against the bounds.
pub fn finish_plan(
    cfg: &BrainConfig,
    input: &ReplanInput<'_>,
    fit: JobFront,
    pick: Pick,
) -> Result<Plan> {
    let spec = input.spec;
    let JobFront {
        model,
        report,
        front,
        ps_mem_needed_gb: need,
        mut reasons,
    } = fit;
    reasons.extend(pick.reasons);
    let (kind, mut alloc, tp, gain) = match (pick.chosen, input.current) {
        (Some(c), _) => (PlanKind::Replan, c.alloc, c.throughput, Some(c.gain)),
        (None, Some(cur)) => {
            reasons.push("no candidate gains throughput net of scaling overhead within capacity: keep the current allocation".into());
            let cur = spec.bounds.clamp(&cur);
            (PlanKind::Keep, cur, model.predict(&cur), Some(0.0))
        }
        (None, None) => {
            return Err(BrainError::Infeasible(format!(
                "no allocation inside the bounds fits the free capacity ({:.0} CPU, {:.0} GiB) and holds {need:.1} GiB of model state",
                pick.free.cpu, pick.free.mem_gb
            )))
        }
    };
    let (a2, note) = fit_memory(alloc, need, &spec.bounds);
    alloc = a2;
    reasons.extend(note);
    let mut memory = Vec::new();
    // OOM prediction fits each PS's growth; until every PS has enough readings (a job
    // that just started) the plan goes on without it.
    let readings_ok = {
        let mut per_ps: std::collections::BTreeMap<u32, usize> = Default::default();
        for m in input.memory {
            *per_ps.entry(m.ps_index).or_default() += 1;
        }
        let ok = per_ps.values().all(|&n| n >= oom::OOM_MIN_SAMPLES);
        if !ok {
            reasons.push(format!(
                "OOM prediction waits for {} memory readings of every PS",
                oom::OOM_MIN_SAMPLES
            ));
        }
        ok
    };
    if let Some((cur_step, total)) = input.steps {
        if !input.memory.is_empty() && readings_ok {
            // Per-PS actions for the layout the readings come from ...
            let limit = input.current.map_or(alloc.ps_mem_gb, |c| c.ps_mem_gb);
            let fits = oom::fit_each(input.memory)?;
            memory = oom::predict_from(
                &fits,
                limit,
                cur_step,
                total,
                cfg.oom,
                spec.bounds.ps_mem_gb,
            )?;
            // ... and the plan's own layout must hold the predicted total at job end
            // (rows are hashed evenly over the PS, so the total re-shards).
            let peak_total: f64 = fits.iter().map(|(_, g)| g.at(total)).sum();
            let need_end = peak_total * (1.0 + cfg.oom.headroom);
            if f64::from(alloc.ps) * alloc.ps_mem_gb < need_end {
                let (a3, note) = fit_memory(alloc, need_end, &spec.bounds);
                reasons.push(format!(
                    "OOM prediction: PS memory grows to {peak_total:.1} GiB in total by step {total} (now step {cur_step}){}; plan holds {:.1} GiB with {:.0}% headroom",
                    memory
                        .iter()
                        .filter_map(|m| m.step_at_limit)
                        .min()
                        .map_or(String::new(), |s| format!(", the current {limit:.1} GiB per PS is reached at step {s}")),
                    need_end,
                    cfg.oom.headroom * 100.0
                ));
                reasons.extend(note);
                alloc = a3;
            } else if !memory.is_empty() {
                reasons.push(format!(
                    "OOM prediction: the planned {} PS x {:.1} GiB hold the predicted {peak_total:.1} GiB at step {total}",
                    alloc.ps, alloc.ps_mem_gb
                ));
            }
        }
    }
    spec.bounds.ensure_contains(&alloc)?;
    Ok(Plan {
        job_id: spec.job_id.clone(),
        kind,
        allocation: alloc,
        predicted_throughput: Some(tp),
        predicted_cost: cfg.prices.cost(&alloc),
        predicted_gain: gain,
        reasons,
        fit: Some(report),
        memory,
        front,
    })
}

/// A re-plan of a job on a brain shared by several jobs ([`crate::shared`]): records the
/// job's front, allocation and remaining samples at `now_ms`, runs the weighted greedy over
/// every active job under the cluster capacity `cfg.capacity`, finishes the job's plan
/// ([`finish_plan`]) and records it as granted. The service and the cluster simulator
/// both call this.
pub fn replan_shared(
    cfg: &BrainConfig,
    jobs: &mut crate::shared::ActiveJobs,
    input: &ReplanInput<'_>,
    fit: JobFront,
    now_ms: u64,
) -> Result<Plan> {
    let id = &input.spec.job_id;
    jobs.update(
        id,
        fit.front.clone(),
        input.current,
        input.remaining_samples,
        now_ms,
    );
    let capacity = Resources {
        cpu: cfg.capacity.cpu,
        mem_gb: cfg.capacity.mem_gb,
    };
    let joint = jobs.plan(id, capacity, cfg.greedy)?;
    let plan = finish_plan(cfg, input, fit, joint.pick)?;
    jobs.grant(id, plan.allocation);
    Ok(plan)
}

/// Training mode of a streaming job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// Synchronous (Eq. 6).
    Sync,
    /// Asynchronous (Eq. 9).
    Async,
}

/// Input of [`stream_plan`].
#[derive(Debug, Clone, Copy)]
pub struct StreamInput<'a> {
    /// The job.
    pub spec: &'a JobSpec,
    /// Runtime profile (throughput at several worker counts).
    pub samples: &'a [ProfileSample],
    /// Sync or async.
    pub mode: Mode,
    /// Global batch `M` (sync).
    pub global_batch: f64,
    /// Observed traffic, samples/s per interval.
    pub traffic: &'a [f64],
    /// Interval length, seconds.
    pub interval_s: f64,
    /// Season length in intervals.
    pub period: usize,
    /// Intervals to plan.
    pub horizon: usize,
    /// Workers now.
    pub current_workers: u32,
    /// Measured stream lag, samples.
    pub lag: f64,
    /// Measured utilization (0..1).
    pub utilization: f64,
}

/// Most intervals a streaming plan covers.
pub const MAX_HORIZON: usize = 10_000;

/// KALE: forecast traffic, fewest workers per interval (Eq. 10), stabilize (Algorithm 1),
/// then apply the fallback rule to the first interval.
pub fn stream_plan(cfg: &BrainConfig, input: StreamInput<'_>) -> Result<StreamPlan> {
    let spec = input.spec;
    spec.validate()?;
    check_positive("interval_s", input.interval_s)?;
    check_positive("global_batch", input.global_batch)?;
    if input.horizon == 0 || input.horizon > MAX_HORIZON {
        return Err(BrainError::invalid(
            "horizon",
            format!("need 1..={MAX_HORIZON}, got {}", input.horizon),
        ));
    }
    if input.period == 0 || input.period > input.traffic.len().max(1) {
        return Err(BrainError::invalid(
            "period",
            format!(
                "need 1..=len(traffic_history) = {}, got {}",
                input.traffic.len(),
                input.period
            ),
        ));
    }
    let variant = match input.mode {
        Mode::Sync => KaleVariant::SyncW,
        Mode::Async => KaleVariant::AsyncW,
    };
    validate_profile(input.samples, variant.len() + 3)?;
    let ks: Vec<KaleSample> = input
        .samples
        .iter()
        .map(|s| KaleSample {
            workers: s.alloc.workers,
            ps: s.alloc.ps,
            throughput: s.throughput(),
        })
        .collect();
    let (model, report) = KaleModel::fit(variant, input.global_batch, &ks)?;
    let mut reasons = vec![format!(
        "fitted KALE {variant:?} model on {} samples: theta {:?}; held-out MAPE {:.2}%",
        ks.len(),
        model
            .theta
            .iter()
            .map(|t| format!("{t:.3e}"))
            .collect::<Vec<_>>(),
        report.mape
    )];
    let forecast = if input.traffic.len() >= 2 * input.period {
        let hw = HoltWinters::new(input.period);
        reasons.push(format!(
            "traffic forecast by {} (period {})",
            hw.name(),
            input.period
        ));
        hw.forecast(input.traffic, input.horizon)?
    } else {
        let sn = SeasonalNaive {
            period: input.period,
        };
        reasons.push(format!(
            "traffic forecast by {} (under two seasons of history)",
            sn.name()
        ));
        sn.forecast(input.traffic, input.horizon)?
    };
    let f = |w: u32| model.throughput(w, w);
    let (raw, short) = plan_series(f, &forecast, spec.bounds.workers)?;
    if !short.is_empty() {
        reasons.push(format!(
            "{} of {} intervals exceed the most the bounds allow ({} workers max): planned at peak throughput",
            short.len(),
            forecast.len(),
            spec.bounds.workers.max
        ));
    }
    let stabilized = stabilize(&raw, input.interval_s, cfg.stabilization)?;
    let changes = |v: &[u32]| v.windows(2).filter(|w| w[0] != w[1]).count();
    reasons.push(format!(
        "stabilization (rho {}, tau {:.0} s): {} scaling actions -> {}",
        cfg.stabilization.rho,
        cfg.stabilization.tau_s,
        changes(&raw),
        changes(&stabilized)
    ));
    let planned = stabilized[0];
    let fb = cfg.fallback.apply(
        planned,
        input.current_workers.max(1),
        input.lag,
        input.utilization,
        spec.bounds.workers,
    )?;
    if let Some(r) = fb.reason {
        reasons.push(r);
    } else {
        reasons.push(format!(
            "fewest workers with F(w) > L(t) = {:.1}: {} (F = {:.1})",
            forecast[0],
            planned,
            f(planned)
        ));
    }
    Ok(StreamPlan {
        job_id: spec.job_id.clone(),
        forecast,
        raw_workers: raw,
        stabilized_workers: stabilized,
        workers_now: fb.workers,
        predicted_throughput_now: f(fb.workers),
        reasons,
        fit: Some(report),
    })
}

/// Reads a job file and plans: a re-plan when it carries enough profile samples, a
/// warm-start default otherwise (no database is consulted).
pub fn plan_for_job_file(path: impl AsRef<std::path::Path>) -> Result<Plan> {
    let file = crate::job::JobFile::read(path.as_ref())?;
    plan_for_job(&file)
}

/// [`plan_for_job_file`] on a parsed file.
pub fn plan_for_job(file: &crate::job::JobFile) -> Result<Plan> {
    let cfg = BrainConfig {
        prices: Prices {
            cpu: file.cluster.cpu_price,
            mem_gb: file.cluster.mem_price,
        },
        capacity: CapacityConfig {
            cpu: file.cluster.cpu,
            mem_gb: file.cluster.mem_gb,
        },
        network: NetworkConfig {
            bandwidth_mb_s: file.cluster.bandwidth_mb_s,
        },
        ..BrainConfig::default()
    };
    let samples = file.samples();
    if samples.len() < DLROVER_MIN_SAMPLES {
        let mut p = warm_plan(&cfg, &file.job, &[])?;
        p.reasons.insert(
            0,
            format!(
                "profile has {} samples (< {DLROVER_MIN_SAMPLES} to fit a model): start-up plan without history",
                samples.len()
            ),
        );
        return Ok(p);
    }
    replan(
        &cfg,
        ReplanInput {
            spec: &file.job,
            samples: &samples,
            current: file.current,
            remaining_samples: file.remaining_samples.unwrap_or(file.job.dataset_samples) as f64,
            memory: &file.memory,
            steps: file.steps.map(|s| (s.current, s.total)),
            max_cpu: None,
            max_workers: None,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::tests::spec;
    use crate::throughput::dlrover::tests as dl;

    /// The allocation the re-plan tests start from.
    fn two_small_workers() -> Allocation {
        Allocation {
            workers: 2,
            ps: 1,
            worker_cpu: 2.0,
            ps_cpu: 2.0,
            worker_mem_gb: 8.0,
            ps_mem_gb: 16.0,
        }
    }

    #[test]
    fn replan_stays_in_bounds_and_explains_itself() {
        let s = dl::synthetic(40, 0.02, 4);
        let mut job = spec("j");
        job.bounds.workers = crate::Range::new(2, 24);
        let cur = two_small_workers();
        let p = replan(
            &BrainConfig::default(),
            ReplanInput {
                spec: &job,
                samples: &s,
                current: Some(cur),
                remaining_samples: 1e9,
                memory: &[],
                steps: None,
                max_cpu: None,
                max_workers: None,
            },
        )
        .unwrap();
        assert!(job.bounds.contains(&p.allocation));
        assert_eq!(p.kind, PlanKind::Replan);
        assert!(
            p.predicted_throughput.unwrap()
                > DlroverModel::new(dl::constants(), dl::truth()).predict(&cur)
        );
        assert!(p.reasons.len() >= 3 && p.fit.is_some());
        let t = p.render_table();
        assert!(t.contains("pareto front"), "{t}");
    }

    /// Limits the job measured (a growth beyond them did not pay) leave the front's larger
    /// allocations out, and the plan says so.
    #[test]
    fn measured_limits_leave_larger_allocations_out_of_the_front() {
        let s = dl::synthetic(40, 0.02, 4);
        let job = spec("j");
        let cur = two_small_workers();
        let input = ReplanInput {
            spec: &job,
            samples: &s,
            current: Some(cur),
            remaining_samples: 1e9,
            memory: &[],
            steps: None,
            max_cpu: None,
            max_workers: None,
        };
        let cfg = BrainConfig::default();
        let free = fit_front(&cfg, &input).unwrap();
        assert!(free
            .front
            .iter()
            .any(|c| c.alloc.workers > 3 && c.alloc.total_cpu() > 20.0));
        let capped = fit_front(
            &cfg,
            &ReplanInput {
                max_workers: Some(3),
                max_cpu: Some(20.0),
                ..input
            },
        )
        .unwrap();
        assert!(!capped.front.is_empty());
        assert!(capped
            .front
            .iter()
            .all(|c| c.alloc.workers <= 3 && c.alloc.total_cpu() <= 20.0));
        assert!(
            capped
                .reasons
                .iter()
                .any(|r| r.contains("more than the 3 workers and 20 cores")),
            "{:?}",
            capped.reasons
        );
        let p = replan(
            &cfg,
            ReplanInput {
                max_workers: Some(3),
                ..input
            },
        )
        .unwrap();
        assert!(p.allocation.workers <= 3, "{:?}", p.allocation);
        let e = fit_front(
            &cfg,
            &ReplanInput {
                max_cpu: Some(-1.0),
                ..input
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("max_cpu"), "{e}");
    }

    /// The halves of a re-plan compose: without a pick the job keeps its allocation, and
    /// without one either the plan is refused naming the room it had.
    #[test]
    fn finish_plan_keeps_the_current_allocation_or_refuses() {
        let s = dl::synthetic(40, 0.02, 4);
        let job = spec("j");
        let cur = two_small_workers();
        let cfg = BrainConfig::default();
        let input = ReplanInput {
            spec: &job,
            samples: &s,
            current: Some(cur),
            remaining_samples: 1e9,
            memory: &[],
            steps: None,
            max_cpu: None,
            max_workers: None,
        };
        let fit = fit_front(&cfg, &input).unwrap();
        let none = Pick {
            chosen: None,
            free: Resources {
                cpu: 3.0,
                mem_gb: 5.0,
            },
            reasons: vec!["no room".into()],
        };
        let p = finish_plan(&cfg, &input, fit.clone(), none.clone()).unwrap();
        assert_eq!((p.kind, p.allocation), (PlanKind::Keep, cur));
        assert!(p.reasons.iter().any(|r| r == "no room"), "{:?}", p.reasons);
        let fresh = ReplanInput {
            current: None,
            ..input
        };
        let e = finish_plan(&cfg, &fresh, fit.clone(), none).unwrap_err();
        assert!(
            e.to_string().contains("free capacity (3 CPU, 5 GiB)"),
            "{e}"
        );
        let pick = pick_alone(&cfg, &input, &fit.front).unwrap();
        let p = finish_plan(&cfg, &input, fit, pick).unwrap();
        assert_eq!(p, replan(&cfg, input).unwrap());
    }

    #[test]
    fn replan_rejects_malformed_profile() {
        let mut s = dl::synthetic(20, 0.02, 4);
        s[3].iter_time_s = -1.0;
        let job = spec("j");
        let err = replan(
            &BrainConfig::default(),
            ReplanInput {
                spec: &job,
                samples: &s,
                current: None,
                remaining_samples: 1e9,
                memory: &[],
                steps: None,
                max_cpu: None,
                max_workers: None,
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("samples[3].iter_time_s"), "{err}");
    }

    #[test]
    fn stream_plan_keeps_up_with_a_diurnal_load() {
        let truth = KaleModel::new(
            KaleVariant::SyncW,
            vec![0.00035, 2.5726, 0.9824, 0.02786],
            16_384.0,
        )
        .unwrap();
        let samples: Vec<ProfileSample> = (1..=16u32)
            .map(|w| {
                let a = Allocation {
                    workers: w,
                    ps: w,
                    worker_cpu: 8.0,
                    ps_cpu: 8.0,
                    worker_mem_gb: 8.0,
                    ps_mem_gb: 8.0,
                };
                // throughput = w m / T  => T = w m / f
                let m = 16_384 / w;
                ProfileSample {
                    alloc: a,
                    batch_size: m,
                    iter_time_s: f64::from(w * m) / truth.throughput(w, w),
                }
            })
            .collect();
        let traffic = crate::forecast::diurnal_trace(3, 48, 14_000.0, 0.03, 1);
        let job = spec("s");
        let p = stream_plan(
            &BrainConfig::default(),
            StreamInput {
                spec: &job,
                samples: &samples,
                mode: Mode::Sync,
                global_batch: 16_384.0,
                traffic: &traffic,
                interval_s: 1800.0,
                period: 48,
                horizon: 48,
                current_workers: 5,
                lag: 0.0,
                utilization: 0.5,
            },
        )
        .unwrap();
        assert_eq!(p.raw_workers.len(), 48);
        for ((f, r), s) in p
            .forecast
            .iter()
            .zip(&p.raw_workers)
            .zip(&p.stabilized_workers)
        {
            // Throughput is measured in samples/s of the fitted model; the raw plan keeps up
            // with every interval, and stabilization never plans fewer workers than needed
            // except on a downward step it has not yet taken.
            let fit_f = truth.throughput(*r, *r);
            assert!(fit_f > f * 0.99, "{r} workers give {fit_f} < {f}");
            assert!(job.bounds.workers.contains(*s));
        }
        assert!(p.reasons.iter().any(|r| r.contains("stabilization")));
        assert!(
            !p.reasons.iter().any(|r| r.contains("exceed")),
            "{:?}",
            p.reasons
        );
        assert!(
            p.stabilized_workers
                .windows(2)
                .filter(|w| w[0] != w[1])
                .count()
                <= p.raw_workers.windows(2).filter(|w| w[0] != w[1]).count()
        );
    }
}
