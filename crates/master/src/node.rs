//! The master process (`elastrec run`): validates the job, opens (or reopens) its state
//! database, serves gRPC and `/metrics`, launches nodes through the backend, runs the
//! control loop (exits, heartbeat timeouts, progress display) and writes the result.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use elastrec_job::config::JobConfig;
use elastrec_job::distributed::SyncMode;
use elastrec_proto::master::master_server::MasterServer;
use elastrec_rpc::tls::TlsMaterial;
use elastrec_rpc::{role_token, Caller, ServerAuth};
use rand::Rng;
use serde::{Deserialize, Serialize};
use tonic::service::interceptor::InterceptedService;

use crate::backend::{BackendKind, ClusterBackend};
use crate::checkpoint::{CheckpointReport, CheckpointStats, Coordinator, Fingerprint};
use crate::job::{Context as _, Job, NodeState, Phase, Policy, Role};
use crate::launch::LaunchTemplate;
use crate::ledger::LedgerSummary;
use crate::service::{now_ms, LiveCtx, MasterCore, MasterService};
use crate::store::{Store, Writer};
use crate::tasks::{ShardSpec, TaskQueue};

/// Files of a job directory.
pub struct JobDir(pub PathBuf);

impl JobDir {
    /// The state database.
    pub fn db(&self) -> PathBuf {
        self.0.join("master.db")
    }
    /// The per-job token (mode 0600).
    pub fn token(&self) -> PathBuf {
        self.0.join("token")
    }
    /// The master's gRPC address.
    pub fn addr(&self) -> PathBuf {
        self.0.join("master.addr")
    }
    /// The `/metrics` address.
    pub fn metrics_addr(&self) -> PathBuf {
        self.0.join("metrics.addr")
    }
    /// The job's result.
    pub fn result(&self) -> PathBuf {
        self.0.join("result.json")
    }
    /// Node logs.
    pub fn logs(&self) -> PathBuf {
        self.0.join("logs")
    }
    /// The job's TLS material (when its channels use TLS).
    pub fn tls(&self) -> PathBuf {
        self.0.join("tls")
    }
}

/// A training file and its row count, as recorded at job start.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileRows {
    /// Absolute path.
    pub path: String,
    /// Rows.
    pub rows: u64,
}

/// The job's result JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobResult {
    /// Job id.
    pub job_id: String,
    /// `finished` or `failed`.
    pub status: String,
    /// Failure message.
    pub error: Option<String>,
    /// Ledger verdict per epoch.
    pub epochs: Vec<EpochLedger>,
    /// Ledger verdict over the job.
    pub ledger: LedgerSummary,
    /// Final evaluation.
    pub eval: Option<crate::job::EvalResult>,
    /// Samples trained per second of wall time since the job started.
    pub samples_per_s: f64,
    /// Wall time from job start (including master downtime), seconds.
    pub wall_s: f64,
    /// Worker processes launched over the job.
    pub workers_launched: u32,
    /// Workers declared dead.
    pub workers_dead: u32,
    /// Parameter-server processes launched over the job (a recovery or a re-sharding
    /// launches more).
    #[serde(default)]
    pub ps_launched: u32,
    /// Checkpoints, recoveries and the portion of lost samples (when enabled).
    pub checkpoint: Option<CheckpointReport>,
    /// The autoscaler: bounds, last plan and every scaling action (when enabled).
    #[serde(default)]
    pub autoscale: Option<serde_json::Value>,
    /// What the job used (this master's lifetime).
    #[serde(default)]
    pub resources: Resources,
    /// Changes of the PS count while the job trained.
    #[serde(default)]
    pub reshards: Vec<crate::reshard::ReshardRecord>,
    /// An online job's stream: lag per partition, SLO violations, accumulated lag,
    /// downtime, worker-hours and every scaling decision (KALE Table 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub online: Option<serde_json::Value>,
}

/// Resources a job used: node-seconds (the time each node process was live, summed; on
/// the local backend every node is allotted one core, so these are the allotted
/// core-seconds) and the CPU time the processes reported.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Resources {
    /// Worker processes' live seconds, summed.
    pub worker_node_s: f64,
    /// Parameter servers' live seconds, summed.
    pub ps_node_s: f64,
    /// CPU seconds (user + system) of every node process, from their last heartbeats.
    pub cpu_s: f64,
}

/// The `online` part of an online job's result.
fn online_result(core: &MasterCore, worker_node_s: f64) -> Option<serde_json::Value> {
    let stats = core.stream_stats.lock().clone()?;
    let decisions = core.online_scaling.lock().clone();
    let raw_changes = decisions
        .windows(2)
        .filter(|w| w[0].decision.raw != w[1].decision.raw)
        .count();
    let changes = decisions
        .iter()
        .filter(|d| d.decision.target != d.decision.workers)
        .count();
    // The figures as the job ends, after the last periodic record.
    let progressive = core.progressive.lock().as_mut().map(|p| {
        p.record(stats.observed_s);
        p.summary()
    });
    Some(serde_json::json!({
        "stream": stats,
        "progressive": progressive,
        "worker_hours": worker_node_s / 3600.0,
        "raw_plan_changes": raw_changes,
        "scaling_changes": changes,
        "decisions": decisions,
    }))
}

