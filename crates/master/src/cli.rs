//! Library side of the `run`, `status`, `scale` and `bench-master` commands (the `elastrec`
//! binary only parses arguments and calls these).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use elastrec_proto::master::{
    get_task_response::Reply, GetTaskRequest, HeartbeatRequest, RegisterRequest,
    ReportProgressRequest, Role as PbRole, ScaleRequest, StatusRequest,
};
use elastrec_worker::rpc::{self, Master};

use crate::node::{resume_job, start_job, JobDir, JobResult};

/// `elastrec run`: start a distributed job (master + PS + workers as local processes).
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The job file (TOML) with a `[cluster]` section.
    #[arg(required_unless_present = "resume")]
    pub job: Option<PathBuf>,
    /// Restart the master of the job in this directory (after the master died).
    #[arg(long, value_name = "JOB_DIR", conflicts_with = "job")]
    pub resume: Option<PathBuf>,
    /// Where role processes run; only `local` (processes on this machine) for now.
    #[arg(long, default_value = "local")]
    pub backend: String,
    /// Start the job from a checkpoint of another job (its model and data position): a
    /// checkpoint directory or s3://bucket/prefix. The number of parameter servers may
    /// differ; rows are re-routed by the stable hash.
    #[arg(long, value_name = "LOCATION", conflicts_with = "resume")]
    pub from_checkpoint: Option<String>,
    /// With --from-checkpoint: this checkpoint id instead of the newest intact one.
    #[arg(long, requires = "from_checkpoint")]
    pub checkpoint_id: Option<u64>,
}

/// Runs (or resumes) a job to its end.
pub async fn run(args: RunArgs) -> anyhow::Result<JobResult> {
    anyhow::ensure!(
        args.backend == "local",
        "backend `{}` is not available yet; use `local`",
        args.backend
    );
    let exe = std::env::current_exe().context("locating the elastrec binary")?;
    match (args.resume, args.job) {
        (Some(dir), _) => resume_job(&dir, exe).await,
        (None, Some(job)) => {
            let from = args
                .from_checkpoint
                .map(|location| crate::node::FromCheckpoint {
                    location,
                    id: args.checkpoint_id,
                });
            start_job(&job, exe, from).await
        }
        (None, None) => anyhow::bail!("give a job file or --resume JOB_DIR"),
    }
}

