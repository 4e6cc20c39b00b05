//! The distributed worker process (`elastrec worker`, started by the job master).
//!
//! Loop: ask the master for a data task, read its rows batch by batch, pull the batch's
//! embedding rows (and, when stale, the dense parameters) from the parameter servers,
//! run forward/backward locally, push sparse and dense gradients, and only after every PS
//! accepted them report the new progress offset. A heartbeat task keeps the membership
//! lease; without a fresh acknowledgement from the master the worker pushes nothing (so a
//! worker the master declared dead cannot train samples that were handed to another).

use std::collections::HashMap;
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
use elastrec_proto::ps::{BatchKey, DenseSpan, PullRequest, PushRequest};
use elastrec_rpc::{self as rpc, dense_slice, is_transient, Master, Ps};
use parking_lot::Mutex;
use tonic::Code;

use crate::fail_points::{fail_point_exit_after_push, fail_point_slow_batch, RowTrace};
use crate::layout::{split_parts, PsLayout, PushPart};
use crate::pooling::{LookupPlan, SlotLayout};
use crate::split_source::{open_split, task_split, TaskFiles};

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
    task: Gauge,
    process: elastrec_metrics::process::ProcessMetrics,
}

impl WorkerMetrics {
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
        let process = elastrec_metrics::process::ProcessMetrics::register(&mut registry);
        Self {
            process,
            registry,
            samples,
            batches,
            pull_latency,
            push_latency,
            get_task_waits,
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

/// Where each (sample, table) slot of a batch lives: PS index and position in that PS's
/// unique-row list, under the PS layout `layout`. With named features (`pool`), `slot`
/// has one entry per lookup of the plan, which says where each row adds to and how much.
struct Routing {
    per_ps: Vec<(Vec<u32>, Vec<u64>)>,
    slot: Vec<(u32, u32)>,
    layout: u64,
    pool: Option<Arc<LookupPlan>>,
}

/// Why a round of calls to the parameter servers did not complete.
enum Refusal {
    /// PS `i` is unreachable (died, or restarting): wait for its replacement.
    Unreachable(usize, tonic::Status),
    /// PS `i` does not serve the layout the call was routed by: wait for the new layout.
    Layout(usize, tonic::Status),
}

/// How long a worker waits for a replacement of a fenced server (see `elastrec_ps::lease`)
/// before it calls that server again.
const FENCE_POLL: Duration = Duration::from_millis(200);
/// How often a worker says that a server still refuses it as fenced.
const FENCE_LOG_EVERY: Duration = Duration::from_secs(5);

/// How long a worker waits for the master to publish a new layout after a server refused
/// its layout before it tries the servers again (they may be finishing their commit).
const LAYOUT_POLL: Duration = Duration::from_millis(50);

/// How long servers may refuse a worker's layout before it gives up.
const LAYOUT_WAIT_LIMIT: Duration = Duration::from_secs(120);

/// Dense model copy plus the PS connections.
struct RemoteModel {
    dense: DenseDlrm,
    ws: Workspace,
    emb: Vec<f32>,
    /// What each table's ids hash over (`resolve_key_spaces`).
    key_spaces: Vec<u64>,
    /// Shared tables and pooled lists of named features; `None`: slot `t` is table `t`'s
    /// single id.
    slots: Option<SlotLayout>,
    /// The attention units' histories of the last pull (`[n, max_len, d]` each), their
    /// lengths, and their gradient after the last compute.
    hist: Vec<f32>,
    lens: Vec<u32>,
    d_hist: Vec<f32>,
    dim: usize,
    ps: Vec<Ps>,
    /// Address of each PS connection (to notice a replaced PS).
    addrs: Vec<String>,
    /// Version of the PS layout `ps`, `addrs` and `slices` belong to: every pull and push
    /// names it, and a server of another layout refuses them.
    layout: u64,
    token: String,
    max_bytes: usize,
    call_timeout: Duration,
    shared: Arc<Shared>,
    slices: Vec<std::ops::Range<usize>>,
    versions: Vec<u64>,
    need_dense: bool,
    staleness: u64,
    mode: SyncMode,
    worker_id: u32,
    /// `[optimizer.schedule]`'s multiplier for the next pushes, as the master last said
    /// (0: no schedule). Until its first reply, the schedule's start.
    lr_scale: f32,
    /// The sum of the last batch's sample weights (none: the data has no weights).
    loss_weight: Option<f64>,
    /// When a fenced server's refusal was last logged.
    fence_logged: Option<Instant>,
}

impl RemoteModel {
    fn new(
        job: &JobConfig,
        layout: PsLayout,
        token: String,
        shared: Arc<Shared>,
        worker_id: u32,
    ) -> anyhow::Result<Self> {
        let dense = dense_model(job)?;
        let batch = job.train.batch_size;
        let mut ws = dense.workspace(batch);
        // Workers compute gradients side by side: each draws its own dropout masks. (A
        // restarted worker id repeats its masks from step 0: harmless, they are noise.)
        ws.set_dropout_stream(elastrec_common::splitmix::derive(
            job.model.seed,
            u64::from(worker_id) + 1,
        ));
        let mut me = Self {
            ws,
            emb: vec![0.0; batch * dense.config().num_tables * job.model.row_width()],
            key_spaces: resolve_key_spaces(job),
            slots: job.data.schema().as_ref().and_then(SlotLayout::of),
            hist: Vec::new(),
            lens: Vec::new(),
            d_hist: Vec::new(),
            dim: job.model.row_width(),
            slices: Vec::new(),
            versions: Vec::new(),
            need_dense: true,
            staleness: job.cluster.staleness as u64,
            mode: job.cluster.mode,
            dense,
            ps: Vec::new(),
            addrs: Vec::new(),
            layout: 0,
            token,
            max_bytes: job.cluster.max_message_bytes,
            call_timeout: job.cluster.rpc_timeout(),
            shared,
            worker_id,
            lr_scale: if job.optimizer.schedule.is_constant() {
                0.0
            } else {
                job.optimizer.schedule.scale(0, u64::MAX)
            },
            loss_weight: None,
            fence_logged: None,
        };
        me.connect(layout)?;
        Ok(me)
    }

    /// Routes by `layout` from now on: clients (connections to addresses that stay are
    /// kept), dense slices, and fresh dense parameters at the next pull.
    fn connect(&mut self, layout: PsLayout) -> anyhow::Result<()> {
        let mut open: HashMap<String, Ps> = self.addrs.drain(..).zip(self.ps.drain(..)).collect();
        self.ps = layout
            .addrs
            .iter()
            .map(|a| match open.remove(a) {
                Some(c) => Ok(c),
                None => rpc::ps_client(a, &self.token, self.max_bytes, self.call_timeout),
            })
            .collect::<anyhow::Result<_>>()?;
        let (p, n) = (self.ps.len(), self.dense.num_params());
        self.addrs = layout.addrs;
        self.layout = layout.version;
        self.slices = (0..p).map(|i| dense_slice(n, p, i)).collect();
        self.versions = vec![0; p];
        self.need_dense = true;
        Ok(())
    }

    /// Switches to the layout the master published when it is newer than ours.
    fn follow_layout(&mut self) -> anyhow::Result<bool> {
        let published = self.shared.ps_layout.lock().clone();
        if published.version <= self.layout || published.addrs.is_empty() {
            return Ok(false);
        }
        eprintln!(
            "worker {}: PS layout {} ({} servers) replaces layout {} ({} servers)",
            self.worker_id,
            published.version,
            published.addrs.len(),
            self.layout,
            self.ps.len()
        );
        self.connect(published)?;
        Ok(true)
    }

    /// PS `i` failed a call: waits until the master publishes a replacement (a new
    /// address), reconnects, and asks for fresh dense parameters. A PS that stays away
    /// for two minutes ends the worker (the master stops the job or recovers it fully).
    /// A new layout published meanwhile is taken instead. A fenced PS (alive, past its
    /// lease) is called again after `FENCE_POLL` unless replaced by then.
    async fn await_replacement(&mut self, i: usize, why: &tonic::Status) -> anyhow::Result<()> {
        // A fenced server is alive but lost the master's lease: it serves again once the
        // master answers it, or the master replaces it. Either way the master settles it
        // (a fenced server's heartbeats are no sign of life), so the call is retried
        // every `FENCE_POLL` until then, with no deadline of its own.
        let fenced = rpc::is_fence_refusal(why);
        if !fenced
            || self
                .fence_logged
                .is_none_or(|t| t.elapsed() > FENCE_LOG_EVERY)
        {
            eprintln!(
                "worker {}: PS {i} at {} failed ({}); waiting for it or its replacement",
                self.worker_id,
                self.addrs[i],
                why.message()
            );
            if fenced {
                self.fence_logged = Some(Instant::now());
            }
        }
        let started = Instant::now();
        let deadline = started + Duration::from_secs(120);
        loop {
            if self.follow_layout()? {
                return Ok(());
            }
            let published = self.shared.ps_layout.lock().clone();
            let addrs = published.addrs;
            if published.version == self.layout
                && addrs.len() == self.addrs.len()
                && addrs[i] != self.addrs[i]
            {
                for (k, a) in addrs.iter().enumerate() {
                    if *a != self.addrs[k] {
                        self.ps[k] =
                            rpc::ps_client(a, &self.token, self.max_bytes, self.call_timeout)?;
                    }
                }
                self.addrs = addrs;
                self.need_dense = true;
                eprintln!(
                    "worker {}: PS {i} is back at {}",
                    self.worker_id, self.addrs[i]
                );
                return Ok(());
            }
            if fenced && started.elapsed() >= FENCE_POLL {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("PS {i} did not come back within 120 s ({why})");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// PS `i` refused our layout (the servers are being re-sharded, or were): waits for
    /// the master to publish a newer layout and switches to it; without one within
    /// [`LAYOUT_POLL`], returns to retry the same layout (the servers of a layout we
    /// already have may be finishing their commit). Servers that refuse every layout we
    /// get for [`LAYOUT_WAIT_LIMIT`] since `since` end the worker.
    async fn await_layout(
        &mut self,
        i: usize,
        why: &tonic::Status,
        since: Instant,
    ) -> anyhow::Result<()> {
        if since.elapsed() < LAYOUT_POLL {
            eprintln!(
                "worker {}: PS {i} refused layout {} ({}); waiting for the new layout",
                self.worker_id,
                self.layout,
                why.message()
            );
        }
        // A server that committed the new layout names it: no need to wait for the
        // master's next heartbeat reply.
        if let Some((version, addrs)) = rpc::refusal_layout(why) {
            self.shared.ps_layout.lock().take_newer(version, &addrs);
        }
        let poll = Instant::now();
        loop {
            if self.follow_layout()? {
                return Ok(());
            }
            if since.elapsed() > LAYOUT_WAIT_LIMIT {
                bail!(
                    "the parameter servers refused layout {} for {} s ({why})",
                    self.layout,
                    LAYOUT_WAIT_LIMIT.as_secs()
                );
            }
            if poll.elapsed() >= LAYOUT_POLL {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn route(&self, batch: &Batch) -> anyhow::Result<Routing> {
        let tables = self.dense.config().num_tables;
        let Some(slots) = &self.slots else {
            let keys = batch
                .sparse
                .iter()
                .enumerate()
                .map(|(i, &id)| (i % tables, id));
            return Ok(self.route_keys(keys, None));
        };
        let mut plan = LookupPlan::default();
        plan.plan(slots, batch)?;
        let keys: Vec<(usize, u64)> = plan
            .tables
            .iter()
            .zip(&plan.ids)
            .map(|(&t, &id)| (t as usize, id))
            .collect();
        Ok(self.route_keys(keys.into_iter(), Some(Arc::new(plan))))
    }

    /// Routes each `(table, id)` to its server, once per distinct row.
    fn route_keys(
        &self,
        keys: impl Iterator<Item = (usize, u64)>,
        pool: Option<Arc<LookupPlan>>,
    ) -> Routing {
        let p = self.ps.len();
        let mut per_ps: Vec<(Vec<u32>, Vec<u64>)> = vec![(Vec::new(), Vec::new()); p];
        let mut index: Vec<HashMap<(u32, u64), u32>> = vec![HashMap::new(); p];
        let mut slot = Vec::with_capacity(keys.size_hint().0);
        for (t, id) in keys {
            let row = row_of(t, id, self.key_spaces[t]);
            let s = shard_of(t, row, p as u32) as usize;
            let k = *index[s].entry((t as u32, row)).or_insert_with(|| {
                per_ps[s].0.push(t as u32);
                per_ps[s].1.push(row);
                (per_ps[s].1.len() - 1) as u32
            });
            slot.push((s as u32, k));
        }
        Routing {
            per_ps,
            slot,
            layout: self.layout,
            pool,
        }
    }

    /// `r` routed by the current layout instead of the one it was made for (the same
    /// unique rows, each at its new owner; the slots follow them).
    fn reroute(&self, r: &Routing) -> Routing {
        let p = self.ps.len();
        let mut per_ps: Vec<(Vec<u32>, Vec<u64>)> = vec![(Vec::new(), Vec::new()); p];
        // Each (table, row) appears once in `r`, under one server.
        let moved: Vec<Vec<(u32, u32)>> = r
            .per_ps
            .iter()
            .map(|(tables, rows)| {
                tables
                    .iter()
                    .zip(rows)
                    .map(|(&t, &row)| {
                        let s = shard_of(t as usize, row, p as u32) as usize;
                        per_ps[s].0.push(t);
                        per_ps[s].1.push(row);
                        (s as u32, (per_ps[s].1.len() - 1) as u32)
                    })
                    .collect()
            })
            .collect();
        let slot = r
            .slot
            .iter()
            .map(|&(s, k)| moved[s as usize][k as usize])
            .collect();
        Routing {
            per_ps,
            slot,
            layout: self.layout,
            pool: r.pool.clone(),
        }
    }

    /// Pulls the batch's rows (and the dense parameters when stale) into place, waiting
    /// out the replacement of a failed PS and changes of the PS layout (the pull is done
    /// again by the new layout's routing).
    async fn pull(&mut self, routing: &Routing) -> anyhow::Result<()> {
        self.follow_layout()?;
        let mut refused_since = None;
        loop {
            let rerouted;
            let r = if routing.layout == self.layout {
                routing
            } else {
                rerouted = self.reroute(routing);
                &rerouted
            };
            match self.try_pull(r).await? {
                None => return Ok(()),
                Some(Refusal::Unreachable(i, status)) => self.await_replacement(i, &status).await?,
                Some(Refusal::Layout(i, status)) => {
                    let since = *refused_since.get_or_insert_with(Instant::now);
                    self.await_layout(i, &status, since).await?
                }
            }
        }
    }

    /// One pull attempt (`routing` is of the current layout); `Some` when a PS was
    /// unreachable or refused the layout.
    async fn try_pull(&mut self, routing: &Routing) -> anyhow::Result<Option<Refusal>> {
        let want_dense = self.need_dense || self.mode == SyncMode::Sync;
        let layout_version = self.layout;
        let calls = self
            .ps
            .iter()
            .zip(&routing.per_ps)
            .map(|(c, (tables, rows))| {
                let mut c = c.clone();
                let req = PullRequest {
                    version: rpc::version(),
                    tables: tables.clone(),
                    rows: rows.clone(),
                    want_dense,
                    layout_version,
                };
                async move { c.pull(req).await }
            });
        let replies = rpc::join_all(calls).await;
        let d = self.dim;
        let mut values = Vec::with_capacity(replies.len());
        let mut replies_ok = Vec::with_capacity(replies.len());
        for (i, r) in replies.into_iter().enumerate() {
            match r {
                Ok(r) => replies_ok.push(r.into_inner()),
                Err(s) if rpc::is_layout_refusal(&s) => return Ok(Some(Refusal::Layout(i, s))),
                Err(s) if is_transient(&s) => return Ok(Some(Refusal::Unreachable(i, s))),
                Err(s) => return Err(s).with_context(|| format!("pull from PS {i}")),
            }
        }
        for (i, r) in replies_ok.into_iter().enumerate() {
            anyhow::ensure!(
                r.values.len() == routing.per_ps[i].1.len() * d,
                "PS {i} returned {} values for {} rows",
                r.values.len(),
                routing.per_ps[i].1.len()
            );
            if want_dense {
                let range = self.slices[i].clone();
                anyhow::ensure!(
                    r.dense.len() == range.len(),
                    "PS {i} returned a wrong dense slice"
                );
                self.dense.params_mut()[range].copy_from_slice(&r.dense);
                self.versions[i] = r.dense_version;
            }
            values.push(r.values);
        }
        self.need_dense = false;
        match &routing.pool {
            None => {
                for (j, &(s, k)) in routing.slot.iter().enumerate() {
                    let src = &values[s as usize][k as usize * d..(k as usize + 1) * d];
                    self.emb[j * d..(j + 1) * d].copy_from_slice(src);
                }
            }
            Some(plan) => {
                // Each lookup's row, scaled, added to its bag's (or single id's) slot, or
                // laid out as a history for an attention unit, which pools it here.
                let slots = self.dense.config().num_tables;
                let emb = &mut self.emb[..plan.rows * slots * d];
                let layout = self.slots.as_ref().expect("a pooled routing has a layout");
                self.hist.resize(plan.history_len(layout, d), 0.0);
                plan.pool(d, emb, &mut self.hist, |j| {
                    let (s, k) = routing.slot[j];
                    &values[s as usize][k as usize * d..(k as usize + 1) * d]
                });
                self.lens.clone_from(&plan.lens);
                if !self.dense.attention().is_empty() {
                    self.dense
                        .attend(&self.hist, &self.lens, emb, &mut self.ws)?;
                }
            }
        }
        Ok(None)
    }

    /// Forward/backward on the pulled parameters; returns the loss.
    /// Forward and backward of one batch; `stream` says it came from a stream partition
    /// (an MTRM trains its adapt tower on those, its memory tower on history files).
    fn compute(&mut self, batch: &Batch, stream: bool) -> anyhow::Result<f32> {
        let n = batch.len();
        let emb = &self.emb[..n * self.dense.config().num_tables * self.dim];
        let tower = self.dense.tower_for(stream);
        let labels = elastrec_model::Labels {
            labels: &batch.labels,
            task_labels: &batch.task_labels,
            weights: &batch.weights,
        };
        self.loss_weight =
            (!batch.weights.is_empty()).then(|| batch.weights.iter().map(|&w| f64::from(w)).sum());
        let loss =
            self.dense
                .forward_backward_weighted(&batch.dense, emb, labels, tower, &mut self.ws)?;
        if !self.dense.attention().is_empty() {
            self.d_hist.resize(self.hist.len(), 0.0);
            self.dense.attend_backward(
                &self.hist,
                &self.lens,
                emb,
                &mut self.d_hist,
                &mut self.ws,
            )?;
        }
        Ok(loss)
    }

    /// The probabilities of the last [`Self::compute`], made with the parameters pulled
    /// before its update: what the model predicted for `batch` before training on it.
    /// A multi-task model's are every task's, row-major, task 0 first.
    fn predictions(&self, batch: &Batch) -> Predictions {
        let (n, tasks) = (batch.len(), self.dense.tasks());
        let mut probs = Vec::with_capacity(n * tasks);
        let mut labels = Vec::with_capacity(n * tasks);
        for r in 0..n {
            probs.extend((0..tasks).map(|t| sigmoid(self.ws.task_logits(t)[r])));
            let row = std::iter::once(&batch.labels[r]).chain(batch.task_labels_row(r));
            labels.extend(row.map(|&y| u8::from(y > 0.5)));
        }
        Predictions {
            probs,
            labels,
            tasks: tasks as u32,
            weights: batch.weights.clone(),
        }
    }

    /// The push of `part` to PS `j` of the current layout: the whole dense slice in the
    /// plain form (one optimizer step), other ranges as spans. A part re-split after a
    /// re-sharding (`resplit`) is always sent as spans: the rest of a step the new server
    /// counted already (its step count is the largest of the old servers').
    #[allow(clippy::too_many_arguments)]
    fn push_request(
        &self,
        j: usize,
        part: &PushPart,
        resplit: bool,
        dense_grad: &[f32],
        contributors: u32,
        batch: BatchKey,
        samples: u32,
    ) -> PushRequest {
        let whole = !resplit && part.dense.len() == 1 && part.dense[0] == self.slices[j];
        let (dense_grad, dense_spans) = if whole || part.dense.is_empty() {
            let slice = part.dense.first().cloned().unwrap_or_default();
            (dense_grad[slice].to_vec(), Vec::new())
        } else {
            let values = part.dense.iter().flat_map(|r| &dense_grad[r.clone()]);
            let spans = part.dense.iter().map(|r| DenseSpan {
                start: r.start as u64,
                len: r.len() as u64,
            });
            (values.copied().collect(), spans.collect())
        };
        PushRequest {
            version: rpc::version(),
            worker_id: self.worker_id,
            tables: part.tables.clone(),
            rows: part.rows.clone(),
            grads: part.grads.clone(),
            dense_grad,
            base_version: self.versions[j],
            step: self.versions[j],
            contributors,
            batch: Some(batch),
            samples,
            layout_version: self.layout,
            dense_spans,
            lr_scale: self.lr_scale,
            loss_weight: self.loss_weight,
        }
    }

    /// Pushes the gradients of `batch` to every PS; returns once all accepted them. A PS
    /// that failed is retried alone once replaced (the others applied their part). When
    /// servers refuse the layout (re-sharding), only the parts they refused are split by
    /// the new layout and sent to the new owners: the accepted parts moved with the state.
    async fn push(
        &mut self,
        routing: &Routing,
        contributors: u32,
        batch: BatchKey,
        samples: u32,
    ) -> anyhow::Result<()> {
        self.follow_layout()?;
        let rerouted;
        let routing = if routing.layout == self.layout {
            routing
        } else {
            rerouted = self.reroute(routing);
            &rerouted
        };
        let d = self.dim;
        let d_emb = self.ws.d_emb();
        let mut grads: Vec<Vec<f32>> = routing
            .per_ps
            .iter()
            .map(|(_, rows)| vec![0.0; rows.len() * d])
            .collect();
        for (j, &(s, k)) in routing.slot.iter().enumerate() {
            let dst = &mut grads[s as usize][k as usize * d..(k as usize + 1) * d];
            match &routing.pool {
                None => {
                    for (a, g) in dst.iter_mut().zip(&d_emb[j * d..(j + 1) * d]) {
                        *a += g;
                    }
                }
                Some(plan) => plan.add_grad(j, d, d_emb, &self.d_hist, dst),
            }
        }
        // What each server of the current layout has not accepted yet (`None`: accepted).
        let mut parts: Vec<Option<PushPart>> = routing
            .per_ps
            .iter()
            .zip(grads)
            .zip(&self.slices)
            .map(|(((tables, rows), grads), slice)| {
                Some(PushPart {
                    tables: tables.clone(),
                    rows: rows.clone(),
                    grads,
                    dense: vec![slice.clone()],
                })
            })
            .collect();
        let (first_layout, mut parts_layout) = (self.layout, self.layout);
        let mut refused_since = None;
        loop {
            let dense_grad = self.ws.grads();
            let pending: Vec<usize> = (0..parts.len()).filter(|&i| parts[i].is_some()).collect();
            let calls = pending.iter().map(|&i| {
                let mut c = self.ps[i].clone();
                let part = parts[i].as_ref().expect("pending");
                let resplit = parts_layout != first_layout;
                let req =
                    self.push_request(i, part, resplit, dense_grad, contributors, batch, samples);
                async move { c.push(req).await }
            });
            let replies = rpc::join_all(calls).await;
            let mut refusal = None;
            for (&i, r) in pending.iter().zip(replies) {
                match r {
                    Ok(r) => {
                        parts[i] = None;
                        let v = r.into_inner().dense_version;
                        if v.saturating_sub(self.versions[i]) > self.staleness {
                            self.need_dense = true;
                        }
                    }
                    Err(s) if rpc::is_layout_refusal(&s) => {
                        if !matches!(refusal, Some(Refusal::Layout(..))) {
                            refusal = Some(Refusal::Layout(i, s));
                        }
                    }
                    Err(s) if is_transient(&s) => {
                        refusal.get_or_insert(Refusal::Unreachable(i, s));
                    }
                    Err(s) => return Err(s).with_context(|| format!("push to PS {i}")),
                }
            }
            match refusal {
                None => return Ok(()),
                Some(Refusal::Layout(i, s)) => {
                    let since = *refused_since.get_or_insert_with(Instant::now);
                    self.await_layout(i, &s, since).await?;
                }
                Some(Refusal::Unreachable(i, s)) => self.await_replacement(i, &s).await?,
            }
            if self.layout != parts_layout {
                let left = parts.into_iter().flatten();
                parts = split_parts(left, &self.slices, d)
                    .into_iter()
                    .map(|p| (!p.is_empty()).then_some(p))
                    .collect();
                parts_layout = self.layout;
            }
        }
    }

    /// Forward-only evaluation over in-memory batches: one accumulator per task, task 0
    /// first.
    async fn evaluate(
        &mut self,
        batches: &[Batch],
        user: Option<usize>,
    ) -> anyhow::Result<Vec<EvalAccumulator>> {
        self.need_dense = true;
        let tasks = self.dense.tasks();
        let mut accs: Vec<EvalAccumulator> = (0..tasks).map(|_| EvalAccumulator::new()).collect();
        let mut probs = Vec::new();
        for b in batches {
            self.follow_layout()?;
            let routing = self.route(b)?;
            self.pull(&routing).await?;
            let n = b.len();
            probs.resize(n * tasks, 0.0);
            let emb = &self.emb[..n * self.dense.config().num_tables * self.dim];
            self.dense
                .predict_tasks(&b.dense, emb, &mut self.ws, &mut probs)?;
            crate::step::push_task_figures(&mut accs, &probs, b, user);
        }
        Ok(accs)
    }
}

/// What the model predicted for a batch before training on it (progressive validation of
/// online jobs; empty for other jobs).
#[derive(Default)]
struct Predictions {
    /// `samples × tasks`, row-major.
    probs: Vec<f32>,
    labels: Vec<u8>,
    tasks: u32,
    /// Each sample's weight; empty: 1 each.
    weights: Vec<f32>,
}

/// Reports progress, retrying while the master is unreachable (e.g. restarting).
/// Returns `(task_done, stop, lr_scale)` (`lr_scale` 0: no schedule).
async fn report(
    master: &mut Master,
    id: u32,
    task: u64,
    offset: u64,
    predicted: Predictions,
) -> anyhow::Result<(bool, bool, f32)> {
    let req = ReportProgressRequest {
        version: rpc::version(),
        node_id: id,
        task_id: task,
        offset,
        predicted: predicted.probs,
        labels: predicted.labels,
        tasks: predicted.tasks,
        weights: predicted.weights,
    };
    let r = rpc::retry_transient(Some(Duration::from_secs(300)), || {
        let (mut m, req) = (master.clone(), req.clone());
        async move { m.report_progress(req).await }
    })
    .await;
    match r {
        Ok(r) => {
            let r = r.into_inner();
            Ok((r.task_done, r.stop, r.lr_scale))
        }
        Err(s) if s.code() == Code::NotFound || s.code() == Code::FailedPrecondition => {
            eprintln!("worker {id}: master refused progress ({s}); exiting");
            std::process::exit(3);
        }
        Err(s) => bail!("report progress: {s}"),
    }
}

/// The evaluation the master asked for at the job's end: the model as the PS hold it,
/// judged on the job's evaluation files, reported per task.
async fn evaluate_and_report(
    job: &JobConfig,
    model: &mut RemoteModel,
    master: &Master,
    id: u32,
) -> anyhow::Result<()> {
    let mut stats = elastrec_data::ReadStats::default();
    let batches = crate::trainer::load_eval_set(&job.eval_files(), job, &mut stats)?;
    let accs = model.evaluate(&batches, job.data.user_slot()).await?;
    let results: Vec<_> = accs.iter().map(EvalAccumulator::result).collect();
    let (first, rest) = (results[0], &results[1..]);
    let nan = |v: Option<f64>| v.unwrap_or(f64::NAN);
    let req = ReportEvalRequest {
        version: rpc::version(),
        node_id: id,
        auc: first.auc,
        logloss: first.logloss,
        samples: first.samples,
        ne: nan(first.ne),
        calibration: nan(first.calibration),
        task_auc: rest.iter().map(|r| r.auc).collect(),
        task_logloss: rest.iter().map(|r| r.logloss).collect(),
        task_ne: rest.iter().map(|r| nan(r.ne)).collect(),
        task_calibration: rest.iter().map(|r| nan(r.calibration)).collect(),
        gauc: nan(first.gauc),
        task_gauc: rest.iter().map(|r| nan(r.gauc)).collect(),
    };
    rpc::retry_transient(None, || {
        let (mut m, req) = (master.clone(), req.clone());
        async move { m.report_eval(req).await }
    })
    .await
    .map_err(|s| anyhow::anyhow!("report eval: {s}"))?;
    Ok(())
}

/// The worker process.
pub async fn run_worker(args: WorkerArgs) -> anyhow::Result<()> {
    let token = rpc::token_from_env()?;
    elastrec_rpc::tls::install_from_env()?;
    let id = args.node_id;
    let mut master = rpc::master_client(&args.master, &token, 64 << 20)?;
    // The job says where to bind; registering again with the endpoint's address also
    // waits for the parameter servers.
    let (job, _, _, _) = register(&mut master, Role::Worker, id, "", "", false).await?;
    let ip = elastrec_job::resources::bind_address(&job).map_err(anyhow::Error::msg)?;
    let metrics = Arc::new(WorkerMetrics::new(id));
    let m = metrics.clone();
    let port = job
        .cluster
        .node_metrics_port(id)
        .map_err(anyhow::Error::msg)?;
    let endpoint =
        elastrec_metrics::serve(std::net::SocketAddr::new(ip, port), &token, move || {
            m.render()
        })
        .await
        .with_context(|| format!("binding the metrics endpoint (port {port})"))?;
    let metrics_addr = elastrec_job::resources::advertise_for(&job.engine, endpoint.addr())
        .map_err(anyhow::Error::msg)?;
    eprintln!("worker {id}: metrics on http://{metrics_addr}/metrics");
    let reg = register_node(&mut master, Role::Worker, id, "", &metrics_addr, true).await?;
    let hb_ms = reg.heartbeat_ms;
    let layout = PsLayout {
        version: reg.layout_version,
        addrs: reg.ps_addrs,
    };
    let max = job.cluster.max_message_bytes;
    let mut master = rpc::master_client(&args.master, &token, max)?;
    let shared = Arc::new(Shared::default());
    shared.executors.set_credentials(&token, max);
    *shared.ps_layout.lock() = layout.clone();
    *shared.last_ack.lock() = Some(Instant::now());
    // On a thread of their own (`rpc::beats`): training, reading and pushing keep this
    // runtime busy, and the master must hear from the worker all the same.
    let beat_shared = shared.clone();
    let _beats = rpc::beats::spawn(
        "heartbeats",
        &args.master,
        &token,
        Duration::from_millis(hb_ms),
        move |mut m, seq| {
            let req = heartbeat_request(id, &beat_shared);
            let shared = beat_shared.clone();
            async move {
                let r = m.heartbeat(req).await;
                apply_heartbeat_reply(r, seq, id, &shared);
            }
        },
    )?;
    // The master declares a node dead after `dead_after_ms` of silence; stop pushing well
    // before that so a worker it gave up on never trains reassigned samples.
    let lease = job.cluster.lease(hb_ms);
    let mut model = RemoteModel::new(&job, layout, token.clone(), shared.clone(), id)?;
    let batch_size = job.train.batch_size;
    let files = TaskFiles::of_blocking(&job).await?;
    // Compiled once: every task's reader runs it.
    let plan = elastrec_job::prepare::feature_plan(&job)?;
    // An online job's consumer, made on its first task.
    let mut stream: Option<elastrec_stream::StreamInput> = None;
    let mut batch = Batch::with_capacity(batch_size);
    let mut exit_after_push = fail_point_exit_after_push(id);
    let slow_batch = fail_point_slow_batch(id);
    let mut trace = RowTrace::open(id)?;
    let tasks = job.model.tasks();
    // Online jobs judge the stream (`stream.eval_window`); batch jobs every batch
    // (`train.progressive_window`).
    let progressive = match &job.stream {
        Some(s) => s.eval_window > 0,
        None => job.train.progressive_window > 0,
    };
    let mut predicted = Predictions::default();
    shared
        .active_workers
        .store(job.cluster.workers, Ordering::Relaxed);
    loop {
        let req = GetTaskRequest {
            version: rpc::version(),
            node_id: id,
        };
        let t_ask = Instant::now();
        let reply = match rpc::retry_transient(None, || {
            let mut m = master.clone();
            async move { m.get_task(req).await }
        })
        .await
        {
            Ok(r) => r.into_inner().reply,
            Err(s) => {
                eprintln!("worker {id}: get-task refused: {s}; exiting");
                return Ok(());
            }
        };
        let task = match reply {
            Some(Reply::Task(t)) => t,
            Some(Reply::WaitMs(ms)) => {
                metrics.get_task_waits.inc();
                tokio::time::sleep(Duration::from_millis(ms.clamp(10, 2000) as u64)).await;
                TimeSplit::add(&shared.profile.master_us, t_ask);
                continue;
            }
            Some(Reply::Finished(f)) => {
                let served = shared.executors.served.load(Ordering::Relaxed);
                if served > 0 {
                    eprintln!("worker {id}: {served} samples came through the data executors");
                }
                if f.evaluate {
                    evaluate_and_report(&job, &mut model, &master, id).await?;
                }
                return Ok(());
            }
            Some(Reply::Stop(_)) | None => return Ok(()),
        };
        TimeSplit::add(&shared.profile.master_us, t_ask);
        let split = task_split(&task)?;
        let (held, start) = (split.len(), split.range.start);
        let mut offset = task.offset;
        let (file_index, mut reader) = open_split(
            &job,
            &files,
            plan.as_ref(),
            &shared.executors,
            &mut stream,
            &split,
            task.source_index,
            start + offset,
            id,
        )
        .with_context(|| format!("task {}", task.task_id))?;
        let file = split.source.to_string();
        // Progressive validation judges the model on the stream only, not on the history
        // a mixture job also trains.
        let from_stream = split.is_stream();
        let validate = progressive && (from_stream || job.stream.is_none());
        shared.task.store(task.task_id, Ordering::Relaxed);
        metrics.task.set(task.task_id as i64);
        shared.offset.store(offset, Ordering::Relaxed);
        let mut skipped_before = reader.stats().rows_skipped;
        while offset < held {
            // A stream reader may wait on its broker: off the runtime's async threads.
            let rows = local_batch_size(&job, &shared);
            let t0 = Instant::now();
            let n = tokio::task::block_in_place(|| reader.next_batch(&mut batch, rows))?;
            batch.check_tasks(tasks, Path::new(&file))?;
            TimeSplit::add(&shared.profile.read_us, t0);
            let skipped = reader.stats().rows_skipped - skipped_before;
            skipped_before = reader.stats().rows_skipped;
            // Files count rows; a stream counts offsets (whole messages delivered).
            let physical = match reader.position() {
                Some(at) => at.saturating_sub(start + offset),
                None => n as u64 + skipped,
            };
            if n == 0 && physical == 0 {
                bail!("{} ended before row {}", file, start + offset);
            }
            if n > 0 {
                if let Some(pause) = slow_batch {
                    // A slow machine: every sample takes longer, counted as compute
                    // (the master measures capacity from busy time). Per sample, so that
                    // the small tasks of a quiet stream are not charged a whole batch.
                    let t0 = Instant::now();
                    let full = job.train.batch_size.max(1) as f64;
                    tokio::time::sleep(pause.mul_f64(n as f64 / full)).await;
                    TimeSplit::add(&shared.profile.compute_us, t0);
                }
                let routing = model.route(&batch)?;
                let t0 = Instant::now();
                model.pull(&routing).await?;
                metrics.pull_latency.observe(t0.elapsed().as_secs_f64());
                TimeSplit::add(&shared.profile.pull_us, t0);
                let t0 = Instant::now();
                let loss = tokio::task::block_in_place(|| model.compute(&batch, from_stream))?;
                if validate {
                    predicted = model.predictions(&batch);
                }
                TimeSplit::add(&shared.profile.compute_us, t0);
                if !loss.is_finite() {
                    bail!("training diverged (loss {loss})");
                }
                while !shared.lease_ok(lease) {
                    // No recent word from the master: it may have given our task away.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let contributors = shared.active_workers.load(Ordering::Relaxed).max(1);
                let key = BatchKey {
                    epoch: task.epoch,
                    file: file_index,
                    start_row: start + offset,
                };
                let t0 = Instant::now();
                model.push(&routing, contributors, key, n as u32).await?;
                metrics.push_latency.observe(t0.elapsed().as_secs_f64());
                TimeSplit::add(&shared.profile.push_us, t0);
                if let Some(left) = exit_after_push.as_mut() {
                    *left -= 1;
                    if *left == 0 {
                        eprintln!(
                            "worker {id}: fail point: exiting after a push, before its report"
                        );
                        std::process::exit(86);
                    }
                }
            }
            offset += physical;
            let t0 = Instant::now();
            let predictions = std::mem::take(&mut predicted);
            let (_, stop, lr_scale) =
                report(&mut master, id, task.task_id, offset, predictions).await?;
            if lr_scale > 0.0 {
                model.lr_scale = lr_scale;
            }
            TimeSplit::add(&shared.profile.master_us, t0);
            if let Some(trace) = trace.as_mut() {
                trace.record(&task, &batch)?;
            }
            if n > 0 {
                shared.profile.batches.fetch_add(1, Ordering::Relaxed);
                shared
                    .profile
                    .samples
                    .fetch_add(n as u64, Ordering::Relaxed);
            }
            shared.offset.store(offset, Ordering::Relaxed);
            shared.samples.fetch_add(n as u64, Ordering::Relaxed);
            shared.steps.fetch_add(1, Ordering::Relaxed);
            if n > 0 {
                metrics.samples.inc_by(n as u64);
                metrics.batches.inc();
            }
            if stop {
                eprintln!("worker {id}: scaled away after reporting offset {offset}; exiting");
                return Ok(());
            }
        }
        shared.task.store(0, Ordering::Relaxed);
        metrics.task.set(0);
    }
}

/// Rows of this worker's next batch. Asynchronous: `train.batch_size`. Synchronous: the
/// job's batch is the global one, shared by the workers that train this step, so a step
/// applies the mean gradient of `batch_size` samples, as the single-process trainer does.
fn local_batch_size(job: &JobConfig, shared: &Shared) -> usize {
    let batch = job.train.batch_size;
    match job.cluster.mode {
        SyncMode::Async => batch,
        SyncMode::Sync => {
            let workers = shared.active_workers.load(Ordering::Relaxed).max(1) as usize;
            batch.div_ceil(workers)
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
            };
            self.pulls.lock().push(r);
            Ok(Response::new(reply))
        }

        async fn push(&self, r: Request<PushRequest>) -> Result<Response<PushResponse>, Status> {
            self.pushes.lock().push(r.into_inner());
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
