//! The checkpoint coordinator of the job master: when to checkpoint (CPR's interval from
//! measured costs), how (flash checkpoints of every PS, then the data position, then the
//! manifest), and how a dead parameter server is recovered (full, partial, or CPR's choice).
//!
//! Consistency: the data position is taken *before* the servers copy their state. Every
//! sample it counts was reported, hence already applied on every PS, so nothing counted is
//! missing from the model; a batch applied between the two moments is in the model but not
//! in the position and is trained again after a full restore (at most one batch per worker,
//! the same window as a worker death; see docs/checkpoints.md).

mod fingerprint;

use fingerprint::file_names;
pub use fingerprint::Fingerprint;
// The policy this coordinator executes.
pub use elastrec_control::checkpoint::{CheckpointPolicy, CheckpointStats, Commit, RecoveryRecord};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context as _};
use elastrec_checkpoint::format::{CheckpointKind, Manifest, PartMeta};
use elastrec_checkpoint::shm::ShmRoot;
use elastrec_checkpoint::store::{redact_location, CheckpointStore};
use elastrec_control::cpr::{PlsTracker, RecoveryDecision, RecoveryMode};
use elastrec_job::config::JobConfig;
use elastrec_job::distributed::CheckpointConfig;
use elastrec_proto::master::{CheckpointStatus, RestorePlan};
use elastrec_proto::ps::CheckpointRequest;
use elastrec_rpc as rpc;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::core::{monotonic_ms, now_ms, MasterCore};
use crate::events::event;
use crate::job::{Change, PsFailure};
use crate::tasks::{DataPosition, TaskQueue};

/// Name of the master's part (the data position) in every checkpoint.
pub const MASTER_PART: &str = "master.json";

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

/// The coordinator: executes what its [`CheckpointPolicy`] decides (flash checkpoints
/// on every PS, recoveries through the state machine) and feeds it what they measured.
pub struct Coordinator {
    cfg: CheckpointConfig,
    store: Arc<CheckpointStore>,
    shm_ns: String,
    token: String,
    max_bytes: usize,
    /// What the job's checkpoints belong to (its files grow in a following job).
    fingerprint: Mutex<Fingerprint>,
    policy: Mutex<CheckpointPolicy>,
    /// Held while a checkpoint is being taken: one at a time, the others queue behind it.
    running: tokio::sync::Mutex<()>,
    /// The checkpoint a job started from (`--from-checkpoint`), used until it has its own.
    origin: Mutex<Option<(Manifest, RestorePlan, DataPosition)>>,
    /// Servers relaunched by the partial recovery in progress: they take their dense slice
    /// from their successor's replica (see `elastrec_ps`'s dense replicas).
    dense_from_replica: Mutex<std::collections::BTreeSet<u32>>,
    /// The highest checkpoint id this master asked the servers for: an id is never asked
    /// for twice, even when its attempt failed before any part reached storage (a
    /// server that was cut off may still write its part of that id later).
    attempted: std::sync::atomic::AtomicU64,
}

