//! Test fail points of a worker (`elastrec_common::fail_points`: set by environment
//! variables, only in builds with the `fail-points` feature). A setting `NODE:N[,NODE:N...]`
//! names nodes by id (`*`: every node); relaunched workers get new ids and ignore it.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use elastrec_common::fail_points;
use elastrec_data::Batch;

/// Test fail point `ELASTREC_FAIL_EXIT_AFTER_PUSH=NODE:N`: worker `NODE` exits right
/// after the PS accepted its `N`-th push, before reporting it to the master (the window in
/// which a batch's gradients are applied but its samples are not counted).
pub(crate) fn fail_point_exit_after_push(node: u32) -> Option<u64> {
    fail_points::for_node("ELASTREC_FAIL_EXIT_AFTER_PUSH", node).filter(|&n| n > 0)
}

/// Test fail point `ELASTREC_TEST_TRACE_ROWS=DIR`: every worker appends the rows the master
/// accepted (reported batches) to `DIR/worker-<id>.tsv`, one line per row: epoch, task id,
/// the row's first dense value (`ln(1 + x)` of the file's first integer). What a test needs
/// to see the order rows were trained in, which nothing else records.
pub(crate) struct RowTrace(std::io::BufWriter<std::fs::File>);

impl RowTrace {
    pub(crate) fn open(node: u32) -> anyhow::Result<Option<Self>> {
        let Some(dir) = fail_points::value("ELASTREC_TEST_TRACE_ROWS") else {
            return Ok(None);
        };
        let path = Path::new(&dir).join(format!("worker-{node}.tsv"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("row trace {}", path.display()))?;
        Ok(Some(Self(std::io::BufWriter::new(file))))
    }

    pub(crate) fn record(
        &mut self,
        task: &elastrec_proto::master::Task,
        batch: &Batch,
    ) -> anyhow::Result<()> {
        use std::io::Write as _;
        for i in 0..batch.len() {
            let first = batch.dense_row(i).first().copied().unwrap_or(f32::NAN);
            writeln!(self.0, "{}\t{}\t{first:?}", task.epoch, task.task_id)?;
        }
        // A worker may be killed at any point: what was reported is on disk.
        self.0.flush()?;
        Ok(())
    }
}

/// Test fail point `ELASTREC_FAIL_SLOW_WORKER=NODE:MS`: worker `NODE` (`*`: every worker)
/// spends `MS` more milliseconds per `train.batch_size` samples trained (a batch of
/// another size in proportion), as a worker on a slow or overloaded machine would (or,
/// for every worker, a job whose workers are the bottleneck).
/// `5:250,*:20` slows worker 5 by 250 ms and every other worker by 20 ms.
pub(crate) fn fail_point_slow_batch(node: u32) -> Option<Duration> {
    fail_points::for_node("ELASTREC_FAIL_SLOW_WORKER", node).map(Duration::from_millis)
}
