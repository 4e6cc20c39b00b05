//! The checkpoint coordinator of the job master: when to checkpoint (CPR's interval from
//! measured costs), how (flash checkpoints of every PS, then the data position, then the
//! manifest), and how a dead parameter server is recovered (full, partial, or CPR's choice).
//!
//! Consistency: the data position is taken *before* the servers copy their state. Every
//! sample it counts was reported, hence already applied on every PS, so nothing counted is
//! missing from the model; a batch applied between the two moments is in the model but not
//! in the position and is trained again after a full restore (at most one batch per worker,
//! the same window as a worker death; see docs/checkpoints.md).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context as _};
use elastrec_checkpoint::cpr::{decide, CprCosts, PlsTracker, RecoveryDecision, RecoveryMode};
use elastrec_checkpoint::format::{CheckpointKind, Manifest, PartMeta};
use elastrec_checkpoint::shm::ShmRoot;
use elastrec_checkpoint::store::{redact_location, CheckpointStore};
use elastrec_job::config::JobConfig;
use elastrec_job::distributed::{CheckpointConfig, RecoveryChoice, SavePriority};
use elastrec_proto::master::{CheckpointStatus, RestorePlan};
use elastrec_proto::ps::CheckpointRequest;
use elastrec_rpc as rpc;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::core::{now_ms, MasterCore};
use crate::events::event;
use crate::job::{Change, PsFailure};
use crate::tasks::{DataPosition, TaskQueue};

/// Name of the master's part (the data position) in every checkpoint.
pub const MASTER_PART: &str = "master.json";

/// Until one checkpoint measured it, the training stall of a checkpoint is assumed to be
/// this long (s) when choosing the interval.
const ASSUMED_SAVE_S: f64 = 0.05;
/// Rescheduling cost (s) assumed until a recovery measured it.
const ASSUMED_RESCHEDULE_S: f64 = 1.0;
/// The first checkpoint comes this soon (s) when the interval is chosen by the policy: it
/// measures the save cost the policy needs.
const FIRST_CHECKPOINT_S: f64 = 10.0;
/// Bounds of a policy-chosen interval (s).
const INTERVAL_BOUNDS_S: (f64, f64) = (2.0, 6.0 * 3600.0);

/// What must match between a checkpoint and the job restoring it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// Model shape (tables, dimensions, MLPs, seed).
    pub model: serde_json::Value,
    /// Dense and sparse optimizers (their state layout is in the checkpoint).
    pub optimizer: serde_json::Value,
    /// Training files (names) and their rows: the data position refers to them.
    pub files: Vec<(String, u64)>,
    /// A following job's files grow: a checkpoint of it restores into the same job with
    /// more files (its own are a prefix of the job's).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub following: bool,
}

impl Fingerprint {
    /// The fingerprint of `job` over training files with the given rows.
    pub fn of(job: &JobConfig, files: &[(String, u64)]) -> Self {
        Self {
            model: serde_json::to_value(&job.model).expect("model serializes"),
            optimizer: serde_json::to_value(&job.optimizer).expect("optimizer serializes"),
            files: file_names(files),
            following: job.data.follow,
        }
    }

    /// A short stable digest (the manifest's `fingerprint`).
    pub fn digest(&self) -> String {
        let text = serde_json::to_string(self).expect("serializes");
        format!("{:016x}", xxhash_rust::xxh3::xxh3_64(text.as_bytes()))
    }

    /// Why a checkpoint with fingerprint `other` cannot be restored into this job, naming
    /// the section that differs.
    pub fn mismatch(&self, other: &Fingerprint) -> Option<String> {
        if self.model != other.model {
            return Some(format!(
                "[model] differs: checkpoint {} vs job {}",
                other.model, self.model
            ));
        }
        if self.optimizer != other.optimizer {
            return Some(format!(
                "[optimizer] differs: checkpoint {} vs job {}",
                other.optimizer, self.optimizer
            ));
        }
        let grown = self.following && self.files.starts_with(&other.files);
        if self.files != other.files && !grown {
            return Some(format!(
                "training files differ: checkpoint {:?} vs job {:?}",
                other.files, self.files
            ));
        }
        None
    }
}

/// Files as a fingerprint names them: by file name (the job directory may move), with rows.
fn file_names(files: &[(String, u64)]) -> Vec<(String, u64)> {
    files
        .iter()
        .map(|(p, r)| {
            let name = std::path::Path::new(p)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| p.clone());
            (name, *r)
        })
        .collect()
}

