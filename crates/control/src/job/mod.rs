//! The job master's state machine: node table, task queue, ledger, scaling and failure
//! policy. Side effects (clock, persistence, starting and stopping processes, log events)
//! go through [`Context`], so the same code runs live, in tests and in a simulator.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use elastrec_common::EvalResult;

use crate::ledger::{ConsumedRange, LedgerSummary};
use crate::tasks::{Assignment, DataPosition, Pin, ReportError, Reported, Task, TaskQueue};

mod liveness;
mod membership;
mod recorder;
mod reshard;
mod work;

pub use liveness::MAX_PROBE_SAVES;
pub use recorder::Recorder;

/// Parameter-server failures recovered over a job before it gives up (a PS that keeps
/// dying is not a transient failure).
pub const MAX_PS_RECOVERIES: u32 = 32;

/// Role of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// Parameter server.
    Ps,
    /// Training worker.
    Worker,
    /// Data executor (`cluster.executors`): reads and parses file tasks for the workers.
    Executor,
}

/// Life of a node as the master sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeState {
    /// Launched, not registered yet.
    Pending,
    /// Registered and heartbeating.
    Running,
    /// Asked to finish its batch and exit (scaled away).
    Stopping,
    /// Left normally.
    Exited,
    /// Declared dead (silent too long or its process died).
    Dead,
}

impl NodeState {
    /// Still expected to heartbeat.
    pub fn is_live(self) -> bool {
        matches!(
            self,
            NodeState::Pending | NodeState::Running | NodeState::Stopping
        )
    }
}

/// One row of the node table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// Unique, never reused.
    pub id: u32,
    /// PS or worker.
    pub role: Role,
    /// PS index (shard number); for workers the launch sequence number.
    pub index: u32,
    /// Life state.
    pub state: NodeState,
    /// OS process id (0 unknown).
    pub pid: u32,
    /// Served address (PS).
    pub addr: String,
    /// Address of its `/metrics` endpoint (empty until it registers one).
    #[serde(default)]
    pub metrics_addr: String,
    /// Last time the master heard from it (ms, master clock).
    pub last_seen_ms: u64,
    /// When it was launched (ms).
    pub started_ms: u64,
    /// Samples trained (workers) as last reported.
    pub samples: u64,
    /// Step (PS: dense version; worker: local steps).
    pub step: u64,
    /// Which relaunch this is (0 for an original node).
    pub restarts: u32,
}

impl Node {
    /// A node about to be launched: no process, address or progress yet.
    pub fn pending(id: u32, role: Role, index: u32) -> Self {
        Self {
            id,
            role,
            index,
            state: NodeState::Pending,
            pid: 0,
            addr: String::new(),
            metrics_addr: String::new(),
            last_seen_ms: 0,
            started_ms: 0,
            samples: 0,
            step: 0,
            restarts: 0,
        }
    }
}

/// Job-level settings of the state machine.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Number of parameter servers.
    pub num_ps: u32,
    /// A node silent this long is dead.
    pub dead_after_ms: u64,
    /// How many times dead workers are replaced over the job.
    pub max_worker_restarts: u32,
    /// A worker whose rate is below this fraction of its peers' median is a straggler.
    pub straggler_ratio: f64,
    /// Whether a final evaluation runs.
    pub evaluate: bool,
    /// A dead PS is recovered from checkpoints (otherwise it stops the job).
    pub recover_ps: bool,
    /// Until this many samples are reported, one worker trains alone (async warm-up).
    pub warmup_samples: u64,
    /// Each file (stream partition) goes only to one worker: the one ranked
    /// `file mod w` among the `w` running workers (`stream.assignment = "pinned"`).
    pub pin_partitions: bool,
    /// Data executors to keep running (`cluster.executors`).
    pub executors: u32,
}

/// An online job's queue is compacted once it holds this many done tasks (a day at
/// 20 tasks/s would otherwise keep 1.7 million of them in memory and in `master.db`).
pub const COMPACT_DONE_TASKS: u64 = 10_000;

/// The answer to a progress report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgressAck {
    /// The report finished the worker's task.
    pub task_done: bool,
    /// The worker is to stop (scaled away).
    pub stop: bool,
    /// Rows the report added to the ledger: 0 for a report already received (a retry
    /// after a lost reply), whose predictions must not be counted again either.
    pub new_rows: u64,
}

