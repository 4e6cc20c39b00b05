//! Dynamic data sharding: the task table (todo / doing / done), handed out on demand.
//!
//! A task is a row range of one file in one epoch. Workers report a progress offset (rows
//! of the task whose gradients the PS accepted); each report appends exactly the newly
//! covered range to the [`Ledger`]. A lost worker's task is split at its offset: the
//! reported part is done, exactly the unreported remainder goes back to the front of the
//! queue. Everything here is pure: no clock, no I/O.

use std::collections::{BTreeMap, HashMap};

use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::ledger::{ConsumedRange, Ledger, LedgerSummary};
use crate::serving::{Buffers, Served, Serving, HISTORY};

mod position;
mod stream;

/// How the data set is cut into tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataSharding {
    /// Rows of a normal task (batches per shard × batch size).
    pub rows_per_shard: u64,
    /// Smallest task a straggler is cut down to (one batch).
    pub min_rows: u64,
    /// Passes over the data.
    pub epochs: u32,
    /// Seed of the per-epoch shuffle of task order.
    pub seed: u64,
    /// Shuffle task order within each epoch.
    pub shuffle: bool,
    /// Permute the rows within each shard-sized block of a file, per epoch
    /// (`train.shuffle_buffer`; see [`TaskQueue::row_shuffle`]).
    pub shuffle_rows: bool,
}

/// A worker's place among `slots` workers when partitions are pinned: it owns the
/// files `f` with `f mod slots == slot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pin {
    /// The worker's rank among the running workers.
    pub slot: u32,
    /// How many workers run.
    pub slots: u32,
}

impl Pin {
    /// Whether file (partition) `file` is this worker's.
    pub fn owns(self, file: u32) -> bool {
        self.slots > 0 && file % self.slots == self.slot
    }
}

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskState {
    /// Waiting in the queue.
    Todo,
    /// Handed to this worker.
    Doing(u32),
    /// Every row reported (or the task was truncated at a lost worker's offset).
    Done,
}

/// One data task: rows `[start, end)` of file `file` in epoch `epoch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// Unique, never reused.
    pub id: u64,
    /// Epoch the rows are trained for.
    pub epoch: u32,
    /// Index of the file in the data set.
    pub file: u32,
    /// First row.
    pub start: u64,
    /// One past the last row.
    pub end: u64,
    /// Rows from `start` already reported.
    pub offset: u64,
    /// Queue state.
    pub state: TaskState,
    /// Position in the queue (smaller first); requeued remainders go to the front.
    pub order: i64,
}

impl Task {
    /// Rows in the task.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// True for a task without rows.
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// Answer to a worker asking for work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assignment {
    /// Train this task.
    Task(Task),
    /// Nothing now; other workers still hold tasks that may come back.
    Wait,
    /// Every epoch is done.
    Finished,
}

/// Why a progress report was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// The task is not (or no longer) held by this worker.
    #[error("task {task} is not held by worker {worker}")]
    NotHeld {
        /// Task id.
        task: u64,
        /// Reporting worker.
        worker: u32,
    },
    /// The offset goes backwards or past the task's end.
    #[error("offset {offset} is invalid for task {task} (reported {reported}, length {len})")]
    BadOffset {
        /// Task id.
        task: u64,
        /// Offered offset.
        offset: u64,
        /// Offset already recorded.
        reported: u64,
        /// Task length.
        len: u64,
    },
}

/// Effect of an accepted report.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reported {
    /// Newly covered range; `None` for a repeated report.
    pub range: Option<ConsumedRange>,
    /// The task is complete.
    pub task_done: bool,
    /// The epoch this completed, with its ledger verdict.
    pub epoch_done: Option<(u32, LedgerSummary)>,
}

