//! What the gRPC handlers and the master's loops share: the [`Job`] state machine under
//! one lock, the group-commit writer, the backend, and the job's live figures.
//!
//! Every mutation goes through [`MasterCore::run`]: it changes the state under the lock,
//! queues the resulting changes to the writer (in mutation order), and returns only once
//! they are durable; then it performs the side effects (launches, kills, events). A call
//! that changed nothing still returns only once the queued changes its result rests on are
//! durable (for a heartbeat: node rows and the phase, rarely pending).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use elastrec_job::split::Source;
use elastrec_proto::master::{self as pb, NodeStatus, RestorePlan, StatusResponse};
use parking_lot::Mutex;

use crate::backend::ClusterBackend;
use crate::error::MasterError;
use crate::events::event;
use crate::job::{Change, Context, Event, Job, Node, Phase, Role};
use crate::metrics::Metrics;
use crate::store::{Barrier, Depends, Writer};

/// How long a `/metrics` scrape waits for the job's lock to refresh the gauges.
pub const SCRAPE_WAIT: Duration = Duration::from_millis(200);

/// Wall-clock milliseconds since the Unix epoch: only for times shown to people or
/// compared across processes (checkpoint manifests, recovery records), never for timeouts.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub use elastrec_common::clock::monotonic_ms;

/// Side effects collected while the state lock is held, executed after it is released.
#[derive(Default)]
pub struct LiveCtx {
    now: u64,
    changes: Vec<Change>,
    launches: Vec<Node>,
    kills: Vec<Node>,
    events: Vec<Event>,
    probes: Vec<Node>,
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
    fn probe(&mut self, node: &Node) {
        self.probes.push(node.clone());
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
    /// The job's data sources by index: its training files, then its stream's partitions
    /// (a following job's list grows as partitions land).
    pub sources: parking_lot::RwLock<Vec<Source>>,
    pub(crate) heartbeat_ms: u32,
    /// Prometheus metrics.
    pub metrics: Metrics,
    /// Job id.
    pub job_id: String,
    /// Nodes whose launch failed (fed back as exits by the control loop).
    failed_launches: Mutex<Vec<u32>>,
    /// Suspected nodes the control loop is to probe (`crate::probe`).
    probes_due: Mutex<Vec<Node>>,
    /// (time, samples done) samples for the recent rate.
    rate: Mutex<VecDeque<(Instant, u64)>>,
    /// Set when the job reached a terminal phase.
    pub done: tokio::sync::Notify,
    /// What a (re)started PS loads (the last checkpoint at the time of the recovery).
    pub(crate) restore_plan: Mutex<Option<RestorePlan>>,
    /// The checkpoint coordinator, when checkpoints are enabled.
    checkpoints: std::sync::OnceLock<Arc<crate::checkpoint::Coordinator>>,
    /// The latest heartbeat profile of every node (CPU, memory, time split).
    pub profiles: Mutex<std::collections::BTreeMap<u32, elastrec_proto::master::NodeProfile>>,
    /// The autoscaler's state, refreshed by its loop (absent: autoscaling off).
    pub autoscale_status: Mutex<Option<elastrec_proto::master::AutoscaleStatus>>,
    /// How the master calls parameter servers (re-sharding).
    pub ps_access: std::sync::OnceLock<crate::reshard::PsAccess>,
    /// How the backend starts nodes (its sizes grow after an out-of-memory kill).
    pub launch: std::sync::OnceLock<Arc<crate::launch::LaunchTemplate>>,
    /// Changes of the PS count so far.
    pub reshards: Mutex<Vec<crate::reshard::ReshardRecord>>,
    /// An online job's stream statistics (lag, SLO), refreshed by its watcher.
    pub stream_stats: Mutex<Option<crate::stream_stats::StreamStats>>,
    /// A following job's view of its datasets, refreshed by its watcher.
    pub follow_status: Mutex<Option<elastrec_proto::master::DatasetsStatus>>,
    /// The serving buffers' names: the history's sources, then the stream
    /// (`elastrec_job::mix::source_names`); set at start and resume.
    pub source_names: std::sync::OnceLock<Vec<String>>,
    /// An online job's scaling decisions so far.
    pub online_scaling: Mutex<Vec<crate::online_scale_loop::ScalingEvent>>,
    /// A resumed online job's traffic history as the previous master persisted it (JSON of
    /// `elastrec_brain::traffic::TrafficHistory`): its forecaster goes on with it.
    pub resumed_traffic: std::sync::OnceLock<String>,
    /// An online job's progressive validation (predictions the workers made before
    /// training), when `stream.eval_window` is not 0.
    pub progressive: Mutex<Option<crate::progressive::ProgressiveEval>>,
    /// `[optimizer.schedule]` of a batch job and its epochs: each progress reply carries
    /// the multiplier at the samples trained so far (unset: constant rates).
    pub lr_schedule: std::sync::OnceLock<(elastrec_model::LrSchedule, u32)>,
    /// The last multiplier sent (f32 bits), for the status and the result.
    pub lr_scale_sent: std::sync::atomic::AtomicU32,
    /// While set, parameter servers stay up after the job finished: its final model is
    /// checkpointed from them before they are told to stop.
    pub keep_ps: std::sync::atomic::AtomicBool,
    /// Nodes killed for their memory (by the engine or the memory watchdog): a job that
    /// then fails ran out of memory, which its brain records as such.
    pub memory_kills: std::sync::atomic::AtomicU32,
    /// The job's TensorBoard event file in its directory, once the job serves.
    pub board: std::sync::OnceLock<Mutex<elastrec_metrics::tensorboard::EventWriter>>,
}

impl MasterCore {
    /// Appends scalars at `samples` trained to the job's TensorBoard event file (a
    /// no-op before it is open). A failed write is said once and costs only the file.
    pub fn board_scalars(&self, samples: u64, values: &[(&str, f64)]) {
        static SAID: std::sync::Once = std::sync::Once::new();
        if let Some(board) = self.board.get() {
            let mut board = board.lock();
            if let Err(e) = board.scalars(samples, values) {
                let path = board.path().display().to_string();
                SAID.call_once(|| {
                    eprintln!("master: writing TensorBoard events to {path} failed: {e}")
                });
            }
        }
    }

