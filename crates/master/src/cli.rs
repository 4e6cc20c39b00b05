//! Library side of the `run`, `status`, `scale` and `bench-master` commands (the `elastrec`
//! binary only parses arguments and calls these). Reading and printing a live job's status
//! is `elastrec-client`'s; here a job whose master is down is read from its database.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use elastrec_client::connect::{connect, connect_with_timeout};
use elastrec_client::status::{print_result, status_value};
use elastrec_proto::master::{
    get_task_response::Reply, GetTaskRequest, HeartbeatRequest, PauseRequest, RegisterRequest,
    ReportProgressRequest, Role as PbRole, ScaleRequest, StatusRequest, TakeCheckpointRequest,
};
use elastrec_rpc::{self as rpc, Master};

use crate::run::{resume_job, start_job, JobDir, JobResult};

/// `elastrec run`: start a distributed job (master + PS + workers as local processes).
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The job file (TOML) with a `[cluster]` section.
    #[arg(required_unless_present = "resume")]
    pub job: Option<PathBuf>,
    /// Restart the master of the job in this directory (after the master died).
    #[arg(long, value_name = "JOB_DIR", conflicts_with = "job")]
    pub resume: Option<PathBuf>,
    /// Where role processes run: `local` (processes on this machine, the default),
    /// `slurm` (one `srun` step per node) or `kubernetes` (one pod per node). A resumed
    /// job keeps the backend it started with.
    #[arg(long, value_enum)]
    pub backend: Option<crate::backend::BackendKind>,
    /// Start the job from a checkpoint of another job (its model and data position): a
    /// checkpoint directory or s3://bucket/prefix. The number of parameter servers may
    /// differ; rows are re-routed by the stable hash.
    #[arg(long, value_name = "LOCATION", conflicts_with = "resume")]
    pub from_checkpoint: Option<String>,
    /// With --from-checkpoint: this checkpoint id instead of the newest intact one.
    #[arg(long, requires = "from_checkpoint")]
    pub checkpoint_id: Option<u64>,
    /// Pause the job once this many samples are trained (`elastrec unpause` goes on).
    #[arg(long, value_name = "SAMPLES", conflicts_with = "resume")]
    pub pause_at_samples: Option<u64>,
    /// Print the manifests of the job's Secret and first pods (YAML, the token redacted)
    /// and start nothing (with `--backend kubernetes`).
    #[arg(long, conflicts_with = "resume")]
    pub dry_run: bool,
}

/// Runs (or resumes) a job to its end.
pub async fn run(args: RunArgs) -> anyhow::Result<JobResult> {
    let exe = std::env::current_exe().context("locating the elastrec binary")?;
    match (args.resume, args.job) {
        (Some(dir), _) => resume_job(&dir, exe, args.backend).await,
        (None, Some(job)) => {
            let from = args
                .from_checkpoint
                .map(|location| crate::run::FromCheckpoint {
                    location,
                    id: args.checkpoint_id,
                });
            start_job(
                &job,
                exe,
                from,
                args.pause_at_samples,
                args.backend.unwrap_or_default(),
            )
            .await
        }
        (None, None) => anyhow::bail!("give a job file or --resume JOB_DIR"),
    }
}

/// `elastrec status`: nodes, shards, rate of a job.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// The job directory (the job's `output.dir`).
    pub job_dir: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The job file a job directory's master stored when the job started (`run --resume`
/// reads the job from there, not from the file it was started with, which may have
/// changed or gone).
pub fn stored_job(dir: &std::path::Path) -> anyhow::Result<elastrec_job::config::JobConfig> {
    let db = JobDir(dir.to_path_buf()).db();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Only the stored job: the master reads the whole state when it resumes.
    let text = rt
        .block_on(async {
            let store = crate::store::MasterDb::open_read_only(&db).await?;
            store.meta("job_toml").await
        })?
        .with_context(|| format!("{} lacks the stored job", db.display()))?;
    Ok(elastrec_job::config::JobConfig::from_toml(&text, &db)?)
}

