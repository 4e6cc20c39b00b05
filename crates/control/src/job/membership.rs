//! Nodes joining, beating, slowing down, leaving and dying: registration, heartbeats,
//! stragglers, the worker count, data executors, and the recovery of a lost PS.

use super::*;

impl Job {
    pub(super) fn live_node(&mut self, id: u32, cx: &impl Context) -> Result<&mut Node, JobError> {
        let now = cx.now_ms();
        // Any request from a node is word from it: a suspicion of it ends.
        self.suspects.remove(&id);
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

    /// A heartbeat from a node that says it is fenced (its lease from the master ran out:
    /// it hears no replies). It is no sign of life, so the node's silence goes on counting
    /// and ends in a probe and a verdict as silence does; the node is only told what to do.
    pub fn fenced_heartbeat(&self, id: u32) -> Directive {
        match self.nodes.get(&id) {
            Some(n) if n.state == NodeState::Stopping => Directive::Stop,
            Some(n) if n.state.is_live() => Directive::Continue,
            _ => Directive::Unknown,
        }
    }

    /// Recent rate (samples/s) of a worker, once it has been watched for a whole window.
    /// Before that it is unknown: a rate since launch mostly measures process start-up
    /// and would flag a worker that merely started a little later than its peers.
    pub(super) fn recent_rate(&self, id: u32) -> Option<f64> {
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

    /// A worker leaves normally: its unreported remainder returns to the queue.
    pub(super) fn leave(&mut self, id: u32, cx: &mut impl Context) {
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

    pub(super) fn declare_dead(&mut self, id: u32, reason: String, cx: &mut impl Context) {
        let Some(n) = self.nodes.get_mut(&id) else {
            return;
        };
        let was_stopping = n.state == NodeState::Stopping;
        n.state = NodeState::Dead;
        self.suspects.remove(&id);
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
            // re-sharding that started it fails and is rolled back (the master's `reshard` protocol).
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

    pub(super) fn executor_nodes(&self) -> impl Iterator<Item = &Node> {
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
}
