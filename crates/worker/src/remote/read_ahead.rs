//! A task's reader on a thread of its own, one batch ahead of the step: the next batch is
//! read and parsed while this one is pulled, computed, pushed and reported, so the
//! worker's step waits on its data only when reading is the slower of the two.
//!
//! Reading ahead changes nothing the ledger sees: batches come in the reader's order, each
//! with the rows (or stream offsets) it consumed, and the task loop reports offsets as
//! before. A batch read but never trained (the worker stops mid-task) is dropped with its
//! thread; the task goes back to the master at the last reported offset.

use super::*;

/// One batch as the reader delivered it.
pub(super) struct ReadBatch {
    pub(super) batch: Batch,
    /// Rows delivered into `batch`.
    pub(super) rows: usize,
    /// Physical rows (files) or offsets (streams) consumed by this batch, malformed rows
    /// skipped under `data.on_bad_row` included.
    pub(super) consumed: u64,
}

/// Batches of one task's split, read on a blocking thread of the worker's runtime (a
/// data executor's reader and a stream reader wait on the network there).
pub(super) struct ReadAhead {
    ready: tokio::sync::mpsc::Receiver<anyhow::Result<ReadBatch>>,
    /// Batches the step is done with, back to the reader to be filled again (no
    /// allocation per batch).
    spare: std::sync::mpsc::Sender<Batch>,
    thread: Option<tokio::task::JoinHandle<()>>,
    /// The split's file or partition, for an error of the reader's thread itself.
    source: String,
}

/// Batches read ahead of the step. One is enough to hide the read behind the step (the
/// step is the longer of the two, or reading is the bottleneck anyway); more would only
/// hold memory.
const AHEAD: usize = 1;

impl ReadAhead {
    /// Starts reading `reader` (positioned at `start`, the split's first unreported row)
    /// with batches of `batch_rows()` rows, checked to carry the model's `tasks` labels.
    pub(super) fn start(
        mut reader: Box<dyn BatchReader>,
        start: u64,
        file: String,
        tasks: usize,
        batch_rows: impl Fn() -> usize + Send + 'static,
    ) -> Self {
        let (ready_tx, ready) = tokio::sync::mpsc::channel(AHEAD);
        let (spare, spare_rx) = std::sync::mpsc::channel::<Batch>();
        let source = file.clone();
        let thread = tokio::task::spawn_blocking(move || {
            let mut at = start;
            let mut skipped_before = reader.stats().rows_skipped;
            loop {
                let rows = batch_rows();
                let mut batch = spare_rx.try_recv().unwrap_or_else(|_| Batch::default());
                let read = reader
                    .next_batch(&mut batch, rows)
                    .map_err(anyhow::Error::from)
                    .and_then(|n| {
                        batch.check_tasks(tasks, Path::new(&file))?;
                        Ok(n)
                    });
                let item = read.map(|rows| {
                    let skipped = reader.stats().rows_skipped - skipped_before;
                    skipped_before = reader.stats().rows_skipped;
                    // Files count rows; a stream counts offsets (whole messages delivered).
                    let consumed = match reader.position() {
                        Some(next) => next.saturating_sub(at),
                        None => rows as u64 + skipped,
                    };
                    at += consumed;
                    ReadBatch {
                        batch,
                        rows,
                        consumed,
                    }
                });
                let end = match &item {
                    Ok(b) => b.rows == 0 && b.consumed == 0,
                    Err(_) => true,
                };
                // The step stopped listening (the task ended early): so does the reader.
                if ready_tx.blocking_send(item).is_err() || end {
                    return;
                }
            }
        });
        Self {
            ready,
            spare,
            thread: Some(thread),
            source,
        }
    }

    /// The next batch; an empty one (`rows` and `consumed` 0) when the split's reader is
    /// exhausted.
    pub(super) async fn next(&mut self) -> anyhow::Result<ReadBatch> {
        match self.ready.recv().await {
            Some(item) => item,
            // The reader ended after an error or the end it already delivered; a panic in
            // it (a dependency's, on corrupt input) is an error naming the split's source.
            None => match self.thread.take() {
                Some(thread) => match thread.await {
                    Ok(()) => Ok(ReadBatch {
                        batch: Batch::default(),
                        rows: 0,
                        consumed: 0,
                    }),
                    Err(e) => Err(anyhow::anyhow!("reading {} failed: {e}", self.source)),
                },
                None => anyhow::bail!("the split's reader was read past its end"),
            },
        }
    }

    /// Hands a batch the step is done with back to the reader.
    pub(super) fn recycle(&self, batch: Batch) {
        // A reader that has ended keeps no batches: this one is dropped.
        let _ = self.spare.send(batch);
    }