/// One PS failure and what was done about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecoveryRecord {
    /// When it was detected (ms since the Unix epoch).
    pub at_ms: u64,
    /// Failed PS indices.
    pub ps: Vec<u32>,
    /// Why they were declared dead.
    pub reason: String,
    /// Full or partial.
    pub mode: RecoveryMode,
    /// Checkpoint restored (none: state at initialization).
    pub checkpoint: Option<u64>,
    /// Samples trained when the failure was detected.
    pub samples_at_failure: u64,
    /// Samples of the restored checkpoint's data position.
    pub samples_at_checkpoint: u64,
    /// PLS added (partial recovery, Eq. 3).
    pub pls_added: f64,
    /// Seconds from detection until every PS served again.
    pub seconds: Option<f64>,
    /// The decision with both overhead estimates.
    pub decision: String,
}

/// Aggregates over the job, persisted in the master database.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CheckpointStats {
    /// Checkpoints committed.
    pub count: u64,
    /// Newest committed id.
    pub last_id: u64,
    /// When it was committed (ms since the Unix epoch).
    pub last_ms: u64,
    /// Delta checkpoints since the last full one.
    pub deltas_since_full: u32,
    /// Sum over checkpoints of the longest PS stall (ms).
    pub stall_ms_sum: f64,
    /// Sum of the matching plain memory-copy times (ms).
    pub memcpy_ms_sum: f64,
    /// Sum of background persistence times (s) and bytes.
    pub persist_s_sum: f64,
    /// Bytes persisted.
    pub bytes_sum: u64,
    /// PS load time of the last recovery (s), when measured.
    pub o_load_s: Option<f64>,
    /// Rescheduling time of the last recovery (s), when measured.
    pub o_res_s: Option<f64>,
    /// Portion of lost samples.
    pub pls: Option<PlsTracker>,
    /// Every recovery.
    pub recoveries: Vec<RecoveryRecord>,
    /// Samples trained again after full recoveries.
    pub retrained_samples: u64,
    /// The decision in force.
    pub decision: Option<RecoveryDecision>,
}

impl CheckpointStats {
    fn mean(sum: f64, n: u64) -> f64 {
        if n == 0 {
            0.0
        } else {
            sum / n as f64
        }
    }
    /// Mean stall per checkpoint (ms).
    pub fn stall_ms(&self) -> f64 {
        Self::mean(self.stall_ms_sum, self.count)
    }
    /// Mean memory-copy time of the same bytes (ms).
    pub fn memcpy_ms(&self) -> f64 {
        Self::mean(self.memcpy_ms_sum, self.count)
    }
    /// Background persistence rate (MB/s).
    pub fn persist_mb_s(&self) -> f64 {
        if self.persist_s_sum > 0.0 {
            self.bytes_sum as f64 / 1e6 / self.persist_s_sum
        } else {
            0.0
        }
    }
}

/// The job's checkpoint summary in `result.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointReport {
    /// Where checkpoints went.
    pub location: String,
    /// Everything measured.
    #[serde(flatten)]
    pub stats: CheckpointStats,
    /// Final portion of lost samples.
    pub pls: f64,
    /// Mean training stall per checkpoint (ms) and a memory copy of the same bytes (ms).
    pub stall_ms: f64,
    /// See `stall_ms`.
    pub memcpy_ms: f64,
    /// Background persistence rate (MB/s).
    pub persist_mb_s: f64,
    /// Interval in force at the end (s).
    pub interval_s: f64,
}

/// The coordinator.
pub struct Coordinator {
    cfg: CheckpointConfig,
    store: Arc<CheckpointStore>,
    shm_ns: String,
    token: String,
    max_bytes: usize,
    /// What the job's checkpoints belong to (its files grow in a following job).
    fingerprint: Mutex<Fingerprint>,
    /// PS count of the layout in force (changes with online re-sharding).
    num_ps: std::sync::atomic::AtomicU32,
    /// The next checkpoint must be full (the PS layout changed: a delta's base was written
    /// by other servers).
    force_full: AtomicBool,
    total_samples: u64,
    started: Instant,
    stats: Mutex<CheckpointStats>,
    busy: AtomicBool,
    /// When this master last committed a checkpoint (monotonic: the interval must not
    /// depend on wall-clock steps).
    last_commit: Mutex<Option<Instant>>,
    /// A recovery in progress: (record index, when it started).
    pending: Mutex<Option<(usize, Instant)>>,
    /// The checkpoint a job started from (`--from-checkpoint`), used until it has its own.
    origin: Mutex<Option<(Manifest, RestorePlan, DataPosition)>>,
}