/// What the autoscaling loop of a job starts with.
pub struct AutoscaleStart {
    brain: Box<dyn crate::brain_link::BrainLink>,
    brain_job_id: String,
    samples_total: u64,
    registered: bool,
}

/// Connects the job's brain and registers the job with it. Returns the loop's start and,
/// when `warm_start` is set and the brain answered, the start-up worker count. A brain that
/// cannot be reached does not stop the job: it starts with `cluster.workers` and the loop
/// registers it later.
async fn connect_brain(
    cfg: &JobConfig,
    dir: &JobDir,
    brain_job_id: String,
    samples_total: u64,
    warm: bool,
) -> anyhow::Result<(AutoscaleStart, Option<u32>)> {
    let brain = crate::brain_link::connect(
        &cfg.autoscale.brain,
        &cfg.autoscale.brain_db,
        &dir.0,
        crate::autoscale_loop::brain_config(cfg),
    )
    .await?;
    let (registered, workers) =
        match crate::autoscale_loop::warm_start(&*brain, cfg, &brain_job_id, samples_total).await {
            Ok(plan) => {
                let w = plan.allocation.map(|a| a.workers);
                if warm {
                    eprintln!(
                        "autoscale: warm start from the {}: {} workers ({})",
                        brain.describe(),
                        w.unwrap_or(cfg.cluster.workers),
                        plan.reasons.join("; ")
                    );
                }
                (true, w.filter(|_| warm))
            }
            Err(e) => {
                eprintln!(
                    "autoscale: {e}; starting with cluster.workers = {} and registering later",
                    cfg.cluster.workers
                );
                (false, None)
            }
        };
    Ok((
        AutoscaleStart {
            brain,
            brain_job_id,
            samples_total,
            registered,
        },
        workers,
    ))
}

/// One epoch's ledger line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpochLedger {
    /// Epoch.
    pub epoch: u32,
    /// Verdict.
    #[serde(flatten)]
    pub summary: LedgerSummary,
}

fn shard_spec(cfg: &JobConfig) -> ShardSpec {
    let b = cfg.train.batch_size as u64;
    ShardSpec {
        rows_per_shard: b * cfg.cluster.batches_per_shard as u64,
        min_rows: b,
        epochs: cfg.train.epochs,
        seed: cfg.cluster.seed,
        // A following job trains its partitions in the order they landed.
        shuffle: cfg.cluster.shuffle && !cfg.data.follow,
    }
}

fn policy(cfg: &JobConfig) -> Policy {
    Policy {
        num_ps: cfg.cluster.ps,
        dead_after_ms: cfg.cluster.dead_after_ms,
        max_worker_restarts: cfg.cluster.max_worker_restarts,
        straggler_ratio: cfg.cluster.straggler_ratio,
        evaluate: !cfg.data.eval.is_empty(),
        recover_ps: cfg.checkpoint.enabled,
        warmup_samples: match cfg.cluster.mode {
            SyncMode::Async => u64::from(cfg.cluster.warmup_steps) * cfg.train.batch_size as u64,
            SyncMode::Sync => 0,
        },
    }
}

/// The job's backend of `kind` and the template it starts nodes from: nodes start `exe`
/// and reach the master at `addr`. With autoscaling, nodes take the allotment of
/// `[autoscale]` (see `autoscale_loop::size_nodes`); otherwise the role's `[resources]`
/// size it.
#[allow(clippy::too_many_arguments)]
fn open_backend(
    kind: BackendKind,
    exe: PathBuf,
    job_id: &str,
    job_uid: &str,
    addr: &str,
    token: &str,
    tls: Option<TlsMaterial>,
    dir: &JobDir,
    cfg: &JobConfig,
) -> anyhow::Result<(Arc<dyn ClusterBackend>, Arc<LaunchTemplate>)> {
    let mut template = LaunchTemplate::new(
        exe,
        job_id,
        job_uid,
        addr,
        token,
        dir.logs(),
        cfg.resources.clone(),
    );
    template.tls = tls;
    crate::autoscale_loop::size_nodes(&template, cfg);
    let template = Arc::new(template);
    let enforce = cfg.autoscale.enabled || cfg.engine.local.enforce_resources;
    Ok((
        crate::backend::open(kind, template.clone(), &cfg.engine, enforce)?,
        template,
    ))
}

/// The engine killed node `id` for exceeding its memory: its role's next nodes (the
/// relaunch included) ask for more, up to the role's `memory_gb_max`.
fn out_of_memory(core: &MasterCore, id: u32, reason: &str) {
    let Some(role) = core.job.lock().node(id).map(|n| n.role) else {
        return;
    };
    let Some(launch) = core.launch.get() else {
        return;
    };
    let (before, after) = launch.grow_memory(role);
    let role = crate::launch::role_name(role);
    if after > before {
        eprintln!(
            "master: {role} node {id} was killed for its memory ({reason}); {role}s start with {:.2} GiB instead of {:.2} GiB from now on",
            after as f64 / 1024.0,
            before as f64 / 1024.0
        );
    } else {
        eprintln!(
            "master: {role} node {id} was killed for its memory ({reason}) at its role's maximum of {:.2} GiB; raise resources.{role}.memory_gb_max (autoscale.{role}_mem_gb_max in an autoscaled job)",
            before as f64 / 1024.0
        );
    }
}

