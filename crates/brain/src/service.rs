//! The brain's gRPC service (`elastrec.brain.v1.Brain`): thin handlers that validate the
//! wire, call the planner, store what they learn and map errors to `tonic::Status`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use elastrec_metrics::prometheus_client::metrics::counter::Counter;
use elastrec_metrics::prometheus_client::metrics::family::Family;
use elastrec_metrics::prometheus_client::registry::Registry;
use elastrec_proto::brain as pb;
use pb::brain_server::{Brain, BrainServer};
use tonic::{Request, Response, Status};

use crate::alloc::{Allocation, Bounds, Range};
use crate::db::{ConfigDb, Outcome};
use crate::error::{BrainError, Result};
use crate::job::{JobSpec, TableSpec};
use crate::oom::MemorySample;
use crate::plan::{Plan, PlanKind, StreamPlan};
use crate::planner::{self, BrainConfig, Mode, PlanAsk, StreamInput};
use crate::shared::{ActiveJobs, Clock, SystemClock};
use crate::throughput::{FitReport, ProfileSample};

/// Most profile samples or memory readings accepted in one report.
pub const MAX_REPORT: usize = 100_000;
/// Most traffic values accepted in one streaming request.
pub const MAX_TRAFFIC: usize = 100_000;
pub use crate::planner::FIT_WINDOW;
/// Default listen address (loopback only).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:50070";
/// Default `/metrics` address: loopback, any free port (logged at start).
pub const DEFAULT_METRICS: &str = "127.0.0.1:0";

/// Environment variable holding the brain's shared token (`elastrec brain`). The token is
/// never a command-line argument: those are visible to every user through `ps`.
pub const TOKEN_ENV: &str = "ELASTREC_BRAIN_TOKEN";

/// Options of `elastrec brain --db URL [--listen ADDR] [--token-file PATH]`.
#[derive(Clone)]
pub struct BrainServeOptions {
    /// Database URL: `sqlite://brain.db?mode=rwc` or `postgres://...`.
    pub db_url: String,
    /// Address to listen on (default [`DEFAULT_LISTEN`]).
    pub listen: SocketAddr,
    /// Shared token every request must carry as `authorization: Bearer <token>`.
    pub token: String,
    /// Address of the Prometheus `/metrics` endpoint (default [`DEFAULT_METRICS`]); off
    /// loopback it requires the token too.
    pub metrics: SocketAddr,
    /// Policy settings.
    pub config: BrainConfig,
}

impl BrainServeOptions {
    /// Options with the default listen address and policy settings.
    pub fn new(db_url: impl Into<String>, token: impl Into<String>) -> Self {
        Self {
            db_url: db_url.into(),
            listen: DEFAULT_LISTEN.parse().expect("constant address parses"),
            token: token.into(),
            metrics: DEFAULT_METRICS.parse().expect("constant address parses"),
            config: BrainConfig::default(),
        }
    }
}

/// Hides the secrets: the database password and the token.
impl std::fmt::Debug for BrainServeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrainServeOptions")
            .field("db_url", &crate::db::redact_url(&self.db_url))
            .field("listen", &self.listen)
            .field("token", &"***")
            .field("config", &self.config)
            .finish()
    }
}

/// The shared token, from the file `token_file` (`--token-file`) or the value of
/// [`TOKEN_ENV`] (`env_value`), exactly one of them.
///
/// Surrounding whitespace is dropped (a file usually ends with a newline). The token must
/// then be non-empty and printable ASCII without spaces, since it travels in an
/// `authorization: Bearer <token>` header; errors name the source, never the token.
pub fn resolve_token(
    token_file: Option<&std::path::Path>,
    env_value: Option<std::ffi::OsString>,
) -> Result<String> {
    let (raw, source) = match (token_file, env_value) {
        (Some(_), Some(_)) => {
            // Either could be stale; picking one would turn a mix-up into Unauthenticated.
            return Err(BrainError::Config(format!(
                "both --token-file and {TOKEN_ENV} are set: use only one"
            )));
        }
        (Some(path), None) => {
            let text = std::fs::read_to_string(path).map_err(|source| BrainError::Io {
                path: path.display().to_string(),
                source,
            })?;
            (text, format!("token file {}", path.display()))
        }
        (None, Some(value)) => {
            let text = value
                .into_string()
                .map_err(|_| BrainError::Config(format!("{TOKEN_ENV} is not valid UTF-8")))?;
            (text, TOKEN_ENV.to_string())
        }
        (None, None) => {
            return Err(BrainError::Config(format!(
                "the brain needs a shared token: set {TOKEN_ENV} or pass --token-file PATH \
                 (masters send it with every request)"
            )))
        }
    };
    let token = raw.trim();
    if token.is_empty() {
        return Err(BrainError::Config(format!("{source}: the token is empty")));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(BrainError::Config(format!(
            "{source}: the token must be printable ASCII without spaces (it is sent in an HTTP header)"
        )));
    }
    Ok(token.to_string())
}

