//! The distributed worker process (`elastrec worker`, started by the job master).
//!
//! Loop: ask the master for a data task, read its rows batch by batch, pull the batch's
//! embedding rows (and, when stale, the dense parameters) from the parameter servers,
//! run forward/backward locally, push sparse and dense gradients, and only after every PS
//! accepted them report the new progress offset. The stages overlap where the ledger and
//! the staleness bound allow: the next batch is read on a thread of its own
//! (`read_ahead`), its pull may start before this batch's compute (`cluster.staleness` ≥
//! 1), and a report is answered while the next batch is computed (it is pushed only
//! after). A heartbeat task keeps the membership lease; without a fresh acknowledgement
//! from the master the worker pushes nothing (so a worker the master declared dead cannot
//! train samples that were handed to another).

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use elastrec_data::{Batch, BatchReader};
use elastrec_embedding::{row_of, shard_of};
use elastrec_job::distributed::SyncMode;
use elastrec_job::prepare::{dense_model, resolve_key_spaces};
use elastrec_job::register::{register, register_node};
use elastrec_job::split::Split;
use elastrec_job::JobConfig;
use elastrec_metrics::prometheus_client::metrics::counter::Counter;
use elastrec_metrics::prometheus_client::metrics::gauge::Gauge;
use elastrec_metrics::prometheus_client::metrics::histogram::Histogram;
use elastrec_metrics::prometheus_client::registry::Registry;
use elastrec_model::{sigmoid, DenseDlrm, EvalAccumulator, Workspace};
use elastrec_proto::master::{
    get_task_response::Reply, GetTaskRequest, HeartbeatRequest, NodeAction, NodeProfile,
    ReportEvalRequest, ReportProgressRequest, Role,
};
use elastrec_proto::ps::{BatchKey, DenseSpan, PullRequest, PullResponse, PushRequest};
use elastrec_rpc::{self as rpc, dense_slice, is_transient, Master, Ps};
use parking_lot::Mutex;
use tonic::Code;

use crate::fail_points::{fail_point_exit_after_push, fail_point_slow_batch, RowTrace};
use crate::layout::{split_parts, PsLayout, PushPart};
use crate::pooling::{LookupPlan, SlotLayout};
use crate::split_source::{open_split, task_split, TaskFiles};

mod ps_model;
mod read_ahead;
mod task_loop;

use ps_model::{Predictions, Prefetch, RemoteModel, Routing};
use read_ahead::{ReadAhead, ReadBatch};
pub use task_loop::run_worker;

/// Arguments of the hidden `elastrec worker` role command.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// Address of the job master.
    #[arg(long)]
    pub master: String,
    /// Node id the master assigned to this process.
    #[arg(long)]
    pub node_id: u32,
    /// Unique id of the job: on the command line so that the master recognizes its own
    /// processes after a restart (node ids repeat across jobs).
    #[arg(long, default_value = "")]
    pub job: String,
}

/// Prometheus metrics of a worker (prefix `elastrec_worker`, label `node`: its node id).
pub struct WorkerMetrics {
    registry: Registry,
    samples: Counter,
    batches: Counter,
    pull_latency: Histogram,
    push_latency: Histogram,
    get_task_waits: Counter,
    /// Pulls started before the previous batch's push that served their batch, and those
    /// that did not (the batch was pulled again).
    prefetched: Counter,
    prefetches_discarded: Counter,
    task: Gauge,
    process: elastrec_metrics::process::ProcessMetrics,
}

impl WorkerMetrics {
    /// How worker `id`'s pulls went, once it prefetched any: of its batches, how many a
    /// pull started before the previous batch's compute and push served, and how many
    /// were pulled again.
    pub(crate) fn how_pulls_went(&self, id: u32) -> Option<String> {
        let (batches, used, discarded) = (
            self.batches.get(),
            self.prefetched.get(),
            self.prefetches_discarded.get(),
        );
        (used + discarded > 0).then(|| {
            format!(
                "worker {id}: of {batches} batches, {used} were served by pulls started before \
                 the previous batch's compute and push, {discarded} were pulled again"
            )
        })
    }