/// A parameter server that died and awaits recovery.
#[derive(Debug, Clone, PartialEq)]
pub struct PsFailure {
    /// PS index (shard).
    pub index: u32,
    /// The dead node.
    pub node: u32,
    /// Why it was declared dead.
    pub reason: String,
    /// Samples trained (ledger) when it died.
    pub samples: u64,
}

/// Where the job is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Phase {
    /// Training (or waiting for PS to come up).
    Training,
    /// Data done; one worker evaluates.
    Evaluating,
    /// Complete.
    Finished,
    /// Stopped by a failure.
    Failed(String),
}

/// Something worth a log line (and a metric).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// An epoch's ledger closed.
    EpochDone(u32, LedgerSummary),
    /// A node was declared dead.
    NodeDead {
        /// Node id.
        id: u32,
        /// Role.
        role: Role,
        /// Why.
        reason: String,
    },
    /// A node sent nothing for `dead_after_ms`: it is probed before any verdict.
    NodeSuspected {
        /// Node id.
        id: u32,
        /// Role.
        role: Role,
        /// How long it has been silent.
        silent_ms: u64,
    },
    /// A suspected node answered its probe: alive, and kept.
    ProbeAnswered {
        /// Node id.
        id: u32,
        /// Role.
        role: Role,
        /// How long it had been silent.
        silent_ms: u64,
    },
    /// A worker's remainder went back to the queue.
    Requeued {
        /// Worker.
        worker: u32,
        /// New task holding the remainder.
        task: u64,
    },
    /// A parameter server died; recovery follows.
    PsFailed(PsFailure),
    /// A worker became (or stopped being) a straggler: its shards are cut in half.
    Straggler {
        /// Worker node.
        id: u32,
        /// True when it is a straggler now.
        slow: bool,
    },
    /// The job reached a terminal phase.
    JobEnded(Phase),
}

/// One persisted change; applied to the database before the triggering reply is sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Insert or update a task row.
    Task(Task),
    /// Append a consumed range.
    Range(ConsumedRange),
    /// Insert or update a node row.
    Node(Node),
    /// Set a scalar (JSON text).
    Meta(&'static str, String),
    /// Replace every task and ledger range (a full recovery rewound the data position).
    ResetData(Vec<Task>, Vec<ConsumedRange>),
}

/// Side effects of the state machine.
pub trait Context {
    /// Milliseconds on the master's monotonic clock.
    fn now_ms(&self) -> u64;
    /// Records a change to persist before the current reply.
    fn persist(&mut self, change: Change);
    /// Starts a process for `node`.
    fn launch(&mut self, node: &Node);
    /// Stops `node`'s process (forcefully; used for dead or failed nodes).
    fn kill(&mut self, node: &Node);
    /// Reports an event (log line and metric).
    fn event(&mut self, event: Event);
    /// Probes `node` directly (its metrics endpoint); the answer comes back as
    /// [`Job::probe_answered`] or [`Job::probe_failed`].
    fn probe(&mut self, node: &Node);
}

/// Answer to a worker's heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Directive {
    /// Keep going.
    Continue,
    /// Finish the current batch, report, exit.
    Stop,
    /// Not a member (declared dead or never launched): exit without reporting.
    Unknown,
}

/// Answer to get-task.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskReply {
    /// Train it.
    Task(Task),
    /// Ask again later.
    Wait,
    /// Training over; evaluate when true.
    Finished {
        /// This worker runs the final evaluation.
        evaluate: bool,
    },
    /// Scaled away or unknown: exit.
    Stop,
}

/// Errors a caller can act on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JobError {
    /// The node id is not in the table (or is dead).
    #[error("node {0} is not a live member of this job")]
    UnknownNode(u32),
    /// A refused progress report.
    #[error(transparent)]
    Report(#[from] ReportError),
    /// The request does not fit the node's role.
    #[error("node {0} has the wrong role for this call")]
    WrongRole(u32),
}

