//! The master's gRPC service: thin handlers over the [`Job`] state machine. Every handler
//! mutates the state under one lock, queues the resulting changes to the group-commit
//! writer (in mutation order), and replies only once they are durable. A handler that
//! changed nothing still replies only once the queued changes its reply rests on are
//! durable (for a heartbeat: node rows and the phase, rarely pending).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use elastrec_proto::master::master_server::Master;
use elastrec_proto::master::{
    self as pb, get_task_response::Reply, GetTaskRequest, GetTaskResponse, HeartbeatRequest,
    HeartbeatResponse, NodeAction, NodeStatus, PauseRequest, PauseResponse, RegisterRequest,
    RegisterResponse, ReportEvalRequest, ReportEvalResponse, ReportProgressRequest,
    ReportProgressResponse, RestorePlan, ScaleRequest, ScaleResponse, StatusRequest,
    StatusResponse, StopRequest, StopResponse, TakeCheckpointRequest, TakeCheckpointResponse,
};
use elastrec_rpc::{self as rpc, check_version};
use parking_lot::Mutex;
use tonic::{Request, Response, Status};

use crate::backend::ClusterBackend;
use crate::job::{
    Change, Context, Directive, EvalResult, Event, Job, JobError, Node, Phase, Role, TaskReply,
};
use crate::metrics::Metrics;
use crate::store::{Barrier, Depends, Writer};

/// Wall-clock milliseconds since the Unix epoch: only for times shown to people or
/// compared across processes (checkpoint manifests, recovery records), never for timeouts.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Milliseconds on this master process's monotonic clock: liveness and rates are measured
/// on it, so a step of the wall clock (NTP, a VM resume, an operator) cannot declare every
/// node dead at once. Its origin is the first call, so values do not survive a restart:
/// [`Job::restore`] resets the node times it loads.
pub fn monotonic_ms() -> u64 {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    // Offset by one so that 0 keeps meaning "never".
    ORIGIN.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// Side effects collected while the state lock is held, executed after it is released.
#[derive(Default)]
pub struct LiveCtx {
    now: u64,
    changes: Vec<Change>,
    launches: Vec<Node>,
    kills: Vec<Node>,
    events: Vec<Event>,
}

impl LiveCtx {
    /// A context at the current time.
    pub fn now() -> Self {
        Self {
            now: monotonic_ms(),
            ..Self::default()
        }
    }

    /// Takes the changes to persist.
    pub fn take_changes(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.changes)
    }
}

impl Context for LiveCtx {
    fn now_ms(&self) -> u64 {
        self.now
    }
    fn persist(&mut self, change: Change) {
        self.changes.push(change);
    }
    fn launch(&mut self, node: &Node) {
        self.launches.push(node.clone());
    }
    fn kill(&mut self, node: &Node) {
        self.kills.push(node.clone());
    }
    fn event(&mut self, event: Event) {
        self.events.push(event);
    }
}

/// Everything the handlers and the control loop share.
pub struct MasterCore {
    /// The state machine.
    pub job: Mutex<Job>,
    writer: Writer,
    backend: Arc<dyn ClusterBackend>,
    /// Job file every node trains with.
    pub job_toml: String,
    /// Training file paths by index (a following job's list grows as partitions land).
    pub files: parking_lot::RwLock<Vec<String>>,
    heartbeat_ms: u32,
    /// Prometheus metrics.
    pub metrics: Metrics,
    /// Job id.
    pub job_id: String,
    /// Nodes whose launch failed (fed back as exits by the control loop).
    failed_launches: Mutex<Vec<u32>>,
    /// (time, samples done) samples for the recent rate.
    rate: Mutex<VecDeque<(Instant, u64)>>,
    /// Set when the job reached a terminal phase.
    pub done: tokio::sync::Notify,
    /// What a (re)started PS loads (the last checkpoint at the time of the recovery).
    restore_plan: Mutex<Option<RestorePlan>>,
    /// The checkpoint coordinator, when checkpoints are enabled.
    checkpoints: std::sync::OnceLock<Arc<crate::checkpoint::Coordinator>>,
    /// The latest heartbeat profile of every node (CPU, memory, time split).
    pub profiles: Mutex<std::collections::BTreeMap<u32, elastrec_proto::master::NodeProfile>>,
    /// The autoscaler's state as JSON, refreshed by its loop (absent: autoscaling off).
    pub autoscale_status: Mutex<Option<serde_json::Value>>,
    /// How the master calls parameter servers (re-sharding).
    pub ps_access: std::sync::OnceLock<crate::reshard::PsAccess>,
    /// How the backend starts nodes (its sizes grow after an out-of-memory kill).
    pub launch: std::sync::OnceLock<Arc<crate::launch::LaunchTemplate>>,
    /// Changes of the PS count so far.
    pub reshards: Mutex<Vec<crate::reshard::ReshardRecord>>,
    /// An online job's stream statistics (lag, SLO), refreshed by its watcher.
    pub stream_stats: Mutex<Option<crate::stream_stats::StreamStats>>,
    /// A following job's view of its datasets as JSON, refreshed by its watcher.
    pub follow_status: Mutex<Option<serde_json::Value>>,
    /// An online job's scaling decisions so far.
    pub online_scaling: Mutex<Vec<crate::online_scale_loop::ScalingEvent>>,
    /// An online job's progressive validation (predictions the workers made before
    /// training), when `stream.eval_window` is not 0.
    pub progressive: Mutex<Option<crate::progressive::ProgressiveEval>>,
}