fn connect(dir: &std::path::Path) -> anyhow::Result<Master> {
    let dir = JobDir(dir.to_path_buf());
    let addr = std::fs::read_to_string(dir.addr())
        .with_context(|| format!("{} holds no running job (no master.addr)", dir.0.display()))?;
    let token = std::fs::read_to_string(dir.token())?;
    rpc::master_client(addr.trim(), token.trim(), 64 << 20)
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
                println!("master is not running; result of the job:\n{text}");
                return Ok(());
            }
            let store = crate::store::Store::open_read_only(&dir.db()).await?;
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
        let nodes: Vec<serde_json::Value> = s
            .nodes
            .iter()
            .map(|n| {
                serde_json::json!({
                    "id": n.node_id, "role": if n.role == PbRole::Ps as i32 { "ps" } else { "worker" },
                    "state": n.state, "pid": n.pid, "addr": n.addr,
                    "last_heartbeat_ms_ago": n.last_heartbeat_ms_ago, "samples": n.samples,
                    "restarts": n.restarts, "task": n.task_id,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({
                "job": s.job_id, "phase": s.phase, "epoch": s.epoch, "epochs": s.epochs,
                "shards": {"todo": s.shards_todo, "doing": s.shards_doing, "done": s.shards_done},
                "samples_done": s.samples_done, "samples_total": s.samples_total,
                "samples_per_sec": s.samples_per_sec, "target_workers": s.target_workers,
                "nodes": nodes,
                "checkpoint": s.checkpoint.as_ref().map(|c| serde_json::json!({
                    "count": c.count, "last_id": c.last_id, "last_age_s": c.last_age_s,
                    "interval_s": c.interval_s, "pls": c.pls, "recovery": c.recovery,
                    "stall_ms": c.stall_ms, "memcpy_ms": c.memcpy_ms,
                    "recoveries": c.recoveries,
                })),
            })
        );
        return Ok(());
    }
    println!("job {} ({})", s.job_id, s.phase);
    println!(
        "epoch {}/{}  samples {}/{}  {:.0} samples/s  shards todo {} doing {} done {}  target workers {}",
        s.epoch + 1,
        s.epochs,
        s.samples_done,
        s.samples_total,
        s.samples_per_sec,
        s.shards_todo,
        s.shards_doing,
        s.shards_done,
        s.target_workers
    );
    println!(
        "{:>5}  {:<6}  {:<8}  {:>7}  {:<21}  {:>12}  {:>9}  {:>8}  {:>6}",
        "node", "role", "state", "pid", "addr", "heartbeat", "samples", "restarts", "task"
    );
    for n in &s.nodes {
        println!(
            "{:>5}  {:<6}  {:<8}  {:>7}  {:<21}  {:>9} ms  {:>9}  {:>8}  {:>6}",
            n.node_id,
            if n.role == PbRole::Ps as i32 {
                "ps"
            } else {
                "worker"
            },
            n.state,
            n.pid,
            n.addr,
            n.last_heartbeat_ms_ago,
            n.samples,
            n.restarts,
            n.task_id
        );
    }
    if let Some(c) = &s.checkpoint {
        println!(
            "checkpoints {} (last id {}, {:.1} s ago, every {:.1} s; stall {:.2} ms vs memory copy {:.2} ms)  PS recoveries {}  PLS {:.4}",
            c.count, c.last_id, c.last_age_s, c.interval_s, c.stall_ms, c.memcpy_ms, c.recoveries, c.pls
        );
        println!("recovery policy: {}", c.recovery);
    }
    Ok(())
}

/// `elastrec scale`: change the number of workers of a running job.
#[derive(Debug, Clone, clap::Args)]
pub struct ScaleArgs {
    /// The job directory (the job's `output.dir`).
    pub job_dir: PathBuf,
    /// Desired number of workers.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub workers: u32,
}

/// Asks the master to scale the workers.
pub async fn scale(args: ScaleArgs) -> anyhow::Result<()> {
    let mut client = connect(&args.job_dir)?;
    let r = client
        .scale(ScaleRequest {
            version: rpc::version(),
            workers: args.workers,
        })
        .await
        .map_err(|s| anyhow::anyhow!("scale refused: {}", s.message()))?
        .into_inner();
    println!("workers: {} -> {}", r.previous, r.target);
    Ok(())
}

/// `elastrec bench-master`: load test of the master's task and heartbeat service.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Simulated workers (concurrent clients).
    #[arg(long, default_value_t = 64)]
    pub clients: u32,
    /// Seconds to measure.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Heartbeats per progress report.
    #[arg(long, default_value_t = 1)]
    pub heartbeats_per_report: u32,
}

