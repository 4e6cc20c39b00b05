//! Starting a new job, and resuming one whose master died, from its database.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use elastrec_job::config::JobConfig;
use elastrec_job::split::Source;
use elastrec_rpc::tls::TlsMaterial;
use elastrec_rpc::{role_token, Caller};

use super::job_dir::{self, write_private, FileRows, JobDir};
use super::result::JobResult;
use super::serve::serve;
use super::setup::*;
use crate::backend::{BackendKind, ClusterBackend};
use crate::checkpoint::{CheckpointStats, Coordinator, Fingerprint};
use crate::core::{now_ms, LiveCtx, MasterCore};
use crate::events::event;
use crate::file_count;
use crate::job::{Job, Node, Phase, Role};
use crate::launch::LaunchTemplate;
use crate::ledger::LedgerSummary;
use crate::store::{MasterDb, Writer};
use crate::tasks::{DataPosition, TaskQueue};
use elastrec_checkpoint::format::Manifest;
use elastrec_proto::master::RestorePlan;

/// Where a new job's model and data position come from (`--from-checkpoint`).
#[derive(Debug, Clone)]
pub struct FromCheckpoint {
    /// Checkpoint storage location (directory or s3://...).
    pub location: String,
    /// A specific checkpoint id (default: the newest intact one).
    pub id: Option<u64>,
}

