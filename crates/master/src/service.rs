//! The master's gRPC service: thin handlers over [`MasterCore`]. A handler checks what
//! the request carries, runs the state machine through [`MasterCore::run`] (which replies
//! only once the changes are durable) and converts a [`MasterError`] into a status.

use std::sync::Arc;

use elastrec_job::split::Split;
use elastrec_proto::master::master_server::Master;
use elastrec_proto::master::{
    self as pb, get_task_response::Reply, GetTaskRequest, GetTaskResponse, HeartbeatRequest,
    HeartbeatResponse, NodeAction, PauseRequest, PauseResponse, RegisterRequest, RegisterResponse,
    ReportEvalRequest, ReportEvalResponse, ReportProgressRequest, ReportProgressResponse,
    ScaleRequest, ScaleResponse, StatusRequest, StatusResponse, StopRequest, StopResponse,
    TakeCheckpointRequest, TakeCheckpointResponse,
};
use elastrec_rpc::{self as rpc, check_version};
use tonic::{Request, Response, Status};

use crate::core::MasterCore;
use crate::error::MasterError;
use crate::events::event;
use crate::job::{Directive, EvalResult, JobError, Phase, Role, TaskReply};
use crate::store::Depends;

/// The tonic service.
pub struct MasterService(pub Arc<MasterCore>);

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
            Ok(pb::Role::Executor) => Role::Executor,
            _ => return Err(MasterError::invalid("role must be ps, worker or executor").into()),
        };
        // A worker's token cannot register a parameter server (and the reverse).
        let claimed = match role {
            Role::Ps => rpc::Caller::Ps,
            Role::Worker | Role::Executor => rpc::Caller::Worker,
        };
        if caller != rpc::Caller::Admin && caller != claimed {
            return Err(MasterError::PermissionDenied(format!(
                "a {} token cannot register a {}",
                caller.name(),
                claimed.name()
            ))
            .into());
        }
        if req.addr.len() > 256 || req.metrics_addr.len() > 256 {
            return Err(MasterError::invalid("address too long").into());
        }
        if role != Role::Worker
            && !req.addr.is_empty()
            && req.addr.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(MasterError::invalid("addr must be host:port").into());
        }
        // Shown to operators, who fetch it: only a socket address, nothing else.
        if !req.metrics_addr.is_empty() && req.metrics_addr.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(MasterError::invalid("metrics_addr must be host:port").into());
        }
        let (ps_addrs, layout_version, num_ps, joining, (peer_addrs, peer_nodes), ps_index) = self
            .0
            .run(|job, cx| {
                job.register(req.node_id, role, &req.addr, &req.metrics_addr, req.pid, cx)?;
                // A PS started for a layout being formed joins that one.
                let (version, n, joining) = match job.reshard() {
                    Some(r) if job.is_joining(req.node_id) => (r.version, r.num_ps, true),
                    _ => (job.layout_version(), job.policy().num_ps, false),
                };
                let peers = if role == Role::Ps {
                    (job.running_ps_addrs(), job.running_ps_nodes())
                } else {
                    Default::default()
                };
                let index = job.node(req.node_id).map(|n| n.index);
                Ok::<_, JobError>((
                    job.ps_addrs().unwrap_or_default(),
                    version,
                    n,
                    joining,
                    peers,
                    index,
                ))
            })
            .await?
            .map_err(MasterError::from)?;
        let recovering = role == Role::Ps && !joining;
        let coordinator = self.0.checkpoints().filter(|_| recovering);
        if let Some(c) = coordinator.filter(|_| req.restore_s > 0.0 || req.dense_rewound) {
            c.ps_restored(req.restore_s, req.dense_rewound.then_some(req.node_id));
        }
        let dense_from_replica =
            coordinator.is_some_and(|c| ps_index.is_some_and(|i| c.dense_from_replica(i)));
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
            peer_addrs,
            dense_from_replica,
            peer_nodes,
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
        let keep_ps = self.0.keep_ps.load(std::sync::atomic::Ordering::Acquire);
        let (d, ps_addrs, active, layout_version, executor_addrs, ps_nodes) = self
            .0
            .run_depending(Depends::Nodes, |job, cx| {
                let mut d = if req.fenced {
                    job.fenced_heartbeat(req.node_id)
                } else {
                    job.heartbeat(req.node_id, req.samples, req.step, cx)
                };
                // Parameter servers stop with the job (after its final model is saved).
                let ended = match job.phase() {
                    Phase::Finished => !keep_ps,
                    Phase::Failed(_) => true,
                    _ => false,
                };
                let is_ps = job.node(req.node_id).is_some_and(|n| n.role == Role::Ps);
                if ended && is_ps {
                    d = Directive::Stop;
                }
                (
                    d,
                    job.ps_addrs().unwrap_or_default(),
                    job.training_workers(),
                    job.layout_version(),
                    job.executor_addrs(),
                    if is_ps {
                        job.running_ps_nodes()
                    } else {
                        Vec::new()
                    },
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
            executor_addrs,
            ps_nodes,
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
        let (reply, shuffle) = self
            .0
            .run(|job, cx| {
                let reply = job.get_task(req.node_id, cx)?;
                let shuffle = match &reply {
                    TaskReply::Task(t) => job.tasks().row_shuffle(t),
                    _ => None,
                };
                Ok::<_, JobError>((reply, shuffle))
            })
            .await?
            .map_err(MasterError::from)?;
        let reply = match reply {
            TaskReply::Task(t) => {
                let split = Split {
                    source: self.0.sources.read()[t.file as usize].clone(),
                    range: t.start..t.end,
                    shuffle,
                };
                Reply::Task(pb::Task {
                    task_id: t.id,
                    epoch: t.epoch,
                    offset: t.offset,
                    source_index: t.file,
                    split: Some(split.to_proto()),
                })
            }
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
        let progressive = &self.0.progressive;
        let tasks = progressive.lock().as_ref().map_or(1, |p| p.tasks());
        let predicted =
            crate::progressive::check(&req.predicted, &req.labels, &req.weights, req.tasks, tasks)
                .map_err(|e| MasterError::invalid(format!("progress report: {e}")))?;
        let schedule = self.0.lr_schedule.get();
        let (ack, lr_scale) = self
            .0
            .run(|job, cx| {
                let ack = job.report(req.node_id, req.task_id, req.offset, cx)?;
                // The schedule's multiplier at the job's samples so far, over the rows of
                // its files times its epochs (`train` uses its own count the same way).
                let lr_scale = schedule.map_or(0.0, |(s, epochs)| {
                    let rows = job.tasks().rows_per_epoch();
                    s.scale(job.samples_done(), rows * u64::from(*epochs))
                });
                // Under the job's lock, with the ledger change: the reply then waits for
                // the change to be stored, and a worker killed in that wait drops this
                // call; its rows stay counted, so their predictions must be in by then.
                // A retried report (its reply was lost) records nothing new; its
                // predictions were counted the first time.
                if ack.new_rows > 0 && !predicted.is_empty() {
                    if let Some(p) = progressive.lock().as_mut() {
                        p.push(predicted);
                    }
                }
                Ok::<_, MasterError>((ack, lr_scale))
            })
            .await??;
        if lr_scale > 0.0 {
            self.0
                .lr_scale_sent
                .store(lr_scale.to_bits(), std::sync::atomic::Ordering::Relaxed);
        }
        Ok(Response::new(ReportProgressResponse {
            task_done: ack.task_done,
            stop: ack.stop,
            lr_scale,
        }))
    }

    async fn report_eval(
        &self,
        req: Request<ReportEvalRequest>,
    ) -> Result<Response<ReportEvalResponse>, Status> {
        rpc::require(&req, &[rpc::Caller::Worker])?;
        let req = req.into_inner();
        check_version(&req.version)?;
        self.0.metrics.request("report_eval");
        let n = req.task_auc.len();
        if [
            &req.task_logloss,
            &req.task_ne,
            &req.task_calibration,
            &req.task_gauc,
        ]
        .iter()
        .any(|v| v.len() != n)
            || n >= elastrec_model::MAX_TASKS
        {
            return Err(MasterError::invalid(format!(
                "evaluation: {n} task AUCs with {} log losses, {} NEs, {} calibrations and {} GAUCs (at most {} tasks after the first, as many of each)",
                req.task_logloss.len(),
                req.task_ne.len(),
                req.task_calibration.len(),
                req.task_gauc.len(),
                elastrec_model::MAX_TASKS - 1
            ))
            .into());
        }
        let defined = |v: f64| Some(v).filter(|v| v.is_finite());
        let result = |auc, logloss, ne, calibration, gauc| EvalResult {
            auc,
            logloss,
            samples: req.samples,
            ne: defined(ne),
            calibration: defined(calibration),
            gauc: defined(gauc),
        };
        let eval = result(req.auc, req.logloss, req.ne, req.calibration, req.gauc);
        let tasks: Vec<EvalResult> = if n == 0 {
            Vec::new()
        } else {
            std::iter::once(eval)
                .chain((0..n).map(|t| {
                    result(
                        req.task_auc[t],
                        req.task_logloss[t],
                        req.task_ne[t],
                        req.task_calibration[t],
                        req.task_gauc[t],
                    )
                }))
                .collect()
        };
        self.0
            .run(|job, cx| job.report_eval(req.node_id, eval, tasks, cx))
            .await?
            .map_err(MasterError::from)?;
        Ok(Response::new(ReportEvalResponse {}))
    }

    async fn scale(&self, req: Request<ScaleRequest>) -> Result<Response<ScaleResponse>, Status> {
        rpc::require(&req, &[])?;
        let req = req.into_inner();
        check_version(&req.version)?;
        self.0.metrics.request("scale");
        if req.workers > 256 {
            return Err(MasterError::invalid("workers must be between 1 and 256").into());
        }
        if req.ps.is_some_and(|p| p == 0 || p > 64) {
            return Err(MasterError::invalid("ps must be between 1 and 64").into());
        }
        let mut reshard = None;
        if let Some(ps) = req.ps {
            let r = crate::reshard::change_ps(&self.0, ps, "requested")
                .await
                .map_err(|e| MasterError::not_now(format!("{e:#}")))?;
            reshard = Some(crate::wire::reshard_message(&r));
        }
        if req.workers == 0 {
            let target = self.0.job.lock().target_workers();
            return Ok(Response::new(ScaleResponse {
                previous: target,
                target,
                reshard,
            }));
        }
        let previous = self
            .0
            .run(|job, cx| {
                if !matches!(job.phase(), Phase::Training) {
                    Err(MasterError::not_training())
                } else if job.recovering() {
                    Err(MasterError::not_now(
                        "a parameter server is being recovered; scale again once `elastrec status` shows every PS running",
                    ))
                } else {
                    Ok(job.scale(req.workers, cx))
                }
            })
            .await??;
        event!(
            "workers_scaled",
            previous,
            target = req.workers,
            "master: scaling workers {previous} -> {}",
            req.workers
        );
        Ok(Response::new(ScaleResponse {
            previous,
            target: req.workers,
            reshard,
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
                    return Err(MasterError::not_training());
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
            Some(at) => event!(
                "paused",
                at_samples = at,
                samples_done = done,
                "master: pausing at {at} samples ({done} trained)"
            ),
            None => event!(
                "pause_lifted",
                samples_done = done,
                "master: pause lifted at {done} samples"
            ),
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
        let c = self
            .0
            .checkpoints()
            .cloned()
            .ok_or_else(|| MasterError::not_now("checkpoints are disabled for this job"))?;
        let m = c
            .spawn_checkpoint(self.0.clone(), "requested")
            .await
            .map_err(|e| MasterError::Unavailable(format!("checkpoint task: {e}")))?
            .map_err(|e| MasterError::Unavailable(format!("{e:#}")))?;
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
                .map_err(|e| MasterError::Unavailable(format!("checkpoint task: {e}")))?
                .map_err(|e| MasterError::Unavailable(format!("{e:#}; the job was not stopped")))?;
            checkpoint_id = m.id;
        }
        let samples_done = self
            .0
            .run(|job, cx| {
                if job.stop_training(cx) {
                    job.set_pause(None, cx);
                    Ok(job.samples_done())
                } else {
                    Err(MasterError::not_training())
                }
            })
            .await??;
        event!(
            "stopped",
            samples_done,
            "master: stopped at {samples_done} samples on request"
        );
        Ok(Response::new(StopResponse {
            samples_done,
            checkpoint_id,
        }))
    }
}
