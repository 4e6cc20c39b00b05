//! A data executor (`elastrec executor`, started by the master for `cluster.executors`):
//! it reads and parses rows of the job's data files and serves them to workers as ready
//! batches (Primus's data workers).
//!
//! Reads are stateless for the worker: each one names the file and the row it starts at,
//! so a worker whose executor dies asks another from the same row (see
//! [`crate::executor_reader`]). The executor keeps the readers it opened, keyed by the
//! position they stand at, and after answering a read it parses the next chunk of the same
//! range ahead (its serving buffer), so the worker's next read is usually answered from
//! memory.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use elastrec_data::{Batch, BatchReader};
use elastrec_job::config::JobConfig;
use elastrec_job::register::register_node;
use elastrec_proto::executor::data_executor_server::{DataExecutor, DataExecutorServer};
use elastrec_proto::executor::{ListColumn, ReadRequest, ReadResponse};
use elastrec_proto::master::{HeartbeatRequest, NodeAction, NodeProfile, Role};
use elastrec_rpc::{self as rpc, check_version, is_transient, ServerAuth};
use parking_lot::Mutex;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use crate::executor_reader::{ReadLayout, RowFormat};
use crate::remote::WorkerArgs;
use crate::split_source::TaskFiles;

/// Largest read a worker may ask for, samples (a batch is far smaller).
const MAX_READ_ROWS: u32 = 1 << 20;
/// Readers kept open, at most (one per range a worker is reading, plus strays).
const MAX_CURSORS: usize = 256;

/// An open reader of rows `[.., end)` of one file, with the chunk it parsed ahead
/// (samples, physical rows consumed, rows skipped); it is kept under the row that chunk
/// starts at.
struct Cursor {
    reader: Box<dyn BatchReader>,
    end: u64,
    ahead: Option<(Batch, u64, u64)>,
    used: Instant,
}

/// What the executor served, for its heartbeat profile.
#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    hits: AtomicU64,
    samples: AtomicU64,
    read_us: AtomicU64,
}

struct Executor {
    job: JobConfig,
    /// How the job's rows become batches (its `[[preprocess]]` plan or its named
    /// features): executors serve finished batches.
    format: RowFormat,
    files: TaskFiles,
    /// Open readers by (file index, position).
    cursors: Mutex<HashMap<(u32, u64), Cursor>>,
    counters: Counters,
}

/// Fail point `ELASTREC_FAIL_SLOW_EXECUTOR=ms`: every chunk takes that much longer to
/// parse (a slow or overloaded executor; the scaling test's bottleneck).
fn slow_parse() -> Option<Duration> {
    static SLOW: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *SLOW.get_or_init(|| {
        elastrec_common::fail_points::number("ELASTREC_FAIL_SLOW_EXECUTOR")
            .map(Duration::from_millis)
    })
}

/// Reads up to `rows` samples from `reader`; returns the chunk, the physical rows it
/// consumed and the rows skipped.
fn read_chunk(reader: &mut dyn BatchReader, rows: usize) -> anyhow::Result<(Batch, u64, u64)> {
    if let Some(pause) = slow_parse() {
        std::thread::sleep(pause);
    }
    let mut batch = Batch::default();
    let mut stats = elastrec_data::ReadStats::default();
    let n = crate::executor_reader::read_counted(reader, &mut batch, rows, &mut stats)?;
    Ok((batch, n as u64 + stats.rows_skipped, stats.rows_skipped))
}