/// Serves until Ctrl-C.
pub async fn serve(opts: BrainServeOptions) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|source| BrainError::Io {
            path: opts.listen.to_string(),
            source,
        })?;
    let db = crate::db::redact_url(&opts.db_url);
    tracing::info!(listen = %opts.listen, %db, "brain serving");
    serve_with_listener(opts, listener, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}

/// Serves on an already bound listener until `shutdown` completes (tests bind port 0),
/// with metrics on `opts.metrics`.
pub async fn serve_with_listener(
    opts: BrainServeOptions,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    let metrics = tokio::net::TcpListener::bind(opts.metrics)
        .await
        .map_err(|source| BrainError::Io {
            path: opts.metrics.to_string(),
            source,
        })?;
    serve_with_listeners(opts, listener, metrics, shutdown).await
}

/// Serves gRPC on `listener` and `/metrics` on `metrics` (open on loopback, the token
/// elsewhere) until `shutdown` completes.
pub async fn serve_with_listeners(
    opts: BrainServeOptions,
    listener: tokio::net::TcpListener,
    metrics: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    if opts.token.is_empty() {
        return Err(BrainError::Config(format!(
            "a non-empty shared token is required ({TOKEN_ENV} or --token-file)"
        )));
    }
    let store = ConfigDb::connect(&opts.db_url).await?;
    let counters = Arc::new(BrainMetrics::new());
    let io = |source| BrainError::Io {
        path: "the metrics listener".into(),
        source,
    };
    let access =
        elastrec_metrics::Access::for_bind(metrics.local_addr().map_err(io)?.ip(), &opts.token);
    let c = counters.clone();
    // Serves until dropped, when this function returns.
    let endpoint = elastrec_metrics::serve_on(metrics, access, move || c.render()).map_err(io)?;
    // Printed, not logged at info: an operator needs the address (the default port is
    // chosen by the OS), whatever the log filter.
    eprintln!("brain metrics on http://{}/metrics", endpoint.addr());
    let svc = BrainService::new(store, opts.config, counters, Arc::new(SystemClock))?;
    // The shared token check every elastrec server uses (digests compared in constant
    // time); the brain's token is the owner's, so every call is allowed.
    let server = BrainServer::with_interceptor(svc, elastrec_rpc::ServerAuth::new(&opts.token));
    tonic::transport::Server::builder()
        .add_service(server)
        .serve_with_incoming_shutdown(elastrec_rpc::incoming(listener), shutdown)
        .await?;
    Ok(())
}

/// Maps a brain error to a gRPC status (the edge is the only place this happens).
pub fn status_of(e: BrainError) -> Status {
    match &e {
        BrainError::InvalidInput { .. } => Status::invalid_argument(e.to_string()),
        BrainError::Profile(_) => Status::failed_precondition(e.to_string()),
        BrainError::Infeasible(_) => Status::resource_exhausted(e.to_string()),
        BrainError::UnknownJob(_) => Status::not_found(e.to_string()),
        _ => {
            tracing::error!(error = %e, "brain request failed");
            Status::internal(e.to_string())
        }
    }
}

type Labels = Vec<(String, String)>;

/// Prometheus metrics of the brain (prefix `elastrec_brain`).
struct BrainMetrics {
    registry: Registry,
    requests: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
}