    /// Wires the state machine to its writer and backend.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        job: Job,
        writer: Writer,
        backend: Arc<dyn ClusterBackend>,
        job_toml: String,
        sources: Vec<Source>,
        heartbeat_ms: u32,
        job_id: String,
    ) -> Self {
        Self {
            job: Mutex::new(job),
            writer,
            backend,
            job_toml,
            sources: parking_lot::RwLock::new(sources),
            heartbeat_ms,
            metrics: Metrics::new(),
            job_id,
            failed_launches: Mutex::new(Vec::new()),
            probes_due: Mutex::new(Vec::new()),
            rate: Mutex::new(VecDeque::new()),
            done: tokio::sync::Notify::new(),
            restore_plan: Mutex::new(None),
            checkpoints: std::sync::OnceLock::new(),
            stream_stats: Mutex::new(None),
            follow_status: Mutex::new(None),
            source_names: std::sync::OnceLock::new(),
            online_scaling: Mutex::new(Vec::new()),
            resumed_traffic: std::sync::OnceLock::new(),
            progressive: Mutex::new(None),
            lr_schedule: std::sync::OnceLock::new(),
            lr_scale_sent: std::sync::atomic::AtomicU32::new(0),
            profiles: Mutex::new(Default::default()),
            autoscale_status: Mutex::new(None),
            ps_access: std::sync::OnceLock::new(),
            launch: std::sync::OnceLock::new(),
            reshards: Mutex::new(Vec::new()),
            keep_ps: std::sync::atomic::AtomicBool::new(false),
            memory_kills: std::sync::atomic::AtomicU32::new(0),
            board: std::sync::OnceLock::new(),
        }
    }

    /// Makes changes that do not touch the state machine durable (e.g. statistics).
    pub async fn persist(&self, changes: Vec<Change>) -> Result<(), MasterError> {
        Ok(self.writer.submit(changes).await?)
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
    pub async fn run<R>(
        &self,
        f: impl FnOnce(&mut Job, &mut LiveCtx) -> R,
    ) -> Result<R, MasterError> {
        self.run_depending(Depends::All, f).await
    }

    /// [`MasterCore::run`] for a read whose result depends only on what `depends` names.
    pub(crate) async fn run_depending<R>(
        &self,
        depends: Depends,
        f: impl FnOnce(&mut Job, &mut LiveCtx) -> R,
    ) -> Result<R, MasterError> {
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
        }?;
        self.effects(cx);
        Ok(r)
    }