impl Coordinator {
    /// A coordinator for `job`; `stats` come from the master database after a restart.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        job: &JobConfig,
        fingerprint: Fingerprint,
        total_samples: u64,
        token: &str,
        shm_ns: String,
        stats: Option<CheckpointStats>,
    ) -> anyhow::Result<Self> {
        let store = open_store(&job.checkpoint.location)?;
        let mut stats = stats.unwrap_or_default();
        if stats.pls.is_none() {
            stats.pls = Some(PlsTracker::new(total_samples.max(1), job.cluster.ps));
        }
        Ok(Self {
            cfg: job.checkpoint.clone(),
            store: Arc::new(store),
            shm_ns,
            token: token.to_string(),
            max_bytes: job.cluster.max_message_bytes,
            fingerprint: Mutex::new(fingerprint),
            num_ps: std::sync::atomic::AtomicU32::new(job.cluster.ps),
            force_full: AtomicBool::new(false),
            total_samples: total_samples.max(1),
            started: Instant::now(),
            stats: Mutex::new(stats),
            busy: AtomicBool::new(false),
            last_commit: Mutex::new(None),
            pending: Mutex::new(None),
            origin: Mutex::new(None),
        })
    }

    /// Records the checkpoint this job started from: a PS failing before the job's own
    /// first checkpoint is restored from it.
    pub fn set_origin(&self, origin: (Manifest, RestorePlan, DataPosition)) {
        *self.origin.lock() = Some(origin);
    }

    /// The checkpoint storage.
    pub fn store(&self) -> &Arc<CheckpointStore> {
        &self.store
    }

    /// Shared-memory namespace of this job's PS images.
    pub fn shm_namespace(&self) -> &str {
        &self.shm_ns
    }

    /// A copy of the statistics.
    pub fn stats(&self) -> CheckpointStats {
        self.stats.lock().clone()
    }

    /// Seconds since this coordinator started, on the clock reading `now`.
    fn elapsed_s(&self, now: Instant) -> f64 {
        now.saturating_duration_since(self.started).as_secs_f64()
    }

    fn costs(&self, st: &CheckpointStats, now: Instant) -> CprCosts {
        let o_save_s = if st.count > 0 {
            st.stall_ms() / 1e3
        } else {
            ASSUMED_SAVE_S
        };
        // Loading reads what saving wrote: until a recovery measured it, the persistence
        // time of a checkpoint stands in for it.
        let o_load_s = st.o_load_s.unwrap_or(if st.count > 0 {
            st.persist_s_sum / st.count as f64
        } else {
            ASSUMED_SAVE_S
        });
        let failures = st.recoveries.len() as f64;
        let elapsed = self.elapsed_s(now);
        let t_fail_s = if failures > 0.0 {
            // Observed rate, never more optimistic than the configured one.
            (elapsed / failures).min(self.cfg.mtbf_s)
        } else {
            self.cfg.mtbf_s
        };
        CprCosts {
            o_save_s,
            o_load_s,
            o_res_s: st.o_res_s.unwrap_or(ASSUMED_RESCHEDULE_S),
            t_fail_s,
        }
    }

    /// CPR's decision from the current measurements (`samples_done` estimates the job
    /// length), with the configured mode forced unless `recovery = "auto"`.
    pub fn decision(&self, samples_done: u64) -> RecoveryDecision {
        self.decision_at(Instant::now(), samples_done)
    }

    /// [`Coordinator::decision`] at clock reading `now` (the policy reads no clock itself).
    pub fn decision_at(&self, now: Instant, samples_done: u64) -> RecoveryDecision {
        let st = self.stats.lock();
        let c = self.costs(&st, now);
        let elapsed = self.elapsed_s(now).max(1.0);
        let rate = samples_done as f64 / elapsed;
        let t_total = if self.total_samples <= 1 {
            // An online job has no end: CPR's job length becomes a day of training.
            ONLINE_HORIZON_S
        } else if rate > 0.0 {
            self.total_samples as f64 / rate
        } else {
            self.cfg.mtbf_s
        };
        let mut d = decide(
            &c,
            t_total,
            self.num_ps(),
            self.cfg.target_pls,
            self.cfg.min_benefit,
        );
        let forced = match self.cfg.recovery {
            RecoveryChoice::Auto => None,
            RecoveryChoice::Full => Some(RecoveryMode::Full),
            RecoveryChoice::Partial => Some(RecoveryMode::Partial),
        };
        if let Some(m) = forced {
            if m != d.mode {
                d.reason = format!("{m} recovery (configured); CPR would choose {}", d.reason);
                d.mode = m;
            } else {
                d.reason = format!("{m} recovery (configured, CPR agrees); {}", d.reason);
            }
        }
        d
    }

    /// Seconds between full checkpoints now.
    pub fn interval_s(&self, samples_done: u64) -> f64 {
        self.interval_s_at(Instant::now(), samples_done)
    }

    /// [`Coordinator::interval_s`] at clock reading `now`.
    pub fn interval_s_at(&self, now: Instant, samples_done: u64) -> f64 {
        if self.cfg.interval_s > 0.0 {
            return self.cfg.interval_s;
        }
        let (count, persist_s) = {
            let st = self.stats.lock();
            (st.count, st.persist_s_sum / st.count.max(1) as f64)
        };
        if count == 0 {
            return FIRST_CHECKPOINT_S;
        }
        // A flash checkpoint barely stalls training, so CPR's optimum can be very short;
        // background persistence still costs CPU and I/O: keep it under half the time.
        let floor = INTERVAL_BOUNDS_S.0.max(2.0 * persist_s);
        self.decision_at(now, samples_done)
            .t_save_s()
            .clamp(floor, INTERVAL_BOUNDS_S.1.max(floor))
    }

    /// Seconds between checkpoints of any kind (deltas come `1/ratio` times as often).
    fn period_s(&self, now: Instant, samples_done: u64) -> f64 {
        let full = self.interval_s_at(now, samples_done);
        match self.cfg.priority {
            SavePriority::None => full,
            _ => full * self.cfg.ratio,
        }
    }

    /// PS count of the layout in force.
    pub fn num_ps(&self) -> u32 {
        self.num_ps.load(Ordering::Acquire)
    }

    /// The PS layout changed to `num_ps` servers: checkpoints are written by them from now
    /// on, and the next one is full.
    pub fn layout_changed(&self, num_ps: u32) {
        self.num_ps.store(num_ps, Ordering::Release);
        self.force_full.store(true, Ordering::Release);
        if let Some(p) = self.stats.lock().pls.as_mut() {
            p.n_emb = num_ps;
        }
    }

    /// True while a checkpoint is being taken.
    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    /// True when a checkpoint is due and none is running.
    pub fn due(&self, samples_done: u64) -> bool {
        self.due_at(Instant::now(), samples_done)
    }

    /// [`Coordinator::due`] at clock reading `now`.
    pub fn due_at(&self, now: Instant, samples_done: u64) -> bool {
        if !self.cfg.enabled || self.busy.load(Ordering::Relaxed) {
            return false;
        }
        let last = self.last_commit.lock().unwrap_or(self.started);
        let since = now.saturating_duration_since(last).as_secs_f64();
        since >= self.period_s(now, samples_done)
    }

    /// Takes a checkpoint now: data position, flash copy on every PS, master part,
    /// manifest last, then retention. Nothing is committed if any part fails.
    pub async fn checkpoint(&self, core: &MasterCore, reason: &str) -> anyhow::Result<Manifest> {
        if self.busy.swap(true, Ordering::AcqRel) {
            bail!("a checkpoint is already being taken");
        }
        // A PS or the storage that never answers must not leave `busy` set forever (that
        // would silently stop every later checkpoint): the whole checkpoint has a deadline.
        let r = match tokio::time::timeout(self.cfg.timeout(), self.checkpoint_inner(core, reason))
            .await
        {
            Ok(r) => r,
            Err(_) => Err(anyhow::anyhow!(
                "checkpoint not committed within checkpoint.timeout_s = {} s; abandoned",
                self.cfg.timeout_s
            )),
        };
        self.busy.store(false, Ordering::Release);
        r
    }

    /// [`Coordinator::checkpoint`] on a blocking thread of the current runtime, beside the
    /// control loop and the gRPC handlers: its future is not `Send` (object_store's
    /// streams borrow), which a spawned task or a tonic handler must be.
    pub fn spawn_checkpoint(
        self: &Arc<Self>,
        core: Arc<MasterCore>,
        reason: &'static str,
    ) -> tokio::task::JoinHandle<anyhow::Result<Manifest>> {
        let (c, rt) = (self.clone(), tokio::runtime::Handle::current());
        tokio::task::spawn_blocking(move || rt.block_on(c.checkpoint(&core, reason)))
    }

    async fn checkpoint_inner(&self, core: &MasterCore, reason: &str) -> anyhow::Result<Manifest> {
        let (pos, step, addrs) = {
            let job = core.job.lock();
            let step = job
                .nodes()
                .filter(|n| n.role == crate::job::Role::Ps && n.state.is_live())
                .map(|n| n.step)
                .max()
                .unwrap_or(0);
            (job.data_position(), step, job.ps_addrs())
        };
        let addrs = addrs.context("not every parameter server is up")?;
        let id = self.store.next_id().await?;
        let ratio = self.cfg.ratio;
        let forced_full = self.force_full.swap(false, Ordering::AcqRel);
        let delta = {
            let st = self.stats.lock();
            let per_full = (1.0 / ratio).round().max(1.0) as u32;
            self.cfg.priority != SavePriority::None
                && st.count > 0
                && st.deltas_since_full + 1 < per_full
                && !forced_full
        };
        let shm_namespace = if self.cfg.shm {
            self.shm_ns.clone()
        } else {
            String::new()
        };
        // Plain loop, not an iterator of closures: the spawned futures must not borrow.
        let mut handles = Vec::with_capacity(addrs.len());
        for (i, a) in addrs.iter().enumerate() {
            let client = rpc::ps_client(a, &self.token, self.max_bytes, self.cfg.timeout());
            let req = CheckpointRequest {
                version: rpc::version(),
                id,
                location: self.cfg.location.clone(),
                delta,
                ratio,
                shm_namespace: shm_namespace.clone(),
            };
            handles.push(tokio::spawn(async move {
                let mut c = client?;
                c.checkpoint(req)
                    .await
                    .map(|r| r.into_inner())
                    .with_context(|| format!("checkpoint {id} on PS {i}"))
            }));
        }
        let mut parts = Vec::with_capacity(addrs.len() + 1);
        let (mut stall, mut memcpy, mut persist) = (0u64, 0u64, 0u64);
        for h in handles {
            let r = h.await.context("checkpoint task")??;
            stall = stall.max(r.stall_us);
            memcpy = memcpy.max(r.memcpy_us);
            persist = persist.max(r.persist_us);
            parts.push(PartMeta {
                name: r.part,
                bytes: r.bytes,
                checksum: r.checksum,
            });
        }
        let master = serde_json::to_vec(&pos)?;
        parts.push(
            self.store
                .put_part(id, MASTER_PART, bytes::Bytes::from(master))
                .await?,
        );
        let last_id = self.stats.lock().last_id;
        let mut info = BTreeMap::new();
        info.insert("reason".into(), reason.into());
        info.insert("stall_ms".into(), (stall as f64 / 1e3).into());
        info.insert("memcpy_ms".into(), (memcpy as f64 / 1e3).into());
        info.insert("persist_s".into(), (persist as f64 / 1e6).into());
        info.insert(
            "fingerprint_parts".into(),
            serde_json::to_value(&*self.fingerprint.lock())?,
        );
        let manifest = Manifest {
            id,
            created_ms: now_ms(),
            fingerprint: self.fingerprint.lock().digest(),
            kind: if delta {
                CheckpointKind::Delta { base: last_id }
            } else {
                CheckpointKind::Full
            },
            num_ps: self.num_ps(),
            step,
            samples: pos.samples(),
            parts,
            info,
        };
        self.store.commit(&manifest).await?;
        let deleted = self.store.retain(self.cfg.keep).await?;
        let bytes = manifest.total_bytes();
        let snapshot = {
            let mut st = self.stats.lock();
            st.count += 1;
            st.last_id = id;
            st.last_ms = manifest.created_ms;
            *self.last_commit.lock() = Some(Instant::now());
            st.deltas_since_full = if delta { st.deltas_since_full + 1 } else { 0 };
            st.stall_ms_sum += stall as f64 / 1e3;
            st.memcpy_ms_sum += memcpy as f64 / 1e3;
            st.persist_s_sum += persist as f64 / 1e6;
            st.bytes_sum += bytes;
            if let Some(p) = st.pls.as_mut() {
                p.on_checkpoint(manifest.samples);
            }
            st.clone()
        };
        self.persist(core, &snapshot).await;
        event!("checkpoint", id, delta, reason, bytes, samples = manifest.samples, stall_ms = stall as f64 / 1e3, memcpy_ms = memcpy as f64 / 1e3, persist_s = persist as f64 / 1e6,
            "checkpoint {id} ({}, {reason}): {:.1} MB from {} PS at {} samples; stall {:.2} ms (memory copy {:.2} ms), persisted in {:.2} s{}",
            if delta { "delta" } else { "full" },
            bytes as f64 / 1e6,
            self.num_ps(),
            manifest.samples,
            stall as f64 / 1e3,
            memcpy as f64 / 1e3,
            persist as f64 / 1e6,
            if deleted.is_empty() {
                String::new()
            } else {
                format!("; removed {deleted:?}")
            }
        );
        Ok(manifest)
    }

    async fn persist(&self, core: &MasterCore, stats: &CheckpointStats) {
        let text = serde_json::to_string(stats).expect("stats serialize");
        if let Err(e) = core
            .persist(vec![Change::Meta("checkpoint_stats", text)])
            .await
        {
            tracing::warn!(error = %e, "could not persist checkpoint statistics");
        }
    }

    /// The newest intact checkpoint, its restore plan and data position (`None`: none
    /// exists yet; restore means initialization).
    pub async fn latest(&self) -> anyhow::Result<Option<(Manifest, RestorePlan, DataPosition)>> {
        let Some(m) = self.store.latest_valid().await? else {
            return Ok(self.origin.lock().clone());
        };
        self.plan_for(m).await.map(Some)
    }

    /// The restore plan and data position of checkpoint `m` of this job's storage.
    pub async fn plan_for(
        &self,
        m: Manifest,
    ) -> anyhow::Result<(Manifest, RestorePlan, DataPosition)> {
        let shm = if self.cfg.shm {
            self.shm_ns.as_str()
        } else {
            ""
        };
        let fingerprint = self.fingerprint.lock().clone();
        plan_from(&self.store, &self.cfg.location, shm, &fingerprint, m).await
    }

    /// A following job's new files: later checkpoints name them.
    pub fn add_files(&self, files: &[(String, u64)]) {
        self.fingerprint.lock().files.extend(file_names(files));
    }

    /// Recovers failed parameter servers: partial (relaunch them on their last part) or
    /// full (every node and the data position back to the last checkpoint).
    pub async fn recover(&self, core: &MasterCore, failures: Vec<PsFailure>) -> anyhow::Result<()> {
        self.recover_as(core, failures, None).await
    }

    /// Full recovery whatever the policy (the whole job crashed: nothing else kept its
    /// progress).
    pub async fn recover_full(
        &self,
        core: &MasterCore,
        failures: Vec<PsFailure>,
    ) -> anyhow::Result<()> {
        self.recover_as(core, failures, Some(RecoveryMode::Full))
            .await
    }

    async fn recover_as(
        &self,
        core: &MasterCore,
        failures: Vec<PsFailure>,
        force: Option<RecoveryMode>,
    ) -> anyhow::Result<()> {
        let samples_now = failures
            .iter()
            .map(|f| f.samples)
            .max()
            .unwrap_or(0)
            .max(core.job.lock().samples_done());
        let mut decision = self.decision(samples_now);
        if let Some(m) = force {
            if m != decision.mode {
                decision.reason = format!(
                    "{m} recovery (the whole job restarted); {}",
                    decision.reason
                );
                decision.mode = m;
            }
        }
        let latest = self.latest().await?;
        let (ckpt, plan, pos) = match latest {
            Some((m, plan, pos)) => (Some(m.id), Some(plan), pos),
            None => {
                let job = core.job.lock();
                let starts = job
                    .tasks()
                    .is_stream()
                    .then(|| job.tasks().file_start().to_vec());
                (None, None, empty_position(starts))
            }
        };
        core.set_restore_plan(plan);
        let ps: Vec<u32> = failures.iter().map(|f| f.index).collect();
        let mut pls_added = 0.0;
        match decision.mode {
            RecoveryMode::Partial => {
                {
                    let mut st = self.stats.lock();
                    if let Some(p) = st.pls.as_mut() {
                        pls_added = p.on_failure(samples_now, ps.len() as u32);
                    }
                }
                let restarts: Vec<(u32, u32)> = {
                    let job = core.job.lock();
                    failures
                        .iter()
                        .map(|f| (f.index, job.node(f.node).map_or(0, |n| n.restarts) + 1))
                        .collect()
                };
                core.run(|job, cx| {
                    for &(index, restarts) in &restarts {
                        job.relaunch_ps(index, restarts, cx);
                    }
                })
                .await
                .context("master state")?;
            }
            RecoveryMode::Full => {
                let (spec, rows, following) = {
                    let job = core.job.lock();
                    let q = job.tasks();
                    (q.spec().clone(), q.file_rows().to_vec(), q.is_following())
                };
                let mut queue = TaskQueue::from_position(spec, rows, &pos);
                if following {
                    // Files that landed after the checkpoint get their tasks back.
                    queue.follow();
                }
                let closed = pos.epochs_closed.clone();
                core.run(|job, cx| job.full_restore(queue, closed, cx))
                    .await
                    .context("master state")?;
                self.stats.lock().retrained_samples += samples_now.saturating_sub(pos.samples());
            }
        }
        let record = RecoveryRecord {
            at_ms: now_ms(),
            ps: ps.clone(),
            reason: failures
                .iter()
                .map(|f| f.reason.as_str())
                .collect::<Vec<_>>()
                .join("; "),
            mode: decision.mode,
            checkpoint: ckpt,
            samples_at_failure: samples_now,
            samples_at_checkpoint: pos.samples(),
            pls_added,
            seconds: None,
            decision: decision.reason.clone(),
        };
        event!("ps_recovery", ps = ?ps, mode = %decision.mode, checkpoint = ?ckpt, reason = %decision.reason,
            "master: recovering PS {ps:?} ({}) from {}: {}",
            decision.mode,
            ckpt.map_or("initialization".to_string(), |c| format!("checkpoint {c}")),
            decision.reason
        );
        let snapshot = {
            let mut st = self.stats.lock();
            st.recoveries.push(record);
            st.decision = Some(decision);
            *self.pending.lock() = Some((st.recoveries.len() - 1, Instant::now()));
            st.clone()
        };
        self.persist(core, &snapshot).await;
        Ok(())
    }

    /// Called every control-loop tick: closes a recovery once every PS serves again.
    pub async fn observe(&self, core: &MasterCore) {
        let done = {
            let p = self.pending.lock();
            match *p {
                Some((i, t0)) if core.job.lock().ps_addrs().is_some() => Some((i, t0)),
                _ => None,
            }
        };
        let Some((i, t0)) = done else { return };
        *self.pending.lock() = None;
        let secs = t0.elapsed().as_secs_f64();
        let snapshot = {
            let mut st = self.stats.lock();
            if let Some(r) = st.recoveries.get_mut(i) {
                r.seconds = Some(secs);
            }
            // Load and rescheduling are not separated from outside the PS; the whole
            // time bounds both (an overestimate, which only favours full recovery).
            st.o_res_s = Some(secs);
            st.o_load_s = Some(secs);
            st.clone()
        };
        event!(
            "ps_recovered",
            seconds = secs,
            "master: every PS serves again {secs:.2} s after the failure"
        );
        self.persist(core, &snapshot).await;
    }

    /// The status block.
    pub fn status(&self, samples_done: u64) -> CheckpointStatus {
        let st = self.stats.lock().clone();
        let decision = self.decision(samples_done);
        CheckpointStatus {
            count: st.count,
            last_id: st.last_id,
            last_age_s: if st.last_ms == 0 {
                0.0
            } else {
                now_ms().saturating_sub(st.last_ms) as f64 / 1e3
            },
            interval_s: self.interval_s(samples_done),
            pls: st.pls.as_ref().map_or(0.0, PlsTracker::pls),
            recovery: decision.reason,
            stall_ms: st.stall_ms(),
            memcpy_ms: st.memcpy_ms(),
            recoveries: st.recoveries.len() as u32,
        }
    }

    /// The result-JSON block.
    pub fn report(&self, samples_done: u64) -> CheckpointReport {
        let stats = self.stats();
        CheckpointReport {
            location: self.store.location(),
            pls: stats.pls.as_ref().map_or(0.0, PlsTracker::pls),
            stall_ms: stats.stall_ms(),
            memcpy_ms: stats.memcpy_ms(),
            persist_mb_s: stats.persist_mb_s(),
            interval_s: self.interval_s(samples_done),
            stats,
        }
    }

    /// Removes this job's shared-memory images (at the end of the job).
    pub fn remove_shm(&self) {
        if let Ok(root) = ShmRoot::open_default() {
            let _ = root.remove_namespace(&self.shm_ns);
        }
    }
}