/// Where training stands in the data: every task and the ledger, as a checkpoint stores
/// it. Restoring it resumes exactly there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataPosition {
    /// Every task (held ones are handed out again from their reported offset).
    pub tasks: Vec<Task>,
    /// Covered ledger ranges, merged.
    pub spans: Vec<ConsumedRange>,
    /// Per epoch `(epoch, consumed, duplicated)` as the ledger counted them.
    pub counts: Vec<(u32, u64, u64)>,
    /// Epochs whose tasks exist.
    pub generated_epochs: u32,
    /// Ledger verdicts of the epochs closed so far.
    pub epochs_closed: Vec<(u32, LedgerSummary)>,
    /// An online job's partitions' start offsets (its files are stream partitions, and
    /// their tasks are offset ranges); absent for a job over files. In a mixture job
    /// it covers every file: 0 for the history's files, then the partitions' starts.
    #[serde(default)]
    pub stream_starts: Option<Vec<u64>>,
    /// Index of the first stream partition among the files (the history's files come
    /// before it); 0 for an online job without history.
    #[serde(default)]
    pub stream_from: u32,
}

impl DataPosition {
    /// Samples reported trained (all epochs).
    pub fn samples(&self) -> u64 {
        self.counts.iter().map(|c| c.1).sum()
    }

    /// Per epoch, what the merged spans do not show: `(epoch, consumed − covered,
    /// duplicated)`.
    pub fn ledger_adjustments(&self) -> Vec<(u32, u64, u64)> {
        self.counts
            .iter()
            .map(|&(e, c, d)| {
                let covered: u64 = self
                    .spans
                    .iter()
                    .filter(|r| r.epoch == e)
                    .map(ConsumedRange::rows)
                    .sum();
                (e, c.saturating_sub(covered), d)
            })
            .filter(|a| a.1 > 0 || a.2 > 0)
            .collect()
    }
}

/// The task table and the ledger.
#[derive(Debug, Clone)]
pub struct TaskQueue {
    spec: DataSharding,
    file_rows: Vec<u64>,
    tasks: BTreeMap<u64, Task>,
    /// Queued task ids: one buffer per history source (`[[data.source]]`, one without),
    /// then one for the stream's partitions, served by a policy ([`crate::serving`]).
    todo: Buffers,
    /// The history source of each file (empty: every file is source 0); a stream
    /// partition's tasks wait in the last buffer whatever this says.
    file_source: Vec<u32>,
    doing: HashMap<u32, u64>,
    next_id: u64,
    next_front: i64,
    next_back: i64,
    generated_epochs: u32,
    open_per_epoch: BTreeMap<u32, u64>,
    ledger: Ledger,
    /// Tasks created or changed since the last [`TaskQueue::take_dirty`].
    dirty: Vec<u64>,
    /// Ledger ranges added since the last [`TaskQueue::take_dirty`].
    new_ranges: Vec<ConsumedRange>,
    /// An online job's queue: files from `stream_from` on are stream partitions whose
    /// rows (offsets) grow as messages arrive ([`TaskQueue::extend_stream`]); its single
    /// epoch never ends.
    open_ended: bool,
    /// Index of the first stream partition; the files before it are the history (all of
    /// them in a job without a stream).
    stream_from: u32,
    /// First row (offset) of each file that belongs to the job: 0 for files, the start
    /// offset of each stream partition.
    file_start: Vec<u64>,
    /// A following job's queue (`data.follow`): files are appended as their partitions
    /// land ([`TaskQueue::append_files`]); its single epoch stays open while `growing`.
    follow: bool,
    /// More files may still be appended (cleared by [`TaskQueue::stop_growing`]).
    growing: bool,
    /// Rows per epoch the whole list is expected to hold while it is still being counted
    /// ([`TaskQueue::count_later`]); what progress and the learning-rate schedule divide by.
    expected_rows: u64,
    /// Done tasks dropped by [`TaskQueue::compact`] since this queue was built.
    compacted: u64,
    /// Online queues: per worker, the partition and end offset of its last finished task
    /// (see [`TaskQueue::continuation`]).
    last_end: HashMap<u32, (u32, u64)>,
}

