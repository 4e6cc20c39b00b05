//! The job master's state machine: node table, task queue, ledger, scaling and failure
//! policy. Side effects (clock, persistence, starting and stopping processes, log events)
//! go through [`Context`], so the same code runs live, in tests and in a simulator.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use elastrec_common::EvalResult;

use crate::ledger::{ConsumedRange, LedgerSummary};
use crate::tasks::{Assignment, DataPosition, Pin, ReportError, Reported, Task, TaskQueue};

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
}

/// A change of the PS layout in progress (`crate::reshard` drives it).
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

    /// A following job's new files (rows and `[[data.source]]` of each): appended to the
    /// queue and cut into tasks. Returns the index of the first, or `None` once the job left training.
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

    /// A following job's datasets can bring nothing more: training ends once the queue
    /// is done (at once when it already is).
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

    /// Version of the PS layout in force.
    pub fn layout_version(&self) -> u64 {
        self.layout_version
    }

    /// Restores the layout after a master restart (its PS count is the policy's).
    pub fn set_layout(&mut self, version: u64, num_ps: u32) {
        self.layout_version = version;
        self.policy.num_ps = num_ps;
    }

    /// The change of the PS layout in progress, if any.
    pub fn reshard(&self) -> Option<&Reshard> {
        self.reshard.as_ref()
    }

    /// True for a PS started for a layout that is not committed yet.
    pub fn is_joining(&self, id: u32) -> bool {
        self.reshard
            .as_ref()
            .is_some_and(|r| r.joining.contains(&id))
    }

    /// Starts changing the PS count to `num_ps`: launches the servers of the new layout
    /// that do not exist yet (they join empty and receive their rows). Refused while the
    /// job is not training, a PS is being recovered or another change is in progress.
    pub fn begin_reshard(&mut self, num_ps: u32, cx: &mut impl Context) -> Result<u64, String> {
        if self.phase != Phase::Training {
            return Err("the job is no longer training".into());
        }
        if self.reshard.is_some() {
            return Err("a change of the PS count is already in progress".into());
        }
        if self.recovering() {
            return Err(
                "a parameter server is being recovered; change the PS count once every PS runs"
                    .into(),
            );
        }
        if num_ps == 0 || num_ps > 64 {
            return Err(format!("{num_ps} PS: must be between 1 and 64"));
        }
        if num_ps == self.policy.num_ps {
            return Err(format!("the job already runs {num_ps} PS"));
        }
        let version = self.layout_version + 1;
        let joining = (self.policy.num_ps..num_ps)
            .map(|i| self.launch(Role::Ps, i, 0, cx))
            .collect();
        self.reshard = Some(Reshard {
            version,
            num_ps,
            joining,
        });
        Ok(version)
    }

    /// The new layout's servers by index once every joining one has registered
    /// (`Err` when one of them died).
    pub fn reshard_targets(&self) -> Result<Option<Vec<String>>, String> {
        let Some(r) = &self.reshard else {
            return Err("no change of the PS count in progress".into());
        };
        let mut addrs = vec![String::new(); r.num_ps as usize];
        for n in self.nodes.values().filter(|n| n.role == Role::Ps) {
            let joining = r.joining.contains(&n.id);
            if joining && !n.state.is_live() {
                return Err(format!("PS {} (node {}) died while joining", n.index, n.id));
            }
            let member = joining || (n.index < self.policy.num_ps && n.index < r.num_ps);
            if member && n.state == NodeState::Running && n.index < r.num_ps {
                addrs[n.index as usize] = n.addr.clone();
            }
        }
        Ok(addrs.iter().all(|a| !a.is_empty()).then_some(addrs))
    }

    /// The new layout is committed on every server: it is in force from now; servers
    /// beyond the new count retire (their processes are stopped).
    pub fn commit_reshard(&mut self, cx: &mut impl Context) {
        let Some(r) = self.reshard.take() else { return };
        let retired: Vec<u32> = self
            .nodes
            .values()
            .filter(|n| n.role == Role::Ps && n.state.is_live() && n.index >= r.num_ps)
            .map(|n| n.id)
            .collect();
        for id in retired {
            let n = self.nodes.get_mut(&id).expect("node");
            n.state = NodeState::Exited;
            let n = n.clone();
            cx.kill(&n);
            cx.persist(Change::Node(n));
        }
        self.policy.num_ps = r.num_ps;
        self.layout_version = r.version;
        cx.persist(Change::Meta(
            "ps_layout",
            serde_json::to_string(&(r.version, r.num_ps)).expect("serializes"),
        ));
    }

    /// After a master restart: PS processes of a layout that was never committed (index
    /// beyond the count in force) are stopped. The old servers, which may have been frozen
    /// by it, are told to abort it by the caller.
    pub fn drop_uncommitted_servers(&mut self, cx: &mut impl Context) {
        let stale: Vec<u32> = self
            .nodes
            .values()
            .filter(|n| n.role == Role::Ps && n.state.is_live() && n.index >= self.policy.num_ps)
            .map(|n| n.id)
            .collect();
        for id in stale {
            let n = self.nodes.get_mut(&id).expect("node");
            n.state = NodeState::Exited;
            let n = n.clone();
            cx.kill(&n);
            cx.persist(Change::Node(n));
        }
    }

    /// The change failed: the joining servers are stopped, the old layout stays.
    pub fn abort_reshard(&mut self, cx: &mut impl Context) {
        let Some(r) = self.reshard.take() else { return };
        for id in r.joining {
            if let Some(n) = self.nodes.get_mut(&id) {
                if n.state.is_live() {
                    n.state = NodeState::Exited;
                    let n = n.clone();
                    cx.kill(&n);
                    cx.persist(Change::Node(n));
                }
            }
        }
    }

    fn live_node(&mut self, id: u32, cx: &impl Context) -> Result<&mut Node, JobError> {
        let now = cx.now_ms();
        match self.nodes.get_mut(&id) {
            Some(n) if n.state.is_live() => {
                n.last_seen_ms = now;
                Ok(n)
            }
            _ => Err(JobError::UnknownNode(id)),
        }
    }

    /// A launched process announces itself (also after a master restart).
    pub fn register(
        &mut self,
        id: u32,
        role: Role,
        addr: &str,
        metrics_addr: &str,
        pid: u32,
        cx: &mut impl Context,
    ) -> Result<(), JobError> {
        let n = self.live_node(id, cx)?;
        if n.role != role {
            return Err(JobError::WrongRole(id));
        }
        if n.state == NodeState::Pending {
            n.state = NodeState::Running;
        }
        n.addr = addr.to_string();
        n.metrics_addr = metrics_addr.to_string();
        n.pid = pid;
        let n = n.clone();
        cx.persist(Change::Node(n));
        Ok(())
    }

    /// A heartbeat: liveness, progress counters, and what the node should do.
    pub fn heartbeat(
        &mut self,
        id: u32,
        samples: u64,
        step: u64,
        cx: &mut impl Context,
    ) -> Directive {
        let Ok(n) = self.live_node(id, cx) else {
            return Directive::Unknown;
        };
        n.samples = n.samples.max(samples);
        n.step = n.step.max(step);
        let (role, started, total, now) = (n.role, n.started_ms, n.samples, cx.now_ms());
        let stopping = n.state == NodeState::Stopping;
        if role == Role::Worker {
            let rate = self.rates.entry(id).or_insert(RecentRate {
                at_ms: started,
                ..RecentRate::default()
            });
            if self.waiting.contains(&id) {
                rate.restart(total, now);
            } else {
                rate.observe(total, now);
            }
        }
        if stopping {
            Directive::Stop
        } else {
            Directive::Continue
        }
    }

    /// Recent rate (samples/s) of a worker, once it has been watched for a whole window.
    /// Before that it is unknown: a rate since launch mostly measures process start-up
    /// and would flag a worker that merely started a little later than its peers.
    fn recent_rate(&self, id: u32) -> Option<f64> {
        self.rates.get(&id).and_then(|r| r.ewma)
    }

    /// True when `id`'s recent rate is well below the median of its running peers' (only
    /// workers watched for at least one rate window are compared).
    pub fn is_straggler(&self, id: u32) -> bool {
        let Some(mine) = self.recent_rate(id) else {
            return false;
        };
        let mut peers: Vec<f64> = self
            .running_worker_nodes()
            .filter(|n| n.id != id)
            .filter_map(|n| self.recent_rate(n.id))
            .collect();
        if peers.len() < 2 {
            return false;
        }
        peers.sort_by(f64::total_cmp);
        let median = peers[peers.len() / 2];
        mine < self.policy.straggler_ratio * median
    }

    /// A worker asks for work.
    pub fn get_task(&mut self, id: u32, cx: &mut impl Context) -> Result<TaskReply, JobError> {
        let reply = self.next_reply(id, cx)?;
        // A worker told to wait is idle, not slow: its rate window restarts while it waits.
        if matches!(reply, TaskReply::Wait) {
            self.waiting.insert(id);
        } else {
            self.waiting.remove(&id);
        }
        Ok(reply)
    }

    fn next_reply(&mut self, id: u32, cx: &mut impl Context) -> Result<TaskReply, JobError> {
        let state = self.live_node(id, cx)?.state;
        if state == NodeState::Stopping {
            self.leave(id, cx);
            return Ok(TaskReply::Stop);
        }
        match self.phase {
            Phase::Training => {}
            Phase::Evaluating => {
                if self.evaluator.is_none() || self.evaluator == Some(id) {
                    self.evaluator = Some(id);
                    return Ok(TaskReply::Finished { evaluate: true });
                }
                self.leave(id, cx);
                return Ok(TaskReply::Finished { evaluate: false });
            }
            Phase::Finished | Phase::Failed(_) => {
                self.leave(id, cx);
                return Ok(TaskReply::Finished { evaluate: false });
            }
        }
        if self.held() || self.warming_up(id) {
            return Ok(TaskReply::Wait);
        }
        let small = self.is_straggler(id);
        let changed = if small {
            self.stragglers.insert(id)
        } else {
            self.stragglers.remove(&id)
        };
        if changed {
            cx.event(Event::Straggler { id, slow: small });
        }
        let gen_before = self.tasks.generated_epochs();
        // During the async warm-up one worker trains alone: it owns every partition.
        let pin = (self.policy.pin_partitions && !self.in_warmup()).then(|| self.pin_of(id));
        let reply = match self.tasks.assign_pinned(id, small, pin) {
            Assignment::Task(t) => TaskReply::Task(t),
            Assignment::Wait => TaskReply::Wait,
            Assignment::Finished => {
                self.finish_training(cx);
                return self.next_reply(id, cx);
            }
        };
        self.flush_tasks(cx);
        if gen_before != self.tasks.generated_epochs() {
            self.persist_meta(cx);
        }
        Ok(reply)
    }

    /// The pause point in force (samples), if any.
    pub fn pause_at(&self) -> Option<u64> {
        self.pause_at
    }

    /// Sets (or, with `None`, lifts) the pause point: once `samples_done` reaches it, the
    /// workers finish the shards they hold and then wait. It survives a master restart.
    pub fn set_pause(&mut self, at: Option<u64>, cx: &mut impl Context) {
        self.pause_at = at;
        cx.persist(Change::Meta(
            "pause_at",
            serde_json::to_string(&at).expect("serializes"),
        ));
    }

    /// The pause point a restored master read from its database: in force again, and not
    /// written back (it is already stored).
    pub fn restore_pause(&mut self, at: Option<u64>) {
        self.pause_at = at;
    }

    /// True while training and held at the pause point: no task is handed out.
    pub fn held(&self) -> bool {
        self.phase == Phase::Training && self.pause_at.is_some_and(|p| self.samples_done() >= p)
    }

    /// True until `warmup_samples` are reported (the async warm-up; never without one).
    fn in_warmup(&self) -> bool {
        self.samples_done() < self.policy.warmup_samples
    }

    /// Async warm-up: until `warmup_samples` are reported, only one worker (the first to
    /// ask, or the next one if it dies) gets tasks; the others wait.
    fn warming_up(&mut self, id: u32) -> bool {
        if !self.in_warmup() {
            return false;
        }
        match self.warmup_worker {
            Some(w) if w != id && self.node(w).is_some_and(|n| n.state.is_live()) => true,
            _ => {
                self.warmup_worker = Some(id);
                false
            }
        }
    }

    fn finish_training(&mut self, cx: &mut impl Context) {
        if self.phase != Phase::Training {
            return;
        }
        // Data executors serve training reads only: they stop now.
        self.set_executors(0, cx);
        self.phase = if self.policy.evaluate {
            Phase::Evaluating
        } else {
            Phase::Finished
        };
        if self.phase == Phase::Finished {
            cx.event(Event::JobEnded(Phase::Finished));
        }
        self.persist_meta(cx);
    }

    /// A worker reports rows trained.
    pub fn report(
        &mut self,
        id: u32,
        task: u64,
        offset: u64,
        cx: &mut impl Context,
    ) -> Result<ProgressAck, JobError> {
        let state = self.live_node(id, cx)?.state;
        let r: Reported = self.tasks.report(id, task, offset)?;
        let stop = state == NodeState::Stopping;
        if stop {
            self.leave(id, cx);
        }
        self.flush_tasks(cx);
        let (_, _, done) = self.tasks.counts();
        if done - self.tasks.compacted() >= COMPACT_DONE_TASKS {
            self.compact_tasks(cx);
        }
        self.after_progress(r.epoch_done, cx);
        Ok(ProgressAck {
            task_done: r.task_done,
            stop,
            new_rows: r.range.map_or(0, |range| range.rows()),
        })
    }

    /// The evaluating worker reports the final metrics.
    pub fn report_eval(
        &mut self,
        id: u32,
        eval: EvalResult,
        tasks: Vec<EvalResult>,
        cx: &mut impl Context,
    ) -> Result<(), JobError> {
        self.live_node(id, cx)?;
        if self.phase == Phase::Evaluating {
            self.eval = Some(eval);
            self.task_evals = tasks;
            self.phase = Phase::Finished;
            cx.event(Event::JobEnded(Phase::Finished));
            self.leave(id, cx);
            self.persist_meta(cx);
        }
        Ok(())
    }

    /// A worker leaves normally: its unreported remainder returns to the queue.
    fn leave(&mut self, id: u32, cx: &mut impl Context) {
        if let Some(task) = self.tasks.release(id) {
            cx.event(Event::Requeued { worker: id, task });
        }
        if let Some(n) = self.nodes.get_mut(&id) {
            n.state = NodeState::Exited;
            cx.persist(Change::Node(n.clone()));
        }
        self.flush_tasks(cx);
    }

    /// Sets the desired worker count: starts new workers or asks the newest to stop.
    pub fn scale(&mut self, workers: u32, cx: &mut impl Context) -> u32 {
        let previous = self.target_workers;
        self.target_workers = workers;
        let active = self.active_workers();
        if workers > active {
            for _ in active..workers {
                self.launch_worker(0, cx);
            }
        } else if workers < active {
            let mut victims: Vec<&Node> = self
                .nodes
                .values()
                .filter(|n| {
                    n.role == Role::Worker
                        && matches!(n.state, NodeState::Pending | NodeState::Running)
                })
                .collect();
            // Pending first (they hold nothing), then the newest.
            victims.sort_by_key(|n| (n.state != NodeState::Pending, std::cmp::Reverse(n.id)));
            let ids: Vec<u32> = victims
                .iter()
                .take((active - workers) as usize)
                .map(|n| n.id)
                .collect();
            for id in ids {
                let n = self.nodes.get_mut(&id).expect("node");
                n.state = NodeState::Stopping;
                cx.persist(Change::Node(n.clone()));
            }
        }
        self.persist_meta(cx);
        previous
    }

    /// The master stopped a node's process itself (e.g. the memory watchdog): it is dead
    /// for `reason`, handled like any other death.
    pub fn node_stopped(&mut self, id: u32, reason: String, cx: &mut impl Context) {
        if self.nodes.get(&id).is_some_and(|n| n.state.is_live()) {
            self.declare_dead(id, reason, cx);
        }
    }

    /// Vertical scaling: every training worker is asked to finish its batch and leave, and
    /// as many new ones are started (with the resources the backend now gives workers).
    pub fn replace_workers(&mut self, cx: &mut impl Context) {
        let ids: Vec<u32> = self.active_worker_nodes().map(|n| n.id).collect();
        for &id in &ids {
            let n = self.nodes.get_mut(&id).expect("node");
            n.state = NodeState::Stopping;
            cx.persist(Change::Node(n.clone()));
        }
        for _ in 0..ids.len() {
            self.launch_worker(0, cx);
        }
        self.persist_meta(cx);
    }

    /// The backend saw a node's process exit.
    pub fn process_exited(&mut self, id: u32, cx: &mut impl Context) {
        self.process_ended(id, "process exited", cx);
    }

    /// A node's process ended, with the engine's words for why (a Slurm state, a pod's
    /// termination reason); the reason is what the node table and logs show.
    pub fn process_ended(&mut self, id: u32, reason: &str, cx: &mut impl Context) {
        let Some(n) = self.nodes.get(&id) else { return };
        match n.state {
            NodeState::Stopping => self.leave(id, cx),
            // After the job finished, nodes are told to stop and exit: that is no death.
            s if s.is_live() && self.phase == Phase::Finished => self.leave(id, cx),
            s if s.is_live() => self.declare_dead(id, reason.to_string(), cx),
            _ => {}
        }
    }

    /// The engine still holds node `id` in its queue (waiting for resources): it is not
    /// silent, so its heartbeat timeout starts only once it runs.
    pub fn queued(&mut self, id: u32, cx: &mut impl Context) {
        let now = cx.now_ms();
        if let Some(n) = self.nodes.get_mut(&id) {
            if n.state == NodeState::Pending {
                n.last_seen_ms = now;
            }
        }
    }

    /// Periodic check: declares silent nodes dead and applies the failure policy.
    pub fn tick(&mut self, cx: &mut impl Context) {
        let now = cx.now_ms();
        let silent: Vec<u32> = self
            .nodes
            .values()
            .filter(|n| {
                n.state.is_live() && now.saturating_sub(n.last_seen_ms) > self.policy.dead_after_ms
            })
            .map(|n| n.id)
            .collect();
        for id in silent {
            let ms = now - self.nodes[&id].last_seen_ms;
            self.declare_dead(id, format!("no heartbeat for {ms} ms"), cx);
        }
    }

    fn declare_dead(&mut self, id: u32, reason: String, cx: &mut impl Context) {
        let Some(n) = self.nodes.get_mut(&id) else {
            return;
        };
        let was_stopping = n.state == NodeState::Stopping;
        n.state = NodeState::Dead;
        let node = n.clone();
        cx.persist(Change::Node(node.clone()));
        cx.kill(&node);
        cx.event(Event::NodeDead {
            id,
            role: node.role,
            reason: reason.clone(),
        });
        match node.role {
            // A server of a layout not yet committed holds nothing of the model: the
            // re-sharding that started it fails and is rolled back (`crate::reshard`).
            Role::Ps if self.is_joining(id) => {}
            Role::Ps => {
                let active = matches!(self.phase, Phase::Training | Phase::Evaluating);
                if active && self.policy.recover_ps && self.ps_recoveries < MAX_PS_RECOVERIES {
                    self.ps_recoveries += 1;
                    let failure = PsFailure {
                        index: node.index,
                        node: id,
                        reason,
                        samples: self.samples_done(),
                    };
                    cx.event(Event::PsFailed(failure.clone()));
                    self.ps_failures.push(failure);
                } else if active {
                    self.fail(
                        format!(
                            "parameter server {} (node {id}, {}) is dead ({reason}); last step {}",
                            node.index,
                            if node.addr.is_empty() {
                                "never registered"
                            } else {
                                &node.addr
                            },
                            node.step
                        ),
                        cx,
                    );
                }
            }
            Role::Worker => {
                if let Some(task) = self.tasks.release(id) {
                    cx.event(Event::Requeued { worker: id, task });
                }
                self.flush_tasks(cx);
                if self.evaluator == Some(id) {
                    self.evaluator = None;
                }
                let finished = matches!(self.phase, Phase::Finished | Phase::Failed(_));
                if !was_stopping && !finished {
                    if self.restarts_used < self.policy.max_worker_restarts {
                        self.restarts_used += 1;
                        self.launch_worker(node.restarts + 1, cx);
                    } else {
                        self.target_workers = self.target_workers.saturating_sub(1);
                    }
                    if self.active_workers() == 0 {
                        self.fail(
                            format!(
                                "every worker is dead and the restart budget ({}) is spent",
                                self.policy.max_worker_restarts
                            ),
                            cx,
                        );
                    }
                }
                self.persist_meta(cx);
            }
            // A data executor holds nothing: the workers it served read on from another
            // one (or themselves). It is replaced while the restart budget lasts.
            Role::Executor => {
                let training = matches!(self.phase, Phase::Training);
                if !was_stopping && training {
                    if self.restarts_used < self.policy.max_worker_restarts {
                        self.restarts_used += 1;
                        self.launch(Role::Executor, node.index, node.restarts + 1, cx);
                    }
                    self.persist_meta(cx);
                }
            }
        }
    }

    /// Data executors launched and not stopping.
    pub fn executors(&self) -> u32 {
        self.executor_nodes().count() as u32
    }

    fn executor_nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values().filter(|n| {
            n.role == Role::Executor && matches!(n.state, NodeState::Pending | NodeState::Running)
        })
    }

    /// Sets the number of data executors (Primus Eq. 1's horizontal scaling, or the end
    /// of training): launches new ones, or stops the newest. Returns the previous count.
    pub fn set_executors(&mut self, count: u32, cx: &mut impl Context) -> u32 {
        let current = self.executors();
        if count > current {
            let next_index = self
                .nodes
                .values()
                .filter(|n| n.role == Role::Executor)
                .map(|n| n.index + 1)
                .max()
                .unwrap_or(0);
            for i in 0..count - current {
                self.launch(Role::Executor, next_index + i, 0, cx);
            }
        } else if count < current {
            let mut live: Vec<u32> = self.executor_nodes().map(|n| n.id).collect();
            live.sort_unstable_by(|a, b| b.cmp(a));
            for id in live.into_iter().take((current - count) as usize) {
                let n = self.nodes.get_mut(&id).expect("node");
                n.state = NodeState::Stopping;
                cx.persist(Change::Node(n.clone()));
            }
        }
        current
    }

    /// Node ids of the running data executors.
    pub fn running_executor_ids(&self) -> Vec<u32> {
        self.executor_nodes()
            .filter(|n| n.state == NodeState::Running)
            .map(|n| n.id)
            .collect()
    }

    /// Addresses of the running data executors, in node order.
    pub fn executor_addrs(&self) -> Vec<String> {
        self.executor_nodes()
            .filter(|n| n.state == NodeState::Running && !n.addr.is_empty())
            .map(|n| n.addr.clone())
            .collect()
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

    /// Partial recovery: a new process for PS `index` (it loads its own shard of the last
    /// checkpoint); every other node keeps its progress.
    pub fn relaunch_ps(&mut self, index: u32, restarts: u32, cx: &mut impl Context) -> u32 {
        self.launch(Role::Ps, index, restarts, cx)
    }

    /// Full recovery: every node is stopped and replaced, and the data position returns to
    /// `queue` (the checkpoint's); the ledger forgets everything reported after it.
    pub fn full_restore(
        &mut self,
        mut queue: TaskQueue,
        epochs_closed: Vec<(u32, LedgerSummary)>,
        cx: &mut impl Context,
    ) {
        let live: Vec<u32> = self
            .nodes
            .values()
            .filter(|n| n.state.is_live())
            .map(|n| n.id)
            .collect();
        for id in live {
            let n = self.nodes.get_mut(&id).expect("node");
            n.state = NodeState::Exited;
            let n = n.clone();
            cx.kill(&n);
            cx.persist(Change::Node(n));
        }
        // The serving policy is the job's configuration, not part of the position.
        queue.set_sources(
            self.tasks.source_count(),
            self.tasks.file_sources().to_vec(),
        );
        queue.set_serving(self.tasks.serving().clone());
        self.tasks = queue;
        self.persist_data_reset(cx);
        cx.persist(Change::Meta(
            "ledger_adjust",
            serde_json::to_string(&self.tasks.position().ledger_adjustments()).expect("serializes"),
        ));
        self.epochs_closed = epochs_closed;
        self.evaluator = None;
        self.ps_failures.clear();
        self.phase = Phase::Training;
        for i in 0..self.policy.num_ps {
            self.launch(Role::Ps, i, 0, cx);
        }
        for _ in 0..self.target_workers.max(1) {
            self.launch_worker(0, cx);
        }
        self.persist_meta(cx);
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
pub(crate) mod tests {
    use super::*;
    use crate::tasks::DataSharding;

    /// A recording context with a hand-driven clock.
    /// A [`Context`] that records what the state machine asked for (also used by the
    /// store's tests).
    #[derive(Default)]
    pub(crate) struct Rec {
        pub(crate) now: u64,
        pub(crate) changes: Vec<Change>,
        pub(crate) launched: Vec<Node>,
        pub(crate) killed: Vec<u32>,
        pub(crate) events: Vec<Event>,
    }

    impl Context for Rec {
        fn now_ms(&self) -> u64 {
            self.now
        }
        fn persist(&mut self, c: Change) {
            self.changes.push(c);
        }
        fn launch(&mut self, n: &Node) {
            self.launched.push(n.clone());
        }
        fn kill(&mut self, n: &Node) {
            self.killed.push(n.id);
        }
        fn event(&mut self, e: Event) {
            self.events.push(e);
        }
    }

    fn policy() -> Policy {
        Policy {
            num_ps: 2,
            dead_after_ms: 1000,
            max_worker_restarts: 2,
            straggler_ratio: 0.5,
            evaluate: true,
            recover_ps: false,
            warmup_samples: 0,
            pin_partitions: false,
            executors: 0,
        }
    }

    /// One file of 1000 rows in shards of 100, one epoch.
    fn queue() -> TaskQueue {
        TaskQueue::new(
            DataSharding {
                rows_per_shard: 100,
                min_rows: 10,
                epochs: 1,
                seed: 1,
                shuffle: true,
                shuffle_rows: false,
            },
            vec![1000],
        )
    }

    fn job(cx: &mut Rec, workers: u32) -> Job {
        let mut j = Job::start(policy(), queue(), workers, cx);
        for n in cx.launched.clone() {
            let addr = if n.role == Role::Ps {
                format!("127.0.0.1:{}", 9000 + n.index)
            } else {
                String::new()
            };
            j.register(n.id, n.role, &addr, "", 100 + n.id, cx).unwrap();
        }
        j
    }

    /// A node waiting in the engine's queue is not silent: the heartbeat timeout starts
    /// once it runs. Without the engine's word, the same wait is a death.
    #[test]
    fn a_node_queued_by_the_engine_is_not_declared_dead() {
        let mut cx = Rec::default();
        let mut j = Job::start(policy(), queue(), 1, &mut cx);
        let worker = cx.launched.last().unwrap().id;
        for t in 1..=5u64 {
            cx.now = t * 900;
            j.queued(worker, &mut cx);
            j.tick(&mut cx);
        }
        assert_eq!(j.node(worker).unwrap().state, NodeState::Pending);
        cx.now += 1500;
        j.tick(&mut cx);
        assert_eq!(j.node(worker).unwrap().state, NodeState::Dead);
    }

    #[test]
    fn launches_ps_and_workers_and_publishes_addresses() {
        let mut cx = Rec::default();
        let j = job(&mut cx, 3);
        assert_eq!(cx.launched.len(), 5);
        assert_eq!(
            j.ps_addrs().unwrap(),
            vec!["127.0.0.1:9000", "127.0.0.1:9001"]
        );
        assert_eq!(j.active_workers(), 3);
    }

    #[test]
    fn async_warm_up_lets_one_worker_train_alone_first() {
        let mut cx = Rec::default();
        let mut j = job(&mut cx, 2);
        j.policy.warmup_samples = 150;
        let TaskReply::Task(t) = j.get_task(3, &mut cx).unwrap() else {
            panic!()
        };
        assert_eq!(j.get_task(4, &mut cx).unwrap(), TaskReply::Wait);
        // Between its tasks the first worker holds nothing; the other still waits.
        j.report(3, t.id, 100, &mut cx).unwrap();
        assert_eq!(j.get_task(4, &mut cx).unwrap(), TaskReply::Wait);
        let TaskReply::Task(t2) = j.get_task(3, &mut cx).unwrap() else {
            panic!()
        };
        j.report(3, t2.id, 60, &mut cx).unwrap();
        // 160 samples reported: everyone trains.
        assert!(matches!(
            j.get_task(4, &mut cx).unwrap(),
            TaskReply::Task(_)
        ));
    }

    #[test]
    fn a_restored_pause_point_holds_the_job_without_being_written_again() {
        let mut cx = Rec::default();
        let mut j = job(&mut cx, 2);
        cx.changes.clear();
        j.restore_pause(Some(0));
        assert!(j.held(), "a pause point of 0 samples holds at once");
        assert_eq!(j.get_task(3, &mut cx).unwrap(), TaskReply::Wait);
        assert!(
            !cx.changes
                .iter()
                .any(|c| matches!(c, Change::Meta("pause_at", _))),
            "restoring re-wrote the stored pause point"
        );
    }

    #[test]
    fn a_paused_job_hands_out_nothing_past_its_pause_point_until_released() {
        let mut cx = Rec::default();
        let mut j = job(&mut cx, 2);
        j.set_pause(Some(150), &mut cx);
        assert!(cx
            .changes
            .iter()
            .any(|c| matches!(c, Change::Meta("pause_at", v) if v == "150")));
        let TaskReply::Task(t) = j.get_task(3, &mut cx).unwrap() else {
            panic!()
        };
        // Below the pause point: tasks are handed out.
        let TaskReply::Task(t2) = j.get_task(4, &mut cx).unwrap() else {
            panic!()
        };
        j.report(3, t.id, 100, &mut cx).unwrap();
        assert!(!j.held());
        // The task a worker holds is finished even past the pause point.
        j.report(4, t2.id, 100, &mut cx).unwrap();
        assert!(j.held());
        assert_eq!(j.get_task(3, &mut cx).unwrap(), TaskReply::Wait);
        assert_eq!(j.get_task(4, &mut cx).unwrap(), TaskReply::Wait);
        // Moving the point further lets the job go on until it gets there.
        j.set_pause(Some(300), &mut cx);
        assert!(matches!(
            j.get_task(3, &mut cx).unwrap(),
            TaskReply::Task(_)
        ));
        j.set_pause(None, &mut cx);
        assert!(!j.held());
    }

    #[test]
    fn pinned_partitions_go_to_the_worker_of_their_rank_and_move_when_one_leaves() {
        let mut cx = Rec::default();
        let files = DataSharding {
            rows_per_shard: 100,
            min_rows: 10,
            epochs: 1,
            seed: 1,
            shuffle: false,
            shuffle_rows: false,
        };
        let mut j = Job::start(
            Policy {
                pin_partitions: true,
                executors: 0,
                ..policy()
            },
            TaskQueue::new(files, vec![200, 300, 200]),
            2,
            &mut cx,
        );
        for n in cx.launched.clone() {
            let addr = format!("127.0.0.1:{}", 9000 + n.index);
            j.register(n.id, n.role, &addr, "", 100 + n.id, &mut cx)
                .unwrap();
        }
        // Workers 3 and 4 rank 0 and 1: files 0 and 2 are worker 3's, file 1 worker 4's.
        let files_of = |j: &mut Job, w: u32, cx: &mut Rec| {
            let mut seen = Vec::new();
            while let TaskReply::Task(t) = j.get_task(w, cx).unwrap() {
                seen.push(t.file);
                j.report(w, t.id, t.len(), cx).unwrap();
                if seen.len() == 2 {
                    break;
                }
            }
            seen
        };
        assert_eq!(files_of(&mut j, 4, &mut cx), vec![1, 1]);
        assert_eq!(files_of(&mut j, 3, &mut cx), vec![0, 0]);
        // File 1's last task comes first in the queue, but it is worker 4's.
        let TaskReply::Task(t) = j.get_task(3, &mut cx).unwrap() else {
            panic!("file 2 is worker 3's")
        };
        assert_eq!(t.file, 2);
        j.report(3, t.id, t.len(), &mut cx).unwrap();
        // Worker 4 is scaled away: worker 3 is alone and owns every file, file 1's last
        // task (first in queue order) included.
        j.scale(1, &mut cx);
        assert_eq!(j.get_task(4, &mut cx).unwrap(), TaskReply::Stop);
        assert_eq!(files_of(&mut j, 3, &mut cx), vec![1, 2]);
    }

    #[test]
    fn a_retried_report_adds_no_rows_so_its_predictions_are_not_counted_twice() {
        let mut cx = Rec::default();
        let mut j = job(&mut cx, 2);
        let TaskReply::Task(t) = j.get_task(3, &mut cx).unwrap() else {
            panic!()
        };
        let first = j.report(3, t.id, 40, &mut cx).unwrap();
        assert_eq!(first.new_rows, 40);
        // The reply was lost; the worker sends the same report again.
        let again = j.report(3, t.id, 40, &mut cx).unwrap();
        assert_eq!(again.new_rows, 0);
        assert_eq!(j.samples_done(), 40);
        assert_eq!(j.report(3, t.id, 70, &mut cx).unwrap().new_rows, 30);
    }

    #[test]
    fn silent_worker_is_replaced_and_its_remainder_requeued() {
        let mut cx = Rec::default();
        let mut j = job(&mut cx, 2);
        let TaskReply::Task(t) = j.get_task(3, &mut cx).unwrap() else {
            panic!()
        };
        j.report(3, t.id, 40, &mut cx).unwrap();
        cx.now = 500;
        j.heartbeat(4, 0, 0, &mut cx);
        j.heartbeat(1, 0, 0, &mut cx);
        j.heartbeat(2, 0, 0, &mut cx);
        cx.now = 1200;
        j.tick(&mut cx);
        assert_eq!(j.node(3).unwrap().state, NodeState::Dead);
        assert_eq!(cx.killed, vec![3]);
        assert!(cx
            .events
            .iter()
            .any(|e| matches!(e, Event::Requeued { worker: 3, .. })));
        assert_eq!(cx.launched.last().unwrap().restarts, 1);
        // The dead worker's late report and heartbeat are refused.
        assert!(j.report(3, t.id, 50, &mut cx).is_err());
        assert_eq!(j.heartbeat(3, 0, 0, &mut cx), Directive::Unknown);
        // The next worker gets exactly the remainder.
        let TaskReply::Task(r) = j.get_task(4, &mut cx).unwrap() else {
            panic!()
        };
        assert_eq!((r.start, r.end), (t.start + 40, t.end));
    }

    #[test]
    fn dead_ps_fails_the_job_naming_it() {
        let mut cx = Rec::default();
        let mut j = job(&mut cx, 1);
        j.heartbeat(1, 0, 17, &mut cx);
        j.process_exited(2, &mut cx);
        let Phase::Failed(msg) = j.phase() else {
            panic!("{:?}", j.phase())
        };
        assert!(msg.contains("parameter server 1"), "{msg}");
        assert!(msg.contains("last step 0"), "{msg}");
        assert!(cx.killed.contains(&1) && cx.killed.contains(&3));
    }

    #[test]
    fn dead_ps_with_checkpoints_awaits_recovery_and_full_restore_rewinds() {
        let mut cx = Rec::default();
        let mut j = Job::start(
            Policy {
                recover_ps: true,
                ..policy()
            },
            TaskQueue::new(
                DataSharding {
                    rows_per_shard: 100,
                    min_rows: 10,
                    epochs: 1,
                    seed: 1,
                    shuffle: true,
                    shuffle_rows: false,
                },
                vec![1000],
            ),
            2,
            &mut cx,
        );
        for n in cx.launched.clone() {
            j.register(n.id, n.role, "127.0.0.1:1", "", 1, &mut cx)
                .unwrap();
        }
        let TaskReply::Task(t) = j.get_task(3, &mut cx).unwrap() else {
            panic!()
        };
        j.report(3, t.id, 40, &mut cx).unwrap();
        let pos = j.data_position();
        j.report(3, t.id, 70, &mut cx).unwrap();
        j.process_exited(2, &mut cx);
        assert_eq!(j.phase(), &Phase::Training);
        assert!(j.recovering());
        let f = j.take_ps_failures();
        assert_eq!((f.len(), f[0].index, f[0].samples), (1, 1, 70));
        // Partial: one new PS with the same index.
        let before = cx.launched.len();
        let id = j.relaunch_ps(1, 1, &mut cx);
        assert_eq!(cx.launched.len(), before + 1);
        assert_eq!(j.node(id).unwrap().index, 1);
        // Full: everything replaced, ledger back at 40 rows, the held task requeued.
        let q = TaskQueue::from_position(j.tasks().spec().clone(), vec![1000], &pos);
        j.full_restore(q, pos.epochs_closed.clone(), &mut cx);
        assert_eq!(j.samples_done(), 40);
        assert!(j.nodes().filter(|n| n.state.is_live()).all(|n| n.id > id));
        assert_eq!(j.active_workers(), 2);
        let TaskReply::Task(r) = j.get_task(id + 3, &mut cx).unwrap() else {
            panic!()
        };
        assert_eq!((r.start, r.end), (t.start + 40, t.end));
    }

    #[test]
    fn scale_down_stops_newest_after_its_report_then_scale_up() {
        let mut cx = Rec::default();
        let mut j = job(&mut cx, 3);
        let TaskReply::Task(t) = j.get_task(5, &mut cx).unwrap() else {
            panic!()
        };
        assert_eq!(j.scale(1, &mut cx), 3);
        assert_eq!(j.heartbeat(5, 0, 0, &mut cx), Directive::Stop);
        assert_eq!(j.node(3).unwrap().state, NodeState::Running);
        let ack = j.report(5, t.id, 20, &mut cx).unwrap();
        assert!(ack.stop);
        assert_eq!(j.node(5).unwrap().state, NodeState::Exited);
        assert_eq!(j.get_task(4, &mut cx).unwrap(), TaskReply::Stop);
        assert_eq!(j.active_workers(), 1);
        j.scale(3, &mut cx);
        assert_eq!(j.active_workers(), 3);
        assert_eq!(cx.launched.len(), 7);
    }

    #[test]
    fn restart_budget_is_bounded_and_job_fails_without_workers() {
        let mut cx = Rec::default();
        let mut j = job(&mut cx, 1);
        for _ in 0..3 {
            let w = j
                .nodes()
                .find(|n| n.role == Role::Worker && n.state.is_live())
                .unwrap()
                .id;
            j.process_exited(w, &mut cx);
        }
        assert!(matches!(j.phase(), Phase::Failed(m) if m.contains("restart budget")));
    }

    #[test]
    fn full_run_ends_with_evaluation_and_clean_ledger() {
        let mut cx = Rec::default();
        let mut j = job(&mut cx, 2);
        let mut finished = 0;
        while finished < 2 {
            for w in [3, 4] {
                match j.get_task(w, &mut cx) {
                    Ok(TaskReply::Task(t)) => {
                        j.report(w, t.id, t.len(), &mut cx).unwrap();
                    }
                    Ok(TaskReply::Finished { evaluate: true }) => {
                        j.report_eval(
                            w,
                            EvalResult {
                                auc: 0.7,
                                logloss: 0.5,
                                samples: 10,
                                ne: None,
                                calibration: None,
                                gauc: None,
                            },
                            Vec::new(),
                            &mut cx,
                        )
                        .unwrap();
                        finished += 1;
                    }
                    Ok(TaskReply::Finished { evaluate: false }) | Err(_) => finished += 1,
                    Ok(other) => panic!("{other:?}"),
                }
            }
        }
        assert_eq!(j.phase(), &Phase::Finished);
        assert_eq!(j.epochs_closed().len(), 1);
        assert!(j.epochs_closed()[0].1.exactly_once());
        assert!(j.eval().is_some());
    }

    /// A worker that was as fast as its peers for a long time and then slows down is
    /// flagged within a few seconds: the rate is recent, not an average since launch.
    #[test]
    fn a_worker_that_slows_down_is_flagged_quickly() {
        let mut cx = Rec::default();
        let mut j = job(&mut cx, 3);
        let mut samples = [0u64; 3];
        for t in 1..=60u64 {
            cx.now = t * 1000;
            for (k, w) in [3u32, 4, 5].into_iter().enumerate() {
                // Worker 5 drops to a fifth of its speed after 50 s.
                samples[k] += if w == 5 && t > 50 { 200 } else { 1000 };
                j.heartbeat(w, samples[k], t, &mut cx);
            }
            if t == 50 {
                assert!(!j.is_straggler(5));
            }
        }
        // Its rate since launch is still 87% of its peers'; its recent rate is not.
        assert!(j.is_straggler(5));
        assert!(!j.is_straggler(3));
    }

    /// Start-up and waiting are not slowness: a worker is judged only on a whole window
    /// of work, and a worker told to wait (here: while another warms the model up) is
    /// not flagged once it starts, though it trained nothing during its first seconds.
    #[test]
    fn waiting_or_starting_workers_are_not_stragglers() {
        let mut cx = Rec::default();
        let mut j = job(&mut cx, 3);
        cx.now = 500;
        j.heartbeat(3, 4000, 1, &mut cx);
        j.heartbeat(4, 4000, 1, &mut cx);
        j.heartbeat(5, 100, 1, &mut cx);
        assert!(!j.is_straggler(5), "judged before a whole window");
        // Worker 5 is told to wait (held at a pause point) for 3 s; its peers train.
        j.set_pause(Some(0), &mut cx);
        assert!(matches!(j.get_task(5, &mut cx), Ok(TaskReply::Wait)));
        j.set_pause(None, &mut cx);
        for t in 1..=3u64 {
            cx.now = 500 + t * 1000;
            j.heartbeat(3, 4000 + t * 1000, 1, &mut cx);
            j.heartbeat(4, 4000 + t * 1000, 1, &mut cx);
            j.heartbeat(5, 100, 1, &mut cx);
        }
        assert!(!j.is_straggler(5), "flagged for waiting");
        // Once it works, it is judged on its work: as fast as its peers here.
        assert!(matches!(j.get_task(5, &mut cx), Ok(TaskReply::Task(_))));
        cx.now += 1000;
        j.heartbeat(3, 8000, 2, &mut cx);
        j.heartbeat(4, 8000, 2, &mut cx);
        j.heartbeat(5, 1100, 2, &mut cx);
        assert!(!j.is_straggler(5));
        cx.now += 1000;
        j.heartbeat(3, 9000, 3, &mut cx);
        j.heartbeat(4, 9000, 3, &mut cx);
        j.heartbeat(5, 1100, 3, &mut cx);
        assert!(j.is_straggler(5), "stalled for a whole window");
    }

    #[test]
    fn straggler_detection_uses_peer_median() {
        let mut cx = Rec::default();
        let mut j = job(&mut cx, 3);
        cx.now = 10_000;
        j.heartbeat(3, 1000, 1, &mut cx);
        j.heartbeat(4, 1000, 1, &mut cx);
        j.heartbeat(5, 100, 1, &mut cx);
        assert!(j.is_straggler(5));
        assert!(!j.is_straggler(3));
        let TaskReply::Task(t) = j.get_task(5, &mut cx).unwrap() else {
            panic!()
        };
        assert_eq!(t.len(), 50);
        assert!(cx.events.contains(&Event::Straggler { id: 5, slow: true }));
    }
}