impl Executor {
    /// Answers one read, then parses the next chunk of the range ahead.
    fn read(self: &Arc<Self>, req: &ReadRequest) -> anyhow::Result<ReadResponse> {
        anyhow::ensure!(
            req.start_row <= req.end_row && req.max_rows > 0 && req.max_rows <= MAX_READ_ROWS,
            "rows [{}, {}) by {} are not a valid read",
            req.start_row,
            req.end_row,
            req.max_rows
        );
        let t0 = Instant::now();
        let key = (req.file_index, req.start_row);
        // A cursor stands at the read's row with the chunk it parsed ahead. A chunk with
        // more samples than this read may take cannot be split (its skipped rows have no
        // position of their own): that cursor is dropped and the range opened again at
        // the row, so nothing it parsed ahead is skipped.
        let cursor = self.cursors.lock().remove(&key).filter(|c| {
            c.end == req.end_row
                && c.ahead
                    .as_ref()
                    .is_none_or(|a| a.0.len() <= req.max_rows as usize)
        });
        let mut cursor = match cursor {
            Some(c) => c,
            None => {
                let (path, _) = self.files.resolve(&req.file, req.file_index)?;
                let reader = self.format.open(
                    &path,
                    req.start_row,
                    req.end_row,
                    self.job.data.on_bad_row,
                )?;
                Cursor {
                    reader,
                    end: req.end_row,
                    ahead: None,
                    used: Instant::now(),
                }
            }
        };
        let rows = req.max_rows as usize;
        let (batch, consumed, skipped, hit) = match cursor.ahead.take() {
            Some((b, c, s)) => (b, c, s, true),
            None => {
                let (b, c, s) = read_chunk(cursor.reader.as_mut(), rows)?;
                (b, c, s, false)
            }
        };
        let c = &self.counters;
        c.reads.fetch_add(1, Ordering::Relaxed);
        c.hits.fetch_add(u64::from(hit), Ordering::Relaxed);
        c.samples.fetch_add(batch.len() as u64, Ordering::Relaxed);
        c.read_us
            .fetch_add(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
        let next = req.start_row + consumed;
        if consumed > 0 && next < req.end_row {
            // The serving buffer: parse the next chunk while the worker trains this one.
            let me = self.clone();
            let max_rows = req.max_rows;
            let file = req.file_index;
            tokio::task::spawn_blocking(move || {
                if let Ok((b, c, s)) = read_chunk(cursor.reader.as_mut(), max_rows as usize) {
                    cursor.ahead = Some((b, c, s));
                    cursor.used = Instant::now();
                    me.keep(file, next, cursor);
                }
            });
        }
        Ok(ReadResponse {
            tasks: batch.tasks as u32,
            task_labels: batch.task_labels,
            labels: batch.labels,
            dense: batch.dense,
            sparse: batch.sparse,
            weights: batch.weights,
            lists: batch
                .bags
                .into_iter()
                .map(|j| ListColumn {
                    offsets: j.offsets,
                    ids: j.ids,
                    weights: j.weights,
                })
                .collect(),
            rows_consumed: consumed,
            rows_skipped: skipped,
            prefetched: hit,
        })
    }

    /// Keeps `cursor` for the read at `(file, at)`, dropping the least recently used
    /// readers beyond [`MAX_CURSORS`].
    fn keep(&self, file: u32, at: u64, cursor: Cursor) {
        let mut cursors = self.cursors.lock();
        cursors.insert((file, at), cursor);
        while cursors.len() > MAX_CURSORS {
            let oldest = cursors
                .iter()
                .min_by_key(|(_, c)| c.used)
                .map(|(k, _)| *k)
                .expect("not empty");
            cursors.remove(&oldest);
        }
    }

    fn profile(&self) -> NodeProfile {
        let usage = elastrec_metrics::process::usage();
        let c = &self.counters;
        NodeProfile {
            cpu_s: usage.cpu_s,
            rss_bytes: usage.rss_bytes,
            requests: c.reads.load(Ordering::Relaxed),
            prefetch_hits: c.hits.load(Ordering::Relaxed),
            samples: c.samples.load(Ordering::Relaxed),
            read_s: c.read_us.load(Ordering::Relaxed) as f64 / 1e6,
            ..Default::default()
        }
    }
}

/// The gRPC face of an [`Executor`].
struct Service(Arc<Executor>);

#[tonic::async_trait]
impl DataExecutor for Service {
    async fn read(&self, req: Request<ReadRequest>) -> Result<Response<ReadResponse>, Status> {
        rpc::require(&req, &[rpc::Caller::Worker])?;
        let req = req.into_inner();
        check_version(&req.version)?;
        let ex = self.0.clone();
        let r = tokio::task::spawn_blocking(move || ex.read(&req))
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
        r.map(Response::new)
            .map_err(|e| Status::failed_precondition(format!("{e:#}")))
    }
}

/// The executor's read service on `listener`, accepting `token` (the workers hold the
/// same worker token as the executor).
fn serve(
    executor: Arc<Executor>,
    listener: tokio::net::TcpListener,
    token: String,
) -> anyhow::Result<impl std::future::Future<Output = Result<(), tonic::transport::Error>>> {
    let max = executor.job.cluster.max_message_bytes;
    let svc = DataExecutorServer::new(Service(executor))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    let auth = ServerAuth::new(&token);
    Ok(elastrec_rpc::server()?
        .add_service(InterceptedService::new(svc, auth))
        .serve_with_incoming(elastrec_rpc::incoming(listener)))
}

/// Runs a data executor until the master stops it (or forgets it).
pub async fn run_executor(args: WorkerArgs) -> anyhow::Result<()> {
    let token = rpc::token_from_env()?;
    elastrec_rpc::tls::install_from_env()?;
    let id = args.node_id;
    let mut master = rpc::master_client(&args.master, &token, 64 << 20)?;
    // The job says where to bind.
    let first = register_node(&mut master, Role::Executor, id, "", "", false).await?;
    let job = first.job;
    let ip = elastrec_job::resources::bind_address(&job)?;
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, 0))
        .await
        .context("binding the executor's port")?;
    let addr = elastrec_job::resources::advertise_for(&job.engine, listener.local_addr()?)?;
    let executor = Arc::new(Executor {
        files: TaskFiles::of_blocking(&job).await?,
        format: RowFormat::of(&job)?,
        job: job.clone(),
        cursors: Mutex::new(HashMap::new()),
        counters: Counters::default(),
    });
    let server = tokio::spawn(serve(executor.clone(), listener, token.clone())?);
    let reg = register_node(&mut master, Role::Executor, id, &addr, "", false).await?;
    eprintln!("executor {id}: serving file reads on {addr}");
    let every = Duration::from_millis(reg.heartbeat_ms.max(1));
    let lease = Duration::from_millis(job.cluster.dead_after_ms);
    let mut last_ack = Instant::now();
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        if server.is_finished() {
            anyhow::bail!("executor {id}: the read service stopped");
        }
        let req = HeartbeatRequest {
            version: rpc::version(),
            node_id: id,
            samples: executor.counters.samples.load(Ordering::Relaxed),
            profile: Some(executor.profile()),
            ..Default::default()
        };
        match master.heartbeat(req).await {
            Ok(r) => {
                last_ack = Instant::now();
                match r.into_inner().action() {
                    NodeAction::Stop => {
                        eprintln!("executor {id}: stopped by the master");
                        return Ok(());
                    }
                    NodeAction::Unknown => {
                        eprintln!("executor {id}: the master no longer knows this node; exiting");
                        return Ok(());
                    }
                    _ => {}
                }
            }
            Err(s) if is_transient(&s) && last_ack.elapsed() < lease => {}
            Err(s) => {
                eprintln!("executor {id}: the master is gone ({s}); exiting");
                return Ok(());
            }
        }
    }
}