impl TaskQueue {
    /// A fresh queue over files with the given row counts; no task exists until asked.
    pub fn new(spec: DataSharding, file_rows: Vec<u64>) -> Self {
        assert!(spec.rows_per_shard > 0 && spec.min_rows > 0);
        Self {
            file_start: vec![0; file_rows.len()],
            stream_from: file_rows.len() as u32,
            open_ended: false,
            follow: false,
            growing: false,
            expected_rows: 0,
            ledger: Ledger::new(file_rows.clone()),
            spec,
            file_rows,
            tasks: BTreeMap::new(),
            todo: Buffers::new(2),
            file_source: Vec::new(),
            doing: HashMap::new(),
            next_id: 1,
            next_front: -1,
            next_back: 0,
            generated_epochs: 0,
            open_per_epoch: BTreeMap::new(),
            dirty: Vec::new(),
            new_ranges: Vec::new(),
            compacted: 0,
            last_end: HashMap::new(),
        }
    }

    /// A queue over stream partitions (an online job) whose data begins at offsets
    /// `starts`; no task exists until [`TaskQueue::extend_stream`] says messages arrived.
    /// Its single epoch (0) never ends.
    pub fn new_stream(spec: DataSharding, starts: Vec<u64>) -> Self {
        Self::new_mixed(spec, Vec::new(), starts)
    }

    /// A mixture job's queue: the history's files (of `history_rows` rows), cut into
    /// tasks now (shuffled per `spec`), then stream partitions beginning at offsets
    /// `starts`, dealt as messages arrive. Each source has its own buffer; which one
    /// serves a request is [`TaskQueue::set_serving`]'s policy. Its single epoch (0)
    /// never ends.
    pub fn new_mixed(spec: DataSharding, history_rows: Vec<u64>, starts: Vec<u64>) -> Self {
        let mut q = Self::bare_mixed(spec, history_rows, starts);
        q.generate_epoch();
        q
    }

    /// [`TaskQueue::new_mixed`] without any task yet.
    fn bare_mixed(spec: DataSharding, history_rows: Vec<u64>, starts: Vec<u64>) -> Self {
        let stream_from = history_rows.len();
        let mut file_start = vec![0; stream_from];
        file_start.extend(&starts);
        let mut file_rows = history_rows;
        file_rows.extend(&starts);
        let mut q = Self::new(DataSharding { epochs: 1, ..spec }, file_rows);
        q.open_ended = true;
        q.stream_from = stream_from as u32;
        q.ledger.set_starts(file_start.clone());
        q.file_start = file_start;
        q
    }

    /// How the buffers are served (`data.mix`, `[[data.source]]` weights): one weight per
    /// history source, then the stream's. A queue with one source serves it whatever the
    /// policy.
    pub fn set_serving(&mut self, serving: Serving) {
        self.todo.set_serving(serving);
    }

    /// The serving policy in force.
    pub fn serving(&self) -> &Serving {
        self.todo.serving()
    }

    /// Splits the history into `count` sources (`[[data.source]]`): file `f`'s tasks wait
    /// in buffer `per_file[f]` (0 past its end). Queued tasks are dealt again in their
    /// order, so a restored queue serves exactly what it held.
    pub fn set_sources(&mut self, count: usize, per_file: Vec<u32>) {
        let count = count.max(1);
        debug_assert!(per_file.iter().all(|&s| (s as usize) < count));
        let serving = self.todo.serving().clone();
        let queued = self.todo.drain();
        self.todo = Buffers::new(count + 1);
        self.todo.set_serving(serving);
        self.file_source = per_file;
        for (_, id) in queued {
            let b = self.source(self.tasks[&id].file);
            self.todo.push_back(b, id);
        }
    }

    /// Number of history sources.
    pub fn source_count(&self) -> usize {
        self.todo.count() - 1
    }

    /// The history source of each file (empty when the job has one).
    pub fn file_sources(&self) -> &[u32] {
        &self.file_source
    }

    /// Tasks and rows handed out per buffer (the history's sources, then the stream),
    /// since this queue was built.
    pub fn served(&self) -> &[Served] {
        self.todo.served()
    }

    /// Queued tasks per buffer (the history's sources, then the stream).
    pub fn queued(&self) -> Vec<usize> {
        (0..self.todo.count())
            .map(|b| self.todo.queue(b).len())
            .collect()
    }

    /// The buffer of stream partitions' tasks (after the history's).
    fn stream_buffer(&self) -> usize {
        self.todo.count() - 1
    }

    /// Index of the first stream partition among the files (the file count for a job
    /// without a stream).
    pub fn stream_from(&self) -> u32 {
        if self.open_ended {
            self.stream_from
        } else {
            self.file_rows.len() as u32
        }
    }