/// The whole master state.
#[derive(Debug, Clone)]
pub struct Job {
    policy: Policy,
    tasks: TaskQueue,
    nodes: BTreeMap<u32, Node>,
    next_node: u32,
    /// The worker that trains alone during the async warm-up.
    warmup_worker: Option<u32>,
    target_workers: u32,
    restarts_used: u32,
    phase: Phase,
    evaluator: Option<u32>,
    eval: Option<EvalResult>,
    /// A multi-task model's final evaluation per task (empty for one task).
    task_evals: Vec<EvalResult>,
    epochs_closed: Vec<(u32, LedgerSummary)>,
    ps_failures: Vec<PsFailure>,
    ps_recoveries: u32,
    /// Workers currently handed half-size shards.
    stragglers: std::collections::BTreeSet<u32>,
    /// Recent training rate of each worker (not persisted: re-learned after a restart).
    rates: BTreeMap<u32, RecentRate>,
    /// Workers whose last request was answered "wait" (their rate is not measured).
    waiting: std::collections::BTreeSet<u32>,
    /// No task is handed out once this many samples are trained (`elastrec pause`).
    pause_at: Option<u64>,
    /// Version of the PS layout in force (0: the job's first; see `reshard`).
    layout_version: u64,
    /// A change of the PS count in progress.
    reshard: Option<Reshard>,
    /// Silent nodes being probed before a verdict (`liveness`).
    suspects: BTreeMap<u32, liveness::Suspect>,
}

/// A change of the PS layout in progress (the master's `reshard` protocol drives it).
#[derive(Debug, Clone, PartialEq)]
pub struct Reshard {
    /// The new layout's version and PS count.
    pub version: u64,
    /// See `version`.
    pub num_ps: u32,
    /// Node ids of the PS started for the new layout (indices from the old count up).
    pub joining: Vec<u32>,
}

/// A worker's recent rate: an exponential average over windows of at least
/// [`RecentRate::WINDOW_MS`], so that a worker that slows down is noticed within seconds
/// rather than diluted by its whole history.
#[derive(Debug, Clone, Copy, Default)]
struct RecentRate {
    samples: u64,
    at_ms: u64,
    ewma: Option<f64>,
}

impl RecentRate {
    const WINDOW_MS: u64 = 1000;
    const ALPHA: f64 = 0.5;

    fn observe(&mut self, samples: u64, now: u64) {
        let dt = now.saturating_sub(self.at_ms);
        if dt < Self::WINDOW_MS {
            return;
        }
        let rate = samples.saturating_sub(self.samples) as f64 * 1000.0 / dt as f64;
        self.ewma = Some(match self.ewma {
            Some(e) => Self::ALPHA * rate + (1.0 - Self::ALPHA) * e,
            None => rate,
        });
        self.restart(samples, now);
    }

    /// Starts a new window at `now` (the average so far is kept).
    fn restart(&mut self, samples: u64, now: u64) {
        self.samples = samples;
        self.at_ms = now;
    }
}

impl Job {
    /// A new job: launches the parameter servers and `workers` workers.
    pub fn start(policy: Policy, tasks: TaskQueue, workers: u32, cx: &mut impl Context) -> Self {
        let mut job = Self {
            policy,
            tasks,
            nodes: BTreeMap::new(),
            next_node: 1,
            warmup_worker: None,
            target_workers: workers,
            restarts_used: 0,
            phase: Phase::Training,
            evaluator: None,
            eval: None,
            task_evals: Vec::new(),
            epochs_closed: Vec::new(),
            ps_failures: Vec::new(),
            ps_recoveries: 0,
            stragglers: Default::default(),
            rates: BTreeMap::new(),
            waiting: Default::default(),
            pause_at: None,
            layout_version: 0,
            reshard: None,
            suspects: BTreeMap::new(),
        };
        for i in 0..job.policy.num_ps {
            job.launch(Role::Ps, i, 0, cx);
        }
        for _ in 0..workers {
            job.launch_worker(0, cx);
        }
        for i in 0..job.policy.executors {
            job.launch(Role::Executor, i, 0, cx);
        }
        job.persist_meta(cx);
        job
    }