/// Prints a job's status, from its master or, when the master is down, from its database.
pub async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let mut client = connect(&args.job_dir)?;
    let live = tokio::time::timeout(
        Duration::from_secs(3),
        client.status(StatusRequest {
            version: rpc::version(),
        }),
    )
    .await;
    let s = match live {
        Ok(Ok(r)) => r.into_inner(),
        _ => {
            let dir = JobDir(args.job_dir.clone());
            if let Ok(text) = std::fs::read_to_string(dir.result()) {
                if args.json {
                    println!("{text}");
                } else {
                    println!("master is not running; result of the job (all of it: --json):");
                    print_result(&text);
                }
                return Ok(());
            }
            let store = crate::store::MasterDb::open_read_only(&dir.db()).await?;
            let snap = store.load().await?;
            println!(
                "master is not reachable; state from {}:",
                dir.db().display()
            );
            let count = |st: crate::tasks::TaskState| {
                snap.tasks
                    .iter()
                    .filter(|t| std::mem::discriminant(&t.state) == std::mem::discriminant(&st))
                    .count()
            };
            println!(
                "shards todo {} doing {} done {}; ledger ranges {}",
                count(crate::tasks::TaskState::Todo),
                count(crate::tasks::TaskState::Doing(0)),
                count(crate::tasks::TaskState::Done),
                snap.ranges.len()
            );
            for n in snap.nodes {
                println!(
                    "  node {:>3} {:?} {:?} pid {} {}",
                    n.id, n.role, n.state, n.pid, n.addr
                );
            }
            return Ok(());
        }
    };
    if args.json {
        println!("{}", status_value(&s));
    } else {
        elastrec_client::status::print_table(&s);
    }
    Ok(())
}

/// `elastrec scale`: change the number of workers of a running job.
#[derive(Debug, Clone, clap::Args)]
pub struct ScaleArgs {
    /// The job directory (the job's `output.dir`).
    pub job_dir: PathBuf,
    /// Desired number of workers.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256), required_unless_present = "ps")]
    pub workers: Option<u32>,
    /// Desired number of parameter servers: re-sharded online while the job trains
    /// (asynchronous jobs); returns once the new layout is in force.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub ps: Option<u32>,
}

/// Asks the master to scale the workers.
pub async fn scale(args: ScaleArgs) -> anyhow::Result<()> {
    // Re-sharding moves every PS's state before the reply: allow it the time the master
    // allows each of its steps.
    let timeout = if args.ps.is_some() {
        crate::reshard::STEP_TIMEOUT * 2
    } else {
        rpc::MASTER_CALL_TIMEOUT
    };
    let mut client = connect_with_timeout(&args.job_dir, timeout)?;
    let r = client
        .scale(ScaleRequest {
            version: rpc::version(),
            workers: args.workers.unwrap_or(0),
            ps: args.ps,
        })
        .await
        .map_err(|s| anyhow::anyhow!("scale refused: {}", s.message()))?
        .into_inner();
    if let Some(v) = &r.reshard {
        println!(
            "PS: {} -> {} (layout {}); training paused {:.1} ms, moved {:.1} MB ({:.1} MB pre-copied)",
            v.from,
            v.to,
            v.layout_version,
            v.pause_ms,
            (v.frozen_bytes + v.precopy_bytes) as f64 / 1e6,
            v.precopy_bytes as f64 / 1e6
        );
    }
    if args.workers.is_some() {
        println!("workers: {} -> {}", r.previous, r.target);
    }
    Ok(())
}

/// `elastrec pause`: stop handing out data at a number of samples (default: now).
#[derive(Debug, Clone, clap::Args)]
pub struct PauseArgs {
    /// The job directory (the job's `output.dir`).
    pub job_dir: PathBuf,
    /// Pause once this many samples are trained instead of now.
    #[arg(long, value_name = "SAMPLES")]
    pub at_samples: Option<u64>,
}