/// The job's TLS material when its channels use TLS (`[engine.tls]`; by default on for
/// every backend but `local`): the user's files or a CA and certificate issued now. It is
/// saved in the job directory (for `--resume` and the admin commands) and installed in
/// this process before any channel or server exists.
fn job_tls(
    cfg: &JobConfig,
    kind: BackendKind,
    job_file: &Path,
    dir: &JobDir,
) -> anyhow::Result<Option<TlsMaterial>> {
    if !cfg.engine.tls.enabled(kind == BackendKind::Local) {
        return Ok(None);
    }
    let base = job_file.parent().unwrap_or(Path::new("."));
    let material = match TlsMaterial::from_config(&cfg.engine.tls, base)? {
        Some(m) => m,
        None => TlsMaterial::issue(&dir.0.display().to_string())?,
    };
    material.save(&dir.tls())?;
    elastrec_rpc::tls::install(material.clone())?;
    Ok(Some(material))
}

/// The address nodes reach the master at (see [`elastrec_job::resources::master_advertise`]).
fn advertised(cfg: &JobConfig, bound: SocketAddr) -> anyhow::Result<String> {
    elastrec_job::resources::master_advertise(&cfg.engine, bound).map_err(anyhow::Error::msg)
}

/// The address the master binds: `cluster.bind`.
fn bind_ip(cfg: &JobConfig) -> anyhow::Result<std::net::IpAddr> {
    cfg.cluster
        .bind
        .parse()
        .with_context(|| format!("cluster.bind: `{}` is not an IP address", cfg.cluster.bind))
}

/// The backend a resumed job runs on: the one it started with (`--backend` may only
/// repeat it; a job's nodes cannot move engines while they run).
fn resumed_backend(
    stored: Option<&String>,
    asked: Option<BackendKind>,
) -> anyhow::Result<BackendKind> {
    let stored = match stored.map(String::as_str) {
        None | Some("local") => BackendKind::Local,
        Some("slurm") => BackendKind::Slurm,
        Some("kubernetes") => BackendKind::Kubernetes,
        Some(other) => bail!("master.db names an unknown backend `{other}`"),
    };
    match asked {
        Some(a) if a != stored => bail!(
            "this job runs on the {} backend; resume it with --backend {} (or without --backend)",
            stored.name(),
            stored.name()
        ),
        _ => Ok(stored),
    }
}

/// Where a new job's model and data position come from (`--from-checkpoint`).
#[derive(Debug, Clone)]
pub struct FromCheckpoint {
    /// Checkpoint storage location (directory or s3://...).
    pub location: String,
    /// A specific checkpoint id (default: the newest intact one).
    pub id: Option<u64>,
}

/// Shared-memory namespace of a job's PS images: its name and unique id (never token
/// material: names under /dev/shm are visible to every user).
fn shm_namespace(job_id: &str, job_uid: &str) -> String {
    let name: String = job_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    format!("{name}-{job_uid}")
}

/// `n` random lowercase hex digits.
fn random_hex(n: usize) -> String {
    let mut rng = rand::rng();
    (0..n)
        .map(|_| format!("{:x}", rng.random_range(0..16u8)))
        .collect()
}