/// Checks a read's answer before a worker trains on it: sizes and offsets from the wire
/// are never trusted.
pub(crate) fn check_response(
    r: &ReadResponse,
    max_rows: u32,
    left: u64,
    layout: &ReadLayout,
) -> anyhow::Result<()> {
    let n = r.labels.len();
    let tasks = (r.tasks as usize).max(1);
    anyhow::ensure!(
        tasks <= elastrec_model::MAX_TASKS && r.task_labels.len() == n * (tasks - 1),
        "the executor answered a malformed read ({n} samples, {} labels of {tasks} tasks after the first)",
        r.task_labels.len()
    );
    anyhow::ensure!(
        n <= max_rows as usize
            && r.dense.len() == n * layout.dense_width
            && r.sparse.len() == n * layout.sparse_width
            && (r.weights.is_empty() || r.weights.len() == n)
            && r.rows_consumed >= n as u64 + r.rows_skipped
            && r.rows_consumed <= left
            && (n == 0 || r.rows_consumed > 0),
        "the executor answered a malformed read ({n} samples, {} dense, {} sparse, {} weights, {} rows consumed of {left})",
        r.dense.len(),
        r.sparse.len(),
        r.weights.len(),
        r.rows_consumed
    );
    anyhow::ensure!(
        r.lists.len() == layout.list_max_lens.len(),
        "the executor answered {} list features; the job has {}",
        r.lists.len(),
        layout.list_max_lens.len()
    );
    for (k, (col, &max_len)) in r.lists.iter().zip(&layout.list_max_lens).enumerate() {
        check_list(col, n, max_len)
            .with_context(|| format!("the executor answered a malformed list feature {k}"))?;
    }
    Ok(())
}

