//! Decoding the row groups of one Parquet file, in order, on several threads.
//!
//! Row groups are Parquet's unit of independent decoding: each has its own column chunks,
//! pages and dictionaries. A file of several row groups is decoded by up to
//! [`decode_threads`] threads, thread `t` taking groups `t, t + K, t + 2K, ...`; the reader
//! takes their batches group by group, so rows come out in file order, exactly as one
//! decoder would give them. Each thread runs at most [`AHEAD`] batches ahead of the
//! reader, so a reader that trains slower than the file decodes costs no more memory or
//! CPU than one decoder, and the threads only use cores the reader leaves idle.

use crate::error::{DataError, Result};
use arrow_array::RecordBatch;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

/// Batches a decoding thread may hold ready beyond the one the reader is taking.
const AHEAD: usize = 2;

/// The most threads one file is decoded on: the machine's cores, at most 4 (past that the
/// reader's own conversion of the batches is the limit).
pub(crate) fn decode_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(4)
}

/// The rows of one row group to decode: `skip` rows from its start, then `take` rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GroupSpan {
    pub group: usize,
    pub skip: usize,
    pub take: usize,
}

/// The spans of rows `range` (all with `None`) of a file whose row groups hold
/// `group_rows` rows each; empty groups and groups outside the range are left out.
pub(crate) fn spans(group_rows: &[u64], range: Option<(u64, u64)>) -> Vec<GroupSpan> {
    let (start, end) = range.unwrap_or((0, u64::MAX));
    let mut out = Vec::new();
    let mut first = 0u64;
    for (group, &n) in group_rows.iter().enumerate() {
        let (from, to) = (start.max(first), end.min(first + n));
        if from < to {
            out.push(GroupSpan {
                group,
                skip: (from - first) as usize,
                take: (to - from) as usize,
            });
        }
        first += n;
    }
    out
}

/// What a decoding thread sends: a batch, the end of a group, or why it stopped.
enum Message {
    Batch(RecordBatch),
    GroupDone,
    Failed(DataError),
}

/// A file's decoded batches, in file order: from one decoder on the calling thread, or
/// from several decoding threads.
pub(crate) enum Decoder {
    Serial(ParquetRecordBatchReader),
    Parallel(Pipeline),
}

impl Decoder {
    /// Opens `spans` of `path` (open as `file`, whose footer gave `meta`) with the columns
    /// `mask` selects, in batches of `batch` rows, on up to `threads` threads (one decoder
    /// on this thread, reading `file`, for a single span or a single thread).
    pub(crate) fn open(
        path: &Path,
        file: File,
        meta: ArrowReaderMetadata,
        mask: ProjectionMask,
        batch: usize,
        spans: Vec<GroupSpan>,
        threads: usize,
    ) -> Result<Self> {
        let lanes = threads.min(spans.len());
        if lanes <= 1 {
            let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta)
                .with_projection(mask)
                .with_batch_size(batch)
                .with_row_groups(spans.iter().map(|s| s.group).collect());
            if let Some(first) = spans.first() {
                builder = builder
                    .with_offset(first.skip)
                    .with_limit(spans.iter().map(|s| s.take).sum());
            }
            let reader = crate::parquet_io::guarded(path, "opening the row groups", || {
                builder.build().map_err(|e| DataError::parquet(path, e))
            })?;
            return Ok(Self::Serial(reader));
        }
        let mut receivers = Vec::with_capacity(lanes);
        for lane in 0..lanes {
            let (tx, rx) = sync_channel(AHEAD);
            let mine: Vec<GroupSpan> = spans.iter().copied().skip(lane).step_by(lanes).collect();
            let job = Lane {
                path: path.to_path_buf(),
                meta: meta.clone(),
                mask: mask.clone(),
                batch,
                spans: mine,
            };
            std::thread::Builder::new()
                .name("elastrec-parquet".into())
                .spawn(move || job.run(&tx))
                .map_err(|e| DataError::io(path, e))?;
            receivers.push(rx);
        }
        Ok(Self::Parallel(Pipeline {
            path: path.to_path_buf(),
            receivers,
            next: 0,
            count: spans.len(),
        }))
    }

    /// The next batch in file order; `None` at the end. A decoder that panics on a corrupt
    /// file gives an error naming the file, never the panic.
    pub(crate) fn next_batch(&mut self, path: &Path, what: &str) -> Option<Result<RecordBatch>> {
        match self {
            Self::Serial(reader) => crate::parquet_io::guarded(path, what, || {
                reader
                    .next()
                    .transpose()
                    .map_err(|e| DataError::parquet(path, e))
            })
            .transpose(),
            Self::Parallel(pipeline) => pipeline.next_batch(),
        }
    }
}

/// The reader's side of the decoding threads.
pub(crate) struct Pipeline {
    path: PathBuf,
    /// One per thread; thread `t` decodes spans `t, t + K, ...`.
    receivers: Vec<Receiver<Message>>,
    /// The span whose batches come next.
    next: usize,
    count: usize,
}