impl BrainMetrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("elastrec_brain");
        let requests = Family::<Labels, Counter>::default();
        registry.register("requests", "Requests served, by method", requests.clone());
        let errors = Family::<Labels, Counter>::default();
        registry.register(
            "errors",
            "Requests answered with an error, by method",
            errors.clone(),
        );
        Self {
            registry,
            requests,
            errors,
        }
    }

    /// Counts one request of `method` and whether it failed.
    fn count<T>(&self, method: &str, r: &Result<T>) {
        let l = vec![("method".to_string(), method.to_string())];
        self.requests.get_or_create(&l).inc();
        if r.is_err() {
            self.errors.get_or_create(&l).inc();
        }
    }

    fn render(&self) -> String {
        elastrec_metrics::encode(&self.registry)
    }
}

/// The service state: the store, the policy settings, the counters and the jobs that share
/// the cluster (in memory: a restarted brain relearns them as they re-plan).
pub struct BrainService {
    store: ConfigDb,
    cfg: BrainConfig,
    metrics: Arc<BrainMetrics>,
    shared: Mutex<ActiveJobs>,
    inactive_after: Duration,
    clock: Arc<dyn Clock>,
}

fn check_job_id(id: &str) -> Result<()> {
    if id.is_empty() || id.len() > crate::job::MAX_NAME {
        return Err(BrainError::invalid("job_id", "must be 1..=256 bytes"));
    }
    Ok(())
}

/// An allocation from the wire, checked (`field` names it in the error); `None` stays
/// `None`.
pub fn alloc_from(field: &str, a: Option<pb::Allocation>) -> Result<Option<Allocation>> {
    let Some(a) = a else { return Ok(None) };
    let out = Allocation {
        workers: a.workers,
        ps: a.ps,
        worker_cpu: a.worker_cpu,
        ps_cpu: a.ps_cpu,
        worker_mem_gb: a.worker_mem_gb,
        ps_mem_gb: a.ps_mem_gb,
    };
    out.validate(field)?;
    if out.workers > crate::alloc::MAX_NODES || out.ps > crate::alloc::MAX_NODES {
        return Err(BrainError::invalid(field, "absurd node count"));
    }
    Ok(Some(out))
}

/// The wire form of an allocation.
pub fn alloc_to(a: &Allocation) -> pb::Allocation {
    pb::Allocation {
        workers: a.workers,
        ps: a.ps,
        worker_cpu: a.worker_cpu,
        ps_cpu: a.ps_cpu,
        worker_mem_gb: a.worker_mem_gb,
        ps_mem_gb: a.ps_mem_gb,
    }
}

fn count_range(field: &str, r: Option<pb::Range>, default: Range<u32>) -> Result<Range<u32>> {
    let Some(r) = r else { return Ok(default) };
    for v in [r.min, r.max] {
        if !v.is_finite() || v < 0.0 || v.fract() != 0.0 || v > f64::from(u32::MAX) {
            return Err(BrainError::invalid(
                field,
                format!("counts must be whole numbers, got {v}"),
            ));
        }
    }
    Ok(Range::new(r.min as u32, r.max as u32))
}

fn real_range(r: Option<pb::Range>, default: Range<f64>) -> Range<f64> {
    r.map_or(default, |r| Range::new(r.min, r.max))
}

fn bounds_from(b: Option<pb::Bounds>) -> Result<Bounds> {
    let d = Bounds::default();
    let Some(b) = b else { return Ok(d) };
    let out = Bounds {
        workers: count_range("bounds.workers", b.workers, d.workers)?,
        ps: count_range("bounds.ps", b.ps, d.ps)?,
        worker_cpu: real_range(b.worker_cpu, d.worker_cpu),
        ps_cpu: real_range(b.ps_cpu, d.ps_cpu),
        worker_mem_gb: real_range(b.worker_mem_gb, d.worker_mem_gb),
        ps_mem_gb: real_range(b.ps_mem_gb, d.ps_mem_gb),
    };
    out.validate()?;
    Ok(out)
}

fn spec_from(j: Option<pb::JobSpec>) -> Result<JobSpec> {
    spec_from_proto(j.ok_or_else(|| BrainError::invalid("job", "missing"))?)
}