/// The restore plan and data position of checkpoint `m` in `store`, after checking that it
/// belongs to a job with this model, optimizer and data (`fingerprint`).
pub async fn plan_from(
    store: &CheckpointStore,
    location: &str,
    shm_ns: &str,
    fingerprint: &Fingerprint,
    m: Manifest,
) -> anyhow::Result<(Manifest, RestorePlan, DataPosition)> {
    if let Some(fp) = m.info.get("fingerprint_parts") {
        let theirs: Fingerprint = serde_json::from_value(fp.clone())?;
        if let Some(why) = fingerprint.mismatch(&theirs) {
            bail!(
                "checkpoint {} in {} belongs to another job: {why}",
                m.id,
                store.location()
            );
        }
    }
    let chain = store.chain(&m).await?;
    let pos: DataPosition = serde_json::from_slice(&store.read_part(&m, MASTER_PART).await?)
        .with_context(|| format!("checkpoint {}: {MASTER_PART}", m.id))?;
    let plan = RestorePlan {
        location: location.to_string(),
        chain: chain.iter().map(|c| c.id).collect(),
        num_ps: m.num_ps,
        shm_namespace: shm_ns.to_string(),
    };
    Ok((m, plan, pos))
}

/// Checkpoint `id` (default: the newest intact one) of another job's storage, for
/// Opens the checkpoint store at `location`; an error names the location with any
/// secret in it hidden (credentials come from the environment, never from a location).
pub fn open_store(location: &str) -> anyhow::Result<CheckpointStore> {
    CheckpointStore::open(location).with_context(|| {
        format!(
            "checkpoint location `{}` cannot be opened",
            redact_location(location)
        )
    })
}