    /// The metrics of worker node `node`.
    pub fn new(node: u32) -> Self {
        let mut registry = Registry::with_prefix_and_labels(
            "elastrec_worker",
            [("node".into(), node.to_string().into())].into_iter(),
        );
        let (samples, batches, get_task_waits) =
            (Counter::default(), Counter::default(), Counter::default());
        let pull_latency = elastrec_metrics::latency_histogram();
        let push_latency = elastrec_metrics::latency_histogram();
        let task = Gauge::default();
        registry.register("samples", "Samples trained and reported", samples.clone());
        registry.register("batches", "Batches trained and reported", batches.clone());
        registry.register(
            "pull_latency_seconds",
            "Time to pull a batch's parameters from every PS",
            pull_latency.clone(),
        );
        registry.register(
            "push_latency_seconds",
            "Time until every PS accepted a batch's gradients",
            push_latency.clone(),
        );
        registry.register(
            "get_task_waits",
            "Get-task replies that said to wait (no data to hand out now)",
            get_task_waits.clone(),
        );
        registry.register("task", "Data task in progress (0: none)", task.clone());
        let (prefetched, prefetches_discarded) = (Counter::default(), Counter::default());
        registry.register(
            "prefetched_pulls",
            "Pulls started before the previous batch's compute and push that served their \
             batch (async mode, cluster.staleness >= 1)",
            prefetched.clone(),
        );
        registry.register(
            "discarded_prefetches",
            "Prefetched pulls that could not serve (the PS layout or a server changed, or a \
             server refused): their batch was pulled again",
            prefetches_discarded.clone(),
        );
        let process = elastrec_metrics::process::ProcessMetrics::register(&mut registry);
        Self {
            process,
            registry,
            samples,
            batches,
            pull_latency,
            push_latency,
            get_task_waits,
            prefetched,
            prefetches_discarded,
            task,
        }
    }

    /// The exposition.
    pub fn render(&self) -> String {
        self.process.refresh();
        elastrec_metrics::encode(&self.registry)
    }
}

/// Shared between the training loop and the heartbeat task.
#[derive(Default)]
struct Shared {
    task: AtomicU64,
    active_workers: std::sync::atomic::AtomicU32,
    offset: AtomicU64,
    samples: AtomicU64,
    steps: AtomicU64,
    stop: AtomicBool,
    /// Sequence number of the newest heartbeat reply applied.
    heartbeat_seq: AtomicU64,
    /// When the master last acknowledged this node.
    last_ack: Mutex<Option<Instant>>,
    /// The PS layout as last published by the master (a new version when the servers
    /// were re-sharded; the same version with a new address when a PS was replaced).
    ps_layout: Mutex<PsLayout>,
    /// Where the training loop's time goes (the master's profile), microseconds.
    profile: TimeSplit,
    /// The job's data executors, as the master last said (`cluster.executors`).
    executors: crate::executor_reader::Executors,
}

/// Cumulative time of each part of a training iteration, microseconds.
#[derive(Default)]
struct TimeSplit {
    batches: AtomicU64,
    samples: AtomicU64,
    compute_us: AtomicU64,
    pull_us: AtomicU64,
    push_us: AtomicU64,
    master_us: AtomicU64,
    read_us: AtomicU64,
}

impl TimeSplit {
    fn add(counter: &AtomicU64, since: Instant) {
        counter.fetch_add(since.elapsed().as_micros() as u64, Ordering::Relaxed);
    }

    /// The heartbeat's profile: the split so far plus this process's CPU and memory.
    fn snapshot(&self) -> NodeProfile {
        let s = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64 / 1e6;
        let usage = elastrec_metrics::process::usage();
        NodeProfile {
            batches: self.batches.load(Ordering::Relaxed),
            samples: self.samples.load(Ordering::Relaxed),
            compute_s: s(&self.compute_us),
            pull_s: s(&self.pull_us),
            push_s: s(&self.push_us),
            master_s: s(&self.master_us),
            read_s: s(&self.read_us),
            cpu_s: usage.cpu_s,
            rss_bytes: usage.rss_bytes,
            threads: rayon::current_num_threads() as u32,
            ..NodeProfile::default()
        }
    }
}

