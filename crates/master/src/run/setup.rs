//! What a new job and a resumed one both build from the job file: the backend and its
//! launch template, TLS, the addresses, the task sharding, the state machine's policy,
//! the brain link, and the job file shipped to nodes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context as _};
use elastrec_job::config::JobConfig;
use elastrec_job::distributed::SyncMode;
use elastrec_job::split::Source;
use elastrec_job::stream::PartitionAssignment;
use elastrec_proto::brain as pb;
use elastrec_rpc::tls::TlsMaterial;
use rand::Rng;

use super::job_dir::{FileRows, JobDir};
use crate::backend::{BackendKind, ClusterBackend};
use crate::core::MasterCore;
use crate::events::event;
use crate::job::Policy;
use crate::launch::LaunchTemplate;
use crate::tasks::DataSharding;

/// How the job's data is cut into tasks and ordered.
///
/// `train.shuffle_buffer` permutes the rows within each shard (`TaskQueue::row_shuffle`,
/// `JobConfig::rows_per_shard`).
pub(super) fn data_sharding(cfg: &JobConfig) -> DataSharding {
    let b = cfg.train.batch_size as u64;
    DataSharding {
        rows_per_shard: cfg.rows_per_shard(),
        min_rows: b,
        epochs: cfg.train.epochs,
        seed: cfg.cluster.seed,
        // A following job trains its partitions in the order they landed.
        shuffle: cfg.cluster.shuffle && !cfg.data.follow,
        shuffle_rows: cfg.train.shuffle_buffer > 0,
    }
}

/// The state machine's policy, from the job file.
pub(super) fn policy(cfg: &JobConfig) -> Policy {
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
        pin_partitions: cfg
            .stream
            .as_ref()
            .is_some_and(|s| s.assignment == PartitionAssignment::Pinned),
        executors: cfg.cluster.executors,
    }
}

/// The job's backend of `kind` and the template it starts nodes from: nodes start `exe`
/// and reach the master at `addr`. With autoscaling, nodes take the allotment of
/// `[autoscale]` (see `autoscale_loop::size_nodes`); otherwise the role's `[resources]`
/// size it.
#[allow(clippy::too_many_arguments)]
pub(super) fn open_backend(
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
    template.metrics_port_base = cfg.cluster.node_metrics_port_base;
    if kind == BackendKind::Kubernetes {
        crate::backend::kubernetes::manifests::check_paths(cfg)?;
    }
    crate::autoscale_loop::size_nodes(&template, cfg);
    let template = Arc::new(template);
    let enforce = cfg.autoscale.holds_nodes() || cfg.engine.local.enforce_resources;
    Ok((
        crate::backend::open(kind, template.clone(), &cfg.engine, enforce)?,
        template,
    ))
}

/// The job's TLS material when its channels use TLS (`[engine.tls]`; by default on for
/// every backend but `local`): the user's files or a CA and certificate issued now. It is
/// saved in the job directory (for `--resume` and the admin commands) and installed in
/// this process before any channel or server exists.
pub(super) fn job_tls(
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
pub(super) fn advertised(cfg: &JobConfig, bound: SocketAddr) -> anyhow::Result<String> {
    Ok(elastrec_job::resources::master_advertise(
        &cfg.engine,
        bound,
    )?)
}

/// The address the master binds: `cluster.bind`.
pub(super) fn bind_ip(cfg: &JobConfig) -> anyhow::Result<std::net::IpAddr> {
    cfg.cluster
        .bind
        .parse()
        .with_context(|| format!("cluster.bind: `{}` is not an IP address", cfg.cluster.bind))
}

/// The backend a resumed job runs on: the one it started with (`--backend` may only
/// repeat it; a job's nodes cannot move engines while they run).
pub(super) fn resumed_backend(
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

/// Shared-memory namespace of a job's PS images: its name and unique id (never token
/// material: names under /dev/shm are visible to every user).
pub(super) fn shm_namespace(job_id: &str, job_uid: &str) -> String {
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
pub(super) fn random_hex(n: usize) -> String {
    let mut rng = rand::rng();
    (0..n)
        .map(|_| format!("{:x}", rng.random_range(0..16u8)))
        .collect()
}

/// The job's files as `(path, rows)` pairs.
pub(super) fn file_pairs(files: &[FileRows]) -> Vec<(String, u64)> {
    files.iter().map(|f| (f.path.clone(), f.rows)).collect()
}

/// What the autoscaling loop of a job starts with.
pub struct AutoscaleStart {
    pub(super) brain: Arc<dyn crate::brain_link::BrainLink>,
    pub(super) brain_job_id: String,
    pub(super) samples_total: u64,
    pub(super) registered: bool,
    /// The job starts without a plan: a new job without a warm start (see
    /// `autoscale::Settings::explore`). A resumed job keeps the scale it had.
    pub(super) explore: bool,
}

/// Connects the job's brain and registers the job with it (`start`: a new job, else a
/// resumed one). Returns the loop's start and, when `warm` is set and the brain answered,
/// the start-up allocation. A brain that cannot be reached does not stop the job: it
/// starts with `cluster.workers` and the loop registers it later.
pub(super) async fn connect_brain(
    cfg: &JobConfig,
    dir: &JobDir,
    brain_job_id: String,
    samples_total: u64,
    start: bool,
    warm: bool,
) -> anyhow::Result<(AutoscaleStart, Option<pb::Allocation>)> {
    let brain = crate::brain_link::connect(
        &cfg.autoscale.brain,
        &cfg.autoscale.brain_db,
        &dir.0,
        crate::autoscale_loop::brain_config(cfg),
    )
    .await?;
    let (registered, plan) = match crate::autoscale_loop::warm_start(
        &*brain,
        cfg,
        &brain_job_id,
        samples_total,
    )
    .await
    {
        Ok(plan) => {
            let a = plan.allocation.filter(|_| warm);
            if let Some(a) = &a {
                event!(
                        "warm_start",
                        workers = a.workers,
                        ps = a.ps,
                        worker_cpu = a.worker_cpu,
                        ps_cpu = a.ps_cpu,
                        worker_mem_gb = a.worker_mem_gb,
                        ps_mem_gb = a.ps_mem_gb,
                        "autoscale: warm start from the {}: {} workers x {} cores, {} PS x {} cores ({})",
                        brain.describe(),
                        a.workers,
                        a.worker_cpu,
                        a.ps,
                        a.ps_cpu,
                        plan.reasons.join("; ")
                    );
            }
            (true, a)
        }
        Err(e) => {
            event!(warn, "brain_unreachable", error = %e,
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
            explore: start && plan.is_none(),
        },
        plan,
    ))
}

/// The job file every process of the job reads. A following job's training files are
/// the master's to hand out (they grow): its workers get the dataset definitions, which
/// say where data files may come from, and no file list.
pub(super) fn shipped(cfg: &JobConfig) -> JobConfig {
    let mut out = cfg.clone();
    if cfg.data.follow {
        // The master hands out its files (and their sources) itself; workers read what
        // their tasks name.
        out.data.train.clear();
        for s in &mut out.data.source {
            s.files.clear();
        }
    }
    out
}

pub(super) fn files_rows_total(core: &MasterCore) -> u64 {
    core.job.lock().tasks().rows_per_epoch()
}

/// The job's files with their rows, by index.
pub(crate) fn core_file_pairs(core: &MasterCore) -> Vec<(String, u64)> {
    let rows = core.job.lock().tasks().file_rows().to_vec();
    core.sources
        .read()
        .iter()
        .map(Source::to_string)
        .zip(rows)
        .collect()
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