    /// Rebuilds the master after a restart. Live nodes get a fresh grace period: they are
    /// expected to re-register (or at least heartbeat) within the dead-node timeout.
    #[allow(clippy::too_many_arguments)]
    pub fn restore(
        policy: Policy,
        tasks: TaskQueue,
        nodes: Vec<Node>,
        target_workers: u32,
        restarts_used: u32,
        phase: Phase,
        eval: Option<EvalResult>,
        epochs_closed: Vec<(u32, LedgerSummary)>,
        cx: &mut impl Context,
    ) -> Self {
        let now = cx.now_ms();
        let mut job = Self {
            policy,
            tasks,
            nodes: BTreeMap::new(),
            next_node: 1,
            warmup_worker: None,
            target_workers,
            restarts_used,
            phase,
            evaluator: None,
            eval,
            task_evals: Vec::new(),
            epochs_closed,
            ps_failures: Vec::new(),
            ps_recoveries: 0,
            stragglers: Default::default(),
            rates: BTreeMap::new(),
            waiting: Default::default(),
            pause_at: None,
            layout_version: 0,
            reshard: None,
            suspects: BTreeMap::new(),
        };
        for mut n in nodes {
            job.next_node = job.next_node.max(n.id + 1);
            // Times of the previous master's clock mean nothing on this one.
            n.last_seen_ms = now;
            n.started_ms = now;
            job.nodes.insert(n.id, n);
        }
        job
    }

    fn persist_meta(&self, cx: &mut impl Context) {
        cx.persist(Change::Meta(
            "target_workers",
            self.target_workers.to_string(),
        ));
        cx.persist(Change::Meta(
            "restarts_used",
            self.restarts_used.to_string(),
        ));
        cx.persist(Change::Meta(
            "generated_epochs",
            self.tasks.generated_epochs().to_string(),
        ));
        cx.persist(Change::Meta(
            "phase",
            serde_json::to_string(&self.phase).expect("phase serializes"),
        ));
        cx.persist(Change::Meta(
            "eval",
            serde_json::to_string(&self.eval).expect("eval serializes"),
        ));
        cx.persist(Change::Meta(
            "task_evals",
            serde_json::to_string(&self.task_evals).expect("evals serialize"),
        ));
        cx.persist(Change::Meta(
            "epochs_closed",
            serde_json::to_string(&self.epochs_closed).expect("serializes"),
        ));
    }

    /// An online job's partition `file` holds messages up to offset `high`: deals them
    /// into tasks (see [`TaskQueue::extend_stream`]). Returns the offsets dealt.
    pub fn extend_stream(
        &mut self,
        file: u32,
        high: u64,
        flush: bool,
        cx: &mut impl Context,
    ) -> u64 {
        if self.phase != Phase::Training {
            return 0;
        }
        let dealt = self.tasks.extend_stream(file, high, flush);
        if dealt > 0 {
            self.flush_tasks(cx);
        }
        dealt
    }

    /// New files (rows and `[[data.source]]` of each) of a following job, or of a list the
    /// master is still counting: appended to the queue and cut into tasks. Returns the index of the first, or `None` once the job left training.
    pub fn append_files(
        &mut self,
        rows: &[u64],
        sources: &[u32],
        cx: &mut impl Context,
    ) -> Option<u32> {
        if self.phase != Phase::Training {
            return None;
        }
        let first = self.tasks.append_files(rows, sources);
        self.flush_tasks(cx);
        Some(first)
    }

    /// No file will be appended any more (a following job's datasets are closed, or the
    /// list is counted): epoch 0 closes once done, and training ends once the queue is.
    pub fn stop_growing(&mut self, cx: &mut impl Context) {
        if self.phase != Phase::Training {
            return;
        }
        let done = self.tasks.stop_growing();
        self.after_progress(done, cx);
    }

    /// Records an epoch the queue just closed, and ends training once the queue is done.
    fn after_progress(&mut self, epoch_done: Option<(u32, LedgerSummary)>, cx: &mut impl Context) {
        if let Some(done) = epoch_done {
            self.epochs_closed.push(done);
            cx.event(Event::EpochDone(done.0, done.1));
            self.persist_meta(cx);
        }
        if self.tasks.is_finished() {
            self.finish_training(cx);
        }
    }

    /// Ends an online job's training (`elastrec stop`): no new task is handed out; what
    /// the workers already reported stays in the ledger, and what they hold but did not
    /// report stays untrained in the checkpointed position. Evaluation follows as for a
    /// job over files. Returns false when the job was no longer training.
    pub fn stop_training(&mut self, cx: &mut impl Context) -> bool {
        if self.phase != Phase::Training {
            return false;
        }
        self.finish_training(cx);
        true
    }

    fn flush_tasks(&mut self, cx: &mut impl Context) {
        let (tasks, ranges) = self.tasks.take_dirty();
        for t in tasks {
            cx.persist(Change::Task(t));
        }
        for r in ranges {
            cx.persist(Change::Range(r));
        }
    }

