//! A worker's reader of a file task through the job's data executors
//! ([`crate::executor`]): the same rows, in the same order, as reading the file itself.
//!
//! Every read names the row it starts at, so failing over is exact: when an executor does
//! not answer, the next one is asked from the same row. When none answers, the worker
//! reads the rest of its task itself (and says so once): an executor never holds data a
//! worker depends on, so losing all of them costs speed, never samples.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use elastrec_data::criteo;
use elastrec_data::{BadRowPolicy, Batch, BatchReader, Jagged, ReadStats, Schema};
use elastrec_job::config::JobConfig;
use elastrec_preprocess::Plan;
use elastrec_proto::executor::ReadRequest;
use elastrec_rpc as rpc;
use parking_lot::Mutex;

use crate::executor::check_response;

/// How long one read may take before the executor is taken for gone.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How a job's rows become batches: its `[[preprocess]]` plan, its named features, or
/// neither (the Criteo layout). What an executor parses with, and what a worker reading a
/// file itself falls back to.
#[derive(Clone, Default)]
pub(crate) struct RowFormat {
    pub(crate) plan: Option<Arc<Plan>>,
    pub(crate) schema: Option<Arc<Schema>>,
}

impl RowFormat {
    pub(crate) fn of(job: &JobConfig) -> anyhow::Result<Self> {
        Ok(Self {
            plan: elastrec_job::prepare::feature_plan(job)?,
            schema: elastrec_job::prepare::job_schema(job),
        })
    }

    /// A reader of rows `[start, end)` of `path`.
    pub(crate) fn open(
        &self,
        path: &std::path::Path,
        start: u64,
        end: u64,
        policy: BadRowPolicy,
    ) -> elastrec_data::Result<Box<dyn BatchReader>> {
        elastrec_job::prepare::open_job_reader(
            self.plan.as_ref(),
            self.schema.as_ref(),
            path,
            start,
            end,
            policy,
        )
    }

    /// The layout of the batches it makes.
    pub(crate) fn layout(&self) -> ReadLayout {
        match (&self.plan, &self.schema) {
            (Some(p), _) => ReadLayout {
                dense_width: p.dense_width(),
                sparse_width: p.sparse_width(),
                list_max_lens: Vec::new(),
            },
            (None, Some(s)) => ReadLayout {
                dense_width: s.dense_width(),
                sparse_width: s.sparse_width(),
                list_max_lens: s.lists().map(|f| f.max_len()).collect(),
            },
            (None, None) => ReadLayout {
                dense_width: criteo::DENSE,
                sparse_width: criteo::CATEGORICAL,
                list_max_lens: Vec::new(),
            },
        }
    }
}

/// The layout a read's answer must have: values per sample, and each list feature's
/// longest list (in batch order).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ReadLayout {
    pub(crate) dense_width: usize,
    pub(crate) sparse_width: usize,
    pub(crate) list_max_lens: Vec<usize>,
}

/// What a worker knows of the data executors: their addresses (from the master's
/// heartbeat replies) and the credentials to call them.
#[derive(Clone, Default)]
pub(crate) struct Executors {
    addrs: Arc<Mutex<Vec<String>>>,
    /// The worker's token and its largest message size.
    credentials: Arc<Mutex<(String, usize)>>,
    /// Samples this worker was served by executors.
    pub(crate) served: Arc<std::sync::atomic::AtomicU64>,
}

impl Executors {
    /// How to call the executors: the worker's own token and message limit.
    pub(crate) fn set_credentials(&self, token: &str, max_bytes: usize) {
        *self.credentials.lock() = (token.to_string(), max_bytes);
    }

    /// The running executors, as the master last said.
    pub(crate) fn set(&self, addrs: Vec<String>) {
        *self.addrs.lock() = addrs;
    }

    pub(crate) fn any(&self) -> bool {
        !self.addrs.lock().is_empty()
    }

    fn list(&self) -> Vec<String> {
        self.addrs.lock().clone()
    }
}

/// Rows `[at, end)` of one file, read through the executors.
pub(crate) struct ExecutorReader {
    executors: Executors,
    file: String,
    file_index: u32,
    path: PathBuf,
    at: u64,
    end: u64,
    policy: BadRowPolicy,
    /// How the rows become batches: the executors parse with it, and so does this reader
    /// when it reads the file itself.
    format: RowFormat,
    layout: ReadLayout,
    /// Which executor to ask first (spreads workers over them).
    first: usize,
    /// Connections by address.
    clients: Vec<(String, rpc::Executor)>,
    /// Reading the file itself: no executor answered.
    local: Option<Box<dyn BatchReader>>,
    stats: ReadStats,
    worker: u32,
}

