//! Where the data stands, to restore from: the master's database, or a checkpoint's
//! data position (a full recovery rewinds the queue to it).

use super::*;

impl TaskQueue {
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
        // Files counted after the position was taken join its epoch 0.
        q.cut_untasked();
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

    pub(super) fn restore_ranges(&mut self, tasks: Vec<Task>, ranges: &[ConsumedRange]) {
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
}