impl MasterCore {
    /// Wires the state machine to its writer and backend.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        job: Job,
        writer: Writer,
        backend: Arc<dyn ClusterBackend>,
        job_toml: String,
        files: Vec<String>,
        heartbeat_ms: u32,
        job_id: String,
    ) -> Self {
        Self {
            job: Mutex::new(job),
            writer,
            backend,
            job_toml,
            files: parking_lot::RwLock::new(files),
            heartbeat_ms,
            metrics: Metrics::new(),
            job_id,
            failed_launches: Mutex::new(Vec::new()),
            rate: Mutex::new(VecDeque::new()),
            done: tokio::sync::Notify::new(),
            restore_plan: Mutex::new(None),
            checkpoints: std::sync::OnceLock::new(),
            stream_stats: Mutex::new(None),
            follow_status: Mutex::new(None),
            online_scaling: Mutex::new(Vec::new()),
            progressive: Mutex::new(None),
            profiles: Mutex::new(Default::default()),
            autoscale_status: Mutex::new(None),
            ps_access: std::sync::OnceLock::new(),
            launch: std::sync::OnceLock::new(),
            reshards: Mutex::new(Vec::new()),
        }
    }

    /// Makes changes that do not touch the state machine durable (e.g. statistics).
    pub async fn persist(&self, changes: Vec<Change>) -> Result<(), Status> {
        self.writer
            .submit(changes)
            .await
            .map_err(|e| Status::internal(e.to_string()))
    }

    /// What the group-commit writer did so far.
    pub fn writer_stats(&self) -> crate::store::WriterStats {
        self.writer.stats()
    }

    /// Sets what PS processes started from now on load.
    pub fn set_restore_plan(&self, plan: Option<RestorePlan>) {
        *self.restore_plan.lock() = plan;
    }

    /// Attaches the checkpoint coordinator (once).
    pub fn set_checkpoints(&self, c: Arc<crate::checkpoint::Coordinator>) {
        let _ = self.checkpoints.set(c);
    }

    /// The checkpoint coordinator, when checkpoints are enabled.
    pub fn checkpoints(&self) -> Option<&Arc<crate::checkpoint::Coordinator>> {
        self.checkpoints.get()
    }

    /// Runs `f` on the state, makes its changes durable, then performs its side effects.
    ///
    /// When `f` changed nothing, its result may still rest on changes of other requests
    /// that are queued but not yet durable; it is returned only once they are.
    pub async fn run<R>(&self, f: impl FnOnce(&mut Job, &mut LiveCtx) -> R) -> Result<R, Status> {
        self.run_depending(Depends::All, f).await
    }

    /// [`MasterCore::run`] for a read whose result depends only on what `depends` names.
    async fn run_depending<R>(
        &self,
        depends: Depends,
        f: impl FnOnce(&mut Job, &mut LiveCtx) -> R,
    ) -> Result<R, Status> {
        let mut cx = LiveCtx {
            now: monotonic_ms(),
            ..LiveCtx::default()
        };
        /// What the reply waits for.
        enum Durable<W> {
            /// Its own changes (queued after everything it saw).
            Written(W),
            /// The queued changes it saw.
            Seen(Barrier),
        }
        // Queued or taken under the lock: exactly what `f` saw was queued before.
        let (r, durable) = {
            let mut job = self.job.lock();
            let r = f(&mut job, &mut cx);
            let durable = if cx.changes.is_empty() {
                Durable::Seen(self.writer.barrier(depends))
            } else {
                Durable::Written(self.writer.submit(std::mem::take(&mut cx.changes)))
            };
            (r, durable)
        };
        match durable {
            Durable::Written(w) => w.await,
            Durable::Seen(b) => self.writer.wait(b).await,
        }
        .map_err(|e| Status::internal(e.to_string()))?;
        self.effects(cx);
        Ok(r)
    }

    /// Runs the state machine with a context whose effects are executed immediately (used
    /// once, before serving, to launch the initial nodes).
    pub fn effects(&self, cx: LiveCtx) {
        for n in &cx.kills {
            self.backend.stop(n);
        }
        for n in &cx.launches {
            match self.backend.start(n) {
                Ok(pid) => tracing::info!(node = n.id, role = ?n.role, pid, "launched"),
                Err(e) => {
                    eprintln!(
                        "master: could not start node {} ({:?}): {e:#}",
                        n.id, n.role
                    );
                    self.failed_launches.lock().push(n.id);
                }
            }
        }
        for e in cx.events {
            match &e {
                Event::EpochDone(epoch, s) => {
                    eprintln!("epoch {epoch}: {s}");
                }
                Event::NodeDead { id, role, reason } => {
                    eprintln!("master: node {id} ({role:?}) declared dead: {reason}");
                    self.metrics.node_deaths.inc();
                }
                Event::Requeued { worker, task } => {
                    tracing::info!(worker, task, "unreported remainder requeued");
                    self.metrics.requeues.inc();
                }
                Event::PsFailed(f) => {
                    eprintln!(
                        "master: parameter server {} (node {}) failed ({}) at {} samples; recovering",
                        f.index, f.node, f.reason, f.samples
                    );
                }
                Event::Straggler { id, slow } => {
                    if *slow {
                        eprintln!(
                            "master: worker {id} is a straggler (below the straggler ratio of its peers' median rate): half-size shards"
                        );
                    } else {
                        eprintln!("master: worker {id} caught up: full-size shards again");
                    }
                }
                Event::JobEnded(_) => self.done.notify_one(),
            }
        }
    }

    /// Launch failures since the last call.
    pub fn take_failed_launches(&self) -> Vec<u32> {
        std::mem::take(&mut *self.failed_launches.lock())
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn ClusterBackend> {
        &self.backend
    }

    /// Samples per second over roughly the last ten seconds.
    pub fn recent_rate(&self, samples_done: u64) -> f64 {
        let now = Instant::now();
        let mut q = self.rate.lock();
        q.push_back((now, samples_done));
        while q.len() > 2 && now.duration_since(q[0].0).as_secs_f64() > 10.0 {
            q.pop_front();
        }
        let (t0, s0) = q[0];
        let dt = now.duration_since(t0).as_secs_f64();
        if dt <= 0.0 {
            0.0
        } else {
            samples_done.saturating_sub(s0) as f64 / dt
        }
    }

    /// The status reply (also used by the progress display).
    pub fn status(&self) -> StatusResponse {
        let now = monotonic_ms();
        let job = self.job.lock();
        let q = job.tasks();
        let (todo, doing, done) = q.counts();
        let samples_done: u64 = (0..q.spec().epochs)
            .map(|e| q.ledger().summary(e).consumed)
            .sum();
        let profiles = self.profiles.lock().clone();
        let nodes = job
            .nodes()
            .map(|n| NodeStatus {
                node_id: n.id,
                role: match n.role {
                    Role::Ps => pb::Role::Ps as i32,
                    Role::Worker => pb::Role::Worker as i32,
                },
                state: crate::store::state_str(n.state).to_string(),
                pid: n.pid,
                addr: n.addr.clone(),
                metrics_addr: n.metrics_addr.clone(),
                last_heartbeat_ms_ago: now.saturating_sub(n.last_seen_ms),
                samples: n.samples,
                restarts: n.restarts,
                task_id: q.held_by(n.id).map(|t| t.id).unwrap_or(0),
                profile: profiles.get(&n.id).copied(),
            })
            .collect();
        let phase = match job.phase() {
            Phase::Training => "training".to_string(),
            Phase::Evaluating => "evaluating".to_string(),
            Phase::Finished => "finished".to_string(),
            Phase::Failed(m) => format!("failed: {m}"),
        };
        let reply = StatusResponse {
            job_id: self.job_id.clone(),
            phase,
            epoch: q.current_epoch(),
            epochs: q.spec().epochs,
            shards_todo: todo,
            shards_doing: doing,
            shards_done: done,
            samples_done,
            samples_total: q.total_rows(),
            samples_per_sec: 0.0,
            target_workers: job.target_workers(),
            nodes,
            checkpoint: None,
            paused_at: job.pause_at(),
            held: job.held(),
            layout_version: job.layout_version(),
            num_ps: job.policy().num_ps,
            reshards_json: serde_json::to_string(&*self.reshards.lock()).unwrap_or_default(),
            autoscale_json: self
                .autoscale_status
                .lock()
                .as_ref()
                .map(|v| v.to_string())
                .unwrap_or_default(),
            datasets_json: self
                .follow_status
                .lock()
                .as_ref()
                .map(|v| v.to_string())
                .unwrap_or_default(),
        };
        drop(job);
        let mut reply = reply;
        reply.checkpoint = self.checkpoints().map(|c| c.status(samples_done));
        reply.samples_per_sec = self.recent_rate(samples_done);
        self.metrics.observe(&reply);
        reply
    }
}

