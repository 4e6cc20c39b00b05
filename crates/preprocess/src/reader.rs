//! A reader that preprocesses: raw rows from any [`BatchReader`] through a [`Plan`].

use std::sync::Arc;

use elastrec_data::{Batch, BatchReader, RawColumns, ReadStats};

use crate::plan::{Plan, Scratch};

/// Wraps a reader of raw rows (a file's or a stream's) so that its batches hold the
/// plan's features. Reading and preprocessing share the caller's thread: the rows of one
/// batch are parsed, then transformed while they are still in cache.
pub struct PreprocessedReader<R> {
    inner: R,
    plan: Arc<Plan>,
    raw: RawColumns,
    scratch: Scratch,
}

impl<R: BatchReader> PreprocessedReader<R> {
    /// `inner` through `plan`.
    pub fn new(inner: R, plan: Arc<Plan>) -> Self {
        let scratch = plan.scratch();
        Self {
            inner,
            plan,
            raw: RawColumns::default(),
            scratch,
        }
    }
}

impl<R: BatchReader> BatchReader for PreprocessedReader<R> {
    fn next_batch(&mut self, batch: &mut Batch, max_rows: usize) -> elastrec_data::Result<usize> {
        let read = self.inner.next_raw(&mut self.raw, max_rows);
        // Rows read before a bad row (under the fail policy) are delivered with the
        // error, as every reader does.
        self.plan.run(&self.raw, batch, &mut self.scratch);
        read
    }

    fn next_raw(&mut self, raw: &mut RawColumns, max_rows: usize) -> elastrec_data::Result<usize> {
        self.inner.next_raw(raw, max_rows)
    }

    fn stats(&self) -> &ReadStats {
        self.inner.stats()
    }

    fn position(&self) -> Option<u64> {
        self.inner.position()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::default_graph;
    use elastrec_data::{BadRowPolicy, GenSpec};

    #[test]
    fn the_default_graph_reads_a_file_as_the_plain_reader_does() {
        let dir = std::env::temp_dir().join(format!("elastrec-pre-{}", std::process::id()));
        let report = elastrec_data::generate(&GenSpec::new(&dir, 3000)).unwrap();
        let path = &dir.join(&report.files[0].name);
        let plan = Arc::new(Plan::compile(&default_graph()).unwrap());
        let mut plain = elastrec_data::open_reader(path, BadRowPolicy::Fail).unwrap();
        let mut pre = PreprocessedReader::new(
            elastrec_data::open_reader(path, BadRowPolicy::Fail).unwrap(),
            plan,
        );
        let (mut a, mut b) = (Batch::default(), Batch::default());
        let mut total = 0;
        loop {
            let n = plain.next_batch(&mut a, 700).unwrap();
            assert_eq!(pre.next_batch(&mut b, 700).unwrap(), n);
            assert_eq!(a, b);
            total += n;
            if n == 0 {
                break;
            }
        }
        assert_eq!(total, 3000);
        assert_eq!(pre.stats().rows_read, 3000);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