/// The brain's job spec from its wire form (what a master sends), checked.
pub fn spec_from_proto(j: pb::JobSpec) -> Result<JobSpec> {
    if j.tables.len() > crate::job::MAX_TABLES {
        return Err(BrainError::invalid("job.tables", "too many tables"));
    }
    let spec = JobSpec {
        job_id: j.job_id,
        model_type: if j.model_type.is_empty() {
            "dlrm".into()
        } else {
            j.model_type
        },
        tables: j
            .tables
            .iter()
            .map(|t| TableSpec {
                rows: t.rows,
                dim: t.dim,
            })
            .collect(),
        dense_params: j.dense_params,
        dataset_samples: j.dataset_samples,
        batch_size: if j.batch_size == 0 { 512 } else { j.batch_size },
        scenario: j.scenario,
        user: j.user,
        bounds: bounds_from(j.bounds)?,
        requested: alloc_from("job.requested", j.requested)?,
    };
    spec.validate()?;
    Ok(spec)
}

fn fit_to(f: &FitReport) -> pb::FitError {
    pb::FitError {
        model: f.model.clone(),
        mae: f.mae,
        mape: f.mape,
        rmsle: f.rmsle,
        train_samples: f.train_samples as u32,
        holdout_samples: f.holdout_samples as u32,
    }
}

/// The profile samples and memory readings of a report, each sample checked (its index
/// named in the error).
pub fn profile_from(
    r: &pb::ReportProfileRequest,
) -> Result<(Vec<ProfileSample>, Vec<MemorySample>)> {
    let mut samples = Vec::with_capacity(r.samples.len());
    for (i, s) in r.samples.iter().enumerate() {
        let alloc = alloc_from(&format!("samples[{i}].allocation"), s.allocation)?
            .ok_or_else(|| BrainError::invalid(format!("samples[{i}].allocation"), "missing"))?;
        let p = ProfileSample {
            alloc,
            batch_size: s.batch_size,
            iter_time_s: s.iter_time_s,
        };
        p.validate(i)?;
        samples.push(p);
    }
    let memory: Vec<MemorySample> = r
        .memory
        .iter()
        .map(|m| MemorySample {
            ps_index: m.ps_index,
            step: m.step,
            mem_gb: m.mem_gb,
        })
        .collect();
    Ok((samples, memory))
}

/// The wire form of a profile report.
pub fn profile_to(
    job_id: &str,
    samples: &[ProfileSample],
    memory: &[MemorySample],
) -> pb::ReportProfileRequest {
    pb::ReportProfileRequest {
        job_id: job_id.into(),
        samples: samples
            .iter()
            .map(|s| pb::ProfileSample {
                allocation: Some(alloc_to(&s.alloc)),
                batch_size: s.batch_size,
                iter_time_s: s.iter_time_s,
            })
            .collect(),
        memory: memory
            .iter()
            .map(|m| pb::MemorySample {
                ps_index: m.ps_index,
                step: m.step,
                mem_gb: m.mem_gb,
            })
            .collect(),
    }
}

/// The domain form of a `Plan` request (its allocation checked).
pub fn ask_from(r: &pb::PlanRequest) -> Result<PlanAsk> {
    Ok(PlanAsk {
        current: alloc_from("current", r.current)?,
        remaining_samples: r.remaining_samples,
        current_step: r.current_step,
        total_steps: r.total_steps,
        worker_start_s: r.worker_start_s,
        ps_migration_s: r.ps_migration_s,
        horizon_s: r.horizon_s,
        free_cpu: r.free_cpu,
        free_mem_gb: r.free_mem_gb,
        max_cpu: r.max_cpu,
        max_workers: r.max_workers,
    })
}

/// The wire form of a `Plan` request.
pub fn ask_to(job_id: &str, a: &PlanAsk) -> pb::PlanRequest {
    pb::PlanRequest {
        job_id: job_id.into(),
        current: a.current.as_ref().map(alloc_to),
        remaining_samples: a.remaining_samples,
        current_step: a.current_step,
        total_steps: a.total_steps,
        worker_start_s: a.worker_start_s,
        ps_migration_s: a.ps_migration_s,
        horizon_s: a.horizon_s,
        free_cpu: a.free_cpu,
        free_mem_gb: a.free_mem_gb,
        max_cpu: a.max_cpu,
        max_workers: a.max_workers,
    }
}