    /// Stops the reader and waits for its thread, so that the next task's reader (on the
    /// same stream consumer) starts after this one let go of it. A reader in the middle of
    /// a batch finishes that batch first.
    pub(super) async fn finish(mut self) {
        self.ready.close();
        // Whatever it had read ahead is dropped, which lets a blocked send return.
        while self.ready.recv().await.is_some() {}
        if let Some(thread) = self.thread.take() {
            let _ = thread.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use elastrec_data::{open_reader_range, BadRowPolicy};

    /// `rows` Criteo TSV lines whose first integer is the line's index; line `bad` (if
    /// any) is malformed.
    fn tsv(dir: &Path, rows: usize, bad: Option<usize>) -> std::path::PathBuf {
        let mut text = String::new();
        for i in 0..rows {
            if Some(i) == bad {
                text.push_str("not a row\n");
                continue;
            }
            let ints = (0..13).map(|j| if j == 0 { i } else { j }.to_string());
            let cats = (0..26).map(|j| format!("{:08x}", i * 31 + j));
            let fields: Vec<String> = std::iter::once((i % 2).to_string())
                .chain(ints)
                .chain(cats)
                .collect();
            text.push_str(&fields.join("\t"));
            text.push('\n');
        }
        let path = dir.join("day.tsv");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn start(path: &Path, from: u64, to: u64, policy: BadRowPolicy, rows: usize) -> ReadAhead {
        let reader = open_reader_range(path, from, to, policy).unwrap();
        ReadAhead::start(reader, from, path.display().to_string(), 1, move || rows)
    }

    /// The first dense value of each row, as the reader parsed it (log1p of the index).
    fn first_ints(batch: &Batch) -> Vec<u64> {
        let width = batch.dense.len() / batch.len();
        (0..batch.len())
            .map(|r| (f64::from(batch.dense[r * width]).exp() - 1.0).round() as u64)
            .collect()
    }

    /// Every row of the range comes once, in order, in batches of the asked size, each
    /// with the physical rows it consumed (a skipped bad row counted where it was); then
    /// an empty batch marks the end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn delivers_the_range_in_order_with_what_each_batch_consumed() {
        let dir = tempfile::tempdir().unwrap();
        let path = tsv(dir.path(), 100, Some(45));
        let mut ahead = start(&path, 10, 95, BadRowPolicy::Skip, 16);
        let (mut seen, mut consumed, mut sizes) = (Vec::new(), Vec::new(), Vec::new());
        loop {
            let b = ahead.next().await.unwrap();
            if b.rows == 0 && b.consumed == 0 {
                break;
            }
            assert_eq!(b.rows, b.batch.len());
            seen.extend(first_ints(&b.batch));
            consumed.push(b.consumed);
            sizes.push(b.rows);
            ahead.recycle(b.batch);
        }
        ahead.finish().await;
        let expected: Vec<u64> = (10..95).filter(|&i| i != 45).collect();
        assert_eq!(seen, expected);
        assert_eq!(consumed.iter().sum::<u64>(), 85);
        // Batch 3 (rows 42..59) holds the bad row: 16 rows delivered, 17 consumed.
        assert_eq!(consumed[..3], [16, 16, 17]);
        // 84 good rows: five full batches and the rest.
        assert_eq!(sizes, [16, 16, 16, 16, 16, 4]);
    }

    /// A malformed row under the default policy fails the batch that reaches it, naming
    /// the file and line, after the batches before it were delivered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_bad_row_fails_its_batch_after_the_ones_before() {
        let dir = tempfile::tempdir().unwrap();
        let path = tsv(dir.path(), 40, Some(20));
        let mut ahead = start(&path, 0, 40, BadRowPolicy::Fail, 8);
        for _ in 0..2 {
            let b = ahead.next().await.unwrap();
            assert_eq!((b.rows, b.consumed), (8, 8));
            ahead.recycle(b.batch);
        }
        let err = ahead.next().await.err().expect("the bad row's batch fails");
        let text = format!("{err:#}");
        assert!(text.contains("day.tsv"), "{text}");
        ahead.finish().await;
    }

    /// A reader that panics (as a dependency may on a corrupt file) fails the task with an
    /// error naming the file, not the worker with a panic.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_in_the_reader_is_an_error_naming_the_file() {
        struct Corrupt(elastrec_data::ReadStats);
        impl BatchReader for Corrupt {
            fn next_batch(&mut self, _: &mut Batch, _: usize) -> elastrec_data::Result<usize> {
                panic!("offset + len out of bounds");
            }
            fn stats(&self) -> &elastrec_data::ReadStats {
                &self.0
            }
        }
        let reader = Box::new(Corrupt(Default::default()));
        let mut ahead = ReadAhead::start(reader, 0, "part-7.parquet".into(), 1, || 8);
        let err = ahead.next().await.err().expect("the panic is an error");
        let text = format!("{err:#}");
        assert!(text.contains("part-7.parquet"), "{text}");
        assert!(text.contains("offset + len out of bounds"), "{text}");
        ahead.finish().await;
    }

    /// A task that ends early (its worker scaled away) stops its reader wherever it is
    /// (reading, or holding a batch read ahead that nobody takes): `finish` returns.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn finishing_early_stops_the_reader() {
        let dir = tempfile::tempdir().unwrap();
        let path = tsv(dir.path(), 200, None);
        let mut ahead = start(&path, 0, 200, BadRowPolicy::Fail, 4);
        let b = ahead.next().await.unwrap();
        assert_eq!(first_ints(&b.batch), [0, 1, 2, 3]);
        tokio::time::timeout(Duration::from_secs(60), ahead.finish())
            .await
            .expect("the reader stops");
    }
}
