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
    /// then one for the stream's partitions, served by a policy (`crate::serving`).
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

    /// Makes this the queue of a following job: its one epoch exists at once, stays open
    /// until [`TaskQueue::stop_growing`], and takes appended files. A file without any task
    /// (appended after the checkpointed position this queue was rebuilt from, or persisted
    /// just before a master stopped) is cut into tasks now.
    pub fn follow(&mut self) {
        debug_assert_eq!(self.spec.epochs, 1, "a following job has one epoch");
        self.follow = true;
        self.growing = true;
        if self.generated_epochs == 0 {
            self.generate_epoch();
            return;
        }
        let mut tasked = vec![false; self.file_rows.len()];
        for t in self.tasks.values() {
            if let Some(f) = tasked.get_mut(t.file as usize) {
                *f = true;
            }
        }
        for (f, tasked) in tasked.into_iter().enumerate() {
            if !tasked {
                self.cut_file(f as u32);
            }
        }
    }

    /// True for a following job's queue.
    pub fn is_following(&self) -> bool {
        self.follow
    }

    /// True while a following job's queue may still take files.
    pub fn is_growing(&self) -> bool {
        self.growing
    }

    /// Appends files of the given rows, of the given history sources, to a following
    /// job's queue and cuts them into tasks at the back of their buffers (after every task
    /// already there: data is trained in the order it landed). Returns the index of the
    /// first new file.
    pub fn append_files(&mut self, rows: &[u64], sources: &[u32]) -> u32 {
        let first = self.file_rows.len() as u32;
        if !self.follow {
            return first;
        }
        for (i, &r) in rows.iter().enumerate() {
            if self.source_count() > 1 {
                self.file_source.resize(first as usize + i, 0);
                let s = sources.get(i).copied().unwrap_or(0);
                self.file_source.push(s.min(self.source_count() as u32 - 1));
            }
            self.file_rows.push(r);
            self.file_start.push(0);
            self.ledger.add_file(r);
            self.cut_file(first + i as u32);
        }
        self.growing = true;
        first
    }

    /// No more files will come: the epoch closes once its tasks are done. Returns the
    /// epoch's verdict when that is already the case.
    pub fn stop_growing(&mut self) -> Option<(u32, LedgerSummary)> {
        if !std::mem::take(&mut self.growing) {
            return None;
        }
        let open = self.open_per_epoch.get(&0).copied().unwrap_or(0);
        (self.follow && open == 0).then(|| (0, self.ledger.summary(0)))
    }

    /// Cuts file `f` of epoch 0 into shards at the back of the queue.
    fn cut_file(&mut self, f: u32) {
        for (s, e) in shards(self.file_rows[f as usize], self.spec.rows_per_shard) {
            self.new_task(0, f, s, e, false);
        }
    }

    /// True for an online job's queue.
    pub fn is_stream(&self) -> bool {
        self.open_ended
    }

    /// Messages of partition `file` up to offset `high` exist: cuts them into tasks of
    /// `rows_per_shard` at the back of the queue (oldest data first, across partitions).
    /// A remainder smaller than a shard is cut only with `flush` (it has waited long
    /// enough). Returns the rows (offsets) newly dealt into tasks.
    pub fn extend_stream(&mut self, file: u32, high: u64, flush: bool) -> u64 {
        let f = file as usize;
        if !self.open_ended || file < self.stream_from || f >= self.file_rows.len() {
            return 0;
        }
        let from = self.file_rows[f];
        let mut s = from;
        while high.saturating_sub(s) >= self.spec.rows_per_shard || (flush && high > s) {
            let e = (s + self.spec.rows_per_shard).min(high);
            self.new_task(0, file, s, e, false);
            s = e;
        }
        self.file_rows[f] = s;
        self.ledger.extend_file(f, s);
        s - from
    }

    /// Done tasks an online job's queue has dropped ([`TaskQueue::compact`]).
    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    /// Drops an online job's done tasks, which would otherwise grow without end: the
    /// ledger's merged spans already say what they trained. Per partition the task that
    /// reaches furthest stays, because how far a partition was dealt is restored from its
    /// tasks. Returns how many were dropped. Other queues keep their tasks (a following
    /// job cuts a file without tasks again).
    pub fn compact(&mut self) -> u64 {
        if !self.open_ended {
            return 0;
        }
        let mut furthest: HashMap<u32, (u64, u64)> = HashMap::new();
        for t in self.tasks.values() {
            let best = furthest.entry(t.file).or_insert((t.end, t.id));
            if t.end > best.0 {
                *best = (t.end, t.id);
            }
        }
        let keep: std::collections::HashSet<u64> = furthest.values().map(|&(_, id)| id).collect();
        let before = self.tasks.len();
        self.tasks
            .retain(|id, t| t.state != TaskState::Done || keep.contains(id));
        let dropped = (before - self.tasks.len()) as u64;
        self.compacted += dropped;
        dropped
    }

    /// Offsets of partition `file` known to exist but not yet cut into tasks, given its
    /// high watermark.
    pub fn undealt(&self, file: u32, high: u64) -> u64 {
        self.file_rows
            .get(file as usize)
            .map_or(0, |&end| high.saturating_sub(end))
    }

    /// Per file, the first offset not yet trained: everything before it is covered by
    /// the ledger (what a consumer group's committed offset means).
    pub fn committed(&self) -> Vec<u64> {
        self.committed_from(0)
    }

    /// [`TaskQueue::committed`] of the stream partitions only (what the stream watcher
    /// reports and commits; a mixture job's history files come before them).
    pub fn partitions_committed(&self) -> Vec<u64> {
        self.committed_from(self.stream_from())
    }

    fn committed_from(&self, first: u32) -> Vec<u64> {
        (first as usize..self.file_rows.len())
            .map(|f| self.ledger.covered_from(f as u32, self.file_start[f]))
            .collect()
    }

    /// Per file, the first row (offset) that belongs to the job.
    pub fn file_start(&self) -> &[u64] {
        &self.file_start
    }

    /// Rebuilds a queue from persisted tasks and ledger ranges.
    pub fn restore(
        spec: DataSharding,
        file_rows: Vec<u64>,
        tasks: Vec<Task>,
        ranges: &[ConsumedRange],
        generated_epochs: u32,
    ) -> Self {
        let mut q = Self::new(spec, file_rows);
        q.generated_epochs = generated_epochs;
        q.restore_ranges(tasks, ranges);
        q
    }

    /// [`TaskQueue::restore`] for an online or mixture job (see [`TaskQueue::new_mixed`]):
    /// how far each partition was dealt follows from its tasks. A position from before the
    /// history was cut (`generated_epochs` 0) cuts it now.
    pub fn restore_mixed(
        spec: DataSharding,
        history_rows: Vec<u64>,
        starts: Vec<u64>,
        tasks: Vec<Task>,
        ranges: &[ConsumedRange],
        generated_epochs: u32,
    ) -> Self {
        let mut q = Self::bare_mixed(spec, history_rows, starts);
        if generated_epochs == 0 && tasks.is_empty() {
            q.generate_epoch();
        } else {
            q.generated_epochs = 1;
        }
        q.restore_ranges(tasks, ranges);
        q
    }

    fn restore_ranges(&mut self, tasks: Vec<Task>, ranges: &[ConsumedRange]) {
        let q = self;
        if q.open_ended {
            for t in &tasks {
                if let Some(end) = q.file_rows.get_mut(t.file as usize) {
                    *end = (*end).max(t.end);
                }
            }
            for (f, &end) in q.file_rows.iter().enumerate() {
                q.ledger.extend_file(f, end);
            }
        }
        for &r in ranges {
            q.ledger.record(r);
        }
        let mut todo: Vec<(i64, u64)> = Vec::new();
        for t in tasks {
            q.next_id = q.next_id.max(t.id + 1);
            q.next_front = q.next_front.min(t.order - 1);
            q.next_back = q.next_back.max(t.order + 1);
            match t.state {
                TaskState::Todo => todo.push((t.order, t.id)),
                TaskState::Doing(w) => {
                    q.doing.insert(w, t.id);
                }
                TaskState::Done => {}
            }
            if t.state != TaskState::Done {
                *q.open_per_epoch.entry(t.epoch).or_default() += 1;
            }
            q.tasks.insert(t.id, t);
        }
        todo.sort();
        for (_, id) in todo {
            let b = q.source(q.tasks[&id].file);
            q.todo.push_back(b, id);
        }
    }

    /// The position to checkpoint (without the closed-epoch verdicts, which the job keeps).
    pub fn position(&self) -> DataPosition {
        DataPosition {
            tasks: self.tasks.values().cloned().collect(),
            spans: self.ledger.spans(),
            counts: self.ledger.counts(),
            generated_epochs: self.generated_epochs,
            ..self.start_position()
        }
    }

    /// The position before any training: what a recovery with no checkpoint yet restores.
    pub fn start_position(&self) -> DataPosition {
        DataPosition {
            tasks: Vec::new(),
            spans: Vec::new(),
            counts: Vec::new(),
            generated_epochs: 0,
            epochs_closed: Vec::new(),
            stream_starts: self.open_ended.then(|| self.file_start.clone()),
            stream_from: if self.open_ended { self.stream_from } else { 0 },
        }
    }

    /// Rebuilds the queue at a checkpointed position. No worker holds anything afterwards:
    /// a task that was held goes back to the front of the queue from its reported offset.
    pub fn from_position(spec: DataSharding, file_rows: Vec<u64>, pos: &DataPosition) -> Self {
        let mut q = match &pos.stream_starts {
            Some(starts) => {
                let from = (pos.stream_from as usize).min(starts.len());
                let mut history = file_rows;
                history.truncate(from);
                history.resize(from, 0);
                Self::restore_mixed(
                    spec,
                    history,
                    starts[from..].to_vec(),
                    pos.tasks.clone(),
                    &pos.spans,
                    pos.generated_epochs,
                )
            }
            None => Self::restore(
                spec,
                file_rows,
                pos.tasks.clone(),
                &pos.spans,
                pos.generated_epochs,
            ),
        };
        for (e, c, d) in pos.ledger_adjustments() {
            q.ledger.adjust(e, c, d);
        }
        let holders: Vec<u32> = q.doing.keys().copied().collect();
        for w in holders {
            q.release(w);
        }
        // Everything is rewritten by the caller; nothing is pending.
        q.dirty = q.tasks.keys().copied().collect();
        q.new_ranges.clear();
        q
    }

    /// Adds per-epoch counter adjustments (see [`DataPosition::ledger_adjustments`]).
    pub fn adjust_ledger(&mut self, adjustments: &[(u32, u64, u64)]) {
        for &(e, c, d) in adjustments {
            self.ledger.adjust(e, c, d);
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
        self.file_rows.iter().sum::<u64>() * self.spec.epochs as u64
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
        if self.todo.is_empty() && self.generated_epochs < self.spec.epochs {
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
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn spec(rows: u64, epochs: u32) -> DataSharding {
        DataSharding {
            rows_per_shard: rows,
            min_rows: 10,
            epochs,
            seed: 3,
            shuffle: true,
            shuffle_rows: false,
        }
    }

    fn drain(q: &mut TaskQueue, worker: u32) -> Vec<(u32, LedgerSummary)> {
        let mut epochs = Vec::new();
        loop {
            match q.assign(worker, false) {
                Assignment::Task(t) => {
                    let r = q.report(worker, t.id, t.len()).unwrap();
                    epochs.extend(r.epoch_done);
                }
                Assignment::Wait => panic!("single worker never waits"),
                Assignment::Finished => return epochs,
            }
        }
    }

    /// Trains every task handed out until the queue makes the worker wait.
    fn train_until_wait(q: &mut TaskQueue, worker: u32) -> Vec<(u32, LedgerSummary)> {
        let mut epochs = Vec::new();
        while let Assignment::Task(t) = q.assign(worker, false) {
            epochs.extend(q.report(worker, t.id, t.len()).unwrap().epoch_done);
        }
        epochs
    }

    /// A following job's queue waits for more files while it grows, trains appended files
    /// after the ones before them, and closes its one epoch exactly once, with the ledger
    /// exact over every file, when growth stops.
    #[test]
    fn a_following_queue_trains_appended_files_and_ends_when_growth_stops() {
        let mut q = TaskQueue::new(spec(100, 1), vec![250, 50]);
        q.follow();
        assert!(
            train_until_wait(&mut q, 1).is_empty(),
            "no verdict while growing"
        );
        assert_eq!(q.assign(1, false), Assignment::Wait);
        assert!(!q.is_finished());
        let first = q.append_files(&[120, 0, 30], &[]);
        assert_eq!(first, 2);
        // Appended tasks come in file order (never shuffled in before older data).
        let mut files = Vec::new();
        while let Assignment::Task(t) = q.assign(1, false) {
            files.push(t.file);
            q.report(1, t.id, t.len()).unwrap();
        }
        assert_eq!(files, vec![2, 2, 4]);
        let (epoch, verdict) = q.stop_growing().expect("everything was trained");
        assert_eq!(epoch, 0);
        assert_eq!((verdict.consumed, verdict.missing), (450, 0));
        assert!(verdict.exactly_once());
        assert!(q.is_finished());
        assert_eq!(q.stop_growing(), None, "closed once");
    }

    /// Growth that stops while tasks are open closes the epoch with the last report.
    #[test]
    fn a_following_queue_closes_with_its_last_task_after_growth_stops() {
        let mut q = TaskQueue::new(spec(100, 1), vec![100]);
        q.follow();
        let Assignment::Task(t) = q.assign(1, false) else {
            panic!()
        };
        assert_eq!(q.stop_growing(), None, "a task is still open");
        let r = q.report(1, t.id, t.len()).unwrap();
        assert_eq!(r.epoch_done.map(|e| e.1.missing), Some(0));
        assert_eq!(q.assign(1, false), Assignment::Finished);
    }

    /// Files appended after a checkpointed position (or stored just before a master
    /// stopped) have no task in the rebuilt queue: following again cuts them, once.
    #[test]
    fn following_again_cuts_the_files_a_rebuilt_queue_has_no_task_for() {
        let mut q = TaskQueue::new(spec(100, 1), vec![100]);
        q.follow();
        let pos = q.position();
        q.append_files(&[200], &[]);
        let mut r = TaskQueue::from_position(spec(100, 1), vec![100, 200], &pos);
        r.follow();
        r.follow();
        let tasks: Vec<_> = r.tasks.values().map(|t| (t.file, t.start, t.end)).collect();
        assert_eq!(tasks, vec![(0, 0, 100), (1, 0, 100), (1, 100, 200)]);
        r.stop_growing();
        let verdicts = drain(&mut r, 1);
        assert_eq!(verdicts.len(), 1);
        assert_eq!((verdicts[0].1.consumed, verdicts[0].1.missing), (300, 0));
    }

    /// A queue rebuilt from a mid-epoch position (one task held) finishes the job with the
    /// ledger exact: the held task's unreported rows are trained once, nothing twice.
    #[test]
    fn position_round_trip_resumes_exactly() {
        let mut q = TaskQueue::new(spec(100, 1), vec![1000]);
        let Assignment::Task(a) = q.assign(1, false) else {
            panic!()
        };
        q.report(1, a.id, a.len()).unwrap();
        let Assignment::Task(b) = q.assign(1, false) else {
            panic!()
        };
        q.report(1, b.id, 30).unwrap();
        let pos = q.position();
        assert_eq!(pos.samples(), a.len() + 30);
        let json = serde_json::to_string(&pos).unwrap();
        let pos: DataPosition = serde_json::from_str(&json).unwrap();
        // Training went on after the checkpoint; the rebuilt queue forgets it.
        q.report(1, b.id, 60).unwrap();
        let mut r = TaskQueue::from_position(spec(100, 1), vec![1000], &pos);
        assert_eq!(r.ledger().summary(0).consumed, a.len() + 30);
        let Assignment::Task(next) = r.assign(2, false) else {
            panic!()
        };
        assert_eq!((next.start, next.end), (b.start + 30, b.end));
        let closed = drain(&mut r, 2);
        assert_eq!(closed.len(), 1);
        assert!(closed[0].1.exactly_once(), "{:?}", closed[0].1);
    }

    #[test]
    fn one_worker_covers_every_epoch_exactly_once() {
        let mut q = TaskQueue::new(spec(64, 3), vec![1000, 17, 0, 300]);
        let epochs = drain(&mut q, 1);
        assert_eq!(epochs.len(), 3);
        for (e, (epoch, s)) in epochs.iter().enumerate() {
            assert_eq!(*epoch, e as u32);
            assert_eq!(s.consumed, 1317);
            assert!(s.exactly_once(), "{s}");
        }
        assert!(q.is_finished());
    }

    #[test]
    fn shuffle_is_seeded_and_differs_per_epoch() {
        let order = |seed| {
            let mut s = spec(10, 2);
            s.seed = seed;
            let mut q = TaskQueue::new(s, vec![200]);
            let mut v = Vec::new();
            while let Assignment::Task(t) = q.assign(1, false) {
                v.push((t.epoch, t.start));
                q.report(1, t.id, t.len()).unwrap();
            }
            v
        };
        assert_eq!(order(5), order(5));
        assert_ne!(order(5), order(6));
        let v = order(5);
        let e0: Vec<u64> = v.iter().filter(|x| x.0 == 0).map(|x| x.1).collect();
        let e1: Vec<u64> = v.iter().filter(|x| x.0 == 1).map(|x| x.1).collect();
        assert_ne!(e0, e1);
    }

    /// With `shuffle_rows`, a task of a file carries its rows' order: blocks are the
    /// shards, and each epoch and file has its own seed; a mixture's stream partitions
    /// keep their arrival order.
    #[test]
    fn row_shuffle_is_per_epoch_and_file_and_spares_streams() {
        let s = DataSharding {
            shuffle_rows: true,
            ..spec(100, 2)
        };
        let mut q = TaskQueue::new(s.clone(), vec![250, 130]);
        let mut seeds = std::collections::BTreeMap::new();
        while let Assignment::Task(t) = q.assign(1, false) {
            let r = q.row_shuffle(&t).expect("a file task is shuffled");
            assert_eq!(
                (r.block_rows, r.file_rows),
                (100, [250, 130][t.file as usize])
            );
            assert_eq!(*seeds.entry((t.epoch, t.file)).or_insert(r.seed), r.seed);
            q.report(1, t.id, t.len()).unwrap();
        }
        let distinct: std::collections::BTreeSet<u64> = seeds.values().copied().collect();
        assert_eq!((seeds.len(), distinct.len()), (4, 4));
        let mut mixed = TaskQueue::new_mixed(s.clone(), vec![100], vec![0]);
        mixed.extend_stream(1, 50, true);
        let mut kinds = Vec::new();
        while let Assignment::Task(t) = mixed.assign(1, false) {
            kinds.push((t.file, mixed.row_shuffle(&t).is_some()));
            mixed.report(1, t.id, t.len()).unwrap();
            if kinds.len() > 10 {
                break;
            }
        }
        assert!(
            kinds.contains(&(0, true)) && kinds.contains(&(1, false)),
            "{kinds:?}"
        );
        let mut plain = TaskQueue::new(spec(100, 1), vec![250]);
        let Assignment::Task(t) = plain.assign(1, false) else {
            panic!("no task")
        };
        assert_eq!(plain.row_shuffle(&t), None);
    }

    #[test]
    fn lost_worker_requeues_exactly_the_unreported_remainder() {
        let mut q = TaskQueue::new(spec(100, 1), vec![100]);
        let Assignment::Task(t) = q.assign(1, false) else {
            panic!()
        };
        q.report(1, t.id, 30).unwrap();
        let r = q.release(1).unwrap();
        let rem = q.task(r).unwrap().clone();
        assert_eq!((rem.start, rem.end, rem.state), (30, 100, TaskState::Todo));
        // The dead worker's late report is refused.
        assert!(matches!(
            q.report(1, t.id, 50),
            Err(ReportError::NotHeld { .. })
        ));
        let Assignment::Task(t2) = q.assign(2, false) else {
            panic!()
        };
        assert_eq!(t2.id, rem.id);
        let r = q.report(2, t2.id, 70).unwrap();
        let (_, s) = r.epoch_done.unwrap();
        assert_eq!(s.to_string(), "consumed 100, duplicated 0, missing 0");
    }

    #[test]
    fn repeated_or_backward_reports() {
        let mut q = TaskQueue::new(spec(100, 1), vec![100]);
        let Assignment::Task(t) = q.assign(1, false) else {
            panic!()
        };
        q.report(1, t.id, 40).unwrap();
        assert_eq!(q.report(1, t.id, 40).unwrap().range, None);
        assert!(matches!(
            q.report(1, t.id, 39),
            Err(ReportError::BadOffset { .. })
        ));
        assert!(matches!(
            q.report(1, t.id, 101),
            Err(ReportError::BadOffset { .. })
        ));
        // Asking again returns the held task.
        assert_eq!(
            q.assign(1, false),
            Assignment::Task(q.task(t.id).unwrap().clone())
        );
    }

    #[test]
    fn straggler_gets_a_smaller_task_and_the_tail_stays_first() {
        let mut q = TaskQueue::new(
            DataSharding {
                shuffle: false,
                ..spec(100, 1)
            },
            vec![200],
        );
        let Assignment::Task(t) = q.assign(1, true) else {
            panic!()
        };
        assert_eq!((t.start, t.end), (0, 50));
        let Assignment::Task(t2) = q.assign(2, false) else {
            panic!()
        };
        assert_eq!((t2.start, t2.end), (50, 100));
    }

    #[test]
    fn waits_while_others_hold_tasks_then_finishes() {
        let mut q = TaskQueue::new(spec(100, 1), vec![100]);
        let Assignment::Task(t) = q.assign(1, false) else {
            panic!()
        };
        assert_eq!(q.assign(2, false), Assignment::Wait);
        q.report(1, t.id, 100).unwrap();
        assert_eq!(q.assign(2, false), Assignment::Finished);
    }

    /// Interleaves assignments, partial reports, worker deaths (with and without the
    /// master restarting from its persisted rows) and checks the ledger proves
    /// exactly-once for every epoch.
    #[test]
    fn randomized_interleaving_is_exactly_once() {
        for seed in 0..60u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let files: Vec<u64> = (0..rng.random_range(1..4))
                .map(|_| rng.random_range(0..500))
                .collect();
            let epochs = rng.random_range(1..4);
            let mut q = TaskQueue::new(spec(rng.random_range(10..80), epochs), files.clone());
            // Mirror of the persisted tables.
            let mut db_tasks: BTreeMap<u64, Task> = BTreeMap::new();
            let mut db_ranges = Vec::new();
            let mut workers: Vec<u32> = vec![1, 2, 3];
            let mut next_worker = 4;
            let mut done_epochs = Vec::new();
            for _step in 0..20_000 {
                if q.is_finished() {
                    break;
                }
                let w = workers[rng.random_range(0..workers.len())];
                match rng.random_range(0..10) {
                    0 => {
                        q.release(w);
                        workers.retain(|&x| x != w);
                        workers.push(next_worker);
                        next_worker += 1;
                    }
                    1 => {
                        // Master restart from persisted state.
                        let gen = q.generated_epochs();
                        q = TaskQueue::restore(
                            q.spec().clone(),
                            files.clone(),
                            db_tasks.values().cloned().collect(),
                            &db_ranges,
                            gen,
                        );
                    }
                    _ => match q.assign(w, rng.random_bool(0.2)) {
                        Assignment::Task(t) => {
                            let step = rng.random_range(1..=t.len().max(1));
                            let off = (t.offset + step).min(t.len());
                            let r = q.report(w, t.id, off).unwrap();
                            done_epochs.extend(r.epoch_done);
                        }
                        Assignment::Wait | Assignment::Finished => {}
                    },
                }
                let (tasks, ranges) = q.take_dirty();
                for t in tasks {
                    db_tasks.insert(t.id, t);
                }
                db_ranges.extend(ranges);
            }
            assert!(q.is_finished(), "seed {seed} did not finish");
            for e in 0..epochs {
                let s = q.ledger().summary(e);
                assert!(s.exactly_once(), "seed {seed} epoch {e}: {s}");
                assert_eq!(s.consumed, files.iter().sum::<u64>());
            }
        }
    }

    #[test]
    fn a_stream_worker_continues_its_partition_when_the_next_range_is_near_the_head() {
        let mut q = TaskQueue::new_stream(spec(10, 1), vec![0, 0]);
        // Two polls: tasks alternate between the partitions, oldest first.
        for high in [10, 20] {
            q.extend_stream(0, high, false);
            q.extend_stream(1, high, false);
        }
        let Assignment::Task(a) = q.assign(1, false) else {
            panic!("a task")
        };
        assert_eq!((a.file, a.start), (0, 0));
        let Assignment::Task(b) = q.assign(2, false) else {
            panic!("a task")
        };
        assert_eq!((b.file, b.start), (1, 0));
        q.report(1, a.id, a.len()).unwrap();
        // The head is partition 0's next range anyway; worker 2 then skips past
        // it to continue partition 1.
        q.report(2, b.id, b.len()).unwrap();
        let Assignment::Task(c) = q.assign(2, false) else {
            panic!("a task")
        };
        assert_eq!(
            (c.file, c.start),
            (1, 10),
            "worker 2 reads on in partition 1"
        );
        let Assignment::Task(d) = q.assign(1, false) else {
            panic!("a task")
        };
        assert_eq!((d.file, d.start), (0, 10));
        // A worker whose partition has nothing near the head takes the head.
        q.report(1, d.id, d.len()).unwrap();
        q.extend_stream(1, 30, false);
        let Assignment::Task(e) = q.assign(1, false) else {
            panic!("a task")
        };
        assert_eq!((e.file, e.start), (1, 20));
        assert_eq!(q.ledger().summary(0).duplicated, 0);
    }

    #[test]
    fn compacting_a_stream_queue_keeps_its_position_exactly() {
        let mut q = TaskQueue::new_stream(spec(10, 1), vec![5, 0]);
        q.extend_stream(0, 105, false);
        q.extend_stream(1, 47, true);
        // Train most of it, leave one task held half-way and some untouched.
        for _ in 0..12 {
            let Assignment::Task(t) = q.assign(1, false) else {
                panic!("a task")
            };
            q.report(1, t.id, t.len()).unwrap();
        }
        let Assignment::Task(held) = q.assign(2, false) else {
            panic!("a task")
        };
        q.report(2, held.id, 4).unwrap();
        let (todo, doing, done) = q.counts();
        let before = (q.position(), q.committed(), q.ledger().summary(0));
        let dropped = q.compact();
        assert_eq!(
            dropped, 11,
            "partition 0's furthest task stays (1's is not done)"
        );
        assert_eq!(q.counts(), (todo, doing, done), "status still counts them");
        assert_eq!(q.committed(), before.1);
        assert_eq!(q.ledger().summary(0), before.2);
        // A queue rebuilt from the compacted position is where the full one was.
        let pos = q.position();
        assert!(pos.tasks.len() < before.0.tasks.len());
        let r = TaskQueue::from_position(spec(10, 1), vec![0, 0], &pos);
        let full = TaskQueue::from_position(spec(10, 1), vec![0, 0], &before.0);
        assert_eq!(r.committed(), full.committed());
        assert_eq!(r.ledger().summary(0), full.ledger().summary(0));
        for p in 0..2 {
            assert_eq!(r.undealt(p, 200), full.undealt(p, 200), "partition {p}");
        }
        // A file queue keeps its tasks.
        let mut files = TaskQueue::new(spec(10, 1), vec![30]);
        drain(&mut files, 1);
        assert_eq!(files.compact(), 0);
    }

    #[test]
    fn a_pinned_worker_takes_only_its_own_partitions_in_queue_order() {
        // Three partitions, two workers: slot 0 owns partitions 0 and 2, slot 1 owns 1.
        let mut q = TaskQueue::new_stream(spec(10, 1), vec![0, 0, 0]);
        for p in 0..3 {
            q.extend_stream(p, 20, false);
        }
        let first = Pin { slot: 0, slots: 2 };
        let second = Pin { slot: 1, slots: 2 };
        let mut seen = Vec::new();
        for _ in 0..4 {
            let Assignment::Task(t) = q.assign_pinned(1, false, Some(first)) else {
                panic!("slot 0 has tasks")
            };
            seen.push((t.file, t.start));
            q.report(1, t.id, t.len()).unwrap();
        }
        assert_eq!(seen, vec![(0, 0), (0, 10), (2, 0), (2, 10)]);
        assert_eq!(
            q.assign_pinned(1, false, Some(first)),
            Assignment::Wait,
            "partition 1's data is not slot 0's, however long it waits"
        );
        let Assignment::Task(t) = q.assign_pinned(2, false, Some(second)) else {
            panic!("slot 1 has tasks")
        };
        assert_eq!(t.file, 1);
        // With one worker left, it owns every partition.
        q.release(2);
        let Assignment::Task(t) = q.assign_pinned(1, false, Some(Pin { slot: 0, slots: 1 })) else {
            panic!("the released task")
        };
        assert_eq!((t.file, t.start), (1, 0));
    }

    #[test]
    fn a_stream_queue_deals_arriving_offsets_and_never_finishes() {
        // Partition 0 starts at offset 100, partition 1 at 0.
        let mut q = TaskQueue::new_stream(spec(20, 1), vec![100, 0]);
        assert!(q.is_stream());
        assert_eq!(q.assign(1, false), Assignment::Wait, "nothing arrived yet");
        assert_eq!(q.extend_stream(0, 150, false), 40, "two whole shards");
        assert_eq!(q.undealt(0, 150), 10);
        assert_eq!(q.extend_stream(1, 5, false), 0);
        assert_eq!(
            q.extend_stream(1, 5, true),
            5,
            "a lingering remainder is flushed"
        );
        let Assignment::Task(t) = q.assign(1, false) else {
            panic!("a task")
        };
        assert_eq!((t.file, t.start, t.end), (0, 100, 120));
        q.report(1, t.id, 20).unwrap();
        let Assignment::Task(t) = q.assign(1, false) else {
            panic!("a task")
        };
        assert_eq!((t.file, t.start, t.end), (0, 120, 140));
        q.report(1, t.id, 8).unwrap();
        // The worker dies: its unreported remainder comes back first.
        q.release(1);
        let Assignment::Task(t) = q.assign(2, false) else {
            panic!("a task")
        };
        assert_eq!((t.file, t.start, t.end), (0, 128, 140));
        assert_eq!(q.committed(), vec![128, 0]);
        q.report(2, t.id, 12).unwrap();
        let Assignment::Task(t) = q.assign(2, false) else {
            panic!("a task")
        };
        assert_eq!((t.file, t.start, t.end), (1, 0, 5));
        let r = q.report(2, t.id, 5).unwrap();
        assert!(
            r.task_done && r.epoch_done.is_none(),
            "a stream's epoch never closes"
        );
        assert_eq!(
            q.assign(2, false),
            Assignment::Wait,
            "online: wait, never finished"
        );
        assert!(!q.is_finished());
        assert_eq!(q.committed(), vec![140, 5]);
        let s = q.ledger().summary(0);
        assert_eq!((s.consumed, s.duplicated, s.missing), (45, 0, 0));
        assert_eq!(q.total_rows(), 45);

        // A checkpointed position restores the partitions' starts and how far they were
        // dealt; the rest arrives afterwards.
        let pos = q.position();
        assert_eq!(pos.stream_starts, Some(vec![100, 0]));
        let mut r = TaskQueue::from_position(spec(20, 1), vec![0, 0], &pos);
        assert!(r.is_stream());
        assert_eq!(r.undealt(0, 150), 10);
        assert_eq!(r.committed(), vec![140, 5]);
        assert_eq!(r.extend_stream(0, 160, false), 20);
        let Assignment::Task(t) = r.assign(3, false) else {
            panic!("a task")
        };
        assert_eq!((t.file, t.start, t.end), (0, 140, 160));
        assert_eq!(r.ledger().summary(0).missing, 20, "dealt, not yet trained");
    }

    /// A mixture queue: the history's files first (sequential serving), then the stream;
    /// a checkpointed position taken mid-history, with stream data waiting, rebuilds both
    /// sources exactly, and the ledger counts each row once across them.
    #[test]
    fn a_mixture_queue_trains_the_history_then_the_stream_and_restores_both() {
        // Two history files (250 and 50 rows), two partitions starting at 100 and 0.
        let mut q = TaskQueue::new_mixed(spec(100, 1), vec![250, 50], vec![100, 0]);
        assert!(q.is_stream());
        assert_eq!(q.stream_from(), 2);
        assert_eq!(q.queued(), vec![4, 0], "history cut at once");
        assert_eq!(
            q.extend_stream(0, 5, false),
            0,
            "a history file is no partition"
        );
        assert_eq!(q.extend_stream(2, 300, false), 200);
        assert_eq!(q.extend_stream(3, 50, true), 50);
        assert_eq!(q.queued(), vec![4, 3]);
        let Assignment::Task(a) = q.assign(1, false) else {
            panic!("a task")
        };
        assert!(a.file < 2, "sequential: history first");
        q.report(1, a.id, a.len()).unwrap();
        let Assignment::Task(b) = q.assign(1, false) else {
            panic!("a task")
        };
        q.report(1, b.id, 7).unwrap();
        let pos = q.position();
        assert_eq!(pos.stream_from, 2);
        assert_eq!(pos.stream_starts, Some(vec![0, 0, 100, 0]));
        let json = serde_json::to_string(&pos).unwrap();
        let pos: DataPosition = serde_json::from_str(&json).unwrap();
        let mut r = TaskQueue::from_position(spec(100, 1), vec![250, 50, 0, 0], &pos);
        assert_eq!(r.stream_from(), 2);
        assert_eq!(r.undealt(2, 300), 0, "dealt offsets are restored");
        let mut order = Vec::new();
        while let Assignment::Task(t) = r.assign(2, false) {
            order.push(t.file);
            r.report(2, t.id, t.len()).unwrap();
        }
        let split = order.iter().position(|&f| f >= 2).expect("stream tasks");
        assert!(order[..split].iter().all(|&f| f < 2), "{order:?}");
        assert!(order[split..].iter().all(|&f| f >= 2), "{order:?}");
        assert_eq!(
            r.assign(2, false),
            Assignment::Wait,
            "the stream never ends"
        );
        let s = r.ledger().summary(0);
        assert_eq!((s.consumed, s.duplicated, s.missing), (300 + 250, 0, 0));
        assert_eq!(r.committed(), vec![250, 50, 300, 50]);
        assert_eq!(r.partitions_committed(), vec![300, 50]);
        // Before any checkpoint, a full recovery restores the start: the history again.
        let mut fresh =
            TaskQueue::from_position(spec(100, 1), vec![250, 50, 0, 0], &r.start_position());
        assert_eq!(fresh.queued(), vec![4, 0]);
        assert_eq!(
            fresh.extend_stream(2, 300, false),
            200,
            "from the start offset"
        );
    }

    /// Under a long history backlog, Eq. 4 serves stream data as it arrives (its weight
    /// dominates once a few tasks wait), and the history fills the gaps.
    #[test]
    fn priority_serving_keeps_the_stream_fresh_behind_a_history_backlog() {
        let mut q = TaskQueue::new_mixed(spec(10, 1), vec![1000], vec![0]);
        q.set_serving(Serving::Priority {
            weights: vec![1.0, 4.0],
            target: 1.0,
        });
        let mut high = 0;
        let mut stream_waits = Vec::new();
        for _ in 0..50 {
            // Two stream tasks arrive per history task trained.
            high += 20;
            q.extend_stream(1, high, false);
            for _ in 0..3 {
                let Assignment::Task(t) = q.assign(1, false) else {
                    panic!("a task")
                };
                q.report(1, t.id, t.len()).unwrap();
            }
            stream_waits.push(q.queued()[1]);
        }
        assert!(
            stream_waits.iter().all(|&w| w == 0),
            "never a stream task left behind: {stream_waits:?}"
        );
        let served = q.served();
        assert_eq!(served[1].rows, 1000);
        assert_eq!(served[HISTORY].rows, 500);
        // Sequential serving would have trained the whole history first.
        let mut seq = TaskQueue::new_mixed(spec(10, 1), vec![1000], vec![0]);
        seq.extend_stream(1, 100, false);
        let Assignment::Task(t) = seq.assign(1, false) else {
            panic!("a task")
        };
        assert_eq!(t.file, 0);
    }

    /// `[[data.source]]`: files 0 and 2 are source 0 (weight 3), file 1 source 1
    /// (weight 1). Rows are served 3 : 1 while both have data; a queue restored at a
    /// position mid-way, dealt into the same sources, serves the rest in the same order as
    /// the original; every row trains once.
    #[test]
    fn sources_are_served_by_weight_and_survive_a_restore() {
        let mut q = TaskQueue::new(spec(10, 1), vec![100, 200, 100]);
        q.set_sources(2, vec![0, 1, 0]);
        q.set_serving(Serving::Weighted {
            weights: vec![3.0, 1.0, 1.0],
        });
        let mut files = Vec::new();
        let take = |q: &mut TaskQueue, n: usize, files: &mut Vec<u32>| {
            for _ in 0..n {
                let Assignment::Task(t) = q.assign(1, false) else {
                    return;
                };
                files.push(t.file);
                q.report(1, t.id, t.len()).unwrap();
            }
        };
        take(&mut q, 16, &mut files);
        let source1 = files.iter().filter(|&&f| f == 1).count();
        assert_eq!(source1, 4, "3 : 1 by rows: {files:?}");
        assert_eq!(q.queued(), vec![8, 16, 0]);
        let pos = q.position();
        let mut restored = TaskQueue::from_position(spec(10, 1), vec![100, 200, 100], &pos);
        restored.set_sources(2, vec![0, 1, 0]);
        restored.set_serving(q.serving().clone());
        assert_eq!(restored.queued(), q.queued());
        let (mut rest, mut rest_restored) = (Vec::new(), Vec::new());
        take(&mut q, 100, &mut rest);
        take(&mut restored, 100, &mut rest_restored);
        assert_eq!(rest.len(), 24);
        assert_eq!(rest_restored, rest);
        // Source 0 runs dry first, then source 1 alone.
        assert_eq!(rest.iter().filter(|&&f| f == 1).count(), 16);
        assert_eq!(*rest.last().unwrap(), 1);
        let summary = restored.ledger().summary(0);
        assert_eq!((summary.consumed, summary.duplicated), (400, 0));
        assert_eq!(q.served()[0].rows + q.served()[1].rows, 400);
    }
}