    /// True for a mixture job's queue: a stream after history files.
    pub fn is_mixture(&self) -> bool {
        self.open_ended && self.stream_from > 0
    }

    /// The buffer file `file`'s tasks wait in.
    fn source(&self, file: u32) -> usize {
        if self.open_ended && file >= self.stream_from {
            self.stream_buffer()
        } else {
            self.file_source
                .get(file as usize)
                .map_or(HISTORY, |&s| s as usize)
        }
    }

    /// The shard specification.
    pub fn spec(&self) -> &DataSharding {
        &self.spec
    }

    /// Row counts of the files.
    pub fn file_rows(&self) -> &[u64] {
        &self.file_rows
    }

    /// Number of epochs whose tasks exist.
    pub fn generated_epochs(&self) -> u32 {
        self.generated_epochs
    }

    /// The ledger of consumed ranges.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// A task by id.
    pub fn task(&self, id: u64) -> Option<&Task> {
        self.tasks.get(&id)
    }

    /// The task a worker holds.
    pub fn held_by(&self, worker: u32) -> Option<&Task> {
        self.doing.get(&worker).and_then(|id| self.tasks.get(id))
    }

    /// True when `worker` holds a task: `held_by(worker).is_some()` without looking the
    /// task up (tasks are never removed, so a held id always names one).
    pub fn holds_task(&self, worker: u32) -> bool {
        self.doing.contains_key(&worker)
    }

    /// (todo, doing, done) task counts.
    pub fn counts(&self) -> (u64, u64, u64) {
        let todo = self.todo.len() as u64;
        let doing = self.doing.len() as u64;
        (
            todo,
            doing,
            self.tasks.len() as u64 - todo - doing + self.compacted,
        )
    }

    /// Rows to train over the whole job.
    pub fn total_rows(&self) -> u64 {
        if self.open_ended {
            // Dealt so far: an online job's total grows as messages arrive.
            return self
                .file_rows
                .iter()
                .zip(&self.file_start)
                .map(|(e, s)| e - s)
                .sum();
        }
        self.rows_per_epoch() * self.spec.epochs as u64
    }

    /// Rows of one epoch over the history's files: while the list is still being counted,
    /// at least the rows it is expected to hold.
    pub fn rows_per_epoch(&self) -> u64 {
        let known = self.file_rows[..self.stream_from() as usize]
            .iter()
            .sum::<u64>();
        if self.growing && !self.follow {
            known.max(self.expected_rows)
        } else {
            known
        }
    }

    /// Epoch currently being handed out (the oldest with open tasks).
    pub fn current_epoch(&self) -> u32 {
        self.open_per_epoch
            .iter()
            .find(|(_, &n)| n > 0)
            .map(|(&e, _)| e)
            .unwrap_or(self.generated_epochs.saturating_sub(1))
    }

    /// True once every epoch's tasks exist and all are done.
    pub fn is_finished(&self) -> bool {
        !self.open_ended
            && !self.growing
            && self.generated_epochs == self.spec.epochs
            && self.todo.is_empty()
            && self.doing.is_empty()
    }

    /// Changed tasks and new ledger ranges since the last call (for persistence).
    pub fn take_dirty(&mut self) -> (Vec<Task>, Vec<ConsumedRange>) {
        let mut ids = std::mem::take(&mut self.dirty);
        ids.sort_unstable();
        ids.dedup();
        let tasks = ids
            .into_iter()
            .filter_map(|id| self.tasks.get(&id).cloned())
            .collect();
        (tasks, std::mem::take(&mut self.new_ranges))
    }

