//! Work handed out and reported: tasks on request (held by a pause point or the async
//! warm-up), progress reports into the ledger, and the end of training.

use super::*;

impl Job {
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

    pub(super) fn next_reply(
        &mut self,
        id: u32,
        cx: &mut impl Context,
    ) -> Result<TaskReply, JobError> {
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
    pub(super) fn in_warmup(&self) -> bool {
        self.samples_done() < self.policy.warmup_samples
    }

    /// Async warm-up: until `warmup_samples` are reported, only one worker (the first to
    /// ask, or the next one if it dies) gets tasks; the others wait.
    pub(super) fn warming_up(&mut self, id: u32) -> bool {
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

    pub(super) fn finish_training(&mut self, cx: &mut impl Context) {
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
}