impl Coordinator {
    /// A coordinator for `job`; `stats` come from the master database after a restart.
    pub fn new(
        job: &JobConfig,
        fingerprint: Fingerprint,
        total_samples: u64,
        token: &str,
        shm_ns: String,
        stats: Option<CheckpointStats>,
    ) -> anyhow::Result<Self> {
        let store = open_store(&job.checkpoint.location)?;
        Ok(Self {
            cfg: job.checkpoint.clone(),
            store: Arc::new(store),
            shm_ns,
            token: token.to_string(),
            max_bytes: job.cluster.max_message_bytes,
            fingerprint: Mutex::new(fingerprint),
            policy: Mutex::new(CheckpointPolicy::new(
                job.checkpoint.policy_settings(),
                job.cluster.ps,
                total_samples,
                stats,
                monotonic_ms(),
            )),
            running: tokio::sync::Mutex::new(()),
            dense_from_replica: Mutex::new(Default::default()),
            origin: Mutex::new(None),
            attempted: Default::default(),
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

    /// Where checkpoints go (as configured).
    pub fn location(&self) -> &str {
        &self.cfg.location
    }

    /// Id of the newest committed checkpoint (0: none yet).
    pub fn last_id(&self) -> u64 {
        self.policy.lock().stats().last_id
    }

    /// Shared-memory namespace of this job's PS images.
    pub fn shm_namespace(&self) -> &str {
        &self.shm_ns
    }

    /// A copy of the statistics.
    pub fn stats(&self) -> CheckpointStats {
        self.policy.lock().stats().clone()
    }

    /// CPR's decision now (`samples_done` estimates the job length).
    pub fn decision(&self, samples_done: u64) -> RecoveryDecision {
        self.policy.lock().decision(monotonic_ms(), samples_done)
    }

    /// Seconds between full checkpoints now.
    pub fn interval_s(&self, samples_done: u64) -> f64 {
        self.policy.lock().interval_s(monotonic_ms(), samples_done)
    }

    /// PS count of the layout in force.
    pub fn num_ps(&self) -> u32 {
        self.policy.lock().num_ps()
    }

    /// The PS layout changed to `num_ps` servers: checkpoints are written by them from now
    /// on, and the next one is full.
    pub fn layout_changed(&self, num_ps: u32) {
        self.policy.lock().layout_changed(num_ps);
    }

    /// True while a checkpoint is being taken.
    pub fn busy(&self) -> bool {
        self.running.try_lock().is_err()
    }

    /// True when a checkpoint is due and none is running.
    pub fn due(&self, samples_done: u64) -> bool {
        self.due_at(monotonic_ms(), samples_done)
    }

    /// [`Coordinator::due`] at clock reading `now`.
    fn due_at(&self, now: u64, samples_done: u64) -> bool {
        !self.busy() && self.policy.lock().due(now, samples_done)
    }

    /// Takes a checkpoint now: data position, flash copy on every PS, master part,
    /// manifest last, then retention. Nothing is committed if any part fails.
    ///
    /// One already being taken (a periodic one, say) is waited for first, and then this
    /// one is taken: whoever asks for a checkpoint (`elastrec checkpoint`, `stop`) wants
    /// the state from now, and must not be refused because the interval fell due just
    /// before. The wait is bounded by the running checkpoint's own deadline.
    pub async fn checkpoint(&self, core: &MasterCore, reason: &str) -> anyhow::Result<Manifest> {
        let Ok(_turn) = tokio::time::timeout(self.cfg.timeout(), self.running.lock()).await else {
            bail!(
                "the checkpoint already being taken did not end within checkpoint.timeout_s = {} s",
                self.cfg.timeout_s
            );
        };
        // A PS or the storage that never answers must not hold the turn forever (that
        // would silently stop every later checkpoint): the whole checkpoint has a deadline.
        let started = Instant::now();
        let abandoned = || {
            format!(
                "checkpoint not committed within checkpoint.timeout_s = {} s; abandoned",
                self.cfg.timeout_s
            )
        };
        match tokio::time::timeout(self.cfg.timeout(), self.checkpoint_inner(core, reason)).await {
            // A PS call carries the same deadline, started a moment later; when both
            // expire in one timer tick the call's transport error may win the race. It is
            // the same abandonment and says so, with the call's error as the cause.
            Ok(Err(e)) if started.elapsed() >= self.cfg.timeout() => Err(e.context(abandoned())),
            Ok(r) => r,
            Err(_) => Err(anyhow::anyhow!(abandoned())),
        }
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
        let id = self.fresh_id().await?;
        let ratio = self.cfg.ratio;
        let delta = self.policy.lock().next_is_delta();
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
        let last_id = self.policy.lock().stats().last_id;
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
            let mut p = self.policy.lock();
            p.committed(
                monotonic_ms(),
                &Commit {
                    id,
                    created_ms: manifest.created_ms,
                    delta,
                    samples: manifest.samples,
                    stall_us: stall,
                    memcpy_us: memcpy,
                    persist_us: persist,
                    bytes,
                },
            );
            p.stats().clone()
        };
        self.persist(core, &snapshot).await;
        event!(
            "checkpoint",
            id,
            delta,
            reason,
            bytes,
            samples = manifest.samples,
            stall_ms = stall as f64 / 1e3,
            memcpy_ms = memcpy as f64 / 1e3,
            persist_s = persist as f64 / 1e6,
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

    /// The id of the next checkpoint: past every one in storage and every one attempted
    /// (checkpoints are taken one at a time, under `running`).
    async fn fresh_id(&self) -> anyhow::Result<u64> {
        use std::sync::atomic::Ordering;
        let stored = self.store.next_id().await?;
        let id = stored.max(self.attempted.load(Ordering::Acquire) + 1);
        self.attempted.store(id, Ordering::Release);
        Ok(id)
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

    /// Whether PS `index`, registering now, was relaunched by a partial recovery (its dense
    /// slice then comes from its successor's replica, not the checkpoint).
    pub fn dense_from_replica(&self, index: u32) -> bool {
        self.dense_from_replica.lock().contains(&index)
    }

    /// A relaunched PS spent `secs` loading its checkpoint (and replica): CPR's `O_load`
    /// of the recovery in progress. `rewound`: the node id of a PS that could not take its
    /// dense slice from the replica (its slice is the checkpoint's).
    pub fn ps_restored(&self, secs: f64, rewound: Option<u32>) {
        let mut p = self.policy.lock();
        p.loaded(secs);
        if let Some(node) = rewound {
            p.dense_rewound();
            event!(
                warn,
                "ps_dense_rewound",
                node = node,
                "master: the PS relaunched as node {node} could not take its dense slice from \
                 its successor's replica; the slice is the checkpoint's, behind the rest of \
                 the dense model"
            );
        }
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
        let decision = self
            .policy
            .lock()
            .recovery_decision(monotonic_ms(), samples_now, force);
        let latest = self.latest().await?;
        let (ckpt, plan, pos) = match latest {
            Some((m, plan, pos)) => (Some(m.id), Some(plan), pos),
            None => (None, None, core.job.lock().tasks().start_position()),
        };
        core.set_restore_plan(plan);
        let ps: Vec<u32> = failures.iter().map(|f| f.index).collect();
        let mut pls_added = 0.0;
        match decision.mode {
            RecoveryMode::Partial => {
                pls_added = self
                    .policy
                    .lock()
                    .partial_loss(samples_now, ps.len() as u32);
                self.dense_from_replica.lock().extend(&ps);
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
                self.dense_from_replica.lock().clear();
                let (spec, rows, following, counting) = {
                    let job = core.job.lock();
                    let q = job.tasks();
                    let counting = q.is_growing() && !q.is_following();
                    let expected = counting.then(|| q.rows_per_epoch());
                    (
                        q.spec().clone(),
                        q.file_rows().to_vec(),
                        q.is_following(),
                        expected,
                    )
                };
                // Files that landed or were counted after the checkpoint get their tasks
                // back (in epoch 0).
                let mut queue = TaskQueue::from_position(spec, rows, &pos);
                if following {
                    queue.follow();
                } else if let Some(expected) = counting {
                    queue.count_later(expected);
                }
                let closed = pos.epochs_closed.clone();
                core.run(|job, cx| job.full_restore(queue, closed, cx))
                    .await
                    .context("master state")?;
                self.policy
                    .lock()
                    .retrained(samples_now.saturating_sub(pos.samples()));
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
            load_s: None,
            dense_rewound: false,
            decision: decision.reason.clone(),
        };
        event!(
            "ps_recovery",
            ps = ?ps,
            mode = %decision.mode,
            checkpoint = ckpt,
            reason = %decision.reason,
            "master: recovering PS {ps:?} ({}) from {}: {}",
            decision.mode,
            ckpt.map_or("initialization".to_string(), |c| format!("checkpoint {c}")),
            decision.reason
        );
        let snapshot = {
            let mut p = self.policy.lock();
            p.recovery_started(monotonic_ms(), record, decision);
            p.stats().clone()
        };
        self.persist(core, &snapshot).await;
        Ok(())
    }

    /// Called every control-loop tick: closes a recovery once every PS serves again.
    pub async fn observe(&self, core: &MasterCore) {
        if !self.policy.lock().recovering() || core.job.lock().ps_addrs().is_none() {
            return;
        }
        let Some((secs, snapshot)) = ({
            let mut p = self.policy.lock();
            p.recovered(monotonic_ms()).map(|s| (s, p.stats().clone()))
        }) else {
            return;
        };
        self.dense_from_replica.lock().clear();
        event!(
            "ps_recovered",
            seconds = secs,
            "master: every PS serves again {secs:.2} s after the failure"
        );
        self.persist(core, &snapshot).await;
    }

    /// The status block.
    pub fn status(&self, samples_done: u64) -> CheckpointStatus {
        let st = self.stats();
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
            taking: self.busy(),
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
    let m = pick(&store, location, id).await?;
    plan_from(&store, location, "", fingerprint, m).await
}

/// Checkpoint `id` of `store` after verifying it, or (no id) the newest intact one.
pub async fn pick(
    store: &CheckpointStore,
    location: &str,
    id: Option<u64>,
) -> anyhow::Result<Manifest> {
    match id {
        Some(id) => {
            let m = store.manifest(id).await?;
            store.verify(&m).await?;
            Ok(m)
        }
        None => store
            .latest_valid()
            .await?
            .with_context(|| format!("{} holds no intact checkpoint", redact_location(location))),
    }
}

#[cfg(test)]
mod tests;
