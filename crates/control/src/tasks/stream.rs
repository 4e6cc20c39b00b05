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
        self.open_growing();
    }

    /// Makes this the queue of a job whose file list is still being counted (the master
    /// counts a long list's rows while the first files train): epoch 0 exists at once and
    /// takes the files [`TaskQueue::append_files`] brings, each batch shuffled among
    /// itself; no later epoch is cut, and epoch 0 does not close, before
    /// [`TaskQueue::stop_growing`] says the list is complete. Until then an epoch is
    /// taken to hold at least `expected_rows` (an estimate from the counted files).
    pub fn count_later(&mut self, expected_rows: u64) {
        debug_assert!(!self.open_ended, "a stream's partitions are not counted");
        self.expected_rows = expected_rows;
        self.open_growing();
    }

    /// Opens epoch 0 to appended files: cut now, or (a rebuilt queue) with the files that
    /// have no task cut.
    fn open_growing(&mut self) {
        self.growing = true;
        if self.generated_epochs == 0 {
            self.generate_epoch();
        } else {
            self.cut_untasked();
        }
    }

    /// Cuts into epoch 0 every file that has no task: files appended after the position
    /// this queue was rebuilt from. Only while epoch 0 is the last one cut (a later
    /// epoch's cut covers every file).
    pub(super) fn cut_untasked(&mut self) {
        if self.open_ended || self.generated_epochs != 1 {
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

    /// True while the queue may still take files (a following job's, or one whose list is
    /// still being counted).
    pub fn is_growing(&self) -> bool {
        self.growing
    }

    /// Appends files of the given rows, of the given history sources, to a growing queue
    /// (following, or still counting its list) and cuts them into epoch-0 tasks at the back
    /// of their buffers, after every task already there. A following job trains them in
    /// the order they landed; a counted list's batch is shuffled among itself (seeded by
    /// the job and the batch's first file). Returns the index of the first new file.
    pub fn append_files(&mut self, rows: &[u64], sources: &[u32]) -> u32 {
        let first = self.file_rows.len() as u32;
        if !self.follow && !self.growing {
            return first;
        }
        let mut ranges = Vec::new();
        for (i, &r) in rows.iter().enumerate() {
            if self.source_count() > 1 {
                self.file_source.resize(first as usize + i, 0);
                let s = sources.get(i).copied().unwrap_or(0);
                self.file_source.push(s.min(self.source_count() as u32 - 1));
            }
            self.file_rows.push(r);
            self.file_start.push(0);
            self.ledger.add_file(r);
            let f = first + i as u32;
            ranges.extend(shards(r, self.spec.rows_per_shard).map(|(s, e)| (f, s, e)));
        }
        if !self.follow && self.spec.shuffle {
            let seed = elastrec_common::splitmix::derive(self.spec.seed, u64::from(first));
            ranges.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
        }
        for (f, s, e) in ranges {
            self.new_task(0, f, s, e, false);
        }
        if self.follow {
            // A full recovery may have closed a following job's growth: files reopen it.
            self.growing = true;
        }
        first
    }

    /// No more files will come: epoch 0 closes once its tasks are done (and a job of
    /// several epochs cuts the next). Returns epoch 0's verdict when it is already done.
    pub fn stop_growing(&mut self) -> Option<(u32, LedgerSummary)> {
        if !std::mem::take(&mut self.growing) {
            return None;
        }
        // Epoch 0 held off closing while it grew; its tasks may all be done already.
        let open = self.open_per_epoch.get(&0).copied().unwrap_or(0);
        (open == 0 && self.generated_epochs == 1).then(|| (0, self.ledger.summary(0)))
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