impl ExecutorReader {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        executors: Executors,
        file: String,
        file_index: u32,
        path: PathBuf,
        from: u64,
        end: u64,
        policy: BadRowPolicy,
        format: RowFormat,
        worker: u32,
    ) -> Self {
        Self {
            layout: format.layout(),
            format,
            executors,
            file,
            file_index,
            path,
            at: from,
            end,
            policy,
            first: worker as usize,
            clients: Vec::new(),
            local: None,
            stats: ReadStats::default(),
            worker,
        }
    }

    fn client(&mut self, addr: &str) -> anyhow::Result<rpc::Executor> {
        if let Some((_, c)) = self.clients.iter().find(|(a, _)| a == addr) {
            return Ok(c.clone());
        }
        let (token, max_bytes) = self.executors.credentials.lock().clone();
        let c = rpc::executor_client(addr, &token, max_bytes, READ_TIMEOUT)?;
        self.clients.push((addr.to_string(), c.clone()));
        Ok(c)
    }

    /// One read from the executor at `addr`, checked.
    fn read_from(
        &mut self,
        addr: &str,
        max_rows: u32,
    ) -> anyhow::Result<elastrec_proto::executor::ReadResponse> {
        let mut client = self.client(addr)?;
        let req = ReadRequest {
            version: rpc::version(),
            file: self.file.clone(),
            file_index: self.file_index,
            start_row: self.at,
            end_row: self.end,
            max_rows,
        };
        // The worker calls readers inside `block_in_place`: waiting here is allowed.
        let r = tokio::runtime::Handle::current()
            .block_on(async move { client.read(req).await })
            .map_err(|s| anyhow::anyhow!("executor {addr}: {}", s.message()))?
            .into_inner();
        check_response(&r, max_rows, self.end - self.at, &self.layout)?;
        Ok(r)
    }
}

impl BatchReader for ExecutorReader {
    fn next_batch(&mut self, batch: &mut Batch, max_rows: usize) -> elastrec_data::Result<usize> {
        if let Some(local) = self.local.as_mut() {
            return read_counted(local.as_mut(), batch, max_rows, &mut self.stats);
        }
        batch.clear();
        batch.dense_width = self.layout.dense_width;
        batch.sparse_width = self.layout.sparse_width;
        batch
            .bags
            .resize_with(self.layout.list_max_lens.len(), Jagged::default);
        if self.at >= self.end {
            return Ok(0);
        }
        let max = max_rows.clamp(1, u32::MAX as usize) as u32;
        let addrs = self.executors.list();
        let mut last_err = None;
        for k in 0..addrs.len() {
            let addr = addrs[(self.first + k) % addrs.len()].clone();
            match self.read_from(&addr, max) {
                Ok(r) => {
                    // Stay with the one that answered.
                    self.first = (self.first + k) % addrs.len();
                    let n = r.labels.len();
                    // `read_from` checked the sizes.
                    batch.tasks = (r.tasks as usize).max(1);
                    batch.task_labels.extend_from_slice(&r.task_labels);
                    batch.labels.extend_from_slice(&r.labels);
                    batch.dense.extend_from_slice(&r.dense);
                    batch.sparse.extend_from_slice(&r.sparse);
                    batch.weights.extend_from_slice(&r.weights);
                    for (mine, col) in batch.bags.iter_mut().zip(&r.lists) {
                        mine.offsets.clear();
                        mine.offsets.extend_from_slice(&col.offsets);
                        mine.ids.extend_from_slice(&col.ids);
                        mine.weights.extend_from_slice(&col.weights);
                    }
                    self.at += r.rows_consumed;
                    self.stats.rows_read += n as u64;
                    self.stats.rows_skipped += r.rows_skipped;
                    self.executors
                        .served
                        .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                    return Ok(n);
                }
                Err(e) => {
                    eprintln!(
                        "worker {}: executor {addr} did not answer ({e:#}); asking the next one",
                        self.worker
                    );
                    last_err = Some(e);
                }
            }
        }
        // No executor answered: read on from the same row ourselves.
        let why = last_err.map_or("no executor is running".to_string(), |e| format!("{e:#}"));
        eprintln!(
            "worker {}: no data executor answered ({why}); reading {} from row {} itself",
            self.worker, self.file, self.at
        );
        let reader = self
            .format
            .open(&self.path, self.at, self.end, self.policy)?;
        let local = self.local.insert(reader);
        read_counted(local.as_mut(), batch, max_rows, &mut self.stats)
    }

    fn stats(&self) -> &ReadStats {
        &self.stats
    }
}

/// Reads from `reader`, adding what it read and skipped to `stats` (the reader's own
/// counters are cumulative; callers keep their own: the worker takes differences of them,
/// an executor reports each chunk's).
pub(crate) fn read_counted(
    reader: &mut dyn BatchReader,
    batch: &mut Batch,
    max_rows: usize,
    stats: &mut ReadStats,
) -> elastrec_data::Result<usize> {
    let skipped = reader.stats().rows_skipped;
    let n = reader.next_batch(batch, max_rows)?;
    stats.rows_read += n as u64;
    stats.rows_skipped += reader.stats().rows_skipped - skipped;
    Ok(n)
}