/// The wire form of a plan.
pub fn plan_to(p: &Plan) -> pb::PlanResponse {
    pb::PlanResponse {
        job_id: p.job_id.clone(),
        kind: p.kind.as_str().into(),
        allocation: Some(alloc_to(&p.allocation)),
        predicted_throughput: p.predicted_throughput.unwrap_or(0.0),
        predicted_cost: p.predicted_cost,
        predicted_gain: p.predicted_gain.unwrap_or(0.0),
        reasons: p.reasons.clone(),
        fit: p.fit.as_ref().map(fit_to),
        memory: p
            .memory
            .iter()
            .map(|m| pb::MemoryAction {
                ps_index: m.ps_index,
                predicted_peak_gb: m.predicted_peak_gb,
                limit_gb: m.limit_gb,
                step_at_limit: m.step_at_limit.unwrap_or(0),
                new_mem_gb: m.new_mem_gb,
            })
            .collect(),
        pareto_size: p.front.len() as u32,
    }
}

fn stream_to(p: &StreamPlan) -> pb::StreamPlanResponse {
    pb::StreamPlanResponse {
        job_id: p.job_id.clone(),
        forecast: p.forecast.clone(),
        raw_workers: p.raw_workers.clone(),
        stabilized_workers: p.stabilized_workers.clone(),
        workers_now: p.workers_now,
        predicted_throughput_now: p.predicted_throughput_now,
        reasons: p.reasons.clone(),
        fit: p.fit.as_ref().map(fit_to),
    }
}

impl BrainService {
    /// The service's logic without a server: a job master that runs the brain in its own
    /// process calls the same handlers (the `Brain` trait) directly.
    pub async fn open(db_url: &str, cfg: BrainConfig) -> Result<Self> {
        Self::open_with_clock(db_url, cfg, Arc::new(SystemClock)).await
    }