/// `elastrec run --from-checkpoint`.
pub async fn load_foreign(
    location: &str,
    id: Option<u64>,
    fingerprint: &Fingerprint,
) -> anyhow::Result<(Manifest, RestorePlan, DataPosition)> {
    let store = open_store(location)?;
    let m = match id {
        Some(id) => {
            let m = store.manifest(id).await?;
            store.verify(&m).await?;
            m
        }
        None => store
            .latest_valid()
            .await?
            .with_context(|| format!("{} holds no intact checkpoint", redact_location(location)))?,
    };
    plan_from(&store, location, "", fingerprint, m).await
}

/// The job length CPR plans an online job's checkpoints over (it never ends), seconds.
const ONLINE_HORIZON_S: f64 = 86_400.0;

/// The position before any training; an online job's (`stream_starts`) begins at its
/// partitions' start offsets.
pub fn empty_position(stream_starts: Option<Vec<u64>>) -> DataPosition {
    DataPosition {
        tasks: Vec::new(),
        spans: Vec::new(),
        counts: Vec::new(),
        generated_epochs: 0,
        epochs_closed: Vec::new(),
        stream_starts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn coordinator(interval_s: f64) -> (Coordinator, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let mut job = JobConfig::default();
        job.checkpoint.location = dir.path().to_string_lossy().into_owned();
        job.checkpoint.interval_s = interval_s;
        let c = Coordinator::new(
            &job,
            Fingerprint::of(&job, &[]),
            1000,
            "t",
            "ns".into(),
            None,
        )
        .unwrap();
        (c, dir)
    }

    /// The schedule reads no clock of its own: checkpoints fall due on the clock reading
    /// it is given, from the start, then from the last commit; never while one runs.
    #[test]
    fn checkpoints_fall_due_on_the_injected_clock() {
        let s = Duration::from_secs_f64;
        let (c, _d) = coordinator(10.0);
        let t0 = c.started;
        assert!(!c.due_at(t0 + s(9.9), 0));
        assert!(c.due_at(t0 + s(10.0), 0));
        *c.last_commit.lock() = Some(t0 + s(10.0));
        assert!(!c.due_at(t0 + s(19.9), 0));
        assert!(c.due_at(t0 + s(20.0), 0));
        c.busy.store(true, Ordering::Relaxed);
        assert!(!c.due_at(t0 + s(30.0), 0), "one checkpoint at a time");
        // Chosen by the policy: the first one comes early, to measure the save cost.
        let (p, _d) = coordinator(0.0);
        assert_eq!(p.interval_s_at(p.started, 0), FIRST_CHECKPOINT_S);
        assert!(!p.due_at(p.started + s(FIRST_CHECKPOINT_S - 0.1), 0));
        assert!(p.due_at(p.started + s(FIRST_CHECKPOINT_S), 0));
    }

    #[test]
    fn fingerprint_names_the_section_that_differs() {
        let job = JobConfig::default();
        let files = vec![("/d/day_0.tsv".to_string(), 100)];
        let a = Fingerprint::of(&job, &files);
        assert_eq!(a.files[0].0, "day_0.tsv");
        assert!(a.mismatch(&a.clone()).is_none());
        let mut other = job.clone();
        other.model.embedding_dim += 1;
        let b = Fingerprint::of(&other, &files);
        assert_ne!(a.digest(), b.digest());
        assert!(a.mismatch(&b).unwrap().contains("[model]"));
        let c = Fingerprint::of(&job, &[("/d/day_0.tsv".to_string(), 99)]);
        assert!(a.mismatch(&c).unwrap().contains("training files"));
    }
}