    fn launch(&mut self, role: Role, index: u32, restarts: u32, cx: &mut impl Context) -> u32 {
        let id = self.next_node;
        self.next_node += 1;
        let now = cx.now_ms();
        let node = Node {
            last_seen_ms: now,
            started_ms: now,
            restarts,
            ..Node::pending(id, role, index)
        };
        cx.launch(&node);
        cx.persist(Change::Node(node.clone()));
        self.nodes.insert(id, node);
        id
    }

    fn launch_worker(&mut self, restarts: u32, cx: &mut impl Context) -> u32 {
        let index = self
            .nodes
            .values()
            .filter(|n| n.role == Role::Worker)
            .count() as u32;
        self.launch(Role::Worker, index, restarts, cx)
    }

    /// Policy settings.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The task queue and ledger.
    pub fn tasks(&self) -> &TaskQueue {
        &self.tasks
    }

    /// The node table.
    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values()
    }

    /// A node by id.
    pub fn node(&self, id: u32) -> Option<&Node> {
        self.nodes.get(&id)
    }

    /// Current phase.
    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// Desired number of workers.
    pub fn target_workers(&self) -> u32 {
        self.target_workers
    }

    /// Final evaluation, once reported.
    pub fn eval(&self) -> Option<EvalResult> {
        self.eval
    }

    /// A multi-task model's final evaluation of every task (task 0 first); empty for
    /// one task.
    pub fn task_evals(&self) -> &[EvalResult] {
        &self.task_evals
    }

    /// Restores [`Job::task_evals`] from a stored job.
    pub fn restore_task_evals(&mut self, tasks: Vec<EvalResult>) {
        self.task_evals = tasks;
    }

    /// Ledger verdicts of the epochs closed so far.
    pub fn epochs_closed(&self) -> &[(u32, LedgerSummary)] {
        &self.epochs_closed
    }

    /// Live workers that are training (not stopping).
    pub fn active_workers(&self) -> u32 {
        self.active_worker_nodes().count() as u32
    }

    /// Live workers that hold a task: the contributors of a synchronous step. A worker
    /// waiting for work (the end of an epoch) is not counted, so the others' steps do not
    /// wait for it until the PS's timeout.
    pub fn training_workers(&self) -> u32 {
        self.active_worker_nodes()
            .filter(|n| self.tasks.holds_task(n.id))
            .count() as u32
    }

    fn active_worker_nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values().filter(|n| {
            n.role == Role::Worker && matches!(n.state, NodeState::Pending | NodeState::Running)
        })
    }

    /// Worker `id`'s rank among the running workers (by id), for pinned partitions. A
    /// worker not (yet) running takes the rank after them.
    fn pin_of(&self, id: u32) -> Pin {
        let running: Vec<u32> = self.running_worker_nodes().map(|n| n.id).collect();
        let slots = running.len() as u32;
        match running.iter().position(|&w| w == id) {
            Some(slot) => Pin {
                slot: slot as u32,
                slots,
            },
            None => Pin {
                slot: slots,
                slots: slots + 1,
            },
        }
    }

    /// Workers registered and training (not pending, not stopping).
    pub fn running_workers(&self) -> u32 {
        self.running_worker_nodes().count() as u32
    }

    /// The running workers (see [`Job::running_workers`]), by id.
    pub fn running_worker_nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes
            .values()
            .filter(|n| n.role == Role::Worker && n.state == NodeState::Running)
    }

    /// True when the job trains at its planned allocation with nothing in flux: every
    /// planned worker registered, none stopping, every PS up, no pause, no async warm-up.
    /// Only such stretches measure what an allocation can do.
    pub fn steady(&self) -> bool {
        let in_flux = self.nodes.values().any(|n| {
            matches!(n.state, NodeState::Pending | NodeState::Stopping)
                || (n.role == Role::Ps && n.state != NodeState::Running && n.state.is_live())
        });
        self.phase == Phase::Training
            && !in_flux
            && !self.held()
            && !self.recovering()
            && !self.in_warmup()
            && self.running_workers() == self.target_workers
    }

    /// PS addresses of the layout in force, by index, once all have registered.
    pub fn ps_addrs(&self) -> Option<Vec<String>> {
        let addrs = self.running_ps_addrs();
        addrs.iter().all(|a| !a.is_empty()).then_some(addrs)
    }

    /// The addresses of the layout's running parameter servers by index, "" where one is
    /// not running (a relaunched server finds its peers there while it is still missing).
    pub fn running_ps_addrs(&self) -> Vec<String> {
        let mut addrs = vec![String::new(); self.policy.num_ps as usize];
        for n in self.nodes.values() {
            if n.role == Role::Ps
                && n.state == NodeState::Running
                && n.index < self.policy.num_ps
                && !self.is_joining(n.id)
            {
                addrs[n.index as usize] = n.addr.clone();
            }
        }
        addrs
    }

    /// The node ids of the layout's running parameter servers by index, 0 where one is not
    /// running (the same servers as [`Job::running_ps_addrs`]): a server refuses the
    /// requests of an older node of an index, which was replaced.
    pub fn running_ps_nodes(&self) -> Vec<u32> {
        let mut nodes = vec![0; self.policy.num_ps as usize];
        for n in self.nodes.values() {
            if n.role == Role::Ps
                && n.state == NodeState::Running
                && n.index < self.policy.num_ps
                && !self.is_joining(n.id)
            {
                nodes[n.index as usize] = n.id;
            }
        }
        nodes
    }

    /// Version of the PS layout in force.
    pub fn layout_version(&self) -> u64 {
        self.layout_version
    }

    /// Samples reported trained so far (all epochs).
    pub fn samples_done(&self) -> u64 {
        self.tasks.ledger().consumed()
    }

    /// Replaces the closed-epoch verdicts (a job started from a checkpoint).
    pub fn set_epochs_closed(&mut self, closed: Vec<(u32, LedgerSummary)>, cx: &mut impl Context) {
        self.epochs_closed = closed;
        self.persist_meta(cx);
    }

    /// Persists the data position as a whole: the changed tasks and every ledger span
    /// replace what the database holds (a job put at another position: a full
    /// recovery, a start from a checkpoint).
    pub fn persist_data_reset(&mut self, cx: &mut impl Context) {
        let (tasks, _) = self.tasks.take_dirty();
        let spans = self.tasks.ledger().spans();
        cx.persist(Change::ResetData(tasks, spans));
    }

    /// Drops an online job's done tasks ([`TaskQueue::compact`]) and rewrites the
    /// database's tasks and ledger as what remains: the tasks not done and the ledger's
    /// merged spans, with the counters' adjustments (duplicates) beside them.
    pub fn compact_tasks(&mut self, cx: &mut impl Context) {
        if self.tasks.compact() == 0 {
            return;
        }
        let pos = self.tasks.position();
        cx.persist(Change::Meta(
            "ledger_adjust",
            serde_json::to_string(&pos.ledger_adjustments()).expect("serializes"),
        ));
        cx.persist(Change::ResetData(pos.tasks, pos.spans));
    }

    /// PS failures waiting for recovery (taken once).
    pub fn take_ps_failures(&mut self) -> Vec<PsFailure> {
        std::mem::take(&mut self.ps_failures)
    }

    /// True while a PS is missing (dead and not yet replaced, or replaced but not up) or
    /// the PS set is being changed: no checkpoint, no scaling then.
    pub fn recovering(&self) -> bool {
        !self.ps_failures.is_empty() || self.ps_addrs().is_none() || self.reshard.is_some()
    }

    /// Where training stands, for a checkpoint.
    pub fn data_position(&self) -> DataPosition {
        DataPosition {
            epochs_closed: self.epochs_closed.clone(),
            ..self.tasks.position()
        }
    }

    /// Stops the job with a message; every live process is stopped.
    pub fn fail(&mut self, message: String, cx: &mut impl Context) {
        self.phase = Phase::Failed(message);
        let live: Vec<Node> = self
            .nodes
            .values()
            .filter(|n| n.state.is_live())
            .cloned()
            .collect();
        for n in live {
            cx.kill(&n);
        }
        cx.event(Event::JobEnded(self.phase.clone()));
        self.persist_meta(cx);
    }

    /// After the job ends: nodes still live that should be stopped.
    pub fn leftover_nodes(&self) -> Vec<Node> {
        self.nodes
            .values()
            .filter(|n| n.state.is_live())
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests;