/// One list column of `n` samples: offsets from 0, rising by at most `max_len`, ending
/// at the ids' count; weights none or one per id.
fn check_list(col: &ListColumn, n: usize, max_len: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        col.offsets.len() == n + 1 && col.offsets[0] == 0,
        "{} offsets for {n} samples",
        col.offsets.len()
    );
    if let Some(w) = col
        .offsets
        .windows(2)
        .position(|w| w[1] < w[0] || (w[1] - w[0]) as usize > max_len)
    {
        anyhow::bail!(
            "sample {w} has offsets {}..{} (at most {max_len} ids a sample)",
            col.offsets[w],
            col.offsets[w + 1]
        );
    }
    anyhow::ensure!(
        col.offsets[n] as usize == col.ids.len(),
        "offsets end at {}, with {} ids",
        col.offsets[n],
        col.ids.len()
    );
    anyhow::ensure!(
        col.weights.is_empty() || col.weights.len() == col.ids.len(),
        "{} weights for {} ids",
        col.weights.len(),
        col.ids.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor_reader::{ExecutorReader, Executors};
    use elastrec_data::{criteo, BadRowPolicy};
    use elastrec_proto::executor::ListColumn;

    const TOKEN: &str = "executortesttoken";

    /// The Criteo layout every unlisted job reads.
    fn criteo() -> ReadLayout {
        RowFormat::default().layout()
    }

    /// `rows` Criteo lines, the 7th malformed (a letter in an integer field).
    fn write_data(dir: &std::path::Path, rows: usize) -> std::path::PathBuf {
        let mut text = String::new();
        for r in 0..rows {
            text += &format!("{}", r % 2);
            for i in 0..criteo::DENSE {
                if r == 6 && i == 3 {
                    text += "\tx";
                } else {
                    text += &format!("\t{}", (r * 7 + i) % 50);
                }
            }
            for i in 0..criteo::CATEGORICAL {
                text += &format!("\t{:08x}", (r * 31 + i * 7) % 997);
            }
            text += "\n";
        }
        let path = dir.join("day_0.tsv");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn job(dir: &std::path::Path) -> JobConfig {
        let mut job = JobConfig::default();
        job.data.dir = dir.to_path_buf();
        job.data.train = vec!["day_0.tsv".into()];
        job.data.on_bad_row = BadRowPolicy::Skip;
        job
    }

    /// An executor on its own runtime (so that stopping it drops its open connections
    /// too, as a killed process would): its address, and what stops it (returning once
    /// it is gone).
    fn start(job: &JobConfig) -> (String, impl Fn()) {
        let executor = Arc::new(Executor {
            files: TaskFiles::of(job).unwrap(),
            format: RowFormat::of(job).unwrap(),
            job: job.clone(),
            cursors: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        });
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let (gone_tx, gone_rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.spawn(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx
                    .send(listener.local_addr().unwrap().to_string())
                    .unwrap();
                let _ = serve(executor, listener, TOKEN.into()).unwrap().await;
            });
            let _ = stop_rx.recv();
            // Every task is dropped with the runtime, its connections with them.
            drop(rt);
            let _ = gone_tx.send(());
        });
        let stop = move || {
            stop_tx.send(()).unwrap();
            gone_rx.recv().unwrap();
        };
        (addr_rx.recv().unwrap(), stop)
    }

    /// Reads the whole reader in batches of `rows`, after each batch calling `between`.
    fn drain(r: &mut dyn BatchReader, rows: usize, mut between: impl FnMut(usize)) -> Batch {
        let mut all = Batch::default();
        let mut b = Batch::default();
        for k in 0.. {
            let n = r.next_batch(&mut b, rows).unwrap();
            if n == 0 {
                break;
            }
            if k == 0 {
                all.take_layout(&b);
            }
            all.extend_from(&b, 0..n);
            between(k);
        }
        all
    }

    /// The executors' rows are the file's rows, in order, malformed ones skipped alike;
    /// the first executor dying mid-range hands the read to the second from the same row,
    /// and the second dying hands it to the worker itself, with nothing lost or repeated.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_fail_over_between_executors_and_to_the_file_without_losing_a_row() {
        let tmp = tempfile::tempdir().unwrap();
        let path = write_data(tmp.path(), 500);
        let job = job(tmp.path());
        let (a, stop_a) = start(&job);
        let (b, stop_b) = start(&job);
        let (from, end) = (3u64, 480u64);
        let mut local =
            elastrec_data::open_reader_range(&path, from, end, BadRowPolicy::Skip).unwrap();
        let want = tokio::task::block_in_place(|| drain(local.as_mut(), 64, |_| {}));
        assert_eq!(
            want.len(),
            (end - from - 1) as usize,
            "one row is malformed"
        );

        let executors = Executors::default();
        executors.set_credentials(TOKEN, 64 << 20);
        executors.set(vec![a.clone(), b.clone()]);
        let mut reader = ExecutorReader::new(
            executors.clone(),
            path.to_string_lossy().into_owned(),
            0,
            path.clone(),
            from,
            end,
            BadRowPolicy::Skip,
            RowFormat::default(),
            0,
        );
        let got = tokio::task::block_in_place(|| {
            drain(&mut reader, 64, |k| match k {
                1 => stop_a(),
                4 => stop_b(),
                _ => {}
            })
        });
        assert_eq!(got, want);
        assert_eq!(reader.stats().rows_skipped, 1);
        let served = executors.served.load(Ordering::Relaxed);
        assert_eq!(
            served,
            5 * 64,
            "the executors served the first five batches, the file the rest"
        );
    }

    /// A job of named features: the executors serve its bags, sequences and sample
    /// weights as the file holds them, rows whose weight is null skipped alike, and a
    /// worker whose executor dies reads on from the same row.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn named_features_come_through_the_executors_as_from_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let spec = elastrec_data::gen::named::NamedSpec {
            out: tmp.path().to_path_buf(),
            rows: 700,
            days: 1,
            seed: 3,
            csv: false,
        };
        let path = elastrec_data::gen::named::generate_named(&spec)
            .unwrap()
            .files[0]
            .clone();
        let text = format!(
            r#"
[data]
dir = "{}"
train = ["{}"]
label = "click"
weight = "price"
on_bad_row = "skip"
[[data.feature]]
name = "item_id"
kind = "categorical"
[[data.feature]]
name = "genres"
kind = "bag"
max_len = 3
[[data.feature]]
name = "hist_items"
kind = "sequence"
table = "item_id"
max_len = 5
"#,
            tmp.path().display(),
            path.file_name().unwrap().to_string_lossy()
        );
        let file = tmp.path().join("job.toml");
        std::fs::write(&file, text).unwrap();
        let job = JobConfig::load(&file).unwrap();
        let format = RowFormat::of(&job).unwrap();
        let (from, end) = (5u64, 690u64);
        let mut local = format.open(&path, from, end, BadRowPolicy::Skip).unwrap();
        let want = tokio::task::block_in_place(|| drain(local.as_mut(), 64, |_| {}));
        let skipped = local.stats().rows_skipped;
        assert!(skipped > 0, "the generator writes null prices");
        assert_eq!(want.len() as u64 + skipped, end - from);
        assert_eq!(want.bags.len(), 2);
        assert_eq!(want.weights.len(), want.len());
        assert!(
            want.bags[1].ids.len() > want.len(),
            "the histories hold items"
        );

        let (a, stop_a) = start(&job);
        let (b, _stop_b) = start(&job);
        let executors = Executors::default();
        executors.set_credentials(TOKEN, 64 << 20);
        executors.set(vec![a, b]);
        let mut reader = ExecutorReader::new(
            executors.clone(),
            path.to_string_lossy().into_owned(),
            0,
            path.clone(),
            from,
            end,
            BadRowPolicy::Skip,
            format,
            0,
        );
        let got = tokio::task::block_in_place(|| {
            drain(&mut reader, 64, |k| {
                if k == 2 {
                    stop_a()
                }
            })
        });
        assert_eq!(got, want);
        assert_eq!(reader.stats().rows_skipped, skipped);
        assert_eq!(
            executors.served.load(Ordering::Relaxed),
            want.len() as u64,
            "the second executor served the rest"
        );
    }

    /// Reads of changing sizes (a synchronous job's batch follows its worker count) get
    /// the file's rows in order: a chunk parsed ahead for a larger read is never skipped.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_of_changing_sizes_get_every_row_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        let path = write_data(tmp.path(), 300);
        let job = job(tmp.path());
        let (addr, _stop) = start(&job);
        let mut local =
            elastrec_data::open_reader_range(&path, 0, 300, BadRowPolicy::Skip).unwrap();
        let want = tokio::task::block_in_place(|| drain(local.as_mut(), 1000, |_| {}));
        let executors = Executors::default();
        executors.set_credentials(TOKEN, 64 << 20);
        executors.set(vec![addr]);
        let mut reader = ExecutorReader::new(
            executors,
            path.to_string_lossy().into_owned(),
            0,
            path.clone(),
            0,
            300,
            BadRowPolicy::Skip,
            RowFormat::default(),
            0,
        );
        let mut got = criteo::batch(0);
        let mut b = Batch::default();
        tokio::task::block_in_place(|| {
            for k in 0.. {
                // 64, then 16, then 64, ... and let the executor parse ahead in between.
                let rows = if k % 2 == 0 { 64 } else { 16 };
                let n = reader.next_batch(&mut b, rows).unwrap();
                if n == 0 {
                    break;
                }
                got.labels.extend_from_slice(&b.labels);
                got.dense.extend_from_slice(&b.dense);
                got.sparse.extend_from_slice(&b.sparse);
                // Room for the executor to parse ahead, so that the next read of the
                // other size meets a parsed chunk (the rows must match either way).
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        });
        assert_eq!(got, want);
    }

    /// An answer whose sizes do not match its sample count is refused before a worker
    /// trains on it.
    #[test]
    fn malformed_answers_are_refused() {
        let ok = ReadResponse {
            labels: vec![1.0; 2],
            dense: vec![0.0; 2 * criteo::DENSE],
            sparse: vec![0; 2 * criteo::CATEGORICAL],
            rows_consumed: 3,
            rows_skipped: 1,
            ..Default::default()
        };
        assert!(check_response(&ok, 2, 10, &criteo()).is_ok());
        assert!(
            check_response(&ok, 1, 10, &criteo()).is_err(),
            "more samples than asked"
        );
        assert!(
            check_response(&ok, 2, 2, &criteo()).is_err(),
            "past the range"
        );
        let short = ReadResponse {
            dense: vec![0.0; criteo::DENSE],
            ..ok.clone()
        };
        assert!(check_response(&short, 2, 10, &criteo()).is_err());
        // A multi-task batch: one label per sample for each task after the first.
        let two_tasks = ReadResponse {
            tasks: 2,
            task_labels: vec![0.0, 1.0],
            ..ok.clone()
        };
        assert!(check_response(&two_tasks, 2, 10, &criteo()).is_ok());
        for bad in [
            ReadResponse {
                task_labels: vec![1.0],
                ..two_tasks.clone()
            },
            ReadResponse {
                tasks: 9,
                task_labels: vec![0.0; 16],
                ..ok.clone()
            },
        ] {
            assert!(check_response(&bad, 2, 10, &criteo()).is_err());
        }
    }

    /// A list feature's offsets and weights from the wire are checked against the
    /// samples, the ids and the feature's longest list before a worker indexes with them.
    #[test]
    fn malformed_list_features_are_refused() {
        let layout = ReadLayout {
            dense_width: 1,
            sparse_width: 0,
            list_max_lens: vec![3],
        };
        let ok = ReadResponse {
            labels: vec![1.0; 2],
            dense: vec![0.0; 2],
            weights: vec![0.5, 2.0],
            lists: vec![ListColumn {
                offsets: vec![0, 2, 5],
                ids: vec![1, 2, 3, 4, 5],
                weights: Vec::new(),
            }],
            rows_consumed: 2,
            ..Default::default()
        };
        assert!(check_response(&ok, 2, 10, &layout).is_ok());
        let with = |f: &dyn Fn(&mut ReadResponse)| {
            let mut r = ok.clone();
            f(&mut r);
            check_response(&r, 2, 10, &layout)
                .expect_err("refused")
                .to_string()
        };
        for (what, err) in [
            ("no list", with(&|r| r.lists.clear())),
            ("short offsets", with(&|r| r.lists[0].offsets = vec![0, 5])),
            (
                "offsets from 1",
                with(&|r| r.lists[0].offsets = vec![1, 2, 5]),
            ),
            (
                "falling offsets",
                with(&|r| r.lists[0].offsets = vec![0, 3, 2]),
            ),
            (
                "too long a list",
                with(&|r| r.lists[0].offsets = vec![0, 1, 5]),
            ),
            ("past the ids", with(&|r| r.lists[0].ids.truncate(4))),
            ("id weights", with(&|r| r.lists[0].weights = vec![1.0; 4])),
            ("sample weights", with(&|r| r.weights = vec![1.0])),
        ] {
            assert!(err.contains("executor"), "{what}: {err}");
        }
    }
}