fn file_pairs(files: &[FileRows]) -> Vec<(String, u64)> {
    files.iter().map(|f| (f.path.clone(), f.rows)).collect()
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

/// Validates a job file completely (fields, ranges, data paths) without starting anything.
pub fn validate_job(path: &Path) -> anyhow::Result<JobConfig> {
    let cfg = JobConfig::load(path)?;
    cfg.check_data(path)?;
    if cfg.checkpoint.enabled {
        crate::checkpoint::open_store(&cfg.checkpoint.location)
            .with_context(|| format!("{}: checkpoint.location", path.display()))?;
    }
    Ok(cfg)
}

/// Starts a new job from its file (optionally from another job's checkpoint) and runs it
/// to the end.
pub async fn start_job(
    path: &Path,
    exe: PathBuf,
    from: Option<FromCheckpoint>,
    pause_at: Option<u64>,
    kind: BackendKind,
) -> anyhow::Result<JobResult> {
    let mut cfg = validate_job(path)?;
    elastrec_job::prepare::ensure_data(&cfg, false)?;
    // Datasets become files once, here: the job file stored and shipped to every process
    // is the resolved one. Listing blocks (and may wait for partitions): off the runtime.
    let (cfg, resolved) = tokio::task::spawn_blocking(move || {
        let r = elastrec_job::datasets::resolve_datasets(&mut cfg);
        (cfg, r)
    })
    .await?;
    for line in elastrec_job::datasets::describe(&resolved?) {
        eprintln!("master: {line}");
    }
    let dir = JobDir(cfg.output.dir.clone());
    if dir.db().exists() {
        bail!(
            "{} already holds a job; resume it with `elastrec run --resume {}` or set another output.dir",
            dir.0.display(),
            dir.0.display()
        );
    }
    // Before anything is created: an empty training set is an error naming the files, and
    // an online job's brokers and topics must answer.
    let job_id = dir
        .0
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "job".into());
    let stream_starts = match &cfg.stream {
        Some(s) => {
            let (s, group) = (s.clone(), s.group_for(&job_id));
            Some(
                tokio::task::spawn_blocking(move || crate::stream_watch::resolve(&s, &group))
                    .await??,
            )
        }
        None => None,
    };
    let files: Vec<FileRows> = match &stream_starts {
        // A partition's "rows" are unknown (it grows); 0 keeps checkpoints of the same
        // topics compatible whatever offsets the jobs started at.
        Some((partitions, _)) => partitions
            .iter()
            .map(|p| FileRows {
                path: p.to_string(),
                rows: 0,
            })
            .collect(),
        None => elastrec_job::prepare::count_train_rows(&cfg)?
            .into_iter()
            .map(|(f, rows)| FileRows {
                path: f.to_string_lossy().into_owned(),
                rows,
            })
            .collect(),
    };
    let stream_starts = stream_starts.map(|(_, starts)| starts);
    std::fs::create_dir_all(&dir.0).with_context(|| format!("creating {}", dir.0.display()))?;
    // A job started from a checkpoint checks it before anything is created.
    let foreign = match &from {
        Some(f) => Some(
            crate::checkpoint::load_foreign(
                &f.location,
                f.id,
                &Fingerprint::of(&cfg, &file_pairs(&files)),
            )
            .await?,
        ),
        None => None,
    };
    let token = random_hex(32);
    // Tells this job's processes and shared memory from another job's of the same name.
    let job_uid = random_hex(16);
    write_private(&dir.token(), &token)?;
    let tls = job_tls(&cfg, kind, path, &dir)?;
    let ip = bind_ip(&cfg)?;
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, cfg.cluster.master_port))
        .await
        .context("binding the master port")?;
    let bound = listener.local_addr()?;
    let addr = advertised(&cfg, bound)?;
    std::fs::write(dir.addr(), &addr)?;
    // Before the state database: a backend that refuses the job (no permission on the
    // cluster) leaves no half-started job behind; the same file runs again once fixed.
    let (backend, launch) =
        open_backend(kind, exe, &job_id, &job_uid, &addr, &token, tls, &dir, &cfg)?;
    let master_token = role_token(&token, Caller::Master);
    let job_toml = toml::to_string(&shipped(&cfg))?;
    let store = Store::open(&dir.db(), true).await?;
    store.set_meta("job_toml", job_toml.clone()).await?;
    store
        .set_meta("files", serde_json::to_string(&files)?)
        .await?;
    store.set_meta("job_id", job_id.clone()).await?;
    store.set_meta("job_uid", job_uid.clone()).await?;
    if let Some(starts) = &stream_starts {
        store
            .set_meta("stream_starts", serde_json::to_string(starts)?)
            .await?;
    }
    store.set_meta("master_addr", addr.clone()).await?;
    store.set_meta("master_bind", bound.to_string()).await?;
    store.set_meta("backend", kind.name().to_string()).await?;
    std::fs::write(dir.0.join("started_ms"), now_ms().to_string())?;
    let shm_ns = shm_namespace(&job_id, &job_uid);
    let fingerprint = Fingerprint::of(&cfg, &file_pairs(&files));
    let total_samples = files.iter().map(|f| f.rows).sum::<u64>() * cfg.train.epochs as u64;
    let coordinator = if cfg.checkpoint.enabled {
        Some(Arc::new(Coordinator::new(
            &cfg,
            fingerprint.clone(),
            total_samples,
            &master_token,
            shm_ns.clone(),
            None,
        )?))
    } else {
        None
    };
    let mut queue = match &stream_starts {
        Some(starts) => TaskQueue::new_stream(shard_spec(&cfg), starts.clone()),
        None => TaskQueue::new(shard_spec(&cfg), files.iter().map(|f| f.rows).collect()),
    };
    if cfg.data.follow {
        queue.follow();
    }
    let mut initial_plan = None;
    let mut closed = Vec::new();
    if let Some(from) = &from {
        let (m, plan, pos) = foreign.clone().expect("loaded with --from-checkpoint");
        eprintln!(
            "job {job_id}: starting from checkpoint {} of {} ({} PS, {} samples trained)",
            m.id,
            elastrec_checkpoint::store::redact_location(&from.location),
            m.num_ps,
            m.samples
        );
        queue = TaskQueue::from_position(
            shard_spec(&cfg),
            files.iter().map(|f| f.rows).collect(),
            &pos,
        );
        if cfg.data.follow {
            queue.follow();
        }
        store
            .set_meta(
                "ledger_adjust",
                serde_json::to_string(&pos.ledger_adjustments())?,
            )
            .await?;
        closed = pos.epochs_closed.clone();
        initial_plan = Some(plan.clone());
        if let Some(c) = &coordinator {
            c.set_origin((m, plan, pos));
        }
    }
    let mut workers = cfg.cluster.workers;
    let autoscale = if cfg.autoscale.enabled {
        let (start, warm) = connect_brain(
            &cfg,
            &dir,
            format!("{job_id}-{job_uid}"),
            total_samples,
            cfg.autoscale.warm_start,
        )
        .await?;
        workers = warm.unwrap_or(workers);
        Some(start)
    } else {
        None
    };
    let mut cx = LiveCtx::now();
    let mut job = Job::start(policy(&cfg), queue, workers, &mut cx);
    if from.is_some() {
        job.set_epochs_closed(closed, &mut cx);
        let (tasks, _) = job.take_dirty_tasks();
        let spans = job.tasks().ledger().spans();
        cx.persist(crate::job::Change::ResetData(tasks, spans));
    }
    if pause_at.is_some() {
        job.set_pause(pause_at, &mut cx);
    }
    store.apply(&cx.take_changes()).await?;
    eprintln!(
        "job {job_id}: master on {addr}, {} PS, {} workers, {} rows x {} epochs, {} rows per shard; state in {}",
        cfg.cluster.ps,
        workers,
        files.iter().map(|f| f.rows).sum::<u64>(),
        cfg.train.epochs,
        job.tasks().spec().rows_per_shard,
        dir.db().display()
    );
    let core = Arc::new(MasterCore::new(
        job,
        Writer::spawn(store),
        backend,
        job_toml,
        files.into_iter().map(|f| f.path).collect(),
        cfg.cluster.heartbeat_ms as u32,
        job_id,
    ));
    core.set_restore_plan(initial_plan);
    let _ = core.launch.set(launch.clone());
    let _ = core.ps_access.set(crate::reshard::PsAccess {
        token: master_token.clone(),
        max_bytes: cfg.cluster.max_message_bytes,
    });
    if let Some(c) = coordinator {
        core.set_checkpoints(c);
    }
    core.effects(cx);
    serve(core, listener, token, &cfg, &dir, autoscale).await
}