    fn new_task(&mut self, epoch: u32, file: u32, start: u64, end: u64, front: bool) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let order = if front {
            self.next_front -= 1;
            self.next_front + 1
        } else {
            self.next_back += 1;
            self.next_back - 1
        };
        self.tasks.insert(
            id,
            Task {
                id,
                epoch,
                file,
                start,
                end,
                offset: 0,
                state: TaskState::Todo,
                order,
            },
        );
        *self.open_per_epoch.entry(epoch).or_default() += 1;
        let b = self.source(file);
        if front {
            self.todo.push_front(b, id);
        } else {
            self.todo.push_back(b, id);
        }
        self.dirty.push(id);
        id
    }

    /// Creates the tasks of the next epoch, in seeded shuffled order.
    fn generate_epoch(&mut self) {
        let epoch = self.generated_epochs;
        let mut ranges = Vec::new();
        // A mixture job's stream partitions are dealt as messages arrive, not here.
        let history = &self.file_rows[..self.stream_from() as usize];
        for (f, &rows) in history.iter().enumerate() {
            ranges.extend(shards(rows, self.spec.rows_per_shard).map(|(s, e)| (f as u32, s, e)));
        }
        if self.spec.shuffle {
            let mut rng = rand::rngs::StdRng::seed_from_u64(
                self.spec.seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            );
            ranges.shuffle(&mut rng);
        }
        for (f, s, e) in ranges {
            self.new_task(epoch, f, s, e, false);
        }
        self.generated_epochs += 1;
    }

    /// The order of `task`'s rows: with [`DataSharding::shuffle_rows`], a file's rows are
    /// permuted within blocks of `rows_per_shard` (the shards' own boundaries, so a shard
    /// reads one block) by a seed of the job, epoch and file; a task's `start..end` then
    /// count slots of that order (`elastrec_data::shuffled`). Stream partitions keep their
    /// arrival order.
    pub fn row_shuffle(&self, task: &Task) -> Option<elastrec_data::RowShuffle> {
        use elastrec_common::splitmix::derive;
        (self.spec.shuffle_rows && task.file < self.stream_from()).then(|| {
            elastrec_data::RowShuffle {
                block_rows: self.spec.rows_per_shard,
                file_rows: self.file_rows[task.file as usize],
                seed: derive(
                    derive(self.spec.seed, u64::from(task.epoch)),
                    u64::from(task.file),
                ),
            }
        })
    }

    /// Hands `worker` a task. A worker that already holds one gets the same one back (a
    /// lost reply is harmless). `small` cuts the task down for a straggler.
    pub fn assign(&mut self, worker: u32, small: bool) -> Assignment {
        self.assign_pinned(worker, small, None)
    }

    /// [`TaskQueue::assign`], where a `pin` restricts `worker` to the tasks of its own
    /// files (stream partitions): the first one in queue order whose file is
    /// `pin.slot` modulo `pin.slots`. Without one the worker takes the queue's head.
    pub fn assign_pinned(&mut self, worker: u32, small: bool, pin: Option<Pin>) -> Assignment {
        if let Some(t) = self.held_by(worker) {
            return Assignment::Task(t.clone());
        }
        // A list still being counted cuts its next epoch once it is complete.
        if self.todo.is_empty() && self.generated_epochs < self.spec.epochs && !self.growing {
            self.generate_epoch();
        }
        let next = match pin {
            None => match self.continuation(worker) {
                Some(i) => {
                    let b = self.stream_buffer();
                    self.todo.remove(b, i).map(|id| (b, id))
                }
                None => self
                    .todo
                    .pick()
                    .and_then(|b| self.todo.remove(b, 0).map(|id| (b, id))),
            },
            Some(pin) => {
                let stream = self.stream_buffer();
                std::iter::once(stream).chain(0..stream).find_map(|b| {
                    let at = self
                        .todo
                        .queue(b)
                        .iter()
                        .position(|id| pin.owns(self.tasks[id].file))?;
                    self.todo.remove(b, at).map(|id| (b, id))
                })
            }
        };
        let Some((buffer, id)) = next else {
            return if self.is_finished() {
                Assignment::Finished
            } else {
                Assignment::Wait
            };
        };
        let (epoch, file, start, end) = {
            let t = &self.tasks[&id];
            (t.epoch, t.file, t.start, t.end)
        };
        let small_rows = (self.spec.rows_per_shard / 2).max(self.spec.min_rows);
        if small && end - start > small_rows {
            // Keep the head for the straggler; the tail goes back to the front.
            let cut = start + small_rows;
            self.tasks.get_mut(&id).expect("task").end = cut;
            self.new_task(epoch, file, cut, end, true);
        }
        let t = self.tasks.get_mut(&id).expect("task");
        self.todo.record_served(buffer, t.end - t.start - t.offset);
        t.state = TaskState::Doing(worker);
        self.doing.insert(worker, id);
        self.dirty.push(id);
        Assignment::Task(t.clone())
    }

    /// Records that `worker` trained rows `[start, start + offset)` of `task`.
    pub fn report(&mut self, worker: u32, task: u64, offset: u64) -> Result<Reported, ReportError> {
        if self.doing.get(&worker) != Some(&task) {
            return Err(ReportError::NotHeld { task, worker });
        }
        let t = self.tasks.get_mut(&task).expect("held task exists");
        if offset < t.offset || offset > t.len() {
            return Err(ReportError::BadOffset {
                task,
                offset,
                reported: t.offset,
                len: t.len(),
            });
        }
        let mut out = Reported::default();
        if offset > t.offset {
            let range = ConsumedRange {
                epoch: t.epoch,
                file: t.file,
                start: t.start + t.offset,
                end: t.start + offset,
            };
            t.offset = offset;
            self.ledger.record(range);
            self.new_ranges.push(range);
            out.range = Some(range);
            self.dirty.push(task);
        }
        if offset == t.len() {
            t.state = TaskState::Done;
            let epoch = t.epoch;
            if self.open_ended {
                self.last_end.insert(worker, (t.file, t.end));
            }
            self.doing.remove(&worker);
            out.task_done = true;
            out.epoch_done = self.close_one(epoch);
        }
        Ok(out)
    }

    /// In an online job's queue, the place of the task that starts where `worker`'s last
    /// finished task ended, if it is among the first two tasks per partition: the worker's
    /// consumer then reads on without a new assignment (`elastrec_stream::StreamInput`),
    /// and the oldest-first order bends by at most about one watermark poll.
    fn continuation(&self, worker: u32) -> Option<usize> {
        if !self.open_ended {
            return None;
        }
        let &(file, end) = self.last_end.get(&worker)?;
        let window = 2 * self.file_rows.len().max(1);
        let stream = self.stream_buffer();
        self.todo.queue(stream).iter().take(window).position(|id| {
            let t = &self.tasks[id];
            t.file == file && t.start == end && t.offset == 0
        })
    }

    fn close_one(&mut self, epoch: u32) -> Option<(u32, LedgerSummary)> {
        let open = self.open_per_epoch.entry(epoch).or_default();
        *open -= 1;
        if self.open_ended || self.growing {
            return None; // a stream's epoch never ends; a following job's waits for data
        }
        // Open counts every todo and doing task of the epoch.
        (*open == 0).then(|| (epoch, self.ledger.summary(epoch)))
    }

    /// The worker is gone (dead, stopped or scaled away): its task's reported part is
    /// done and exactly the unreported remainder returns to the front of the queue.
    /// Returns the id of the requeued task.
    pub fn release(&mut self, worker: u32) -> Option<u64> {
        self.last_end.remove(&worker);
        let id = self.doing.remove(&worker)?;
        let b = self.source(self.tasks[&id].file);
        let t = self.tasks.get_mut(&id).expect("held task exists");
        if t.offset == 0 {
            t.state = TaskState::Todo;
            self.next_front -= 1;
            t.order = self.next_front + 1;
            self.todo.push_front(b, id);
            self.dirty.push(id);
            return Some(id);
        }
        let (epoch, file, cut, end) = (t.epoch, t.file, t.start + t.offset, t.end);
        t.end = cut;
        t.state = TaskState::Done;
        self.dirty.push(id);
        // The truncated task closes; the remainder opens: the epoch stays open.
        *self.open_per_epoch.entry(epoch).or_default() -= 1;
        Some(self.new_task(epoch, file, cut, end, true))
    }
}

/// Row ranges `[s, e)` of a file of `rows` rows, `per_shard` rows each (the last shorter).
fn shards(rows: u64, per_shard: u64) -> impl Iterator<Item = (u64, u64)> {
    (0..rows)
        .step_by(per_shard as usize)
        .map(move |s| (s, (s + per_shard).min(rows)))
}

#[cfg(test)]
mod tests;