    /// Runs the state machine with a context whose effects are executed immediately (used
    /// once, before serving, to launch the initial nodes).
    pub fn effects(&self, cx: LiveCtx) {
        self.probes_due.lock().extend(cx.probes);
        for n in &cx.kills {
            self.backend.stop(n);
        }
        for n in &cx.launches {
            match self.backend.start(n) {
                Ok(pid) => tracing::info!(node = n.id, role = ?n.role, pid, "launched"),
                Err(e) => {
                    event!(
                        warn,
                        "launch_failed",
                        node = n.id,
                        role = ?n.role,
                        error = %format!("{e:#}",
                    ),
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
                    event!(
                        "epoch_closed",
                        epoch = *epoch,
                        consumed = s.consumed,
                        duplicated = s.duplicated,
                        missing = s.missing,
                        "epoch {epoch}: {s}"
                    );
                }
                Event::NodeDead { id, role, reason } => {
                    event!(
                        warn,
                        "node_dead",
                        node = *id,
                        role = ?role,
                        reason = %reason,
                        "master: node {id} ({role:?}) declared dead: {reason}",
                    );
                    self.metrics.node_deaths.inc();
                }
                Event::NodeSuspected {
                    id,
                    role,
                    silent_ms,
                } => {
                    event!(
                        warn,
                        "node_suspected",
                        node = *id,
                        role = ?role,
                        silent_ms = *silent_ms,
                        "master: node {id} ({role:?}) sent nothing for {silent_ms} ms; probing it directly",
                    );
                }
                Event::ProbeAnswered {
                    id,
                    role,
                    silent_ms,
                } => {
                    event!(
                        "probe_answered",
                        node = *id,
                        role = ?role,
                        silent_ms = *silent_ms,
                        "master: node {id} ({role:?}) answered its probe after {silent_ms} ms of silence: alive, kept",
                    );
                    self.metrics.probe_saves.inc();
                }
                Event::Requeued { worker, task } => {
                    tracing::info!(worker, task, "unreported remainder requeued");
                    self.metrics.requeues.inc();
                }
                Event::PsFailed(f) => {
                    event!(
                        warn,
                        "ps_failed",
                        ps = f.index,
                        node = f.node,
                        reason = %f.reason,
                        samples = f.samples,
                        "master: parameter server {} (node {}) failed ({}) at {} samples; recovering",
                        f.index, f.node, f.reason, f.samples
                    );
                }
                Event::Straggler { id, slow } => {
                    if *slow {
                        event!("straggler", worker = *id, slow = true,
                            "master: worker {id} is a straggler (below the straggler ratio of its peers' median rate): half-size shards"
                        );
                    } else {
                        event!(
                            "straggler",
                            worker = *id,
                            slow = false,
                            "master: worker {id} caught up: full-size shards again"
                        );
                    }
                }
                Event::JobEnded(_) => self.done.notify_one(),
            }
        }
    }

    /// Suspected nodes to probe since the last call.
    pub fn take_probes(&self) -> Vec<Node> {
        std::mem::take(&mut *self.probes_due.lock())
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

    /// An online job's part of the status: its stream statistics, the latest
    /// progressive-validation window and the last scaling decision.
    fn stream_status(&self) -> Option<elastrec_proto::master::StreamStatus> {
        // One lock at a time, as before: the stream's statistics are read last.
        let latest = self.progressive.lock().as_ref().and_then(|p| p.latest());
        let decision = self.online_scaling.lock().last().cloned();
        let stats = self.stream_stats.lock();
        Some(crate::wire::stream_message(
            stats.as_ref()?,
            latest.as_ref(),
            decision.as_ref(),
        ))
    }

    /// The status reply (also used by the progress display).
    pub fn status(&self) -> StatusResponse {
        self.status_within(None).expect("waits for the job's lock")
    }

    /// The `/metrics` exposition. The gauges the status feeds are refreshed first, unless
    /// the job's state stays locked past [`SCRAPE_WAIT`]: the scrape then serves those of
    /// the previous refresh and counts a stale scrape, rather than answer late (a scraper
    /// gives up after its timeout and marks the node down).
    pub fn scrape(&self) -> String {
        if self.status_within(Some(SCRAPE_WAIT)).is_none() {
            self.metrics.stale_scrapes.inc();
        }
        self.metrics.render()
    }

    /// [`MasterCore::status`], waiting at most `wait` for the job's lock (`None`: as long
    /// as it takes).
    fn status_within(&self, wait: Option<Duration>) -> Option<StatusResponse> {
        let now = monotonic_ms();
        // Before the job's lock: the stream's own locks are never taken inside it here.
        let stream = self.stream_status();
        let progressive = if stream.is_none() {
            self.progressive
                .lock()
                .as_ref()
                .and_then(|p| p.latest())
                .map(|f| crate::wire::window_message(&f))
        } else {
            None
        };
        let job = match wait {
            None => self.job.lock(),
            Some(wait) => self.job.try_lock_for(wait)?,
        };
        let q = job.tasks();
        let mix = self.mix_status(q);
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
                    Role::Executor => pb::Role::Executor as i32,
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
                step: n.step,
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
            reshards: self
                .reshards
                .lock()
                .iter()
                .map(crate::wire::reshard_message)
                .collect(),
            autoscale: self.autoscale_status.lock().clone(),
            datasets: self.follow_status.lock().clone(),
            stream,
            progressive,
            mix,
        };
        drop(job);
        let mut reply = reply;
        reply.checkpoint = self.checkpoints().map(|c| c.status(samples_done));
        reply.samples_per_sec = self.recent_rate(samples_done);
        self.metrics.observe(&reply);
        Some(reply)
    }
}

impl MasterCore {
    /// The serving buffers of a job with several (a mixture, or `[[data.source]]`): how
    /// they are served, and per source (by name) what waits and what was handed out.
    /// `None` for a job with one source.
    pub(crate) fn mix_status(
        &self,
        q: &crate::tasks::TaskQueue,
    ) -> Option<elastrec_proto::master::MixStatus> {
        if !q.is_mixture() && q.source_count() < 2 {
            return None;
        }
        let names = self.source_names.get()?;
        let queued = q.queued();
        let served = q.served();
        // The stream's buffer is last; a job without a stream does not show it.
        let shown = if q.is_stream() {
            names.len()
        } else {
            names.len() - 1
        };
        let mut status = elastrec_proto::master::MixStatus {
            serving: q.serving().to_string(),
            sources: names[..shown].to_vec(),
            ..Default::default()
        };
        for (b, name) in names.iter().enumerate().take(shown) {
            let s = served.get(b).copied().unwrap_or_default();
            let served = elastrec_proto::master::Served {
                tasks: s.tasks,
                rows: s.rows,
            };
            status
                .queued
                .insert(name.clone(), queued.get(b).copied().unwrap_or(0) as u64);
            status.served.insert(name.clone(), served);
        }
        Some(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::NoProcesses;
    use crate::job::Policy;
    use crate::store::MasterDb;
    use crate::tasks::{DataSharding, TaskQueue};

    async fn core(dir: &std::path::Path) -> MasterCore {
        let store = MasterDb::open(&dir.join("master.db"), true).await.unwrap();
        let sharding = DataSharding {
            rows_per_shard: 100,
            min_rows: 10,
            epochs: 1,
            seed: 1,
            shuffle: false,
            shuffle_rows: false,
        };
        let policy = Policy {
            num_ps: 0,
            dead_after_ms: 60_000,
            max_worker_restarts: 0,
            straggler_ratio: 0.5,
            evaluate: false,
            recover_ps: false,
            warmup_samples: 0,
            pin_partitions: false,
            executors: 0,
        };
        let mut cx = LiveCtx::now();
        let job = Job::start(policy, TaskQueue::new(sharding, vec![1000]), 1, &mut cx);
        store.apply(&cx.take_changes()).await.unwrap();
        let source = Source::File("day_0.tsv".into());
        let writer = Writer::spawn(store);
        MasterCore::new(
            job,
            writer,
            Arc::new(NoProcesses),
            String::new(),
            vec![source],
            500,
            "j".into(),
        )
    }

    fn series(text: &str, name: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    }

    #[tokio::test]
    async fn a_scrape_while_the_jobs_state_is_locked_serves_the_last_refresh_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let core = Arc::new(core(dir.path()).await);
        let fresh = core.scrape();
        assert_eq!(series(&fresh, "elastrec_master_stale_scrapes_total"), 0.0);
        let shards = "elastrec_master_shards{state=\"todo\"}";
        assert_eq!(series(&fresh, shards), 0.0, "{fresh}");

        // Another thread holds the job's lock until the scrape has answered.
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let holder = {
            let core = core.clone();
            std::thread::spawn(move || {
                let _job = core.job.lock();
                held_tx.send(()).unwrap();
                // Past this, a scrape that waits for the lock would get it: the stale
                // count below tells the two apart.
                let _ = done_rx.recv_timeout(std::time::Duration::from_secs(30));
            })
        };
        held_rx.recv().unwrap();
        let stale = core.scrape();
        done_tx.send(()).unwrap();
        holder.join().unwrap();
        assert_eq!(series(&stale, "elastrec_master_stale_scrapes_total"), 1.0);
        assert_eq!(series(&stale, shards), 0.0, "the previous refresh's gauges");
        // Once the lock is free, the next scrape refreshes again.
        let again = core.scrape();
        assert_eq!(series(&again, "elastrec_master_stale_scrapes_total"), 1.0);
    }
}