/// Splits the last `share` of the training rows off `files` as the validation slice
/// (`(file, start row, end row)` ranges); the files keep the rows before it.
fn carve_validation(files: Vec<FileRows>, share: f64) -> (Vec<FileRows>, Vec<(PathBuf, u64, u64)>) {
    if share <= 0.0 {
        return (files, Vec::new());
    }
    let counts: Vec<(PathBuf, u64)> = files
        .iter()
        .map(|f| (PathBuf::from(&f.path), f.rows))
        .collect();
    let (kept, slice) = elastrec_job::selection::split_validation(&counts, share);
    let files = files
        .into_iter()
        .zip(kept)
        .map(|(f, (_, rows))| FileRows { rows, ..f })
        .collect();
    (files, slice)
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

/// The job file at `path` as every process of the job will read it: checked, refused
/// where `run` cannot carry a setting out, its data generated where the file asks, its
/// datasets resolved into files, its features inferred, its dense statistics and batch
/// size filled in; each decision logged as an event.
async fn resolve_job(path: &Path) -> anyhow::Result<JobConfig> {
    let mut cfg = validate_job(path)?;
    let train_only = cfg.train_only_settings();
    let (verb, them) = if train_only.len() == 1 {
        ("applies", "it")
    } else {
        ("apply", "them")
    };
    anyhow::ensure!(
        train_only.is_empty(),
        "{}: {} {verb} to `elastrec train` only; `elastrec run` does not carry {them} out yet. \
         Train this job with `elastrec train`, or remove {them}",
        path.display(),
        train_only.join(", "),
    );
    if let Some(why) = crate::validation::refusal(&cfg) {
        bail!("{}: {why}", path.display());
    }
    elastrec_job::prepare::ensure_data(&cfg, false)?;
    // Datasets become files once, here: the job file stored and shipped to every process
    // is the resolved one. Listing blocks (and may wait for partitions): off the runtime.
    // So are the dense features' statistics (`model.dense_norm`): one first pass, whose
    // values every process and model file of the job then share; and the batch size of
    // a job file that leaves it out, from the training rows.
    let (cfg, resolved) = tokio::task::spawn_blocking(move || {
        let r = elastrec_job::datasets::resolve_datasets(&mut cfg).and_then(|r| {
            let inferred = elastrec_job::prepare::resolve_schema(&mut cfg)?;
            let rows = elastrec_job::prepare::fill_dense_stats(&mut cfg)?;
            let batch = elastrec_job::prepare::fill_batch_size(&mut cfg)?;
            Ok((r, rows, batch, inferred))
        });
        (cfg, r)
    })
    .await?;
    let (resolved, stats_rows, small_batch, inferred) = resolved?;
    if let Some(inferred) = inferred {
        let s = &inferred.schema;
        event!(
            "schema_inferred",
            dense = s.dense().count(),
            categorical = s.sparse_width(),
            lists = s.lists().count(),
            "master: features inferred from {} sampled rows: {} dense, {} categorical, {} lists",
            inferred.sampled_rows,
            s.dense().count(),
            s.sparse_width(),
            s.lists().count()
        );
    }
    if let Some(batch) = small_batch {
        event!(
            "batch_size",
            batch,
            "master: a small training set: batch size {batch} (for at least {} steps an \
             epoch; set train.batch_size to choose)",
            elastrec_job::prepare::AUTO_STEPS_PER_EPOCH
        );
    }
    if stats_rows > 0 {
        event!(
            "dense_stats",
            rows = stats_rows,
            "master: dense features standardized with statistics of {stats_rows} training rows"
        );
    }
    for (r, line) in resolved
        .iter()
        .zip(elastrec_job::datasets::describe(&resolved))
    {
        event!(
            "dataset",
            name = %r.name,
            role = ?r.role,
            partitions = r.partitions,
            files = r.files,
            tasks = r.tasks,
            pending = r.pending.len(),
            joined_rows = r.join.map(|j| j.rows),
            joined_positives = r.join.map(|j| j.positives),
            "master: {line}"
        );
    }
    Ok(cfg)
}

/// What a new job trains on: its history's files (the validation slice carved off their
/// end) followed by its stream's partitions.
struct JobFiles {
    files: Vec<FileRows>,
    /// The validation slice: (file, first row, end row).
    slice: Vec<(PathBuf, u64, u64)>,
    /// Index of the first stream partition in `files`.
    stream_from: usize,
    /// The offset each of the stream's partitions starts at (an online job).
    stream_starts: Option<Vec<u64>>,
    /// Listed files counted while the job trains (a long list, see [`file_count`]).
    rest: file_count::Rest,
}

/// Counts the history's rows (only the first files of a long list, unless the job starts
/// from a checkpoint)
/// and, for an online job, asks its brokers where each partition starts: an empty training
/// set is an error naming the files, and brokers and topics that do not answer stop the
/// job before anything is created.
async fn job_files(
    cfg: &JobConfig,
    job_id: &str,
    from_checkpoint: bool,
) -> anyhow::Result<JobFiles> {
    let stream_starts = match &cfg.stream {
        Some(s) => {
            let (s, group) = (s.clone(), s.group_for(job_id));
            Some(
                tokio::task::spawn_blocking(move || crate::stream_watch::resolve(&s, &group))
                    .await??,
            )
        }
        None => None,
    };
    // A mixture's history files come first, then the stream's partitions.
    let mut rest = file_count::Rest::default();
    let history: Vec<FileRows> = if stream_starts.is_none() || cfg.is_mixture() {
        let counted = if file_count::may_count_later(cfg, from_checkpoint) {
            let (counted, left) = file_count::count_first(cfg)?;
            rest = left;
            counted
        } else {
            elastrec_job::prepare::count_train_rows(cfg)?
        };
        counted
            .into_iter()
            .zip(elastrec_job::mix::train_file_sources(cfg))
            .map(|((f, rows), source)| FileRows {
                path: f.to_string_lossy().into_owned(),
                rows,
                source,
            })
            .collect()
    } else {
        Vec::new()
    };
    // The validation slice (`train.validation`): the end of the training rows, which the
    // task queue then never deals.
    let (history, slice) = carve_validation(history, cfg.train.validation);
    let stream_from = history.len();
    let mut files = history;
    // A partition's "rows" are unknown (it grows); 0 keeps checkpoints of the same
    // topics compatible whatever offsets the jobs started at.
    if let Some((partitions, _)) = &stream_starts {
        files.extend(partitions.iter().map(|p| FileRows {
            path: p.to_string(),
            rows: 0,
            source: 0,
        }));
    }
    let stream_starts = stream_starts.map(|(_, starts)| starts);
    Ok(JobFiles {
        files,
        slice,
        stream_from,
        stream_starts,
        rest,
    })
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
    let mut cfg = resolve_job(path).await?;
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
    let job_id = job_name(&dir);
    let JobFiles {
        files,
        slice,
        stream_from,
        stream_starts,
        rest,
    } = job_files(&cfg, &job_id, from.is_some()).await?;
    std::fs::create_dir_all(&dir.0).with_context(|| format!("creating {}", dir.0.display()))?;
    job_dir::attach_events(&dir)?;
    if crate::validation::wanted(&cfg) {
        crate::validation::create(&cfg, slice)?;
    }
    // Tells this job's processes and shared memory from another job's of the same name.
    let job_uid = random_hex(16);
    let total_samples = file_count::expected_rows(&files, &rest) * cfg.train.epochs as u64;
    let autoscale =
        brain_at_start(&mut cfg, &dir, format!("{job_id}-{job_uid}"), total_samples).await?;
    let cfg = cfg;
    let fingerprint = Fingerprint::of(&cfg, &file_pairs(&files)).growing(!rest.is_empty());
    // A job started from a checkpoint checks it before anything is created.
    let foreign = match &from {
        Some(f) => Some(crate::checkpoint::load_foreign(&f.location, f.id, &fingerprint).await?),
        None => None,
    };
    let token = random_hex(32);
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
    let store = MasterDb::open(&dir.db(), true).await?;
    record_new_job(
        &store,
        &NewJob {
            job_toml: &job_toml,
            files: &files,
            job_id: &job_id,
            job_uid: &job_uid,
            stream: stream_starts.as_deref().map(|s| (s, stream_from)),
            addr: &addr,
            bound,
            backend: kind.name(),
        },
    )
    .await?;
    if !rest.is_empty() {
        store.set_meta(file_count::COUNTING_KEY, "1".into()).await?;
    }
    std::fs::write(dir.started_ms_file(), now_ms().to_string())?;
    let shm_ns = shm_namespace(&job_id, &job_uid);
    let coordinator = cfg
        .checkpoint
        .enabled
        .then(|| {
            Coordinator::new(
                &cfg,
                fingerprint,
                total_samples,
                &master_token,
                shm_ns,
                None,
            )
        })
        .transpose()?
        .map(Arc::new);
    let mut queue = fresh_queue(&cfg, &files, stream_from, stream_starts.as_deref());
    let mut initial_plan = None;
    let mut closed = Vec::new();
    if let (Some(from), Some(origin)) = (&from, foreign) {
        let at = start_at_checkpoint(&cfg, &files, &job_id, from, origin, &store).await?;
        queue = at.queue;
        closed = at.closed;
        initial_plan = Some(at.origin.1.clone());
        if let Some(c) = &coordinator {
            c.set_origin(at.origin);
        }
    }
    // The queue the job starts with (fresh, or at the checkpoint's position).
    open_queue(&mut queue, &cfg, &files, Some(&rest));
    let workers = cfg.cluster.workers;
    let mut cx = LiveCtx::now();
    let mut job = Job::start(policy(&cfg), queue, workers, &mut cx);
    if from.is_some() {
        job.set_epochs_closed(closed, &mut cx);
        job.persist_data_reset(&mut cx);
    }
    if pause_at.is_some() {
        job.set_pause(pause_at, &mut cx);
    }
    store.apply(&cx.take_changes()).await?;
    let rows = file_count::describe(&files, &rest);
    event!("job_started", job = %job_id, addr = %addr, ps = cfg.cluster.ps, workers,
        "job {job_id}: master on {addr}, {} PS, {} workers, {rows} x {} epochs, {} rows per shard; state in {}",
        cfg.cluster.ps,
        workers,
        cfg.train.epochs,
        job.tasks().spec().rows_per_shard,
        dir.db().display()
    );
    let core = master_core(
        CoreParts {
            job,
            store,
            backend,
            launch,
            job_toml,
            files,
            job_id,
            master_token,
        },
        &cfg,
    )?;
    core.set_restore_plan(initial_plan);
    if let Some(c) = coordinator {
        core.set_checkpoints(c);
    }
    core.effects(cx);
    file_count::spawn(&core, &cfg, rest);
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
    let store = MasterDb::open(&dir.db(), false).await?;
    job_dir::attach_events(&dir)?;
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
    let rest = uncounted(&snap.meta, &cfg, &files)?;
    let queue = restored_queue(&snap.meta, snap.tasks, &snap.ranges, &cfg, &files, &rest)?;
    let stats: Option<CheckpointStats> = snap
        .meta
        .get("checkpoint_stats")
        .map(|t| serde_json::from_str(t))
        .transpose()?;
    let mut cx = LiveCtx::now();
    let job = restored_job(&cfg, queue, snap.nodes, &snap.meta, &mut cx)?;
    store.apply(&cx.take_changes()).await?;
    // The same address, so live nodes find the new master.
    let sock: SocketAddr = snap.meta.get("master_bind").unwrap_or(&addr).parse()?;
    let listener = rebind(sock).await?;
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
    event!("job_resumed", job = %job_id, addr = %addr, todo, doing, done, ps_gone = ?ps_gone,
        "job {job_id}: master resumed on {addr}: shards todo {todo}, doing {doing}, done {done}; {}",
        if ps_gone.is_empty() || !training {
            "waiting for nodes to re-register".to_string()
        } else {
            format!("parameter servers {ps_gone:?} are gone: restoring the last checkpoint")
        }
    );
    let num_ps = job.policy().num_ps;
    let core = master_core(
        CoreParts {
            job,
            store,
            backend,
            launch,
            job_toml,
            files,
            job_id: job_id.clone(),
            master_token: master_token.clone(),
        },
        &cfg,
    )?;
    if let Some(t) = snap.meta.get(crate::online_scale_loop::TRAFFIC_KEY) {
        let _ = core.resumed_traffic.set(t.clone());
    }
    // The previous master may have died in the middle of a PS change: servers it froze
    // for the next layout go back to the one in force.
    crate::reshard::abort_uncommitted(&core).await;
    if cfg.checkpoint.enabled {
        let fingerprint = Fingerprint::of(&cfg, &core_file_pairs(&core)).growing(rest.is_some());
        let c = Arc::new(Coordinator::new(
            &cfg,
            fingerprint,
            files_rows_total(&core) * cfg.train.epochs as u64,
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
            recover_gone_servers(&core, &c, &ps_gone).await?;
        }
    } else {
        core.effects(cx);
    }
    if let Some(rest) = rest {
        file_count::spawn(&core, &cfg, rest);
    }
    // The autoscaler starts afresh: the profile of the previous master's allocation is in
    // the brain's database already, and its windows are re-measured here.
    let autoscale = if cfg.autoscale.enabled {
        let total = files_rows_total(&core) * cfg.train.epochs as u64;
        let brain_job_id = format!("{job_id}-{job_uid}");
        Some(
            connect_brain(&cfg, &dir, brain_job_id, total, false, false)
                .await?
                .0,
        )
    } else {
        None
    };
    serve(core, listener, token, &cfg, &dir, autoscale).await
}

/// The listed files a resumed job has still to count (its list was long; the previous
/// master recorded the counted part), or `None` once every file is recorded. The list must
/// still begin with the recorded files.
fn uncounted(
    meta: &std::collections::HashMap<String, String>,
    cfg: &JobConfig,
    files: &[FileRows],
) -> anyhow::Result<Option<file_count::Rest>> {
    if meta.get(file_count::COUNTING_KEY).is_none_or(|v| v != "1") {
        return Ok(None);
    }
    let listed = cfg.train_files();
    if let Some((i, (f, l))) = files
        .iter()
        .zip(&listed)
        .enumerate()
        .find(|(_, (f, l))| Path::new(&f.path) != l.as_path())
    {
        bail!(
            "training file {i} was {} when the job started and is now {}: data.train must not change while its rows are counted",
            f.path,
            l.display()
        );
    }
    let rest = file_count::Rest::after(cfg, listed, files.len());
    // Every file was recorded just before the previous master stopped: nothing grows.
    Ok((!rest.is_empty()).then_some(rest))
}

/// A job is named after its directory.
fn job_name(dir: &JobDir) -> String {
    dir.0
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "job".into())
}

/// With autoscaling, the brain's start-up plan sizes the job before anything is shaped by
/// it (the job file every process reads, the checkpoint coordinator, the nodes' launch
/// template): a warm start's plan is applied to `cfg`.
async fn brain_at_start(
    cfg: &mut JobConfig,
    dir: &JobDir,
    brain_job_id: String,
    total_samples: u64,
) -> anyhow::Result<Option<AutoscaleStart>> {
    if !cfg.autoscale.enabled {
        return Ok(None);
    }
    let warm = cfg.autoscale.wants_warm_start();
    let (start, plan) = connect_brain(cfg, dir, brain_job_id, total_samples, true, warm).await?;
    if let Some(a) = plan {
        crate::autoscale_loop::apply_warm_plan(cfg, &a);
    }
    Ok(Some(start))
}

/// Opens a new or resumed job's queue to the files still to come: a following job's partitions as
/// they land, or the rest of a long list as it is counted. Its buffers first, as the job
/// configures them.
fn open_queue(
    queue: &mut TaskQueue,
    cfg: &JobConfig,
    files: &[FileRows],
    rest: Option<&file_count::Rest>,
) {
    set_buffers(queue, cfg, files);
    if cfg.data.follow {
        queue.follow();
    } else if let Some(rest) = rest.filter(|r| !r.is_empty()) {
        queue.count_later(file_count::expected_rows(files, rest));
    }
}

/// A new job's queue: its files, then an online job's partitions from their start
/// offsets.
fn fresh_queue(
    cfg: &JobConfig,
    files: &[FileRows],
    stream_from: usize,
    stream_starts: Option<&[u64]>,
) -> TaskQueue {
    match stream_starts {
        Some(starts) => TaskQueue::new_mixed(
            data_sharding(cfg),
            files[..stream_from].iter().map(|f| f.rows).collect(),
            starts.to_vec(),
        ),
        None => TaskQueue::new(data_sharding(cfg), files.iter().map(|f| f.rows).collect()),
    }
}

/// After a crash of the whole job: the servers `gone` (indices) come back from the last
/// checkpoint, with the data position it holds.
async fn recover_gone_servers(
    core: &Arc<MasterCore>,
    c: &Coordinator,
    gone: &[u32],
) -> anyhow::Result<()> {
    let failures = gone
        .iter()
        .map(|&index| crate::job::PsFailure {
            index,
            node: 0,
            reason: "gone after a restart of the whole job".into(),
            samples: 0,
        })
        .collect();
    c.recover_full(core, failures).await
}

/// What a new job's database records for a resumed master to rebuild it from.
struct NewJob<'a> {
    job_toml: &'a str,
    files: &'a [FileRows],
    job_id: &'a str,
    job_uid: &'a str,
    /// An online job's partitions' start offsets and the index of its first partition.
    stream: Option<(&'a [u64], usize)>,
    addr: &'a str,
    bound: SocketAddr,
    backend: &'a str,
}

async fn record_new_job(store: &MasterDb, j: &NewJob<'_>) -> anyhow::Result<()> {
    store.set_meta("job_toml", j.job_toml.to_string()).await?;
    store
        .set_meta("files", serde_json::to_string(j.files)?)
        .await?;
    store.set_meta("job_id", j.job_id.to_string()).await?;
    store.set_meta("job_uid", j.job_uid.to_string()).await?;
    if let Some((starts, stream_from)) = j.stream {
        store
            .set_meta("stream_starts", serde_json::to_string(starts)?)
            .await?;
        store
            .set_meta("stream_from", stream_from.to_string())
            .await?;
    }
    store.set_meta("master_addr", j.addr.to_string()).await?;
    store.set_meta("master_bind", j.bound.to_string()).await?;
    store.set_meta("backend", j.backend.to_string()).await?;
    Ok(())
}

/// A new job started from another job's checkpoint: its queue at the checkpoint's data
/// position, the epochs that position had closed, and the checkpoint itself.
struct AtCheckpoint {
    queue: TaskQueue,
    closed: Vec<(u32, LedgerSummary)>,
    origin: (Manifest, RestorePlan, DataPosition),
}

async fn start_at_checkpoint(
    cfg: &JobConfig,
    files: &[FileRows],
    job_id: &str,
    from: &FromCheckpoint,
    origin: (Manifest, RestorePlan, DataPosition),
    store: &MasterDb,
) -> anyhow::Result<AtCheckpoint> {
    let (m, _, pos) = &origin;
    event!(
        "from_checkpoint",
        checkpoint = m.id,
        num_ps = m.num_ps,
        samples = m.samples,
        "job {job_id}: starting from checkpoint {} of {} ({} PS, {} samples trained)",
        m.id,
        elastrec_checkpoint::store::redact_location(&from.location),
        m.num_ps,
        m.samples
    );
    let queue = TaskQueue::from_position(
        data_sharding(cfg),
        files.iter().map(|f| f.rows).collect(),
        pos,
    );
    store
        .set_meta(
            "ledger_adjust",
            serde_json::to_string(&pos.ledger_adjustments())?,
        )
        .await?;
    Ok(AtCheckpoint {
        queue,
        closed: pos.epochs_closed.clone(),
        origin,
    })
}

/// What the master's shared state is built from, whether the job starts or resumes.
struct CoreParts {
    job: Job,
    store: MasterDb,
    backend: Arc<dyn ClusterBackend>,
    launch: Arc<LaunchTemplate>,
    job_toml: String,
    files: Vec<FileRows>,
    job_id: String,
    master_token: String,
}

/// The master's shared state: the job, its database writer and backend, and what node
/// launches and calls to the PS need.
fn master_core(p: CoreParts, cfg: &JobConfig) -> anyhow::Result<Arc<MasterCore>> {
    // The queue knows where the stream's partitions start among the recorded names.
    let stream_from = p.job.tasks().stream_from() as usize;
    let sources = p
        .files
        .iter()
        .enumerate()
        .map(|(i, f)| Source::from_recorded(&f.path, i >= stream_from))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("the job's recorded files: {e}"))?;
    let core = Arc::new(MasterCore::new(
        p.job,
        Writer::spawn(p.store),
        p.backend,
        p.job_toml,
        sources,
        cfg.cluster.heartbeat_ms as u32,
        p.job_id,
    ));
    let _ = core.launch.set(p.launch);
    let _ = core.source_names.set(elastrec_job::mix::source_names(cfg));
    let _ = core.ps_access.set(crate::reshard::PsAccess {
        token: p.master_token,
        max_bytes: cfg.cluster.max_message_bytes,
    });
    Ok(core)
}