/// Starts an in-process master (real gRPC on loopback, real SQLite, group commit) with
/// processes that are never started, and drives it with many simulated workers that
/// register, heartbeat, get tasks and report progress. Prints requests/s and latencies.
pub async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    use crate::backend::ClusterBackend;
    use crate::job::{Job, Node, Policy};
    use crate::service::{LiveCtx, MasterCore, MasterService};
    use crate::store::{Store, Writer};
    use crate::tasks::{ShardSpec, TaskQueue};

    struct NoProcesses;
    impl ClusterBackend for NoProcesses {
        fn start(&self, _: &Node) -> anyhow::Result<u32> {
            Ok(0)
        }
        fn stop(&self, _: &Node) {}
        fn exited(&self) -> Vec<u32> {
            Vec::new()
        }
    }

    let dir = tempfile::tempdir()?;
    let store = Store::open(&dir.path().join("master.db"), true).await?;
    let rows = 1_000_000_000u64;
    let queue = TaskQueue::new(
        ShardSpec {
            rows_per_shard: 64 * 256,
            min_rows: 256,
            epochs: 1,
            seed: 1,
            shuffle: true,
        },
        vec![rows],
    );
    let mut cx = LiveCtx::now();
    let job = Job::start(
        Policy {
            num_ps: 0,
            dead_after_ms: 60_000,
            max_worker_restarts: 0,
            straggler_ratio: 0.5,
            evaluate: false,
            recover_ps: false,
        },
        queue,
        args.clients,
        &mut cx,
    );
    store.apply(&cx.take_changes()).await?;
    let core = Arc::new(MasterCore::new(
        job,
        Writer::spawn(store),
        Arc::new(NoProcesses),
        String::new(),
        vec!["bench".into()],
        1000,
        "bench".into(),
    ));
    let token = "benchtoken";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let svc = elastrec_proto::master::master_server::MasterServer::new(MasterService(core.clone()));
    tokio::spawn(
        tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(tonic::service::interceptor::InterceptedService::new(
                svc,
                rpc::ServerAuth::new(token),
            ))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds + 0.5);
    let warm = Instant::now() + Duration::from_millis(500);
    let mut handles = Vec::new();
    // Node ids 1..=clients are the workers created above.
    for id in 1..=args.clients {
        let mut c = rpc::master_client(&addr, token, 64 << 20)?;
        let hb = args.heartbeats_per_report;
        handles.push(tokio::spawn(async move {
            let mut lat: Vec<u32> = Vec::new();
            c.register(RegisterRequest {
                version: rpc::version(),
                role: PbRole::Worker as i32,
                node_id: id,
                addr: String::new(),
                pid: 0,
            })
            .await?;
            let mut task: Option<(u64, u64, u64)> = None;
            while Instant::now() < deadline {
                let t0 = Instant::now();
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
                            task = Some((t.task_id, t.offset, t.end_row - t.start_row));
                        }
                    }
                    Some((tid, off, len)) => {
                        let off = (off + 256).min(len);
                        c.report_progress(ReportProgressRequest {
                            version: rpc::version(),
                            node_id: id,
                            task_id: tid,
                            offset: off,
                        })
                        .await?;
                        task = (off < len).then_some((tid, off, len));
                    }
                }
                if t0 > warm {
                    lat.push(t0.elapsed().as_micros() as u32);
                }
                for _ in 0..hb {
                    let t0 = Instant::now();
                    c.heartbeat(HeartbeatRequest {
                        version: rpc::version(),
                        node_id: id,
                        task_id: 0,
                        offset: 0,
                        samples: 0,
                        step: 0,
                    })
                    .await?;
                    if t0 > warm {
                        lat.push(t0.elapsed().as_micros() as u32);
                    }
                }
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await??);
    }
    all.sort_unstable();
    let secs = args.seconds;
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    let ledger = core.job.lock().tasks().ledger().summary(0);
    println!(
        "master bench: {} clients, {} requests in {:.1} s = {:.0} req/s; latency p50 {} us, p99 {} us, max {} us; rows reported {} (duplicated {})",
        args.clients,
        all.len(),
        secs,
        all.len() as f64 / secs,
        pct(0.5),
        pct(0.99),
        all.last().copied().unwrap_or(0),
        ledger.consumed,
        ledger.duplicated
    );
    Ok(())
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
    /// Load-test the master's task and heartbeat service (requests/s, p99 latency).
    BenchMaster(BenchArgs),
    /// (internal) A parameter-server process, started by the master.
    #[command(hide = true)]
    Ps(elastrec_ps::PsArgs),
    /// (internal) A worker process, started by the master.
    #[command(hide = true)]
    Worker(elastrec_worker::remote::WorkerArgs),
}

/// Runs a [`ClusterCommand`] on a fresh multi-threaded runtime.
pub fn dispatch(cmd: ClusterCommand) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        match cmd {
            ClusterCommand::Run(a) => run(a).await.map(|_| ()),
            ClusterCommand::Status(a) => status(a).await,
            ClusterCommand::Scale(a) => scale(a).await,
            ClusterCommand::BenchMaster(a) => bench(a).await,
            ClusterCommand::Ps(a) => elastrec_ps::run_ps(a).await,
            ClusterCommand::Worker(a) => elastrec_worker::remote::run_worker(a).await,
        }
    })
}