/// `elastrec unpause`: lift a pause.
#[derive(Debug, Clone, clap::Args)]
pub struct UnpauseArgs {
    /// The job directory (the job's `output.dir`).
    pub job_dir: PathBuf,
}

async fn set_pause(
    job_dir: &std::path::Path,
    at_samples: Option<u64>,
    release: bool,
) -> anyhow::Result<()> {
    let mut client = connect(job_dir)?;
    let r = client
        .pause(PauseRequest {
            version: rpc::version(),
            at_samples,
            release,
        })
        .await
        .map_err(|s| anyhow::anyhow!("pause refused: {}", s.message()))?
        .into_inner();
    match r.at_samples {
        Some(at) => println!(
            "paused at {at} samples ({} trained so far; workers finish the shards they hold)",
            r.samples_done
        ),
        None => println!("not paused ({} samples trained so far)", r.samples_done),
    }
    Ok(())
}

/// Asks the master to pause the job.
pub async fn pause(args: PauseArgs) -> anyhow::Result<()> {
    set_pause(&args.job_dir, args.at_samples, false).await
}

/// Asks the master to lift the pause.
pub async fn unpause(args: UnpauseArgs) -> anyhow::Result<()> {
    set_pause(&args.job_dir, None, true).await
}

/// `elastrec checkpoint`: take a checkpoint of a running job now.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckpointArgs {
    /// The job directory (the job's `output.dir`).
    pub job_dir: PathBuf,
}

/// How long `checkpoint` and `stop` wait for their reply. The master bounds both the wait
/// for a checkpoint already running and its own by `checkpoint.timeout_s` (600 s by
/// default), so this deadline only guards against a master that stopped answering.
const CHECKPOINT_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