/// Restarts the master of a job whose master died, from its database. Live nodes
/// re-register; training continues where the ledger says it stopped.
pub async fn resume_job(
    dir: &Path,
    exe: PathBuf,
    backend: Option<BackendKind>,
) -> anyhow::Result<JobResult> {
    let dir = JobDir(dir.to_path_buf());
    anyhow::ensure!(
        dir.db().exists(),
        "{} holds no job (no master.db)",
        dir.0.display()
    );
    let token = std::fs::read_to_string(dir.token())
        .with_context(|| format!("reading the job token {}", dir.token().display()))?
        .trim()
        .to_string();
    elastrec_rpc::check_token(&token)
        .with_context(|| format!("{} is corrupt", dir.token().display()))?;
    let store = Store::open(&dir.db(), false).await?;
    let snap = store.load().await?;
    let meta = |k: &str| {
        snap.meta
            .get(k)
            .cloned()
            .with_context(|| format!("master.db lacks `{k}`"))
    };
    let job_toml = meta("job_toml")?;
    let cfg = JobConfig::from_toml(&job_toml, &dir.db())?;
    let files: Vec<FileRows> = serde_json::from_str(&meta("files")?)?;
    let addr = meta("master_addr")?;
    let job_id = meta("job_id")?;
    let kind = resumed_backend(snap.meta.get("backend"), backend)?;
    let job_uid = match snap.meta.get("job_uid") {
        Some(u) => u.clone(),
        // A job started before job uids existed: its old nodes cannot be recognized
        // by uid (they are treated as gone); new ones get one.
        None => {
            let u = random_hex(16);
            store.set_meta("job_uid", u.clone()).await?;
            u
        }
    };
    let generated: u32 = meta("generated_epochs")?.parse()?;
    let mut queue = match snap.meta.get("stream_starts") {
        Some(starts) => TaskQueue::restore_stream(
            shard_spec(&cfg),
            serde_json::from_str(starts)?,
            snap.tasks,
            &snap.ranges,
        ),
        None => TaskQueue::restore(
            shard_spec(&cfg),
            files.iter().map(|f| f.rows).collect(),
            snap.tasks,
            &snap.ranges,
            generated,
        ),
    };
    if let Some(adj) = snap.meta.get("ledger_adjust") {
        queue.adjust_ledger(&serde_json::from_str::<Vec<(u32, u64, u64)>>(adj)?);
    }
    if cfg.data.follow {
        // Files stored just before the previous master stopped get their tasks.
        queue.follow();
    }
    let stats: Option<CheckpointStats> = snap
        .meta
        .get("checkpoint_stats")
        .map(|t| serde_json::from_str(t))
        .transpose()?;
    let mut cx = LiveCtx::now();
    let mut job = Job::restore(
        policy(&cfg),
        queue,
        snap.nodes,
        meta("target_workers")?.parse()?,
        meta("restarts_used")?.parse()?,
        serde_json::from_str(&meta("phase")?)?,
        serde_json::from_str(&meta("eval")?)?,
        serde_json::from_str(&meta("epochs_closed")?)?,
        &mut cx,
    );
    if let Some(p) = snap.meta.get("pause_at") {
        job.restore_pause(serde_json::from_str(p)?);
    }
    // The PS layout in force when the previous master stopped (after online re-sharding);
    // servers it had started for a layout it never committed are stopped.
    if let Some(l) = snap.meta.get("ps_layout") {
        let (version, num_ps): (u64, u32) = serde_json::from_str(l)?;
        job.set_layout(version, num_ps);
    }
    job.drop_uncommitted_servers(&mut cx);
    store.apply(&cx.take_changes()).await?;
    // The same address, so live nodes find the new master.
    let sock: SocketAddr = snap.meta.get("master_bind").unwrap_or(&addr).parse()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let listener = loop {
        match tokio::net::TcpListener::bind(sock).await {
            Ok(l) => break l,
            Err(e) if Instant::now() < deadline => {
                tracing::warn!(error = %e, "master address busy; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e).context("rebinding the master address"),
        }
    };
    let (todo, doing, done) = job.tasks().counts();
    let tls = TlsMaterial::load(&dir.tls())?;
    if let Some(m) = &tls {
        elastrec_rpc::tls::install(m.clone())?;
    }
    let (backend, launch) =
        open_backend(kind, exe, &job_id, &job_uid, &addr, &token, tls, &dir, &cfg)?;
    let master_token = role_token(&token, Caller::Master);
    // After a crash of the whole job (not only the master) the parameter servers are gone:
    // their state can only come back from a checkpoint, with the data position it holds.
    let ps_gone: Vec<u32> = job
        .nodes()
        .filter(|n| n.role == Role::Ps && n.state.is_live() && !backend.is_alive(n))
        .map(|n| n.index)
        .collect();
    let training = matches!(job.phase(), Phase::Training | Phase::Evaluating);
    if !ps_gone.is_empty() && training && !cfg.checkpoint.enabled {
        bail!(
            "parameter servers {ps_gone:?} of {} are gone and checkpoints are disabled; the model cannot be recovered",
            dir.0.display()
        );
    }
    eprintln!(
        "job {job_id}: master resumed on {addr}: shards todo {todo}, doing {doing}, done {done}; {}",
        if ps_gone.is_empty() || !training {
            "waiting for nodes to re-register".to_string()
        } else {
            format!("parameter servers {ps_gone:?} are gone: restoring the last checkpoint")
        }
    );
    let num_ps = job.policy().num_ps;
    let core = Arc::new(MasterCore::new(
        job,
        Writer::spawn(store),
        backend,
        job_toml,
        files.into_iter().map(|f| f.path).collect(),
        cfg.cluster.heartbeat_ms as u32,
        job_id.clone(),
    ));
    let _ = core.launch.set(launch.clone());
    let _ = core.ps_access.set(crate::reshard::PsAccess {
        token: master_token.clone(),
        max_bytes: cfg.cluster.max_message_bytes,
    });
    // The previous master may have died in the middle of a PS change: servers it froze
    // for the next layout go back to the one in force.
    crate::reshard::abort_uncommitted(&core).await;
    if cfg.checkpoint.enabled {
        let total_samples = files_rows_total(&core) * cfg.train.epochs as u64;
        let c = Arc::new(Coordinator::new(
            &cfg,
            Fingerprint::of(&cfg, &core_file_pairs(&core)),
            total_samples,
            &master_token,
            shm_namespace(&job_id, &job_uid),
            stats,
        )?);
        if num_ps != cfg.cluster.ps {
            c.layout_changed(num_ps);
        }
        core.set_checkpoints(c.clone());
        core.effects(cx);
        if !ps_gone.is_empty() && training {
            let failures = ps_gone
                .iter()
                .map(|&index| crate::job::PsFailure {
                    index,
                    node: 0,
                    reason: "gone after a restart of the whole job".into(),
                    samples: 0,
                })
                .collect();
            c.recover_full(&core, failures).await?;
        }
    } else {
        core.effects(cx);
    }
    // The autoscaler starts afresh: the profile of the previous master's allocation is in
    // the brain's database already, and its windows are re-measured here.
    let autoscale = if cfg.autoscale.enabled {
        let total = files_rows_total(&core) * cfg.train.epochs as u64;
        Some(
            connect_brain(&cfg, &dir, format!("{job_id}-{job_uid}"), total, false)
                .await?
                .0,
        )
    } else {
        None
    };
    serve(core, listener, token, &cfg, &dir, autoscale).await
}

/// The job file every process of the job reads. A following job's training files are
/// the master's to hand out (they grow): its workers get the dataset definitions, which
/// say where data files may come from, and no file list.
fn shipped(cfg: &JobConfig) -> JobConfig {
    let mut out = cfg.clone();
    if cfg.data.follow {
        out.data.train.clear();
    }
    out
}

fn files_rows_total(core: &MasterCore) -> u64 {
    core.job.lock().tasks().file_rows().iter().sum()
}

/// The job's files with their rows, by index.
pub(crate) fn core_file_pairs(core: &MasterCore) -> Vec<(String, u64)> {
    let rows = core.job.lock().tasks().file_rows().to_vec();
    core.files.read().iter().cloned().zip(rows).collect()
}

async fn serve(
    core: Arc<MasterCore>,
    listener: tokio::net::TcpListener,
    token: String,
    cfg: &JobConfig,
    dir: &JobDir,
    autoscale: Option<AutoscaleStart>,
) -> anyhow::Result<JobResult> {
    let max = cfg.cluster.max_message_bytes;
    let svc = MasterServer::new(MasterService(core.clone()))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        elastrec_rpc::server()?
            .add_service(InterceptedService::new(svc, ServerAuth::for_job(&token)))
            .serve_with_incoming_shutdown(elastrec_rpc::incoming(listener), async {
                let _ = stop_rx.await;
            }),
    );
    // Prometheus endpoint (open on loopback, the job token elsewhere).
    let ip: std::net::IpAddr = cfg.cluster.bind.parse()?;
    let mcore = core.clone();
    let metrics = elastrec_metrics::serve(
        SocketAddr::new(ip, cfg.cluster.metrics_port),
        &token,
        move || {
            // Refreshes the gauges the status snapshot feeds.
            mcore.status();
            mcore.metrics.render()
        },
    )
    .await
    .context("binding the metrics endpoint")?;
    std::fs::write(dir.metrics_addr(), metrics.addr().to_string())?;
    let autoscaler = autoscale.map(|a| {
        tokio::spawn(crate::autoscale_loop::run(
            core.clone(),
            a.brain,
            cfg.clone(),
            a.brain_job_id,
            a.samples_total,
            a.registered,
        ))
    });

    if cfg.data.follow {
        tokio::spawn(crate::dataset_watch::run(core.clone(), cfg.clone()));
    }
    if let Some(s) = &cfg.stream {
        if s.eval_window > 0 {
            *core.progressive.lock() = Some(crate::progressive::ProgressiveEval::new(
                s.eval_window as usize,
            ));
        }
        let partitions = crate::stream_watch::partitions_of(&core.files.read())?;
        tokio::spawn(crate::stream_watch::run(
            core.clone(),
            s.clone(),
            partitions,
            s.group_for(&core.job_id),
        ));
        if s.autoscale != elastrec_job::stream::StreamScaling::Off {
            tokio::spawn(crate::online_scale_loop::run(
                core.clone(),
                s.clone(),
                cfg.cluster.mode == elastrec_job::distributed::SyncMode::Sync,
            ));
        }
    }
    let t0 = Instant::now();
    let mut last_print = Instant::now();
    let mut used = Resources::default();
    let mut last_tick = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let phase = loop {
        let interrupted = tokio::select! {
            _ = tick.tick() => None,
            _ = tokio::signal::ctrl_c() => Some("interrupted"),
            _ = sigterm.recv() => Some("terminated"),
        };
        if let Some(how) = interrupted {
            let ckpt = match core.checkpoints() {
                Some(c) if cfg.checkpoint.on_sigterm && !core.job.lock().recovering() => {
                    match tokio::time::timeout(Duration::from_secs(120), c.checkpoint(&core, how))
                        .await
                    {
                        Ok(Ok(m)) => format!("checkpoint {} written; ", m.id),
                        Ok(Err(e)) => format!("no checkpoint ({e:#}); "),
                        Err(_) => "no checkpoint (timed out); ".to_string(),
                    }
                }
                _ => String::new(),
            };
            eprintln!(
                "master: {how}; {ckpt}stopping every node (resume later with `elastrec run --resume {}`)",
                dir.0.display()
            );
            let nodes = core.job.lock().leftover_nodes();
            for n in nodes {
                core.backend().stop(&n);
            }
            core.backend().finish();
            bail!("{how}");
        }
        {
            let dt = last_tick.elapsed().as_secs_f64();
            last_tick = Instant::now();
            let job = core.job.lock();
            for n in job.nodes().filter(|n| n.state.is_live()) {
                match n.role {
                    Role::Worker => used.worker_node_s += dt,
                    Role::Ps => used.ps_node_s += dt,
                }
            }
        }
        let exited: Vec<(u32, String)> = core
            .backend()
            .exited()
            .into_iter()
            .map(|e| {
                tracing::info!(node = e.id, reason = %e.reason, oom = e.oom, "node process ended");
                if e.oom {
                    out_of_memory(&core, e.id, &e.reason);
                }
                (e.id, e.reason)
            })
            .collect();
        let failed = core.take_failed_launches();
        let queued = core.backend().queued();
        let phase = core
            .run(|job, cx| {
                for id in queued {
                    job.queued(id, cx);
                }
                for (id, reason) in exited {
                    let reason = if reason.is_empty() {
                        "process exited".to_string()
                    } else {
                        format!("process exited: {reason}")
                    };
                    job.process_ended(id, &reason, cx);
                }
                for id in failed {
                    job.process_exited(id, cx);
                }
                job.tick(cx);
                job.phase().clone()
            })
            .await
            .map_err(|s| anyhow::anyhow!("master state: {}", s.message()))?;
        if matches!(phase, Phase::Finished | Phase::Failed(_)) {
            break phase;
        }
        if let Some(c) = core.checkpoints().cloned() {
            let failures = core.job.lock().take_ps_failures();
            if !failures.is_empty() {
                if let Err(e) = c.recover(&core, failures).await {
                    let msg = format!("recovering a parameter server failed: {e:#}");
                    core.run(|job, cx| job.fail(msg, cx))
                        .await
                        .map_err(|s| anyhow::anyhow!("master state: {}", s.message()))?;
                    continue;
                }
            }
            c.observe(&core).await;
            let (training, recovering, samples) = {
                let job = core.job.lock();
                (
                    *job.phase() == Phase::Training,
                    job.recovering(),
                    job.samples_done(),
                )
            };
            if training && !recovering && c.due(samples) {
                let task = c.spawn_checkpoint(core.clone(), "interval");
                tokio::spawn(async move {
                    if let Ok(Err(e)) = task.await {
                        eprintln!("master: checkpoint failed (training goes on): {e:#}");
                    }
                });
            }
        }
        if last_print.elapsed() > Duration::from_secs(2) {
            last_print = Instant::now();
            let s = core.status();
            let workers = s
                .nodes
                .iter()
                .filter(|n| {
                    n.role == elastrec_proto::master::Role::Worker as i32 && n.state == "running"
                })
                .count();
            eprintln!(
                "[{:>6.1}s] epoch {}/{} samples {}/{} ({:.0}/s) shards todo {} doing {} done {} workers {} ({})",
                t0.elapsed().as_secs_f64(),
                s.epoch + 1,
                s.epochs,
                s.samples_done,
                s.samples_total,
                s.samples_per_sec,
                s.shards_todo,
                s.shards_doing,
                s.shards_done,
                workers,
                s.phase
            );
        }
    };
    // Let workers and PS leave by themselves (they poll the master), then stop the rest.
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let left = core
            .job
            .lock()
            .leftover_nodes()
            .iter()
            .filter(|n| n.role == Role::Worker)
            .count();
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(2 * cfg.cluster.heartbeat_ms)).await;
    let leftovers = core.job.lock().leftover_nodes();
    for n in &leftovers {
        core.backend().stop(n);
    }
    core.backend().finish();
    if let Some(h) = autoscaler {
        // It stops once the job leaves training, with its final state written.
        let _ = tokio::time::timeout(Duration::from_secs(2), h).await;
    }
    let result = {
        let job = core.job.lock();
        let epochs = job.tasks().spec().epochs;
        let per_epoch: Vec<EpochLedger> = (0..epochs)
            .map(|e| EpochLedger {
                epoch: e,
                summary: job.tasks().ledger().summary(e),
            })
            .collect();
        let total = job.tasks().ledger().total(epochs);
        let started: u64 = Store::started_ms_hint(dir).unwrap_or(now_ms());
        let wall_s = now_ms().saturating_sub(started) as f64 / 1000.0;
        let workers: Vec<_> = job.nodes().filter(|n| n.role == Role::Worker).collect();
        JobResult {
            job_id: core.job_id.clone(),
            status: match &phase {
                Phase::Finished => "finished".into(),
                _ => "failed".into(),
            },
            error: match &phase {
                Phase::Failed(m) => Some(m.clone()),
                _ => None,
            },
            epochs: per_epoch,
            ledger: total,
            eval: job.eval(),
            samples_per_s: total.consumed as f64 / wall_s.max(1e-9),
            wall_s,
            workers_launched: workers.len() as u32,
            workers_dead: workers
                .iter()
                .filter(|n| n.state == NodeState::Dead)
                .count() as u32,
            ps_launched: job.nodes().filter(|n| n.role == Role::Ps).count() as u32,
            checkpoint: core.checkpoints().map(|c| c.report(total.consumed)),
            autoscale: core.autoscale_status.lock().clone(),
            resources: Resources {
                cpu_s: core.profiles.lock().values().map(|p| p.cpu_s).sum(),
                ..used
            },
            reshards: core.reshards.lock().clone(),
            online: online_result(&core, used.worker_node_s),
        }
    };
    if let Some(c) = core.checkpoints() {
        if let Some(r) = &result.checkpoint {
            eprintln!(
                "job {}: {} checkpoints (mean stall {:.2} ms vs memory copy {:.2} ms, persisted at {:.0} MB/s), {} PS recoveries, PLS {:.4}",
                result.job_id,
                r.stats.count,
                r.stall_ms,
                r.memcpy_ms,
                r.persist_mb_s,
                r.stats.recoveries.len(),
                r.pls
            );
        }
        if phase == Phase::Finished {
            c.remove_shm();
        }
    }
    eprintln!("job {}: {}", result.job_id, result.ledger);
    if let Some(e) = result.eval {
        eprintln!(
            "job {}: final eval AUC {:.4} logloss {:.4} on {} samples",
            result.job_id, e.auc, e.logloss, e.samples
        );
    }
    // Readers poll for it: they see the whole file or none (temp + fsync + rename).
    elastrec_job::fsio::write_atomic(
        &dir.result(),
        serde_json::to_string_pretty(&result)?.as_bytes(),
    )?;
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    drop(metrics);
    if let Phase::Failed(m) = phase {
        bail!("job failed: {m}");
    }
    Ok(result)
}

impl Store {
    /// Job start time from the `started_ms` file-side hint (written at start).
    fn started_ms_hint(dir: &JobDir) -> Option<u64> {
        std::fs::read_to_string(dir.0.join("started_ms"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names under /dev/shm are visible to every user: a namespace carries the job's name
    /// and its random uid, never token material, and is a valid plain name even when the
    /// job directory's name is not.
    #[test]
    fn shm_namespace_holds_no_token_and_is_a_plain_name() {
        let token = random_hex(32);
        let uid = random_hex(16);
        let ns = shm_namespace("my job/../x", &uid);
        assert!(!ns.contains(&token[..8]), "{ns}");
        assert!(ns.ends_with(&uid), "{ns}");
        elastrec_checkpoint::shm::validate_namespace(&ns).unwrap();
        assert_ne!(
            shm_namespace("job", &random_hex(16)),
            shm_namespace("job", &uid)
        );
    }
}