/// The tonic service.
pub struct MasterService(pub Arc<MasterCore>);

fn status_of(e: JobError) -> Status {
    match e {
        JobError::UnknownNode(_) => Status::not_found(e.to_string()),
        JobError::WrongRole(_) => Status::invalid_argument(e.to_string()),
        JobError::Report(crate::tasks::ReportError::NotHeld { .. }) => {
            Status::failed_precondition(e.to_string())
        }
        JobError::Report(_) => Status::invalid_argument(e.to_string()),
    }
}

#[tonic::async_trait]
impl Master for MasterService {
    async fn register(
        &self,
        req: Request<RegisterRequest>,
    ) -> Result<Response<RegisterResponse>, Status> {
        let caller = rpc::require(&req, &[rpc::Caller::Worker, rpc::Caller::Ps])?;
        let req = req.into_inner();
        check_version(&req.version)?;
        self.0.metrics.request("register");
        let role = match pb::Role::try_from(req.role) {
            Ok(pb::Role::Ps) => Role::Ps,
            Ok(pb::Role::Worker) => Role::Worker,
            _ => return Err(Status::invalid_argument("role must be ps or worker")),
        };
        // A worker's token cannot register a parameter server (and the reverse).
        let claimed = match role {
            Role::Ps => rpc::Caller::Ps,
            Role::Worker => rpc::Caller::Worker,
        };
        if caller != rpc::Caller::Admin && caller != claimed {
            return Err(Status::permission_denied(format!(
                "a {} token cannot register a {}",
                caller.name(),
                claimed.name()
            )));
        }
        if req.addr.len() > 256 || req.metrics_addr.len() > 256 {
            return Err(Status::invalid_argument("address too long"));
        }
        if role == Role::Ps
            && !req.addr.is_empty()
            && req.addr.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(Status::invalid_argument("addr must be host:port"));
        }
        // Shown to operators, who fetch it: only a socket address, nothing else.
        if !req.metrics_addr.is_empty() && req.metrics_addr.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(Status::invalid_argument("metrics_addr must be host:port"));
        }
        let (ps_addrs, layout_version, num_ps, joining) = self
            .0
            .run(|job, cx| {
                job.register(req.node_id, role, &req.addr, &req.metrics_addr, req.pid, cx)?;
                // A PS started for a layout being formed joins that one.
                let (version, n, joining) = match job.reshard() {
                    Some(r) if job.is_joining(req.node_id) => (r.version, r.num_ps, true),
                    _ => (job.layout_version(), job.policy().num_ps, false),
                };
                Ok::<_, JobError>((job.ps_addrs().unwrap_or_default(), version, n, joining))
            })
            .await?
            .map_err(status_of)?;
        Ok(Response::new(RegisterResponse {
            job_toml: self.0.job_toml.clone(),
            ps_addrs,
            heartbeat_ms: self.0.heartbeat_ms,
            restore: if role == Role::Ps && !joining {
                self.0.restore_plan.lock().clone()
            } else {
                None
            },
            layout_version,
            num_ps,
            joining,
        }))
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        rpc::require(&req, &[rpc::Caller::Worker, rpc::Caller::Ps])?;
        let req = req.into_inner();
        check_version(&req.version)?;
        self.0.metrics.request("heartbeat");
        // A heartbeat changes nothing durable; its reply depends only on node rows and the
        // phase, so pending task and ledger writes of other requests do not delay it.
        if let Some(p) = req.profile {
            self.0.profiles.lock().insert(req.node_id, p);
        }
        let (d, ps_addrs, active, layout_version) = self
            .0
            .run_depending(Depends::Nodes, |job, cx| {
                let mut d = job.heartbeat(req.node_id, req.samples, req.step, cx);
                // Parameter servers stop with the job.
                if job.node(req.node_id).is_some_and(|n| n.role == Role::Ps)
                    && matches!(job.phase(), Phase::Finished | Phase::Failed(_))
                {
                    d = Directive::Stop;
                }
                (
                    d,
                    job.ps_addrs().unwrap_or_default(),
                    job.training_workers(),
                    job.layout_version(),
                )
            })
            .await?;
        let action = match d {
            Directive::Continue => NodeAction::Continue,
            Directive::Stop => NodeAction::Stop,
            Directive::Unknown => NodeAction::Unknown,
        };
        Ok(Response::new(HeartbeatResponse {
            action: action as i32,
            ps_addrs,
            active_workers: active,
            layout_version,
        }))
    }

    async fn get_task(
        &self,
        req: Request<GetTaskRequest>,
    ) -> Result<Response<GetTaskResponse>, Status> {
        rpc::require(&req, &[rpc::Caller::Worker])?;
        let req = req.into_inner();
        check_version(&req.version)?;
        self.0.metrics.request("get_task");
        let reply = self
            .0
            .run(|job, cx| job.get_task(req.node_id, cx))
            .await?
            .map_err(status_of)?;
        let reply = match reply {
            TaskReply::Task(t) => Reply::Task(pb::Task {
                task_id: t.id,
                file: self.0.files.read()[t.file as usize].clone(),
                start_row: t.start,
                end_row: t.end,
                epoch: t.epoch,
                offset: t.offset,
                file_index: t.file,
            }),
            TaskReply::Wait => Reply::WaitMs(200),
            TaskReply::Finished { evaluate } => Reply::Finished(pb::Finished { evaluate }),
            TaskReply::Stop => Reply::Stop(true),
        };
        Ok(Response::new(GetTaskResponse { reply: Some(reply) }))
    }

    async fn report_progress(
        &self,
        req: Request<ReportProgressRequest>,
    ) -> Result<Response<ReportProgressResponse>, Status> {
        rpc::require(&req, &[rpc::Caller::Worker])?;
        let req = req.into_inner();
        check_version(&req.version)?;
        self.0.metrics.request("report_progress");
        // Checked before the progress is accepted: a refused report changes nothing.
        let predicted = crate::progressive::check(&req.predicted, &req.labels)
            .map_err(|e| Status::invalid_argument(format!("progress report: {e}")))?;
        let (task_done, stop) = self
            .0
            .run(|job, cx| job.report(req.node_id, req.task_id, req.offset, cx))
            .await?
            .map_err(status_of)?;
        if !predicted.is_empty() {
            if let Some(p) = self.0.progressive.lock().as_mut() {
                p.push(predicted);
            }
        }
        Ok(Response::new(ReportProgressResponse { task_done, stop }))
    }

    async fn report_eval(
        &self,
        req: Request<ReportEvalRequest>,
    ) -> Result<Response<ReportEvalResponse>, Status> {
        rpc::require(&req, &[rpc::Caller::Worker])?;
        let req = req.into_inner();
        check_version(&req.version)?;
        self.0.metrics.request("report_eval");
        let eval = EvalResult {
            auc: req.auc,
            logloss: req.logloss,
            samples: req.samples,
        };
        self.0
            .run(|job, cx| job.report_eval(req.node_id, eval, cx))
            .await?
            .map_err(status_of)?;
        Ok(Response::new(ReportEvalResponse {}))
    }

    async fn scale(&self, req: Request<ScaleRequest>) -> Result<Response<ScaleResponse>, Status> {
        rpc::require(&req, &[])?;
        let req = req.into_inner();
        check_version(&req.version)?;
        self.0.metrics.request("scale");
        if req.workers > 256 {
            return Err(Status::invalid_argument(
                "workers must be between 1 and 256",
            ));
        }
        if req.ps.is_some_and(|p| p == 0 || p > 64) {
            return Err(Status::invalid_argument("ps must be between 1 and 64"));
        }
        let mut reshard_json = String::new();
        if let Some(ps) = req.ps {
            let r = crate::reshard::change_ps(&self.0, ps, "requested")
                .await
                .map_err(|e| Status::failed_precondition(format!("{e:#}")))?;
            reshard_json = serde_json::to_string(&r).unwrap_or_default();
        }
        if req.workers == 0 {
            let target = self.0.job.lock().target_workers();
            return Ok(Response::new(ScaleResponse {
                previous: target,
                target,
                reshard_json,
            }));
        }
        let previous = self
            .0
            .run(|job, cx| {
                if !matches!(job.phase(), Phase::Training) {
                    Err(Status::failed_precondition("the job is no longer training"))
                } else if job.recovering() {
                    Err(Status::failed_precondition(
                        "a parameter server is being recovered; scale again once `elastrec status` shows every PS running",
                    ))
                } else {
                    Ok(job.scale(req.workers, cx))
                }
            })
            .await??;
        eprintln!("master: scaling workers {previous} -> {}", req.workers);
        Ok(Response::new(ScaleResponse {
            previous,
            target: req.workers,
            reshard_json,
        }))
    }

    async fn status(
        &self,
        req: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        rpc::require(&req, &[])?;
        check_version(&req.into_inner().version)?;
        self.0.metrics.request("status");
        Ok(Response::new(self.0.status()))
    }

    async fn pause(&self, req: Request<PauseRequest>) -> Result<Response<PauseResponse>, Status> {
        rpc::require(&req, &[])?;
        let req = req.into_inner();
        check_version(&req.version)?;
        self.0.metrics.request("pause");
        let (at, done) = self
            .0
            .run(|job, cx| {
                if !matches!(job.phase(), Phase::Training) {
                    return Err(Status::failed_precondition("the job is no longer training"));
                }
                let at = if req.release {
                    None
                } else {
                    Some(req.at_samples.unwrap_or_else(|| job.samples_done()))
                };
                job.set_pause(at, cx);
                Ok((at, job.samples_done()))
            })
            .await??;
        match at {
            Some(at) => eprintln!("master: pausing at {at} samples ({done} trained)"),
            None => eprintln!("master: pause lifted at {done} samples"),
        }
        Ok(Response::new(PauseResponse {
            at_samples: at,
            samples_done: done,
        }))
    }

    async fn take_checkpoint(
        &self,
        req: Request<TakeCheckpointRequest>,
    ) -> Result<Response<TakeCheckpointResponse>, Status> {
        rpc::require(&req, &[])?;
        check_version(&req.into_inner().version)?;
        self.0.metrics.request("take_checkpoint");
        let c =
            self.0.checkpoints().cloned().ok_or_else(|| {
                Status::failed_precondition("checkpoints are disabled for this job")
            })?;
        let m = c
            .spawn_checkpoint(self.0.clone(), "requested")
            .await
            .map_err(|e| Status::internal(format!("checkpoint task: {e}")))?
            .map_err(|e| Status::unavailable(format!("{e:#}")))?;
        Ok(Response::new(TakeCheckpointResponse {
            id: m.id,
            samples: m.samples,
            bytes: m.total_bytes(),
        }))
    }

    async fn stop(&self, req: Request<StopRequest>) -> Result<Response<StopResponse>, Status> {
        rpc::require(&req, &[])?;
        check_version(&req.into_inner().version)?;
        self.0.metrics.request("stop");
        let mut checkpoint_id = 0;
        if let Some(c) = self.0.checkpoints().cloned() {
            // Hold new shards first, so the checkpoint is close to where training ends.
            self.0
                .run(|job, cx| {
                    let now = job.samples_done();
                    job.set_pause(Some(now), cx);
                })
                .await?;
            let m = c
                .spawn_checkpoint(self.0.clone(), "stop")
                .await
                .map_err(|e| Status::internal(format!("checkpoint task: {e}")))?
                .map_err(|e| Status::unavailable(format!("{e:#}; the job was not stopped")))?;
            checkpoint_id = m.id;
        }
        let samples_done = self
            .0
            .run(|job, cx| {
                if job.stop_training(cx) {
                    job.set_pause(None, cx);
                    Ok(job.samples_done())
                } else {
                    Err(Status::failed_precondition("the job is no longer training"))
                }
            })
            .await??;
        eprintln!("master: stopped at {samples_done} samples on request");
        Ok(Response::new(StopResponse {
            samples_done,
            checkpoint_id,
        }))
    }
}