impl Pipeline {
    fn next_batch(&mut self) -> Option<Result<RecordBatch>> {
        while self.next < self.count {
            let lane = &self.receivers[self.next % self.receivers.len()];
            match lane.recv() {
                Ok(Message::Batch(b)) => return Some(Ok(b)),
                Ok(Message::GroupDone) => self.next += 1,
                Ok(Message::Failed(e)) => {
                    self.next = self.count;
                    return Some(Err(e));
                }
                Err(_) => {
                    self.next = self.count;
                    return Some(Err(DataError::parquet(
                        &self.path,
                        "a decoding thread stopped before its row groups' end",
                    )));
                }
            }
        }
        None
    }
}

/// One decoding thread's work: its spans, in order.
struct Lane {
    path: PathBuf,
    meta: ArrowReaderMetadata,
    mask: ProjectionMask,
    batch: usize,
    spans: Vec<GroupSpan>,
}

impl Lane {
    /// Decodes every span, sending its batches then `GroupDone`; stops at the first error
    /// (sent) or when the reader is gone (a send fails).
    fn run(self, tx: &SyncSender<Message>) {
        for span in &self.spans {
            let what = format!("decoding row group {}", span.group);
            let mut reader = match self.open(span) {
                Ok(r) => r,
                Err(e) => {
                    let _ = tx.send(Message::Failed(e));
                    return;
                }
            };
            loop {
                let next = crate::parquet_io::guarded(&self.path, &what, || {
                    reader
                        .next()
                        .transpose()
                        .map_err(|e| DataError::parquet(&self.path, e))
                });
                let message = match next {
                    Ok(Some(b)) => Message::Batch(b),
                    Ok(None) => break,
                    Err(e) => {
                        let _ = tx.send(Message::Failed(e));
                        return;
                    }
                };
                if tx.send(message).is_err() {
                    return;
                }
            }
            if tx.send(Message::GroupDone).is_err() {
                return;
            }
        }
    }

    fn open(&self, span: &GroupSpan) -> Result<ParquetRecordBatchReader> {
        // Its own file handle: a cloned one would share the seek position across threads.
        let file = File::open(&self.path).map_err(|e| DataError::io(&self.path, e))?;
        let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(file, self.meta.clone())
            .with_projection(self.mask.clone())
            .with_batch_size(self.batch)
            .with_row_groups(vec![span.group])
            .with_offset(span.skip)
            .with_limit(span.take);
        crate::parquet_io::guarded(&self.path, "opening a row group", || {
            builder
                .build()
                .map_err(|e| DataError::parquet(&self.path, e))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parquet_io::open_projected_on;
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::Int64Array;
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;
    use std::sync::Arc;

    /// A file of one column holding its row numbers, in row groups of 100 rows.
    fn numbered(dir: &Path, rows: i64) -> PathBuf {
        let path = dir.join("numbered.parquet");
        let column = Arc::new(Int64Array::from_iter_values(0..rows));
        let batch = RecordBatch::try_from_iter([("n", column as _)]).unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(100))
            .build();
        let mut w = ArrowWriter::try_new(File::create(&path).unwrap(), batch.schema(), Some(props))
            .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        path
    }

    fn read(path: &Path, range: Option<(u64, u64)>, threads: usize) -> Vec<i64> {
        let opened = open_projected_on(path, range, |_| Ok(vec![0]), threads).unwrap();
        let mut out = Vec::new();
        if let Some(mut d) = opened.inner {
            while let Some(b) = d.next_batch(path, "test") {
                out.extend(b.unwrap().column(0).as_primitive::<Int64Type>().values());
            }
        }
        out
    }

    #[test]
    fn several_threads_give_the_rows_of_one_decoder_in_file_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = numbered(dir.path(), 1_050);
        for range in [
            None,
            Some((0, 1_050)),
            Some((150, 951)),
            Some((99, 101)),
            Some((7, 7)),
        ] {
            let (start, end) = range.unwrap_or((0, 1_050));
            let want: Vec<i64> = (start as i64..end as i64).collect();
            assert_eq!(read(&path, range, 1), want, "{range:?} on one thread");
            for threads in [2, 3, 16] {
                assert_eq!(read(&path, range, threads), want, "{range:?} on {threads}");
            }
        }
    }

    #[test]
    fn spans_cover_exactly_the_range_and_skip_empty_groups() {
        let groups = [10, 0, 10, 5];
        let all = spans(&groups, None);
        let want = |g, skip, take| GroupSpan {
            group: g,
            skip,
            take,
        };
        assert_eq!(all, vec![want(0, 0, 10), want(2, 0, 10), want(3, 0, 5)]);
        assert_eq!(
            spans(&groups, Some((7, 22))),
            vec![want(0, 7, 3), want(2, 0, 10), want(3, 0, 2)]
        );
        assert_eq!(spans(&groups, Some((12, 14))), vec![want(2, 2, 2)]);
        assert!(spans(&groups, Some((4, 4))).is_empty());
    }
}
