//! A group of changes folded into the rows each table ends up with.

use std::collections::HashMap;

use crate::job::{Change, Node};
use crate::ledger::ConsumedRange;
use crate::tasks::Task;

/// A table written by [`Batch`]: `INSERT INTO {head} VALUES (?, …), … {tail}`.
pub(super) struct Table {
    pub(super) head: &'static str,
    pub(super) cols: usize,
    pub(super) tail: &'static str,
}

pub(super) const TASKS: Table = Table {
    head: "tasks (id, epoch, file, start_row, end_row, offset_rows, state, worker, ord)",
    cols: 9,
    tail: "ON CONFLICT(id) DO UPDATE SET epoch=excluded.epoch, file=excluded.file,
  start_row=excluded.start_row, end_row=excluded.end_row, offset_rows=excluded.offset_rows,
  state=excluded.state, worker=excluded.worker, ord=excluded.ord",
};
pub(super) const LEDGER: Table = Table {
    head: "ledger (epoch, file, start_row, end_row)",
    cols: 4,
    tail: "",
};
pub(super) const NODES: Table = Table {
    head:
        "nodes (id, role, idx, state, pid, addr, last_seen_ms, started_ms, samples, step, restarts, metrics_addr)",
    cols: 12,
    tail: "ON CONFLICT(id) DO UPDATE SET role=excluded.role, idx=excluded.idx,
  state=excluded.state, pid=excluded.pid, addr=excluded.addr, metrics_addr=excluded.metrics_addr,
  last_seen_ms=excluded.last_seen_ms, started_ms=excluded.started_ms,
  samples=excluded.samples, step=excluded.step, restarts=excluded.restarts",
};
pub(super) const META: Table = Table {
    head: "meta (key, value)",
    cols: 2,
    tail: "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
};

/// A group of changes folded into the rows each table ends up with: the last version of
/// each task, node and meta key, every ledger range in order, and whether a
/// [`Change::ResetData`] first empties `tasks` and `ledger` (rows written before the
/// reset in the same group would be deleted by it, so they are dropped).
#[derive(Default)]
pub(super) struct Batch<'a> {
    pub(super) reset: bool,
    pub(super) tasks: Vec<&'a Task>,
    task_pos: HashMap<u64, usize>,
    pub(super) ranges: Vec<ConsumedRange>,
    pub(super) nodes: Vec<&'a Node>,
    node_pos: HashMap<u32, usize>,
    pub(super) meta: Vec<(&'static str, &'a str)>,
}

impl<'a> Batch<'a> {
    pub(super) fn fold(changes: &'a [Change]) -> Self {
        let mut b = Self::default();
        for c in changes {
            match c {
                Change::ResetData(tasks, ranges) => {
                    b.reset = true;
                    b.tasks.clear();
                    b.task_pos.clear();
                    b.ranges.clear();
                    tasks.iter().for_each(|t| b.task(t));
                    b.ranges.extend_from_slice(ranges);
                }
                Change::Task(t) => b.task(t),
                Change::Range(r) => b.ranges.push(*r),
                Change::Node(n) => match b.node_pos.get(&n.id) {
                    Some(&i) => b.nodes[i] = n,
                    None => {
                        b.node_pos.insert(n.id, b.nodes.len());
                        b.nodes.push(n);
                    }
                },
                Change::Meta(k, v) => match b.meta.iter_mut().find(|(key, _)| key == k) {
                    Some(slot) => slot.1 = v,
                    None => b.meta.push((k, v)),
                },
            }
        }
        b
    }

    fn task(&mut self, t: &'a Task) {
        match self.task_pos.get(&t.id) {
            Some(&i) => self.tasks[i] = t,
            None => {
                self.task_pos.insert(t.id, self.tasks.len());
                self.tasks.push(t);
            }
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        !self.reset
            && self.tasks.is_empty()
            && self.ranges.is_empty()
            && self.nodes.is_empty()
            && self.meta.is_empty()
    }
}
