//! Data that grows while the job trains: stream partitions dealt up to their watermark,
//! files appended to a following job, and done tasks compacted.

use super::*;

impl TaskQueue {
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
    pub(super) fn cut_file(&mut self, f: u32) {
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

    pub(super) fn committed_from(&self, first: u32) -> Vec<u64> {
        (first as usize..self.file_rows.len())
            .map(|f| self.ledger.covered_from(f as u32, self.file_start[f]))
            .collect()
    }

    /// Per file, the first row (offset) that belongs to the job.
    pub fn file_start(&self) -> &[u64] {
        &self.file_start
    }
}