/// Asks the master for a checkpoint and waits until it is committed.
pub async fn checkpoint(args: CheckpointArgs) -> anyhow::Result<()> {
    let mut client = connect_with_timeout(&args.job_dir, CHECKPOINT_CALL_TIMEOUT)?;
    let r = client
        .take_checkpoint(TakeCheckpointRequest {
            version: rpc::version(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("checkpoint refused: {}", s.message()))?
        .into_inner();
    println!(
        "checkpoint {} committed: {} samples, {:.1} MB",
        r.id,
        r.samples,
        r.bytes as f64 / 1e6
    );
    Ok(())
}

/// `elastrec stop`: end a job's training (how an online job finishes).
#[derive(Debug, Clone, clap::Args)]
pub struct StopArgs {
    /// The job directory (the job's `output.dir`).
    pub job_dir: PathBuf,
}

/// Asks the master to stop training; with checkpoints on, it takes one first.
pub async fn stop(args: StopArgs) -> anyhow::Result<()> {
    // The master takes a checkpoint before it replies.
    let mut client = connect_with_timeout(&args.job_dir, CHECKPOINT_CALL_TIMEOUT)?;
    let r = client
        .stop(elastrec_proto::master::StopRequest {
            version: rpc::version(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("stop refused: {}", s.message()))?
        .into_inner();
    match r.checkpoint_id {
        0 => println!(
            "stopped at {} samples (checkpoints are off)",
            r.samples_done
        ),
        id => println!(
            "stopped at {} samples; checkpoint {id} holds the model and the stream offsets",
            r.samples_done
        ),
    }
    Ok(())
}

/// `elastrec bench-master`: load test of the master's task and heartbeat service.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Simulated workers (concurrent clients).
    #[arg(long, default_value_t = 64)]
    pub clients: u32,
    /// HTTP/2 connections the clients share, round-robin (requests of clients on one
    /// connection are multiplexed); 0: one connection per client, as real workers have.
    #[arg(long, default_value_t = 0)]
    pub connections: u32,
    /// Seconds to measure (after every client registered and a 0.5 s warm-up).
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Heartbeats per progress report.
    #[arg(long, default_value_t = 1)]
    pub heartbeats_per_report: u32,
    /// Threads of the master's own runtime (the clients run on the command's runtime).
    #[arg(long, default_value_t = 2)]
    pub server_threads: usize,
    /// Durability of the master database's commits (`full`, the master's setting, fsyncs
    /// the WAL at every group commit; `process` survives only a master crash).
    #[arg(long, value_enum, default_value = "full")]
    pub durability: crate::store::Durability,
}

/// CPU seconds (user + system) used so far by this process's threads, split into the
/// master's (its runtime and the SQLite threads) and everything else (the clients).
/// `None` where `/proc` is not available.
fn cpu_split() -> Option<(f64, f64)> {
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let (mut server, mut client) = (0u64, 0u64);
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        let Ok(stat) = std::fs::read_to_string(entry.ok()?.path().join("stat")) else {
            continue; // the thread exited meanwhile
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        // After the command come the fields from 3 (state) on; utime, stime are 14, 15.
        let f: Vec<&str> = stat[close + 2..].split(' ').collect();
        let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
        if comm.starts_with(BENCH_MASTER_THREAD) || comm.starts_with("sqlx-sqlite") {
            server += ticks;
        } else {
            client += ticks;
        }
    }
    Some((server as f64 / tick, client as f64 / tick))
}

/// Name of the bench master's runtime threads.
const BENCH_MASTER_THREAD: &str = "master-server";

/// The bench master's job: one 10⁹-row file in 16 Ki-row shards, `workers` workers that
/// are never launched (the simulated clients register as them).
async fn start_bench_master(
    db: PathBuf,
    durability: crate::store::Durability,
    workers: u32,
    token: &'static str,
) -> anyhow::Result<(Arc<crate::core::MasterCore>, String)> {
    use crate::backend::NoProcesses;
    use crate::core::{LiveCtx, MasterCore};
    use crate::job::{Job, Policy};
    use crate::service::MasterService;
    use crate::store::{MasterDb, Writer};
    use crate::tasks::{DataSharding, TaskQueue};

    let store = MasterDb::open_with(&db, true, durability).await?;
    let queue = TaskQueue::new(
        DataSharding {
            rows_per_shard: 64 * 256,
            min_rows: 256,
            epochs: 1,
            seed: 1,
            shuffle: true,
            shuffle_rows: false,
        },
        vec![1_000_000_000],
    );
    let policy = Policy {
        num_ps: 0,
        dead_after_ms: 60_000,
        max_worker_restarts: 0,
        straggler_ratio: 0.5,
        evaluate: false,
        recover_ps: false,
        warmup_samples: 0,
        pin_partitions: false,
        executors: 0,
    };
    let mut cx = LiveCtx::now();
    let job = Job::start(policy, queue, workers, &mut cx);
    store.apply(&cx.take_changes()).await?;
    let core = Arc::new(MasterCore::new(
        job,
        Writer::spawn(store),
        Arc::new(NoProcesses),
        String::new(),
        vec![elastrec_job::split::Source::File("bench".into())],
        1000,
        "bench".into(),
    ));
    // Served as `elastrec run` serves it (`run/serve.rs`).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let svc = elastrec_proto::master::master_server::MasterServer::new(MasterService(core.clone()));
    tokio::spawn(
        elastrec_rpc::server()?
            .add_service(tonic::service::interceptor::InterceptedService::new(
                svc,
                rpc::ServerAuth::new(token),
            ))
            .serve_with_incoming(elastrec_rpc::incoming(listener)),
    );
    Ok((core, addr))
}

/// What the simulated workers share with the bench.
#[derive(Default)]
struct BenchFlags {
    /// Workers registered so far.
    registered: std::sync::atomic::AtomicU32,
    /// Set during the measured window: requests started then record their latency.
    measuring: std::sync::atomic::AtomicBool,
    /// Set at the end: workers finish their request and stop.
    stop: std::sync::atomic::AtomicBool,
    /// Replies received (every one answered by the master).
    answered: std::sync::atomic::AtomicU64,
}

/// One simulated worker: registers as node `id`, then gets a task, reports progress 256
/// rows at a time until it is done, and sends `heartbeats` heartbeats after each of those
/// requests. Returns the latencies (µs) of requests started while measuring and the rows
/// whose reports the master acknowledged.
async fn simulated_worker(
    mut c: Master,
    id: u32,
    heartbeats: u32,
    flags: Arc<BenchFlags>,
) -> anyhow::Result<(Vec<u32>, u64)> {
    use std::sync::atomic::Ordering::Relaxed;

    let mut lat: Vec<u32> = Vec::new();
    let mut acked = 0u64;
    c.register(RegisterRequest {
        version: rpc::version(),
        role: PbRole::Worker as i32,
        node_id: id,
        addr: String::new(),
        metrics_addr: String::new(),
        pid: 0,
        restore_s: 0.0,
        dense_rewound: false,
    })
    .await?;
    flags.registered.fetch_add(1, Relaxed);
    let done = |t0: Instant, measured: bool, lat: &mut Vec<u32>| {
        flags.answered.fetch_add(1, Relaxed);
        if measured {
            lat.push(t0.elapsed().as_micros() as u32);
        }
    };
    // (task id, rows reported, rows in the task)
    let mut task: Option<(u64, u64, u64)> = None;
    while !flags.stop.load(Relaxed) {
        let (t0, measured) = (Instant::now(), flags.measuring.load(Relaxed));
        match task {
            None => {
                let r = c
                    .get_task(GetTaskRequest {
                        version: rpc::version(),
                        node_id: id,
                    })
                    .await?
                    .into_inner();
                if let Some(Reply::Task(t)) = r.reply {
                    let split = elastrec_job::split::Split::from_proto(t.split.as_ref())?;
                    task = Some((t.task_id, t.offset, split.len()));
                }
            }
            Some((tid, off, len)) => {
                let next = (off + 256).min(len);
                c.report_progress(ReportProgressRequest {
                    version: rpc::version(),
                    node_id: id,
                    task_id: tid,
                    offset: next,
                    ..ReportProgressRequest::default()
                })
                .await?;
                acked += next - off;
                task = (next < len).then_some((tid, next, len));
            }
        }
        done(t0, measured, &mut lat);
        for _ in 0..heartbeats {
            let (t0, measured) = (Instant::now(), flags.measuring.load(Relaxed));
            c.heartbeat(HeartbeatRequest {
                version: rpc::version(),
                node_id: id,
                task_id: 0,
                offset: 0,
                samples: 0,
                step: 0,
                profile: None,
                fenced: false,
            })
            .await?;
            done(t0, measured, &mut lat);
        }
    }
    Ok((lat, acked))
}

/// Starts a master (real gRPC on loopback, real SQLite, group commit) on a runtime of its
/// own, with processes that are never started, and drives it with simulated workers
/// ([`simulated_worker`]) on this runtime. Prints the requests the master answered per
/// second in the measured window, their latencies, the CPU each side used and the group
/// commits, then checks that the ledger, in memory and as reloaded from SQLite, holds
/// exactly the rows whose reports were acknowledged.
pub async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    use std::sync::atomic::Ordering::Relaxed;

    /// Shuts the master's runtime down without blocking (dropping a runtime inside
    /// another one panics), also on early returns.
    struct MasterRuntime(Option<tokio::runtime::Runtime>);
    impl Drop for MasterRuntime {
        fn drop(&mut self) {
            if let Some(rt) = self.0.take() {
                rt.shutdown_background();
            }
        }
    }

    anyhow::ensure!(args.clients > 0, "--clients must be at least 1");
    anyhow::ensure!(
        args.server_threads > 0,
        "--server-threads must be at least 1"
    );
    let connections = match args.connections {
        0 => args.clients,
        n => n.min(args.clients),
    };
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("master.db");
    let token = "benchtoken";
    let master_rt = MasterRuntime(Some(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.server_threads)
            .thread_name(BENCH_MASTER_THREAD)
            .enable_all()
            .build()?,
    ));
    let master = master_rt.0.as_ref().expect("set above").handle().clone();
    let (core, addr) = master
        .spawn(start_bench_master(
            db.clone(),
            args.durability,
            args.clients,
            token,
        ))
        .await??;

    let channels = (0..connections)
        .map(|_| rpc::master_client(&addr, token, 64 << 20))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let flags = Arc::new(BenchFlags::default());
    // Node ids 1..=clients are the workers of the job.
    let mut workers: Vec<_> = (1..=args.clients)
        .map(|id| {
            let c = channels[(id - 1) as usize % channels.len()].clone();
            tokio::spawn(simulated_worker(
                c,
                id,
                args.heartbeats_per_report,
                flags.clone(),
            ))
        })
        .collect();
    wait_registered(&flags, &mut workers, args.clients).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let snapshot = || {
        (
            Instant::now(),
            flags.answered.load(Relaxed),
            core.metrics.requests_total(),
            core.writer_stats(),
            cpu_split(),
        )
    };
    let (t0, answered0, counted0, writes0, cpu0) = snapshot();
    flags.measuring.store(true, Relaxed);
    tokio::time::sleep(Duration::from_secs_f64(args.seconds)).await;
    flags.measuring.store(false, Relaxed);
    let (t1, answered1, counted1, writes1, cpu1) = snapshot();
    flags.stop.store(true, Relaxed);
    let mut lat = Vec::new();
    let mut acked = 0;
    for w in workers {
        let (l, rows) = w.await??;
        lat.extend(l);
        acked += rows;
    }

    lat.sort_unstable();
    print_bench_window(
        &args,
        connections,
        &BenchWindow {
            secs: (t1 - t0).as_secs_f64(),
            answered: answered1 - answered0,
            counted: counted1 - counted0,
            latencies_us: lat,
            cpu: cpu0
                .zip(cpu1)
                .map(|((m0, c0), (m1, c1))| (m1 - m0, c1 - c0)),
            transactions: writes1.transactions - writes0.transactions,
            submissions: writes1.submissions - writes0.submissions,
        },
    );

    // Every acknowledged report is in the ledger exactly once, in memory and on disk.
    let ledger = core.job.lock().tasks().ledger().summary(0);
    let on_disk: u64 = master
        .spawn(async move {
            let snap = crate::store::MasterDb::open(&db, false)
                .await?
                .load()
                .await?;
            Ok::<_, anyhow::Error>(snap.ranges.iter().map(|r| r.rows()).sum())
        })
        .await??;
    println!(
        "  ledger: rows acknowledged {acked}, reported {} (duplicated {}), in SQLite {on_disk}",
        ledger.consumed, ledger.duplicated
    );
    drop(master_rt);
    anyhow::ensure!(
        ledger.consumed == acked && ledger.duplicated == 0 && on_disk == acked,
        "the ledger is not exact"
    );
    Ok(())
}

/// Waits until every simulated worker registered (at most 30 s); an error when one
/// stopped first.
async fn wait_registered(
    flags: &BenchFlags,
    workers: &mut [tokio::task::JoinHandle<ClientResult>],
    clients: u32,
) -> anyhow::Result<()> {
    let setup = Instant::now();
    while flags.registered.load(std::sync::atomic::Ordering::Relaxed) < clients {
        anyhow::ensure!(
            setup.elapsed() < Duration::from_secs(30),
            "the clients did not register within 30 s"
        );
        if let Some(w) = workers.iter_mut().find(|w| w.is_finished()) {
            w.await??;
            anyhow::bail!("a client stopped before the measurement");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// A simulated worker's latencies (us) and the rows it saw acknowledged.
type ClientResult = anyhow::Result<(Vec<u32>, u64)>;

/// What the master bench measured over its window.
struct BenchWindow {
    secs: f64,
    /// Requests the clients saw answered.
    answered: u64,
    /// Requests the master counted.
    counted: u64,
    /// Sorted.
    latencies_us: Vec<u32>,
    /// CPU seconds of the master and of the clients, where the OS says.
    cpu: Option<(f64, f64)>,
    transactions: u64,
    /// Requests that changed state.
    submissions: u64,
}

fn print_bench_window(args: &BenchArgs, connections: u32, w: &BenchWindow) {
    let lat = &w.latencies_us;
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    let (secs, answered) = (w.secs, w.answered);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "master bench: {} clients over {} HTTP/2 connection(s); master runtime {} thread(s); {cpus} CPU(s); durability {:?}",
        args.clients, connections, args.server_threads, args.durability,
    );
    println!(
        "  {answered} requests answered in {secs:.2} s = {:.0} req/s (the master counted {}); latency p50 {} us, p99 {} us, p99.9 {} us, max {} us",
        answered as f64 / secs,
        w.counted,
        pct(0.5),
        pct(0.99),
        pct(0.999),
        lat.last().copied().unwrap_or(0),
    );
    if let Some((master, clients)) = w.cpu {
        let per = |cpu: f64| cpu * 1e6 / answered.max(1) as f64;
        println!(
            "  CPU: master {master:.2} s ({:.0} us/request), clients {clients:.2} s ({:.0} us/request); {:.0}% of {cpus} CPU(s) busy",
            per(master),
            per(clients),
            100.0 * (master + clients) / (secs * cpus as f64),
        );
    }
    let (txs, subs) = (w.transactions, w.submissions);
    println!(
        "  SQLite: {txs} transactions for {subs} requests that changed state ({:.1} per transaction)",
        subs as f64 / txs.max(1) as f64
    );
}

/// The distributed-training subcommands, flattened into the `elastrec` command line.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ClusterCommand {
    /// Run a distributed job: job master + parameter servers + workers as local processes.
    Run(RunArgs),
    /// Show a job: phase, shards, samples/s, nodes with their last heartbeat.
    Status(StatusArgs),
    /// Add or remove workers of a running job.
    Scale(ScaleArgs),
    /// Pause a running job (now or at a number of samples): workers finish their shards
    /// and wait; nodes stay up, checkpoints and recoveries go on.
    Pause(PauseArgs),
    /// Lift a pause.
    Unpause(UnpauseArgs),
    /// Take a checkpoint of a running job now.
    Checkpoint(CheckpointArgs),
    /// End a job's training (an online job runs until stopped): checkpoint, then stop.
    Stop(StopArgs),
    /// Load-test the master's task and heartbeat service (requests/s, p99 latency).
    BenchMaster(BenchArgs),
}

/// Runs a [`ClusterCommand`] on a fresh multi-threaded runtime.
pub fn dispatch(cmd: ClusterCommand) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        match cmd {
            ClusterCommand::Run(a) if a.dry_run => {
                crate::backend::kubernetes::dry_run::run(a.job.as_deref(), a.backend).await
            }
            ClusterCommand::Run(a) => run(a).await.map(|_| ()),
            ClusterCommand::Status(a) => status(a).await,
            ClusterCommand::Scale(a) => scale(a).await,
            ClusterCommand::Pause(a) => pause(a).await,
            ClusterCommand::Unpause(a) => unpause(a).await,
            ClusterCommand::Checkpoint(a) => checkpoint(a).await,
            ClusterCommand::Stop(a) => stop(a).await,
            ClusterCommand::BenchMaster(a) => bench(a).await,
        }
    })
}