    /// [`Self::open`] with the clock that decides when a job stopped calling (tests drive
    /// their own).
    pub async fn open_with_clock(
        db_url: &str,
        cfg: BrainConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self> {
        let store = ConfigDb::connect(db_url).await?;
        Self::new(store, cfg, Arc::new(BrainMetrics::new()), clock)
    }

    fn new(
        store: ConfigDb,
        cfg: BrainConfig,
        metrics: Arc<BrainMetrics>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self> {
        Ok(Self {
            store,
            inactive_after: cfg.sharing.inactive_after()?,
            cfg,
            metrics,
            shared: Mutex::new(ActiveJobs::new()),
            clock,
        })
    }

    /// The shared jobs, with those not heard from for `inactive_after` dropped.
    fn active_jobs(&self) -> Result<std::sync::MutexGuard<'_, ActiveJobs>> {
        let mut jobs = self
            .shared
            .lock()
            .map_err(|_| BrainError::Internal("the shared plan's lock is poisoned".into()))?;
        for id in jobs.expire(self.clock.now_ms(), self.inactive_after) {
            tracing::info!(job = %id, after_s = self.inactive_after.as_secs_f64(), "job stopped calling: dropped from the shared plan");
        }
        Ok(jobs)
    }

    async fn report(&self, r: pb::ReportProfileRequest) -> Result<pb::ReportProfileResponse> {
        check_job_id(&r.job_id)?;
        if r.samples.len() > MAX_REPORT || r.memory.len() > MAX_REPORT {
            return Err(BrainError::invalid(
                "samples",
                format!("at most {MAX_REPORT} per report"),
            ));
        }
        self.store.require_job(&r.job_id).await?;
        let (samples, memory) = profile_from(&r)?;
        let n = self.store.add_samples(&r.job_id, &samples).await?;
        let m = self.store.add_memory(&r.job_id, &memory).await?;
        // A job's configuration is where it runs. A probe, or a scale no plan of this
        // brain made, becomes what later jobs warm-start from (Algorithm 1 reads each past
        // job's latest configuration).
        if let Some(last) = samples.last() {
            if self.store.latest_config(&r.job_id).await? != Some(last.alloc) {
                self.store
                    .record_config(&r.job_id, &last.alloc, "observed")
                    .await?;
            }
        }
        {
            let now = self.clock.now_ms();
            self.active_jobs()?.touch(&r.job_id, now);
        }
        Ok(pb::ReportProfileResponse {
            samples_stored: n,
            memory_samples_stored: m,
        })
    }

    async fn warm(&self, r: pb::WarmStartRequest) -> Result<pb::PlanResponse> {
        let spec = spec_from(r.job)?;
        let silent_ms = (self.cfg.warm.silent_after_s * 1e3) as i64;
        let history = self.store.history(crate::db::now_ms(), silent_ms).await?;
        let plan = planner::warm_plan(&self.cfg, &spec, &history)?;
        self.store.upsert_job(&spec).await?;
        self.store
            .record_config(&spec.job_id, &plan.allocation, "warm-start")
            .await?;
        // From now on its start-up allocation counts against the shared cluster; it takes
        // part in the greedy once its first re-plan brings a front.
        let now = self.clock.now_ms();
        self.active_jobs()?.update(
            &spec.job_id,
            vec![],
            Some(plan.allocation),
            spec.dataset_samples as f64,
            now,
        );
        Ok(plan_to(&plan))
    }

    async fn outcome(&self, r: pb::RecordOutcomeRequest) -> Result<pb::RecordOutcomeResponse> {
        check_job_id(&r.job_id)?;
        self.store.require_job(&r.job_id).await?;
        let outcome = Outcome {
            status: r.status,
            throughput: r.throughput,
            duration_s: r.duration_s,
        };
        let last = alloc_from("final_allocation", r.final_allocation)?;
        // The status first: a bad one stores nothing.
        self.store.record_outcome(&r.job_id, &outcome).await?;
        if let Some(a) = last {
            self.store.record_config(&r.job_id, &a, "final").await?;
        }
        // Its resources are free again for the other jobs of a shared cluster.
        self.active_jobs()?.remove(&r.job_id);
        Ok(pb::RecordOutcomeResponse {})
    }

    async fn replan(&self, r: pb::PlanRequest) -> Result<pb::PlanResponse> {
        check_job_id(&r.job_id)?;
        let spec = self.store.require_job(&r.job_id).await?;
        let mut ask = ask_from(&r)?;
        if ask.current.is_none() {
            ask.current = self.store.configs(&r.job_id).await?.last().map(|c| c.0);
        }
        let cfg = ask.settings(&self.cfg)?;
        let shared = ask.shared();
        let samples = self.store.samples(&r.job_id, FIT_WINDOW).await?;
        let memory = self.store.memory(&r.job_id).await?;
        let input = ask.input(&spec, &samples, &memory);
        if shared {
            // Heard from, even when the fit below fails.
            let now = self.clock.now_ms();
            self.active_jobs()?.touch(&r.job_id, now);
        }
        let fit = planner::fit_front(&cfg, &input)?;
        let plan = if shared {
            let mut jobs = self.active_jobs()?;
            let now = self.clock.now_ms();
            planner::replan_shared(&cfg, &mut jobs, &input, fit, now)?
        } else {
            if self.active_jobs()?.remove(&r.job_id) {
                tracing::info!(job = %r.job_id, "job plans on its own machine: left the shared plan");
            }
            let pick = planner::pick_alone(&cfg, &input, &fit.front)?;
            planner::finish_plan(&cfg, &input, fit, pick)?
        };
        if plan.kind == PlanKind::Replan {
            self.store
                .record_config(&r.job_id, &plan.allocation, "re-plan")
                .await?;
        }
        Ok(plan_to(&plan))
    }

    async fn stream(&self, r: pb::PlanStreamRequest) -> Result<pb::StreamPlanResponse> {
        check_job_id(&r.job_id)?;
        if r.traffic_history.len() > MAX_TRAFFIC {
            return Err(BrainError::invalid(
                "traffic_history",
                format!("at most {MAX_TRAFFIC} values"),
            ));
        }
        let spec = self.store.require_job(&r.job_id).await?;
        let samples = self.store.samples(&r.job_id, FIT_WINDOW).await?;
        let mode = match pb::TrainingMode::try_from(r.mode) {
            Ok(pb::TrainingMode::Sync) => Mode::Sync,
            Ok(pb::TrainingMode::Async) => Mode::Async,
            Err(_) => {
                return Err(BrainError::invalid(
                    "mode",
                    format!("unknown mode {}", r.mode),
                ))
            }
        };
        let global_batch = if r.global_batch == 0 {
            f64::from(spec.batch_size)
        } else {
            f64::from(r.global_batch)
        };
        let plan = planner::stream_plan(
            &self.cfg,
            StreamInput {
                spec: &spec,
                samples: &samples,
                mode,
                global_batch,
                traffic: &r.traffic_history,
                interval_s: r.interval_s,
                period: r.period as usize,
                horizon: r.horizon as usize,
                current_workers: r.current_workers,
                lag: r.lag_samples,
                utilization: r.utilization,
            },
        )?;
        Ok(stream_to(&plan))
    }
}

#[tonic::async_trait]
impl Brain for BrainService {
    async fn report_profile(
        &self,
        request: Request<pb::ReportProfileRequest>,
    ) -> std::result::Result<Response<pb::ReportProfileResponse>, Status> {
        let r = self.report(request.into_inner()).await;
        self.metrics.count("report_profile", &r);
        r.map(Response::new).map_err(status_of)
    }

