//! The PS gRPC service: authentication and version checks, blocking work off the runtime
//! threads, metrics, and what the heartbeat reports of the requests served.

use std::sync::Arc;
use std::time::{Duration, Instant};

use elastrec_proto::ps::parameter_server_server::{ParameterServer, ParameterServerServer};
use elastrec_proto::ps::{
    AbortRequest, AbortResponse, CheckpointRequest, CheckpointResponse, CommitRequest,
    CommitResponse, ImportRequest, ImportResponse, InfoRequest, InfoResponse, PullRequest,
    PullResponse, PushRequest, PushResponse, ReplicateRequest, ReplicateResponse, ReshardRequest,
    ReshardResponse, TakeReplicaRequest, TakeReplicaResponse,
};
use elastrec_rpc::{self as rpc, check_version, ServerAuth};
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use crate::error::PsError;
use crate::fail_points::{fail_point_hang_checkpoint, fail_point_slow_rows};
use crate::shard::PsShard;

struct Service(Arc<PsShard>);

#[tonic::async_trait]
impl ParameterServer for Service {
    async fn pull(&self, req: Request<PullRequest>) -> Result<Response<PullResponse>, Status> {
        rpc::require(
            &req,
            &[rpc::Caller::Worker, rpc::Caller::Master, rpc::Caller::Ps],
        )?;
        let t0 = Instant::now();
        let req = req.into_inner();
        check_version(&req.version)?;
        self.0.lease.check()?;
        let rows = req.rows.len() as u64;
        let shard = self.0.clone();
        let out = tokio::task::spawn_blocking(move || {
            let packed = req.packed;
            shard.pull(&req).map(|mut out| {
                if packed {
                    out.pack();
                }
                out
            })
        })
        .await
        .map_err(PsError::from)??;
        fail_point_slow_rows(rows).await;
        // Served pulls only: a refused one moved no rows.
        let m = &self.0.metrics;
        m.pulls.inc();
        m.rows_pulled.inc_by(rows);
        m.pull_latency.observe(t0.elapsed().as_secs_f64());
        SERVED.add(t0);
        Ok(Response::new(out))
    }

    async fn push(&self, req: Request<PushRequest>) -> Result<Response<PushResponse>, Status> {
        rpc::require(&req, &[rpc::Caller::Worker])?;
        let t0 = Instant::now();
        let mut req = req.into_inner();
        check_version(&req.version)?;
        req.unpack().map_err(Status::invalid_argument)?;
        let rows = req.rows.len() as u64;
        let out = self.0.push(req).await?;
        fail_point_slow_rows(rows).await;
        let m = &self.0.metrics;
        m.pushes.inc();
        m.rows_pushed.inc_by(rows);
        m.push_latency.observe(t0.elapsed().as_secs_f64());
        SERVED.add(t0);
        Ok(Response::new(out))
    }

    async fn checkpoint(
        &self,
        req: Request<CheckpointRequest>,
    ) -> Result<Response<CheckpointResponse>, Status> {
        rpc::require(&req, &[rpc::Caller::Master])?;
        let req = req.into_inner();
        check_version(&req.version)?;
        if fail_point_hang_checkpoint(self.0.index()) {
            eprintln!(
                "PS {}: fail point: never answering this checkpoint",
                self.0.index()
            );
            std::future::pending::<()>().await;
        }
        let out = self.0.checkpoint(req).await?;
        self.0
            .metrics
            .checkpoint(Duration::from_micros(out.stall_us));
        Ok(Response::new(out))
    }

    async fn info(&self, req: Request<InfoRequest>) -> Result<Response<InfoResponse>, Status> {
        rpc::require(
            &req,
            &[rpc::Caller::Worker, rpc::Caller::Master, rpc::Caller::Ps],
        )?;
        check_version(&req.into_inner().version)?;
        // Neither the view nor the version waits for the state lock, which a checkpoint may
        // hold for seconds.
        let view = self.0.layout();
        let l = &view.layout;
        Ok(Response::new(InfoResponse {
            index: l.index,
            num_servers: l.count,
            dense_start: l.range.start as u64,
            dense_end: l.range.end as u64,
            dense_version: self.0.version(),
            rows_held: l.rows_held,
            layout_version: l.version,
            state: view.phase.state() as i32,
            next_layout_version: view.next_version(),
        }))
    }

    async fn reshard(
        &self,
        req: Request<ReshardRequest>,
    ) -> Result<Response<ReshardResponse>, Status> {
        rpc::require(&req, &[rpc::Caller::Master])?;
        let req = req.into_inner();
        check_version(&req.version)?;
        let peers = crate::reshard::GrpcPeers::new(&self.0, &req.addrs)?;
        Ok(Response::new(self.0.reshard(req, Arc::new(peers)).await?))
    }