impl Shared {
    fn lease_ok(&self, lease: Duration) -> bool {
        self.last_ack.lock().is_some_and(|t| t.elapsed() < lease)
    }
}

/// This worker's heartbeat now: its task, progress and process profile.
fn heartbeat_request(id: u32, shared: &Shared) -> HeartbeatRequest {
    HeartbeatRequest {
        version: rpc::version(),
        node_id: id,
        task_id: shared.task.load(Ordering::Relaxed),
        offset: shared.offset.load(Ordering::Relaxed),
        samples: shared.samples.load(Ordering::Relaxed),
        step: shared.steps.load(Ordering::Relaxed),
        profile: Some(shared.profile.snapshot()),
        fenced: false,
    }
}

/// Applies heartbeat reply `seq` in order: one overtaken by a newer reply is dropped.
fn apply_heartbeat_reply(
    r: Result<tonic::Response<elastrec_proto::master::HeartbeatResponse>, tonic::Status>,
    seq: u64,
    id: u32,
    shared: &Shared,
) {
    match r {
        Ok(r) => {
            let r = r.into_inner();
            if r.action() == NodeAction::Unknown {
                // Declared dead: another worker owns our samples now. Exit at once,
                // pushing nothing more.
                eprintln!("worker {id}: the master no longer knows this node; exiting");
                std::process::exit(3);
            }
            if shared.heartbeat_seq.fetch_max(seq, Ordering::AcqRel) > seq {
                return; // a newer reply was applied already
            }
            *shared.last_ack.lock() = Some(Instant::now());
            shared
                .active_workers
                .store(r.active_workers, Ordering::Relaxed);
            shared
                .ps_layout
                .lock()
                .update(r.layout_version, &r.ps_addrs);
            shared.executors.set(r.executor_addrs.clone());
            if r.action() == NodeAction::Stop {
                shared.stop.store(true, Ordering::Relaxed);
            }
        }
        Err(s) if is_transient(&s) => {}
        Err(s) => {
            eprintln!("worker {id}: heartbeat refused: {s}; exiting");
            std::process::exit(3);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use elastrec_proto::ps::parameter_server_server::{ParameterServer, ParameterServerServer};
    use elastrec_proto::ps::{
        AbortRequest, AbortResponse, CheckpointRequest, CheckpointResponse, CommitRequest,
        CommitResponse, ImportRequest, ImportResponse, InfoRequest, InfoResponse, PullResponse,
        PushResponse, ReshardRequest, ReshardResponse,
    };
    use tonic::{Request, Response, Status};

    const TOKEN: &str = "remotetest";

    const DIM: usize = 4;

    /// A scripted parameter server: records the pulls and pushes it gets, answers pulls
    /// with zeros of the right sizes, and either accepts pushes or refuses them for their
    /// layout, publishing `next` (the layout the master would publish) when it refuses.
    struct Fake {
        slice_len: usize,
        refuse: bool,
        /// Pushes fail as from a dead server (`UNAVAILABLE`), after publishing `next`
        /// (its replacement) in `Shared`.
        dies: bool,
        /// The next layout, published in `Shared` as the master would (`Some`), or named
        /// in the refusal (`None`).
        next: Option<(Option<Arc<Shared>>, PsLayout)>,
        pulls: Mutex<Vec<PullRequest>>,
        pushes: Mutex<Vec<PushRequest>>,
    }

    /// The service of a [`Fake`] (which the test keeps to look at).
    struct FakeService(Arc<Fake>);

    impl std::ops::Deref for FakeService {
        type Target = Fake;
        fn deref(&self) -> &Fake {
            &self.0
        }
    }

    #[tonic::async_trait]
    impl ParameterServer for FakeService {
        async fn pull(&self, r: Request<PullRequest>) -> Result<Response<PullResponse>, Status> {
            let r = r.into_inner();
            let reply = PullResponse {
                values: vec![0.0; r.rows.len() * DIM],
                dense: vec![0.0; if r.want_dense { self.slice_len } else { 0 }],
                dense_version: 1,
                ..PullResponse::default()
            };
            self.pulls.lock().push(r);
            Ok(Response::new(reply))
        }

        async fn push(&self, r: Request<PushRequest>) -> Result<Response<PushResponse>, Status> {
            // Read as the real server reads a push: packed floats unpacked.
            let mut r = r.into_inner();
            r.unpack().map_err(Status::invalid_argument)?;
            self.pushes.lock().push(r);
            if self.dies {
                if let Some((Some(shared), next)) = &self.next {
                    *shared.ps_layout.lock() = next.clone();
                }
                return Err(Status::unavailable("PS 1 died"));
            }
            if self.refuse {
                return Err(match &self.next {
                    // The master publishes the layout (the next heartbeat reply).
                    Some((Some(shared), next)) => {
                        *shared.ps_layout.lock() = next.clone();
                        rpc::layout_refusal("PS 1 is moving to layout 1")
                    }
                    // The server committed it and names it.
                    Some((None, next)) => rpc::layout_refusal_naming(
                        "PS 1 serves layout 1",
                        (next.version, &next.addrs),
                    ),
                    None => rpc::layout_refusal("PS 1 is moving to layout 1"),
                });
            }
            Ok(Response::new(PushResponse { dense_version: 1 }))
        }

        async fn info(&self, _: Request<InfoRequest>) -> Result<Response<InfoResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }

        async fn checkpoint(
            &self,
            _: Request<CheckpointRequest>,
        ) -> Result<Response<CheckpointResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }

        async fn reshard(
            &self,
            _: Request<ReshardRequest>,
        ) -> Result<Response<ReshardResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }

        async fn import_shard(
            &self,
            _: Request<ImportRequest>,
        ) -> Result<Response<ImportResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }

        async fn commit_layout(
            &self,
            _: Request<CommitRequest>,
        ) -> Result<Response<CommitResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }

        async fn abort_layout(
            &self,
            _: Request<AbortRequest>,
        ) -> Result<Response<AbortResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }

        async fn replicate(
            &self,
            _: Request<elastrec_proto::ps::ReplicateRequest>,
        ) -> Result<Response<elastrec_proto::ps::ReplicateResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }

        async fn take_replica(
            &self,
            _: Request<elastrec_proto::ps::TakeReplicaRequest>,
        ) -> Result<Response<elastrec_proto::ps::TakeReplicaResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }
    }

    async fn serve(fake: Arc<Fake>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let svc = tonic::service::interceptor::InterceptedService::new(
            ParameterServerServer::new(FakeService(fake)),
            rpc::ServerAuth::new(TOKEN),
        );
        tokio::spawn(
            rpc::server()
                .unwrap()
                .add_service(svc)
                .serve_with_incoming(rpc::incoming(listener)),
        );
        addr
    }

    fn fake(
        slice_len: usize,
        refuse: bool,
        next: Option<(Option<Arc<Shared>>, PsLayout)>,
    ) -> Arc<Fake> {
        Arc::new(Fake {
            slice_len,
            refuse,
            dies: false,
            next,
            pulls: Mutex::new(Vec::new()),
            pushes: Mutex::new(Vec::new()),
        })
    }

    /// Layout 0 has two servers; server 0 accepts a push, server 1 refuses it (it froze
    /// for layout 1, of three servers). The worker sends server 1's part, and only that,
    /// to the servers of layout 1: each row to its new owner, the dense ranges of server
    /// 1's slice cut by the new slices (as spans where partial). A pull routed by layout 0
    /// is then done by layout 1's routing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_push_part_goes_to_the_new_owners_only() {
        resplit(true).await;
    }

    /// The same, the new layout named by the refusing server instead of published by the
    /// master: the worker does not wait for a heartbeat reply.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_layout_named_in_a_refusal_is_followed() {
        resplit(false).await;
    }

    async fn resplit(published_by_master: bool) {
        let job = JobConfig::from_toml(
            &format!(
                "[model]\nbottom_mlp = [8, {DIM}]\ntop_mlp = [8, 1]\nembedding_dim = {DIM}\n\
                 table_rows = 1000\n[cluster]\nps = 2\n"
            ),
            Path::new("job.toml"),
        )
        .unwrap();
        let total = dense_model(&job).unwrap().num_params();
        let shared = Arc::new(Shared::default());
        let new: Vec<Arc<Fake>> = (0..3)
            .map(|j| fake(dense_slice(total, 3, j).len(), false, None))
            .collect();
        let mut new_addrs = Vec::new();
        for f in &new {
            new_addrs.push(serve(f.clone()).await);
        }
        let next = PsLayout {
            version: 1,
            addrs: new_addrs,
        };
        let old = [
            fake(dense_slice(total, 2, 0).len(), false, None),
            fake(
                dense_slice(total, 2, 1).len(),
                true,
                Some((published_by_master.then(|| shared.clone()), next)),
            ),
        ];
        let layout0 = PsLayout {
            version: 0,
            addrs: vec![serve(old[0].clone()).await, serve(old[1].clone()).await],
        };
        *shared.ps_layout.lock() = layout0.clone();
        let mut model = RemoteModel::new(&job, layout0, TOKEN.into(), shared, 7).unwrap();
        for (i, g) in model.ws.grads_mut().iter_mut().enumerate() {
            *g = i as f32;
        }
        // 40 rows of 3 tables routed by layout 0 (the slots do not matter here).
        let mut per_ps = vec![(Vec::new(), Vec::new()); 2];
        for t in 0..3u32 {
            for r in (0..40u64).map(|k| k * 7 + u64::from(t)) {
                let s = shard_of(t as usize, r, 2) as usize;
                per_ps[s].0.push(t);
                per_ps[s].1.push(r);
            }
        }
        let routing = Routing {
            per_ps: per_ps.clone(),
            slot: Vec::new(),
            layout: 0,
            pool: None,
        };
        let key = BatchKey {
            epoch: 1,
            file: 0,
            start_row: 64,
        };
        model.push(&routing, 1, key, 8).await.unwrap();
        assert_eq!(model.layout, 1);
        let (a, b) = (old[0].pushes.lock().clone(), old[1].pushes.lock().clone());
        assert_eq!((a.len(), b.len()), (1, 1));
        assert_eq!(a[0].rows, per_ps[0].1);
        assert_eq!(a[0].dense_grad.len(), dense_slice(total, 2, 0).len());
        assert!(a[0].dense_spans.is_empty(), "a whole slice is sent plain");
        // Server 1's part, re-split.
        let refused_slice = dense_slice(total, 2, 1);
        let mut rows_resent = Vec::new();
        for (j, f) in new.iter().enumerate() {
            let got = f.pushes.lock().clone();
            assert_eq!(got.len(), 1, "PS {j} of layout 1");
            let p = &got[0];
            assert_eq!((p.layout_version, p.batch, p.worker_id), (1, Some(key), 7));
            for (&t, &r) in p.tables.iter().zip(&p.rows) {
                assert_eq!(shard_of(t as usize, r, 3), j as u32);
                assert_eq!(
                    shard_of(t as usize, r, 2),
                    1,
                    "row of the accepted part resent"
                );
                rows_resent.push((t, r));
            }
            assert_eq!(p.grads.len(), p.rows.len() * DIM);
            let mine = dense_slice(total, 3, j);
            let (lo, hi) = (
                mine.start.max(refused_slice.start),
                mine.end.min(refused_slice.end),
            );
            let want: Vec<f32> = (lo..hi).map(|i| i as f32).collect();
            assert_eq!(p.dense_grad, want, "PS {j}");
            // Spans even for a whole slice: the rest of a step the server counted.
            if lo >= hi {
                assert!(p.dense_spans.is_empty(), "PS {j}: {:?}", p.dense_spans);
            } else {
                assert_eq!(
                    p.dense_spans,
                    vec![DenseSpan {
                        start: lo as u64,
                        len: (hi - lo) as u64
                    }]
                );
            }
        }
        rows_resent.sort();
        let mut refused: Vec<(u32, u64)> = per_ps[1]
            .0
            .iter()
            .copied()
            .zip(per_ps[1].1.iter().copied())
            .collect();
        refused.sort();
        assert_eq!(rows_resent, refused);

        model.pull(&routing).await.unwrap();
        let mut pulled = Vec::new();
        for (j, f) in new.iter().enumerate() {
            let got = f.pulls.lock().clone();
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].layout_version, 1);
            assert!(
                got[0].want_dense,
                "fresh dense parameters after a layout change"
            );
            for (&t, &r) in got[0].tables.iter().zip(&got[0].rows) {
                assert_eq!(shard_of(t as usize, r, 3), j as u32);
                pulled.push((t, r));
            }
        }
        pulled.sort();
        let mut all: Vec<(u32, u64)> = per_ps
            .iter()
            .flat_map(|(t, r)| t.iter().copied().zip(r.iter().copied()))
            .collect();
        all.sort();
        assert_eq!(pulled, all);
        assert!(old[0].pulls.lock().is_empty());
    }

    /// The path of a server that died and was replaced at the same index (same layout,
    /// new address): only the part it did not accept is sent again, to the replacement.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replaced_server_gets_the_part_it_did_not_accept() {
        let job = JobConfig::from_toml(
            &format!(
                "[model]\nbottom_mlp = [8, {DIM}]\ntop_mlp = [8, 1]\nembedding_dim = {DIM}\n\
                 table_rows = 1000\n[cluster]\nps = 2\n"
            ),
            Path::new("job.toml"),
        )
        .unwrap();
        let total = dense_model(&job).unwrap().num_params();
        let shared = Arc::new(Shared::default());
        let m0 = fake(dense_slice(total, 2, 0).len(), false, None);
        let replacement = fake(dense_slice(total, 2, 1).len(), false, None);
        let (a0, a2) = (serve(m0.clone()).await, serve(replacement.clone()).await);
        let replaced = PsLayout {
            version: 0,
            addrs: vec![a0.clone(), a2],
        };
        let m1 = Arc::new(Fake {
            dies: true,
            ..Arc::into_inner(fake(
                dense_slice(total, 2, 1).len(),
                false,
                Some((Some(shared.clone()), replaced)),
            ))
            .unwrap()
        });
        let layout0 = PsLayout {
            version: 0,
            addrs: vec![a0, serve(m1.clone()).await],
        };
        *shared.ps_layout.lock() = layout0.clone();
        let mut model = RemoteModel::new(&job, layout0, TOKEN.into(), shared, 3).unwrap();
        let mut per_ps = vec![(Vec::new(), Vec::new()); 2];
        for r in 0..30u64 {
            let s = shard_of(5, r, 2) as usize;
            per_ps[s].0.push(5);
            per_ps[s].1.push(r);
        }
        let routing = Routing {
            per_ps: per_ps.clone(),
            slot: Vec::new(),
            layout: 0,
            pool: None,
        };
        let key = BatchKey {
            epoch: 2,
            file: 1,
            start_row: 0,
        };
        model.push(&routing, 1, key, 8).await.unwrap();
        assert_eq!(model.layout, 0);
        assert_eq!(
            m0.pushes.lock().len(),
            1,
            "the part accepted is not sent again"
        );
        assert_eq!(m1.pushes.lock().len(), 1);
        let got = replacement.pushes.lock().clone();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].rows, per_ps[1].1);
        assert_eq!(got[0].dense_grad.len(), dense_slice(total, 2, 1).len());
        assert!(got[0].dense_spans.is_empty());
        assert_eq!((got[0].layout_version, got[0].batch), (0, Some(key)));
    }
}