/// The job as the previous master left it: its nodes, target, phase and evaluation from
/// `master.db`'s metadata, around the restored `queue`. Servers started for a PS layout
/// that was never committed are stopped (through `cx`).
fn restored_job(
    cfg: &JobConfig,
    queue: TaskQueue,
    nodes: Vec<Node>,
    meta: &std::collections::HashMap<String, String>,
    cx: &mut LiveCtx,
) -> anyhow::Result<Job> {
    let get = |k: &str| {
        meta.get(k)
            .cloned()
            .with_context(|| format!("master.db lacks `{k}`"))
    };
    let mut job = Job::restore(
        policy(cfg),
        queue,
        nodes,
        get("target_workers")?.parse()?,
        get("restarts_used")?.parse()?,
        serde_json::from_str(&get("phase")?)?,
        serde_json::from_str(&get("eval")?)?,
        serde_json::from_str(&get("epochs_closed")?)?,
        cx,
    );
    if let Some(t) = meta.get("task_evals") {
        job.restore_task_evals(serde_json::from_str(t)?);
    }
    if let Some(p) = meta.get("pause_at") {
        job.restore_pause(serde_json::from_str(p)?);
    }
    // The PS layout in force when the previous master stopped (after online re-sharding).
    if let Some(l) = meta.get("ps_layout") {
        let (version, num_ps): (u64, u32) = serde_json::from_str(l)?;
        job.set_layout(version, num_ps);
    }
    job.drop_uncommitted_servers(cx);
    Ok(job)
}