    async fn import_shard(
        &self,
        req: Request<ImportRequest>,
    ) -> Result<Response<ImportResponse>, Status> {
        rpc::require(&req, &[rpc::Caller::Master, rpc::Caller::Ps])?;
        let req = req.into_inner();
        check_version(&req.version)?;
        let shard = self.0.clone();
        let out = tokio::task::spawn_blocking(move || shard.import(req))
            .await
            .map_err(PsError::from)??;
        Ok(Response::new(out))
    }

    async fn commit_layout(
        &self,
        req: Request<CommitRequest>,
    ) -> Result<Response<CommitResponse>, Status> {
        rpc::require(&req, &[rpc::Caller::Master])?;
        let req = req.into_inner();
        check_version(&req.version)?;
        let shard = self.0.clone();
        let out =
            tokio::task::spawn_blocking(move || shard.commit_layout(req.layout_version, req.addrs))
                .await
                .map_err(PsError::from)??;
        Ok(Response::new(out))
    }

    async fn abort_layout(
        &self,
        req: Request<AbortRequest>,
    ) -> Result<Response<AbortResponse>, Status> {
        rpc::require(&req, &[rpc::Caller::Master])?;
        let req = req.into_inner();
        check_version(&req.version)?;
        let shard = self.0.clone();
        let out = tokio::task::spawn_blocking(move || shard.abort_layout(req.layout_version))
            .await
            .map_err(PsError::from)??;
        Ok(Response::new(out))
    }

    async fn replicate(
        &self,
        req: Request<ReplicateRequest>,
    ) -> Result<Response<ReplicateResponse>, Status> {
        rpc::require(&req, &[rpc::Caller::Ps])?;
        let req = req.into_inner();
        check_version(&req.version)?;
        let shard = self.0.clone();
        let out = tokio::task::spawn_blocking(move || shard.replication.apply(&shard, req))
            .await
            .map_err(PsError::from)??;
        Ok(Response::new(out))
    }

    async fn take_replica(
        &self,
        req: Request<TakeReplicaRequest>,
    ) -> Result<Response<TakeReplicaResponse>, Status> {
        rpc::require(&req, &[rpc::Caller::Ps])?;
        let req = req.into_inner();
        check_version(&req.version)?;
        Ok(Response::new(self.0.replication.take(&req)))
    }
}

/// Serves `shard` on `listener` with token checks and message limits.
pub async fn serve(
    shard: Arc<PsShard>,
    listener: tokio::net::TcpListener,
    token: String,
    max_bytes: usize,
) -> anyhow::Result<()> {
    // Calls to the other servers (re-sharding, dense replicas) carry the same token.
    let _ = shard.peer_token.set(token.clone());
    crate::replica::start(&shard);
    let svc = ParameterServerServer::new(Service(shard))
        .max_decoding_message_size(max_bytes)
        .max_encoding_message_size(max_bytes);
    // The accept list `elastrec run` gives a PS (its peers, the master, the workers), or
    // only its own token for a PS started by hand.
    let auth = ServerAuth::for_node(&token)?;
    elastrec_rpc::server()?
        .add_service(InterceptedService::new(svc, auth))
        .serve_with_incoming(elastrec_rpc::incoming(listener))
        .await?;
    Ok(())
}

/// Pulls and pushes this process served and the time it spent on them: the master tells a
/// hot server (slower than its peers) from them.
struct Served {
    requests: std::sync::atomic::AtomicU64,
    micros: std::sync::atomic::AtomicU64,
}

static SERVED: Served = Served {
    requests: std::sync::atomic::AtomicU64::new(0),
    micros: std::sync::atomic::AtomicU64::new(0),
};

impl Served {
    fn add(&self, since: Instant) {
        use std::sync::atomic::Ordering::Relaxed;
        self.requests.fetch_add(1, Relaxed);
        self.micros
            .fetch_add(since.elapsed().as_micros() as u64, Relaxed);
    }
}

/// The PS's heartbeat profile: CPU time, resident memory, requests served and the time
/// they took (the master predicts memory growth and spots a hot server from them).
pub(crate) fn ps_profile() -> elastrec_proto::master::NodeProfile {
    use std::sync::atomic::Ordering::Relaxed;
    let usage = elastrec_metrics::process::usage();
    elastrec_proto::master::NodeProfile {
        cpu_s: usage.cpu_s,
        rss_bytes: usage.rss_bytes,
        requests: SERVED.requests.load(Relaxed),
        serve_s: SERVED.micros.load(Relaxed) as f64 / 1e6,
        ..Default::default()
    }
}