    async fn warm_start(
        &self,
        request: Request<pb::WarmStartRequest>,
    ) -> std::result::Result<Response<pb::PlanResponse>, Status> {
        let r = self.warm(request.into_inner()).await;
        self.metrics.count("warm_start", &r);
        r.map(Response::new).map_err(status_of)
    }

    async fn plan(
        &self,
        request: Request<pb::PlanRequest>,
    ) -> std::result::Result<Response<pb::PlanResponse>, Status> {
        let r = self.replan(request.into_inner()).await;
        self.metrics.count("plan", &r);
        r.map(Response::new).map_err(status_of)
    }

    async fn record_outcome(
        &self,
        request: Request<pb::RecordOutcomeRequest>,
    ) -> std::result::Result<Response<pb::RecordOutcomeResponse>, Status> {
        let r = self.outcome(request.into_inner()).await;
        self.metrics.count("record_outcome", &r);
        r.map(Response::new).map_err(status_of)
    }

    async fn plan_stream(
        &self,
        request: Request<pb::PlanStreamRequest>,
    ) -> std::result::Result<Response<pb::StreamPlanResponse>, Status> {
        let r = self.stream(request.into_inner()).await;
        self.metrics.count("plan_stream", &r);
        r.map(Response::new).map_err(status_of)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The token comes from exactly one of the file or the environment, trimmed; errors
    /// name the source and never echo the token.
    #[test]
    fn token_comes_from_a_file_or_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "s3cret-token\n").unwrap();
        assert_eq!(resolve_token(Some(&file), None).unwrap(), "s3cret-token");
        assert_eq!(
            resolve_token(None, Some(" s3cret-token ".into())).unwrap(),
            "s3cret-token"
        );
        let err = |file: Option<&std::path::Path>, env: Option<&str>| {
            resolve_token(file, env.map(Into::into))
                .unwrap_err()
                .to_string()
        };
        assert!(err(None, None).contains(TOKEN_ENV), "{}", err(None, None));
        assert!(err(None, None).contains("--token-file"));
        assert!(err(Some(&file), Some("x")).contains("both --token-file and"));
        assert!(err(Some(&dir.path().join("missing")), None).contains("missing"));
        std::fs::write(&file, "\n").unwrap();
        assert!(err(Some(&file), None).ends_with("the token is empty"));
        let e = err(None, Some("s3cret token"));
        assert!(
            e.contains(&format!("{TOKEN_ENV}: the token must be printable ASCII")),
            "{e}"
        );
        assert!(!e.contains("s3cret"), "{e}");
    }

    #[test]
    fn options_debug_hides_secrets() {
        let opts = BrainServeOptions::new("postgres://u:pw-in-url@h/db", "s3cret-token");
        let shown = format!("{opts:?}");
        assert!(shown.contains("postgres://u:***@h/db"), "{shown}");
        assert!(
            !shown.contains("pw-in-url") && !shown.contains("s3cret"),
            "{shown}"
        );
    }

    #[test]
    fn wire_validation_names_fields() {
        let bad = pb::Allocation {
            workers: 2,
            ps: 1,
            worker_cpu: f64::NAN,
            ps_cpu: 1.0,
            worker_mem_gb: 1.0,
            ps_mem_gb: 1.0,
        };
        let e = alloc_from("current", Some(bad)).unwrap_err().to_string();
        assert!(e.contains("current.worker_cpu"), "{e}");
        let e = bounds_from(Some(pb::Bounds {
            workers: Some(pb::Range { min: 1.5, max: 3.0 }),
            ..Default::default()
        }))
        .unwrap_err()
        .to_string();
        assert!(e.contains("bounds.workers"), "{e}");
        let s = status_of(BrainError::invalid("x", "y"));
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
    }
}