/// The task queue as the previous master left it (`master.db`'s tasks, ledger ranges
/// and metadata), its buffers as the job configures them.
fn restored_queue(
    meta: &std::collections::HashMap<String, String>,
    tasks: Vec<crate::tasks::Task>,
    ranges: &[crate::ledger::ConsumedRange],
    cfg: &JobConfig,
    files: &[FileRows],
    rest: &Option<file_count::Rest>,
) -> anyhow::Result<TaskQueue> {
    let generated: u32 = meta
        .get("generated_epochs")
        .context("master.db lacks `generated_epochs`")?
        .parse()?;
    let mut queue = match meta.get("stream_starts") {
        Some(starts) => {
            // A job from before mixtures existed has only partitions.
            let from: usize = match meta.get("stream_from") {
                Some(f) => f.parse()?,
                None => 0,
            };
            let starts: Vec<u64> = serde_json::from_str(starts)?;
            anyhow::ensure!(
                from + starts.len() == files.len(),
                "master.db is corrupt: {from} history files and {} partitions are not its {} files",
                starts.len(),
                files.len()
            );
            TaskQueue::restore_mixed(
                data_sharding(cfg),
                files[..from].iter().map(|f| f.rows).collect(),
                starts,
                tasks,
                ranges,
                generated,
            )
        }
        None => TaskQueue::restore(
            data_sharding(cfg),
            files.iter().map(|f| f.rows).collect(),
            tasks,
            ranges,
            generated,
        ),
    };
    if let Some(adj) = meta.get("ledger_adjust") {
        queue.adjust_ledger(&serde_json::from_str::<Vec<(u32, u64, u64)>>(adj)?);
    }
    // Files stored just before the previous master stopped get their tasks.
    open_queue(&mut queue, cfg, files, rest.as_ref());
    Ok(queue)
}

/// Binds the previous master's address again, so that live nodes find the new master;
/// the old socket may linger a little.
async fn rebind(sock: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match tokio::net::TcpListener::bind(sock).await {
            Ok(l) => return Ok(l),
            Err(e) if Instant::now() < deadline => {
                tracing::warn!(error = %e, "master address busy; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e).context("rebinding the master address"),
        }
    }
}

/// The queue's serving buffers as the job configures them: its history dealt into the
/// `[[data.source]]` buffers by each file's recorded source (a job without sources keeps
/// one), served by the job's policy (`elastrec_job::mix::serving`).
fn set_buffers(queue: &mut TaskQueue, cfg: &JobConfig, files: &[FileRows]) {
    if cfg.data.source.len() > 1 {
        queue.set_sources(
            cfg.data.source.len(),
            files.iter().map(|f| f.source).collect(),
        );
    }
    queue.set_serving(elastrec_job::mix::serving(cfg));
}
