//! The PS state ([`PsShard`]): its embedding shard, dense slice and optimizers, pulls,
//! pushes (asynchronous or one synchronous step at a time) and layout checks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use elastrec_checkpoint::priority::{large_tables, SsuList};
use elastrec_embedding::{
    EmbeddingConfig, EmbeddingError, EmbeddingStore, ShardSpec, TableScratch,
};
use elastrec_job::config::JobConfig;
use elastrec_job::distributed::{SavePriority, SyncMode};
use elastrec_job::prepare::dense_model;
use elastrec_model::{DenseOptimizer, DenseOptimizerConfig};
use elastrec_proto::ps::{BatchKey, PullRequest, PullResponse, PushRequest, PushResponse};
use elastrec_rpc::dense_slice;
use parking_lot::{Mutex, RwLock};
use tokio::sync::watch;

use crate::error::PsError;
use crate::fail_points::fail_point_grow;
use crate::layout::{Bitset, Layout, LayoutView, Phase};

/// Gradients of one synchronous step collected so far, each contribution multiplied by
/// its loss weight: its sample count, or the sum of its samples' weights (`loss_weight`
/// sums them; the flush divides by it). `samples` counts the step's samples.
#[derive(Default)]
pub(crate) struct Accum {
    count: u32,
    samples: f64,
    loss_weight: f64,
    /// The schedule's multiplier of the step's latest push (0: none).
    lr_scale: f32,
    tables: Vec<u32>,
    rows: Vec<u64>,
    grads: Vec<f32>,
    dense: Vec<f32>,
}

pub(crate) struct State {
    pub(crate) store: EmbeddingStore,
    scratch: TableScratch,
    pub(crate) dense: Vec<f32>,
    pub(crate) opt: Box<dyn DenseOptimizer>,
    /// The dense learning rate in force (the schedule's multiplier applied).
    pub(crate) dense_lr: f32,
    pub(crate) accum: Accum,
    /// CPR-SSU: sub-sampled lists of touched rows, for the large tables.
    pub(crate) ssu: Vec<Option<SsuList>>,
    /// The last batch each worker pushed that this server applied (or queued for its
    /// synchronous step). A worker reports a batch to the master before it pushes the
    /// next one, so only this batch can be handed out again: one entry per worker
    /// suffices to apply every batch at most once.
    pub(crate) last_batch: HashMap<u32, BatchKey>,
    /// The `last_batch` entries of the servers of the previous layout, by server: their
    /// rows and dense ranges of a push of one of those batches were applied already.
    pub(crate) inherited: Vec<crate::reshard::Inherited>,
    /// Pushes skipped because their batch was already applied.
    pub(crate) repeated_pushes: u64,
    /// Synchronous pushes that joined a step after the one they were computed for.
    pub(crate) late_pushes: u64,
    /// The layout this state belongs to, and where the server stands (copied to
    /// `PsShard::view` by every lock holder that changes them).
    pub(crate) layout: Layout,
    pub(crate) phase: Phase,
    /// See `LayoutView::known`.
    pub(crate) known: Option<(u64, Arc<Vec<String>>)>,
    /// While a re-sharding pre-copies rows: per table, the local rows updated since they
    /// were copied (they are sent again once frozen).
    pub(crate) dirty: Option<Vec<Bitset>>,
}

/// The part of a shard that depends on its layout.
pub(crate) struct ShardParts {
    pub(crate) store: EmbeddingStore,
    pub(crate) dense: Vec<f32>,
    pub(crate) opt: Box<dyn DenseOptimizer>,
    pub(crate) ssu: Vec<Option<SsuList>>,
    pub(crate) layout: Layout,
}

/// What building the shard of any layout needs from the job.
pub(crate) struct ShardConfig {
    pub(crate) embedding: EmbeddingConfig,
    dense_optimizer: DenseOptimizerConfig,
    pub(crate) dense_total: usize,
    /// Offsets of the whole dense vector that hold running statistics (batch norms'),
    /// which each shard's optimizer moves as running averages.
    statistics: Vec<std::ops::Range<usize>>,
    /// Tables a delta checkpoint saves only partly (CPR's large tables).
    pub(crate) large: Vec<bool>,
    priority: SavePriority,
    ratio: f64,
    seed: u64,
}

impl ShardConfig {
    fn new(
        job: &JobConfig,
        table_rows: &[u64],
        dense_total: usize,
        statistics: Vec<std::ops::Range<usize>>,
    ) -> Self {
        let ckpt = &job.checkpoint;
        let mut large = vec![false; table_rows.len()];
        if ckpt.priority != SavePriority::None {
            for t in large_tables(table_rows, ckpt.large_table_coverage) {
                large[t] = true;
            }
        }
        Self {
            embedding: EmbeddingConfig {
                dim: job.model.row_width(),
                rows: table_rows.to_vec(),
                optimizer: job.optimizer.sparse,
                seed: job.model.seed,
                dynamic: job.model.dynamic_embeddings,
            },
            dense_optimizer: job.optimizer.dense.clone(),
            dense_total,
            statistics,
            large,
            priority: ckpt.priority,
            ratio: ckpt.ratio,
            seed: job.model.seed,
        }
    }

    /// A fresh dense optimizer over the slice `range` of the dense vector.
    pub(crate) fn dense_optimizer_for(
        &self,
        range: &std::ops::Range<usize>,
    ) -> Box<dyn DenseOptimizer> {
        self.dense_optimizer.build_with_statistics(
            range.len(),
            elastrec_model::optim::statistics_in(&self.statistics, range),
        )
    }

    /// Shard `index` of `count` of layout `version`: initialized exactly as the
    /// single-process model from the full dense parameters `init`, or, without them, every
    /// float zero (a shard whose rows and dense values are all about to be imported).
    pub(crate) fn parts(
        &self,
        index: u32,
        count: u32,
        version: u64,
        init: Option<&[f32]>,
    ) -> Result<ShardParts, EmbeddingError> {
        let spec = ShardSpec::new(index, count)?;
        let mut store = match init {
            Some(_) => EmbeddingStore::new_shard(self.embedding.clone(), spec)?,
            None => EmbeddingStore::new_shard_zeroed(self.embedding.clone(), spec)?,
        };
        let range = dense_slice(self.dense_total, count as usize, index as usize);
        let dense = match init {
            Some(params) => params[range.clone()].to_vec(),
            None => vec![0.0; range.len()],
        };
        let opt = self.dense_optimizer_for(&range);
        let mut ssu = Vec::with_capacity(self.large.len());
        for (t, &is_large) in self.large.iter().enumerate() {
            let local = store.table(t)?.row_capacity();
            ssu.push(match self.priority {
                SavePriority::Ssu if is_large => {
                    let cap = ((local as f64) * self.ratio).ceil() as usize;
                    Some(SsuList::new(cap, 2, self.seed ^ t as u64))
                }
                _ => None,
            });
            if self.priority == SavePriority::Mfu && is_large {
                store.table_mut(t)?.enable_access_counters();
            }
        }
        let rows_held = store.tables().iter().map(|t| t.local_rows() as u64).sum();
        Ok(ShardParts {
            store,
            dense,
            opt,
            ssu,
            layout: Layout {
                version,
                index,
                count,
                range,
                rows_held,
            },
        })
    }
}

/// One parameter-server shard: embedding rows and a dense slice with optimizer state.
pub struct PsShard {
    pub(crate) state: Mutex<State>,
    /// Dense updates applied to the state. Written only while `state` is locked (the
    /// writers take `&mut State` as proof), so a lock holder reads the value that matches
    /// the state it sees; the heartbeat and `Info` read it without the lock, because a
    /// checkpoint holds the lock for a copy of the whole shard (seconds on a large one) and
    /// a heartbeat stuck behind it looks like a dead server to the master.
    version: AtomicU64,
    pub(crate) version_tx: watch::Sender<u64>,
    /// The layout and phase of `state`, readable without the lock (see `State::layout`).
    view: RwLock<LayoutView>,
    /// The state of the next layout being received (re-sharding), until it is committed.
    pub(crate) staged: Mutex<Option<crate::reshard::Staged>>,
    pub(crate) config: ShardConfig,
    pub(crate) dim: usize,
    /// What each table's ids hash over: its rows, or a dynamic table's key space
    /// (`EmbeddingConfig::key_spaces`); the range incoming rows are checked against.
    pub(crate) table_rows: Vec<u64>,
    pub(crate) mode: SyncMode,
    sync_timeout: Duration,
    /// Samples of one synchronous step: the job's batch size (the global batch).
    step_samples: f64,
    /// The configured dense learning rate, which a push's `lr_scale` multiplies.
    base_lr: f32,
    pub(crate) stores: crate::checkpoint::Stores,
    /// Shared-memory images this process wrote, as (index, servers, checkpoint id): older
    /// ones are removed, whatever layout wrote them.
    pub(crate) shm_ids: Mutex<Vec<(u32, u32, u64)>>,
    /// The job's gRPC message limit (`cluster.max_message_bytes`): a pull reply over it
    /// could not be sent, so it is refused before its buffer is allocated; re-sharding
    /// messages are cut to fit it.
    pub(crate) max_message_bytes: usize,
    /// Deadline of a call to another server (re-sharding).
    pub(crate) call_timeout: Duration,
    /// The job token, for calls to other servers (set by [`crate::service::serve`]).
    pub(crate) peer_token: OnceLock<String>,
    /// The replica of this server's dense slice on its successor, and the one it keeps of
    /// its predecessor's.
    pub(crate) replication: crate::replica::Replication,
    /// The master's lease on this server (armed by the PS process once it registered).
    pub lease: crate::lease::Lease,
    /// Served on `/metrics`.
    pub metrics: crate::metrics::PsMetrics,
}

/// Everything a shard holds (see [`PsShard::snapshot`]).
#[derive(Debug, Clone)]
pub struct ShardSnapshot {
    /// The layout the state belongs to.
    pub layout: Layout,
    /// Every row of every table, with its optimizer state.
    pub tables: Vec<elastrec_embedding::TableSnapshot>,
    /// The dense slice.
    pub dense: Vec<f32>,
    /// The dense optimizer's state buffers over the slice.
    pub dense_state: Vec<Vec<f32>>,
    /// The dense optimizer's step count.
    pub optimizer_steps: u64,
    /// Dense updates applied.
    pub dense_version: u64,
}

/// Upper bound of a pull reply's protobuf encoding beyond its floats: two packed fields
/// (tag and length varint, at most 11 bytes each) and the version (at most 11 bytes).
const PULL_REPLY_FRAMING_BYTES: u64 = 64;

/// The dense part of a push, as offsets into this server's slice.
pub(crate) enum DenseGrad<'a> {
    /// The gradient of the whole slice: one optimizer step (empty: no dense update).
    Whole(&'a [f32]),
    /// Gradients of `(offset, values)` ranges of the slice: the rest of a step whose other
    /// ranges were applied before a re-sharding (see `DenseOptimizer::step_range`).
    Spans(Vec<(usize, &'a [f32])>),
}

impl PsShard {
    /// Shard `index` of `count` for `job` in the job's first layout (version 0),
    /// initialized exactly as the single-process model.
    pub fn new(job: &JobConfig, index: u32, count: u32) -> anyhow::Result<Self> {
        Self::in_layout(job, index, count, 0)
    }

    /// Shard `index` of `count` serving layout `layout_version`, initialized exactly as
    /// the single-process model (a restore then loads the checkpoint into it).
    pub fn in_layout(
        job: &JobConfig,
        index: u32,
        count: u32,
        layout_version: u64,
    ) -> anyhow::Result<Self> {
        let dense = dense_model(job)?;
        Self::build(job, index, count, layout_version, Some(dense.params()))
    }

    /// Shard `index` of `count` of layout `layout_version`, which is being formed by a
    /// re-sharding: every row and dense value comes from the servers of the previous
    /// layout (`ImportShard`); it serves nothing until `CommitLayout`. Its arenas are
    /// allocated zeroed, which costs no time before the rows arrive.
    pub fn joining(
        job: &JobConfig,
        index: u32,
        count: u32,
        layout_version: u64,
    ) -> anyhow::Result<Self> {
        let shard = Self::build(job, index, count, layout_version, None)?;
        {
            let mut st = shard.state.lock();
            st.phase = Phase::Joining;
            shard.publish(&st);
        }
        *shard.staged.lock() = Some(crate::reshard::Staged::new(
            &shard.config,
            index,
            count,
            layout_version,
        )?);
        Ok(shard)
    }

    fn build(
        job: &JobConfig,
        index: u32,
        count: u32,
        layout_version: u64,
        init: Option<&[f32]>,
    ) -> anyhow::Result<Self> {
        let table_rows = elastrec_job::prepare::resolve_table_rows(job);
        let model = dense_model(job)?;
        let config = ShardConfig::new(
            job,
            &table_rows,
            model.num_params(),
            model.statistic_ranges(),
        );
        // What ids hash over: a dynamic table's keys span the whole key space.
        let key_spaces = config.embedding.key_spaces();
        let parts = config.parts(index, count, layout_version, init)?;
        let layout = parts.layout.clone();
        Ok(Self {
            state: Mutex::new(State {
                store: parts.store,
                scratch: TableScratch::default(),
                dense: parts.dense,
                opt: parts.opt,
                dense_lr: job.optimizer.dense.lr(),
                accum: Accum::default(),
                ssu: parts.ssu,
                last_batch: HashMap::new(),
                inherited: Vec::new(),
                repeated_pushes: 0,
                late_pushes: 0,
                layout: layout.clone(),
                phase: Phase::Serving { precopy: None },
                known: None,
                dirty: None,
            }),
            version: AtomicU64::new(0),
            version_tx: watch::channel(0).0,
            view: RwLock::new(LayoutView {
                layout: layout.clone(),
                phase: Phase::Serving { precopy: None },
                known: None,
            }),
            staged: Mutex::new(None),
            config,
            dim: job.model.row_width(),
            table_rows: key_spaces,
            mode: job.cluster.mode,
            sync_timeout: Duration::from_millis(job.cluster.sync_timeout_ms),
            step_samples: job.train.batch_size as f64,
            base_lr: job.optimizer.dense.lr(),
            stores: Default::default(),
            shm_ids: Mutex::new(Vec::new()),
            max_message_bytes: job.cluster.max_message_bytes,
            call_timeout: job.cluster.rpc_timeout(),
            peer_token: OnceLock::new(),
            lease: crate::lease::Lease::default(),
            // Full recovery rewinds every server together: only a partial one needs it.
            replication: crate::replica::Replication::new(
                job.checkpoint.dense_replica
                    && job.checkpoint.recovery != elastrec_job::distributed::RecoveryChoice::Full,
            ),
            metrics: {
                let m = crate::metrics::PsMetrics::new(index, layout.rows_held);
                m.set_layout(layout.version, layout.rows_held);
                m
            },
        })
    }

    /// The layout and phase, without waiting for the state lock.
    pub fn layout(&self) -> LayoutView {
        self.view.read().clone()
    }

    /// This server's index (it keeps it across layouts).
    pub fn index(&self) -> u32 {
        self.view.read().layout.index
    }

    /// This server's slice of the flat dense vector in the layout it serves.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.view.read().layout.range.clone()
    }

    /// Embedding rows held in the layout it serves.
    pub fn rows_held(&self) -> u64 {
        self.view.read().layout.rows_held
    }

    /// Copies the layout and phase of `st` to the lock-free view and the metrics; every
    /// lock holder that changes them calls it before releasing the lock.
    pub(crate) fn publish(&self, st: &State) {
        *self.view.write() = LayoutView {
            layout: st.layout.clone(),
            phase: st.phase,
            known: st.known.clone(),
        };
        self.metrics
            .set_layout(st.layout.version, st.layout.rows_held);
    }

    /// A copy of everything the shard holds, optimizer state included (for tests and
    /// tools: it holds the lock for a copy of the whole shard).
    pub fn snapshot(&self) -> ShardSnapshot {
        let st = self.state.lock();
        ShardSnapshot {
            layout: st.layout.clone(),
            tables: st.store.tables().iter().map(|t| t.export()).collect(),
            dense: st.dense.clone(),
            dense_state: st.opt.state().iter().map(|b| b.to_vec()).collect(),
            optimizer_steps: st.opt.steps(),
            dense_version: self.version_locked(&st),
        }
    }

    /// Bytes of embedding state held, CPR-MFU counters and CPR-SSU lists included.
    pub fn memory_bytes(&self) -> usize {
        let st = self.state.lock();
        st.store.memory_bytes()
            + st.ssu
                .iter()
                .flatten()
                .map(SsuList::memory_bytes)
                .sum::<usize>()
    }

    /// Dense updates applied so far, without waiting for the state lock (see `version`).
    pub fn version(&self) -> u64 {
        // Relaxed: a monitoring read of one counter; lock holders get their ordering from
        // the lock.
        self.version.load(Ordering::Relaxed)
    }

    /// The version of the state `_st` (borrowed to show that the lock is held).
    pub(crate) fn version_locked(&self, _st: &State) -> u64 {
        self.version.load(Ordering::Relaxed)
    }

    /// Sets the version of the state `_st` (borrowed mutably: only lock holders write it).
    pub(crate) fn set_version(&self, _st: &mut State, v: u64) {
        self.version.store(v, Ordering::Relaxed);
    }

    /// Pushes skipped so far because their batch had been applied already.
    pub fn repeated_pushes(&self) -> u64 {
        self.state.lock().repeated_pushes
    }

    /// One line of totals for the log when the server stops.
    pub fn summary(&self) -> String {
        let st = self.state.lock();
        format!(
            "PS {} (layout {}, {:?}): {} dense updates, {} repeated pushes skipped, {} late \
             synchronous pushes",
            st.layout.index,
            st.layout.version,
            st.phase.state(),
            self.version_locked(&st),
            st.repeated_pushes,
            st.late_pushes
        )
    }

    /// Whether `req` names a batch this server already applied (counted and logged).
    fn already_applied(&self, st: &mut State, req: &PushRequest) -> bool {
        let Some(key) = req.batch.as_ref() else {
            return false;
        };
        let Some((&first, _)) = st.last_batch.iter().find(|(_, k)| *k == key) else {
            return false;
        };
        st.repeated_pushes += 1;
        self.metrics.repeated_pushes.inc();
        eprintln!(
            "PS {}: skipped a repeated push of batch (epoch {}, file {}, row {}) from worker \
             {}: already applied from worker {first}",
            st.layout.index, key.epoch, key.file, key.start_row, req.worker_id
        );
        true
    }

    /// Records `req`'s batch as its worker's last one, once it was applied (or queued).
    fn remember(st: &mut State, req: &PushRequest) {
        if let Some(key) = req.batch.as_ref() {
            st.last_batch.insert(req.worker_id, *key);
        }
    }

    /// Checks the parallel arrays of table ids and rows from the wire: every table exists
    /// and every row is in range and held by this server in `layout`.
    fn check_rows(&self, layout: &Layout, tables: &[u32], rows: &[u64]) -> Result<(), PsError> {
        if tables.len() != rows.len() {
            return Err(PsError::ParallelArrays {
                tables: tables.len(),
                rows: rows.len(),
            });
        }
        for (&table, &row) in tables.iter().zip(rows) {
            let Some(&n) = self.table_rows.get(table as usize) else {
                return Err(PsError::UnknownTable {
                    table,
                    tables: self.table_rows.len(),
                });
            };
            if row >= n {
                return Err(PsError::RowOutOfRange {
                    table,
                    row,
                    rows: n,
                });
            }
            if elastrec_embedding::shard_of(table as usize, row, layout.count) != layout.index {
                return Err(PsError::RowNotHeld {
                    table,
                    row,
                    ps: layout.index,
                    count: layout.count,
                });
            }
        }
        Ok(())
    }

    /// Refuses a pull whose reply would exceed the message limit. The client controls the
    /// row count (a 64 MiB request names millions of rows, each reply row `dim` floats), so
    /// this runs before anything is sized by it: a reply over the limit could not be sent
    /// anyway, but building it first would allocate up to gigabytes per request.
    fn check_pull_reply_size(&self, layout: &Layout, req: &PullRequest) -> Result<(), PsError> {
        let dense = if req.want_dense {
            layout.range.len()
        } else {
            0
        };
        let floats = (req.rows.len() as u64)
            .saturating_mul(self.dim as u64)
            .saturating_add(dense as u64);
        let bytes = floats
            .saturating_mul(4)
            .saturating_add(PULL_REPLY_FRAMING_BYTES);
        if bytes > self.max_message_bytes as u64 {
            return Err(PsError::ReplyTooLarge {
                rows: req.rows.len(),
                dim: self.dim,
                dense,
                bytes,
                limit: self.max_message_bytes,
            });
        }
        Ok(())
    }

    /// Copies rows (and optionally the dense slice) out.
    pub fn pull(&self, req: &PullRequest) -> Result<PullResponse, PsError> {
        let view = self.layout();
        view.check(req.layout_version)?;
        self.check_pull_reply_size(&view.layout, req)?;
        self.check_rows(&view.layout, &req.tables, &req.rows)?;
        // Bounded by the message limit (checked above); allocated before taking the lock.
        let mut values = Vec::with_capacity(req.rows.len() * self.dim);
        let st = self.state.lock();
        // The layout may have changed since the checks (a freeze): the state decides.
        st.check_layout(req.layout_version)?;
        for (&t, &r) in req.tables.iter().zip(&req.rows) {
            let at = values.len();
            values.resize(at + self.dim, 0.0);
            st.store
                .table(t as usize)?
                .read_weights(r, &mut values[at..])?;
        }
        Ok(PullResponse {
            values,
            dense: if req.want_dense {
                st.dense.clone()
            } else {
                Vec::new()
            },
            dense_version: self.version_locked(&st),
            ..PullResponse::default()
        })
    }

    fn apply_sparse(
        st: &mut State,
        tables: &[u32],
        rows: &[u64],
        grads: &[f32],
        dim: usize,
    ) -> Result<(), PsError> {
        // Every index and length here was checked by `validate_push`.
        let ntables = st.store.num_tables();
        let mut by_table: Vec<(Vec<u64>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); ntables];
        for (i, (&t, &r)) in tables.iter().zip(rows).enumerate() {
            let e = &mut by_table[t as usize];
            e.0.push(r);
            e.1.extend_from_slice(&grads[i * dim..(i + 1) * dim]);
        }
        let State {
            store,
            scratch,
            ssu,
            dirty,
            ..
        } = st;
        let n = store.shard().count as u64;
        for (t, (rows, grads)) in by_table.iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            if let Some(list) = ssu[t].as_mut() {
                // A dynamic table's slots move as rows come and go: it records keys.
                let dynamic = store.table(t)?.is_dynamic();
                let locals: Vec<usize> = rows
                    .iter()
                    .map(|&r| {
                        if dynamic {
                            r as usize
                        } else {
                            (r / n) as usize
                        }
                    })
                    .collect();
                list.observe(&locals);
            }
            store.table_mut(t)?.apply_rows(rows, grads, scratch)?;
            if let Some(dirty) = dirty.as_mut() {
                for &r in rows {
                    dirty[t].insert((r / n) as usize);
                }
            }
        }
        Ok(())
    }

    pub(crate) fn apply_all(
        &self,
        st: &mut State,
        tables: &[u32],
        rows: &[u64],
        grads: &[f32],
        dense: DenseGrad<'_>,
    ) -> Result<(), PsError> {
        Self::apply_sparse(st, tables, rows, grads, self.dim)?;
        let State {
            opt, dense: params, ..
        } = st;
        match &dense {
            DenseGrad::Whole([]) => return Ok(()),
            DenseGrad::Whole(g) => opt.step(params, g),
            DenseGrad::Spans(spans) if spans.is_empty() => return Ok(()),
            DenseGrad::Spans(spans) => {
                for &(offset, g) in spans {
                    opt.step_range(params, g, offset);
                }
            }
        }
        let v = self.version_locked(st) + 1;
        self.set_version(st, v);
        self.replication.record(st, v, &dense);
        Ok(())
    }

    /// Checks every id and length of a push from the wire before any of it is used.
    fn validate_push(&self, layout: &Layout, req: &PushRequest) -> Result<(), PsError> {
        self.check_rows(layout, &req.tables, &req.rows)?;
        if req.rows.len().checked_mul(self.dim) != Some(req.grads.len()) {
            return Err(PsError::GradientLength {
                values: req.grads.len(),
                rows: req.rows.len(),
                dim: self.dim,
            });
        }
        if req.dense_spans.is_empty() {
            if !req.dense_grad.is_empty() && req.dense_grad.len() != layout.range.len() {
                return Err(PsError::DenseGradientLength {
                    values: req.dense_grad.len(),
                    ps: layout.index,
                    held: layout.range.len(),
                });
            }
        } else {
            self.check_dense_spans(layout, req)?;
        }
        if !(0.0..=1.0).contains(&req.lr_scale) {
            return Err(PsError::BadField {
                message: "Push",
                field: "lr_scale",
                detail: format!("{} is not a multiplier in [0, 1]", req.lr_scale),
            });
        }
        for (what, g) in [("sparse", &req.grads), ("dense", &req.dense_grad)] {
            if let Some(at) = g.iter().position(|g| !g.is_finite()) {
                return Err(PsError::NonFiniteGradient { what, at });
            }
        }
        Ok(())
    }

    /// Dense spans must be ascending, disjoint, non-empty ranges of this server's slice
    /// whose lengths add up to the dense gradient sent.
    fn check_dense_spans(&self, layout: &Layout, req: &PushRequest) -> Result<(), PsError> {
        let bad = |detail: String| PsError::BadField {
            message: "Push",
            field: "dense_spans",
            detail,
        };
        if self.mode != SyncMode::Async {
            return Err(bad(
                "partial dense gradients are taken in asynchronous mode only".into(),
            ));
        }
        let range = &layout.range;
        let (mut end, mut total) = (range.start as u64, 0u64);
        for s in &req.dense_spans {
            let stop = s.start.saturating_add(s.len);
            if s.len == 0 || s.start < end || stop > range.end as u64 {
                return Err(bad(format!(
                    "span [{}, {stop}) is empty, overlaps the previous one or is not inside \
                     PS {}'s slice [{}, {})",
                    s.start, layout.index, range.start, range.end
                )));
            }
            end = stop;
            total += s.len;
        }
        if total != req.dense_grad.len() as u64 {
            return Err(bad(format!(
                "spans of {total} values for a dense gradient of {}",
                req.dense_grad.len()
            )));
        }
        Ok(())
    }

    /// The dense part of a validated push, by offsets into `range`.
    fn dense_of<'a>(req: &'a PushRequest, range: &std::ops::Range<usize>) -> DenseGrad<'a> {
        if req.dense_spans.is_empty() {
            return DenseGrad::Whole(&req.dense_grad);
        }
        let mut at = 0;
        let spans = req
            .dense_spans
            .iter()
            .map(|s| {
                let g = &req.dense_grad[at..at + s.len as usize];
                at += s.len as usize;
                (s.start as usize - range.start, g)
            })
            .collect();
        DenseGrad::Spans(spans)
    }

    /// The learning rates of the next update: the configured ones times `scale`, the
    /// `[optimizer.schedule]` multiplier a push carries (0: no schedule, left as they are).
    fn set_lr_scale(&self, st: &mut State, scale: f32) {
        if scale > 0.0 {
            st.dense_lr = self.base_lr * scale;
            st.opt.set_lr(st.dense_lr);
            st.store.set_lr_scale(scale);
        }
    }

    /// Applies a push: at once (async), or as part of its synchronous step. It is answered
    /// once the update it joined is replicated (see [`crate::replica`]).
    pub async fn push(&self, req: PushRequest) -> Result<PushResponse, PsError> {
        self.lease.check()?;
        let view = self.layout();
        view.check(req.layout_version)?;
        self.validate_push(&view.layout, &req)?;
        fail_point_grow(req.rows.len());
        let dense_version = if self.mode == SyncMode::Async {
            self.push_async(&req, &view)?
        } else {
            self.push_sync(&req).await?
        };
        self.replication.replicated(dense_version).await;
        Ok(PushResponse { dense_version })
    }

    /// Applies an asynchronous push at once; returns the dense version after it.
    fn push_async(&self, req: &PushRequest, view: &LayoutView) -> Result<u64, PsError> {
        let mut st = self.state.lock();
        st.check_layout(req.layout_version)?;
        // Again under the lock: the lease may have run out while the push waited for it.
        self.lease.check()?;
        if self.already_applied(&mut st, req) {
            return Ok(self.version_locked(&st));
        }
        self.set_lr_scale(&mut st, req.lr_scale);
        match crate::reshard::inherited_part(&mut st, req, self.config.dense_total) {
            None => {
                let dense = Self::dense_of(req, &view.layout.range);
                self.apply_all(&mut st, &req.tables, &req.rows, &req.grads, dense)?;
            }
            Some(rest) => {
                self.metrics.repeated_pushes.inc();
                let start = view.layout.range.start;
                let dense = rest
                    .dense
                    .iter()
                    .map(|(s, g)| (s - start, g.as_slice()))
                    .collect();
                let dense = DenseGrad::Spans(dense);
                self.apply_all(&mut st, &rest.tables, &rest.rows, &rest.grads, dense)?;
            }
        }
        Self::remember(&mut st, req);
        Ok(self.version_locked(&st))
    }

    /// Adds a push to its synchronous step and waits for the step to be applied; returns
    /// the dense version after it.
    async fn push_sync(&self, req: &PushRequest) -> Result<u64, PsError> {
        let step = {
            let mut st = self.state.lock();
            st.check_layout(req.layout_version)?;
            if self.already_applied(&mut st, req) {
                // Its gradients are in this or an earlier step already; the step it
                // would have joined completes by its other contributors or the timeout.
                return Ok(self.version_locked(&st));
            }
            if req.base_version != self.version_locked(&st) {
                // Computed before the last step closed (a worker that believed the step
                // needed it too): it joins the open step, one update stale.
                st.late_pushes += 1;
            }
            Self::remember(&mut st, req);
            let held = st.layout.range.len();
            let a = &mut st.accum;
            a.count += 1;
            if req.lr_scale > 0.0 {
                a.lr_scale = req.lr_scale;
            }
            a.tables.extend_from_slice(&req.tables);
            a.rows.extend_from_slice(&req.rows);
            a.samples += f64::from(req.samples.max(1));
            let w = contribution_weight(req);
            a.loss_weight += w;
            let w = w as f32;
            a.grads.extend(req.grads.iter().map(|g| g * w));
            if a.dense.is_empty() {
                a.dense = vec![0.0; held];
            }
            if !req.dense_grad.is_empty() {
                for (x, g) in a.dense.iter_mut().zip(&req.dense_grad) {
                    *x += g * w;
                }
            }
            // The step is complete once every worker that trains has contributed, or once
            // it holds the job's (global) batch of samples.
            if a.count >= req.contributors.max(1) || a.samples >= self.step_samples {
                self.flush(&mut st)?;
                return Ok(self.version_locked(&st));
            }
            self.version_locked(&st)
        };
        let mut rx = self.version_tx.subscribe();
        let waited = tokio::time::timeout(self.sync_timeout, rx.wait_for(|&v| v > step)).await;
        let mut st = self.state.lock();
        if waited.is_err() && self.version_locked(&st) == step {
            // Some contributor never came (died or left): apply what arrived.
            self.flush(&mut st)?;
        }
        Ok(self.version_locked(&st))
    }

    fn flush(&self, st: &mut State) -> Result<(), PsError> {
        let mut a = std::mem::take(&mut st.accum);
        // The (weighted) mean over the step's samples; weights that sum to 0 leave
        // nothing to learn.
        let inv = if a.loss_weight > 0.0 {
            (1.0 / a.loss_weight) as f32
        } else {
            0.0
        };
        for g in a.grads.iter_mut().chain(a.dense.iter_mut()) {
            *g *= inv;
        }
        let dense = if a.dense.is_empty() {
            vec![0.0; st.layout.range.len()]
        } else {
            a.dense
        };
        self.set_lr_scale(st, a.lr_scale);
        self.apply_all(st, &a.tables, &a.rows, &a.grads, DenseGrad::Whole(&dense))?;
        self.version_tx.send_replace(self.version_locked(st));
        Ok(())
    }
}

/// What a synchronous push's mean gradient counts for in its step: the sum of its
/// samples' weights when the data has weights, else its sample count (0 counts as 1).
/// A weight from the wire that is not a finite number >= 0 counts as its sample count.
fn contribution_weight(req: &PushRequest) -> f64 {
    match req.loss_weight {
        Some(w) if w.is_finite() && w >= 0.0 => w,
        _ => f64::from(req.samples.max(1)),
    }
}

impl State {
    /// Accepts a request routed by layout `request` only while serving it (the lock
    /// holder's check: the view may have changed since the caller read it).
    pub(crate) fn check_layout(&self, request: u64) -> Result<(), PsError> {
        LayoutView {
            layout: self.layout.clone(),
            phase: self.phase,
            known: self.known.clone(),
        }
        .check(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use elastrec_rpc as rpc;
    use std::path::Path;
    use tonic::Status;

    fn job(mode: &str) -> JobConfig {
        JobConfig::from_toml(
            &format!(
                "[model]\nbottom_mlp = [8, 4]\ntop_mlp = [8, 1]\nembedding_dim = 4\ntable_rows = 100\n[cluster]\nps = 2\nmode = \"{mode}\"\nsync_timeout_ms = 200\n"
            ),
            Path::new("job.toml"),
        )
        .unwrap()
    }

    /// A push of a dense gradient only, as worker `worker_id` computed it against
    /// `base`, averaging `samples` samples, expecting `contributors` per step.
    fn dense_push(
        worker_id: u32,
        dense_grad: Vec<f32>,
        base: u64,
        contributors: u32,
        samples: u32,
    ) -> PushRequest {
        PushRequest {
            version: rpc::version(),
            worker_id,
            tables: vec![],
            rows: vec![],
            grads: vec![],
            dense_grad,
            base_version: base,
            step: base,
            contributors,
            batch: None,
            samples,
            layout_version: 0,
            dense_spans: vec![],
            lr_scale: 0.0,
            loss_weight: None,
            grads_le: Vec::new(),
            dense_grad_le: Vec::new(),
        }
    }

    /// Pulls table 0's `row` (and the dense slice when `want_dense`).
    fn pull_row(ps: &PsShard, row: u64, want_dense: bool) -> PullResponse {
        ps.pull(&PullRequest {
            version: rpc::version(),
            tables: vec![0],
            rows: vec![row],
            want_dense,
            layout_version: 0,
            packed: false,
        })
        .unwrap()
    }

    fn owned_row(table: u32, shard: u32) -> u64 {
        (0..100u64)
            .find(|&r| elastrec_embedding::shard_of(table as usize, r, 2) == shard)
            .unwrap()
    }

    #[test]
    fn ids_and_sizes_from_the_wire_are_validated() {
        let ps = PsShard::new(&job("async"), 0, 2).unwrap();
        let pull = |tables: Vec<u32>, rows: Vec<u64>| {
            ps.pull(&PullRequest {
                version: rpc::version(),
                tables,
                rows,
                want_dense: false,
                layout_version: 0,
                packed: false,
            })
        };
        let mine = owned_row(3, 0);
        let theirs = owned_row(3, 1);
        assert_eq!(pull(vec![3], vec![mine]).unwrap().values.len(), 4);
        assert!(matches!(
            pull(vec![99], vec![mine]),
            Err(PsError::UnknownTable { table: 99, .. })
        ));
        assert!(matches!(
            pull(vec![3], vec![theirs]),
            Err(PsError::RowNotHeld {
                table: 3,
                ps: 0,
                ..
            })
        ));
        assert!(matches!(
            pull(vec![3], vec![100]),
            Err(PsError::RowOutOfRange {
                row: 100,
                rows: 100,
                ..
            })
        ));
        assert!(matches!(
            pull(vec![3, 3], vec![mine]),
            Err(PsError::ParallelArrays { tables: 2, rows: 1 })
        ));
        for (t, r) in [(99, mine), (3, theirs), (3, 100)] {
            let s = Status::from(pull(vec![t], vec![r]).unwrap_err());
            assert_eq!(s.code(), tonic::Code::InvalidArgument, "{t} {r}: {s}");
        }
    }

    /// A pull whose reply would not fit in `cluster.max_message_bytes` is refused with
    /// the sizes in the message (the allocation side is checked in tests/pull_limits.rs);
    /// the dense slice counts towards the reply.
    #[test]
    fn a_pull_whose_reply_exceeds_the_message_limit_is_refused() {
        let mut job = job("async");
        job.cluster.max_message_bytes = 1 << 20;
        let ps = PsShard::new(&job, 0, 2).unwrap();
        let row = owned_row(3, 0);
        let pull = |n: usize, want_dense: bool| {
            ps.pull(&PullRequest {
                version: rpc::version(),
                tables: vec![3; n],
                rows: vec![row; n],
                want_dense,
                layout_version: 0,
                packed: false,
            })
        };
        // dim 4: 16 bytes a row. The largest pull that fits, then one row more.
        let fits = ((1 << 20) - PULL_REPLY_FRAMING_BYTES as usize) / 16;
        assert_eq!(pull(fits, false).unwrap().values.len(), fits * 4);
        let e = pull(fits + 1, false).unwrap_err();
        assert!(
            matches!(e, PsError::ReplyTooLarge { rows, dim: 4, dense: 0, limit, .. }
                if rows == fits + 1 && limit == 1 << 20),
            "{e}"
        );
        let s = Status::from(e);
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        assert!(s.message().contains("1048576-byte"), "{}", s.message());
        assert!(matches!(
            pull(fits, true),
            Err(PsError::ReplyTooLarge { dense, .. }) if dense == ps.range().len()
        ));
    }

    /// The heartbeat's step is read while another thread holds the state lock (as a
    /// checkpoint's copy of a large shard does for seconds): it must not wait for it.
    #[test]
    fn the_heartbeat_step_is_read_without_the_state_lock() {
        let ps = Arc::new(PsShard::new(&job("async"), 0, 2).unwrap());
        {
            let mut st = ps.state.lock();
            ps.set_version(&mut st, 41);
        }
        let guard = ps.state.lock();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn({
            let ps = ps.clone();
            move || tx.send(ps.version()).unwrap()
        });
        let got = rx.recv_timeout(Duration::from_secs(10));
        drop(guard);
        reader.join().unwrap();
        assert_eq!(got, Ok(41), "the step read waited for the state lock");
    }

    #[tokio::test]
    async fn async_push_applies_at_once_and_checks_lengths() {
        let ps = PsShard::new(&job("async"), 1, 2).unwrap();
        let row = owned_row(0, 1);
        let pull = || pull_row(&ps, row, true);
        let before = pull();
        let req = |grads: Vec<f32>, dense: Vec<f32>| PushRequest {
            version: rpc::version(),
            worker_id: 1,
            tables: vec![0],
            rows: vec![row],
            grads,
            dense_grad: dense,
            base_version: 0,
            step: 0,
            contributors: 1,
            batch: None,
            samples: 0,
            layout_version: 0,
            dense_spans: vec![],
            lr_scale: 0.0,
            loss_weight: None,
            grads_le: Vec::new(),
            dense_grad_le: Vec::new(),
        };
        let n = before.dense.len();
        assert!(matches!(
            ps.push(req(vec![1.0; 3], vec![])).await,
            Err(PsError::GradientLength {
                values: 3,
                rows: 1,
                dim: 4
            })
        ));
        assert!(matches!(
            ps.push(req(vec![1.0; 5], vec![])).await,
            Err(PsError::GradientLength { values: 5, .. })
        ));
        assert!(matches!(
            ps.push(req(vec![1.0; 4], vec![1.0; n + 1])).await,
            Err(PsError::DenseGradientLength { values, held, .. }) if values == n + 1 && held == n
        ));
        assert!(matches!(
            ps.push(req(vec![1.0, 1.0, f32::NAN, 1.0], vec![])).await,
            Err(PsError::NonFiniteGradient {
                what: "sparse",
                at: 2
            })
        ));
        assert!(matches!(
            ps.push(req(vec![1.0; 4], vec![f32::INFINITY; n])).await,
            Err(PsError::NonFiniteGradient {
                what: "dense",
                at: 0
            })
        ));
        assert!(matches!(
            ps.push(PushRequest {
                tables: vec![99],
                ..req(vec![1.0; 4], vec![])
            })
            .await,
            Err(PsError::UnknownTable { table: 99, .. })
        ));
        assert!(matches!(
            ps.push(PushRequest {
                tables: vec![0, 0],
                ..req(vec![1.0; 8], vec![])
            })
            .await,
            Err(PsError::ParallelArrays { tables: 2, rows: 1 })
        ));
        // A refused push changed nothing.
        assert_eq!(ps.version(), 0);
        let unchanged = pull();
        assert_eq!(unchanged.values, before.values);
        let r = ps.push(req(vec![1.0; 4], vec![0.5; n])).await.unwrap();
        assert_eq!(r.dense_version, 1);
        let after = pull();
        assert!(after.values.iter().zip(&before.values).all(|(a, b)| a < b));
        assert!(after.dense.iter().zip(&before.dense).all(|(a, b)| a < b));
    }

    /// `[optimizer.schedule]` in `run`: a push's `lr_scale` multiplies the learning rates
    /// of its update, dense and sparse, in both modes (Adagrad's first step moves by the
    /// rate), 0 leaves the configured rates, and a multiplier off [0, 1] is refused.
    #[tokio::test]
    async fn a_pushs_lr_scale_multiplies_its_update() {
        for mode in ["async", "sync"] {
            let row = owned_row(0, 1);
            let moved = |scale: f32| {
                let ps = PsShard::new(&job(mode), 1, 2).unwrap();
                async move {
                    let pull = || pull_row(&ps, row, true);
                    let before = pull();
                    let push = PushRequest {
                        tables: vec![0],
                        rows: vec![row],
                        grads: vec![0.5; 4],
                        lr_scale: scale,
                        ..dense_push(1, vec![0.5; before.dense.len()], 0, 1, 1)
                    };
                    ps.push(push).await.unwrap();
                    let after = pull();
                    let step = |a: &[f32], b: &[f32]| (a[0] - b[0]).abs();
                    (
                        step(&after.dense, &before.dense),
                        step(&after.values, &before.values),
                    )
                }
            };
            let (dense, sparse) = moved(0.0).await;
            assert!(dense > 0.0 && sparse > 0.0, "{mode}");
            assert_eq!(moved(1.0).await, (dense, sparse), "{mode}");
            let (d, s) = moved(0.25).await;
            assert!(
                (d / dense - 0.25).abs() < 1e-3,
                "{mode}: dense {d} vs {dense}"
            );
            assert!(
                (s / sparse - 0.25).abs() < 1e-3,
                "{mode}: sparse {s} vs {sparse}"
            );
        }
        let ps = PsShard::new(&job("async"), 1, 2).unwrap();
        let bad = PushRequest {
            lr_scale: 2.0,
            ..dense_push(1, vec![], 0, 1, 1)
        };
        assert!(matches!(
            ps.push(bad).await,
            Err(PsError::BadField {
                field: "lr_scale",
                ..
            })
        ));
    }

    /// A push may carry the gradient of ranges of the slice only (the rest of a push
    /// re-split after a re-sharding): ascending, disjoint, inside the slice, adding up to
    /// the values sent; only those parameters change.
    #[tokio::test]
    async fn dense_spans_update_only_their_ranges() {
        use elastrec_proto::ps::DenseSpan;
        let ps = PsShard::new(&job("async"), 1, 2).unwrap();
        let r = ps.range();
        let span = |start: usize, len: u64| DenseSpan {
            start: start as u64,
            len,
        };
        let req = |spans: Vec<DenseSpan>, n: usize| PushRequest {
            dense_spans: spans,
            ..dense_push(1, vec![0.5; n], 0, 1, 1)
        };
        for (spans, n, says) in [
            (vec![span(r.start - 1, 2)], 2, "not inside"),
            (vec![span(r.end - 1, 2)], 2, "not inside"),
            (vec![span(r.start, 2), span(r.start + 1, 1)], 3, "overlaps"),
            (vec![span(r.start, 0)], 0, "empty"),
            (vec![span(r.start, 2)], 3, "spans of 2 values"),
        ] {
            let e = ps.push(req(spans, n)).await.unwrap_err();
            assert!(
                matches!(&e, PsError::BadField { field: "dense_spans", detail, .. } if detail.contains(says)),
                "{says}: {e}"
            );
        }
        let before = ps.state.lock().dense.clone();
        let v = ps
            .push(req(vec![span(r.start + 1, 2), span(r.start + 5, 1)], 3))
            .await
            .unwrap()
            .dense_version;
        assert_eq!(v, 1);
        let after = ps.state.lock().dense.clone();
        for (i, (a, b)) in after.iter().zip(&before).enumerate() {
            assert_eq!(a != b, [1, 2, 5].contains(&i), "parameter {i}");
        }
        let sync = PsShard::new(&job("sync"), 1, 2).unwrap();
        let e = sync.push(req(vec![span(r.start, 1)], 1)).await.unwrap_err();
        assert!(e.to_string().contains("asynchronous mode"), "{e}");
    }

    /// A batch handed out again after its worker died (or a retried call) reaches the
    /// server a second time: it is acknowledged without being applied again, in both modes.
    #[tokio::test]
    async fn a_batch_pushed_twice_is_applied_once() {
        use elastrec_proto::ps::BatchKey;
        for mode in ["async", "sync"] {
            let ps = PsShard::new(&job(mode), 0, 2).unwrap();
            let row = owned_row(0, 0);
            let key = |start_row| BatchKey {
                epoch: 1,
                file: 0,
                start_row,
            };
            let req = |worker_id, batch: BatchKey| PushRequest {
                version: rpc::version(),
                worker_id,
                tables: vec![0],
                rows: vec![row],
                grads: vec![1.0; 4],
                dense_grad: vec![],
                base_version: 0,
                step: 0,
                contributors: 1,
                batch: Some(batch),
                samples: 0,
                layout_version: 0,
                dense_spans: vec![],
                lr_scale: 0.0,
                loss_weight: None,
                grads_le: Vec::new(),
                dense_grad_le: Vec::new(),
            };
            let values = || pull_row(&ps, row, false).values;
            ps.push(req(7, key(512))).await.unwrap();
            let once = values();
            // Worker 7 died before reporting; worker 9 trains the same batch again.
            ps.push(req(9, key(512))).await.unwrap();
            assert_eq!(
                values(),
                once,
                "{mode}: the repeated batch changed the rows"
            );
            // Worker 7's lost reply, retried.
            ps.push(req(7, key(512))).await.unwrap();
            assert_eq!(values(), once, "{mode}");
            assert_eq!(ps.repeated_pushes(), 2, "{mode}");
            // The next batch, and the same rows in the next epoch, are new.
            ps.push(req(9, key(768))).await.unwrap();
            let twice = values();
            assert_ne!(twice, once, "{mode}");
            ps.push(req(
                9,
                BatchKey {
                    epoch: 2,
                    ..key(512)
                },
            ))
            .await
            .unwrap();
            assert_ne!(values(), twice, "{mode}");
            assert_eq!(ps.repeated_pushes(), 2, "{mode}");
        }
    }

    /// A synchronous shard with a global batch of 100 samples whose dense update is SGD
    /// with rate 1: a step moves every weight by minus the step's mean gradient.
    fn sgd_sync_shard() -> Arc<PsShard> {
        let mut job = job("sync");
        job.train.batch_size = 100;
        job.cluster.sync_timeout_ms = 5_000;
        job.optimizer.dense = elastrec_model::DenseOptimizerConfig::Sgd {
            lr: 1.0,
            weight_decay: 0.0,
        };
        Arc::new(PsShard::new(&job, 0, 2).unwrap())
    }

    /// A synchronous step closes as soon as it holds the job's batch of samples, even when
    /// the pushing workers expected more contributors; its update is the sample-weighted
    /// mean; a push computed before the step closed joins the next one.
    #[tokio::test]
    async fn sync_step_closes_on_the_global_batch_and_weights_by_samples() {
        let ps = sgd_sync_shard();
        let start = ps.state.lock().dense.clone();
        let n = ps.range().len();
        let push = |w: u32, samples: u32, grad: f32, base: u64| {
            let ps = ps.clone();
            async move {
                let req = dense_push(w, vec![grad; n], base, 3, samples);
                ps.push(req).await.unwrap().dense_version
            }
        };
        let t0 = std::time::Instant::now();
        let (a, b) = tokio::join!(
            tokio::spawn(push(1, 25, 4.0, 0)),
            tokio::spawn(push(2, 75, 0.0, 0))
        );
        assert_eq!((a.unwrap(), b.unwrap()), (1, 1));
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "waited for the timeout"
        );
        // SGD with lr 1 moves every weight by the weighted mean (25 * 4 + 75 * 0) / 100.
        let before = ps.state.lock().dense.clone();
        for (x, y) in before.iter().zip(&start) {
            assert!((y - x - 1.0).abs() < 1e-5, "{y} -> {x}");
        }
        let (c, d) = tokio::join!(
            tokio::spawn(push(3, 40, 1.0, 0)),
            tokio::spawn(push(1, 60, 1.0, 1))
        );
        assert_eq!((c.unwrap(), d.unwrap()), (2, 2));
        assert_eq!(ps.state.lock().late_pushes, 1);
        let after = ps.state.lock().dense.clone();
        for (x, y) in after.iter().zip(&before) {
            assert!((y - x - 1.0).abs() < 1e-5, "{y} -> {x}");
        }
    }

    /// With sample weights (`data.weight`), a synchronous step's update is the mean
    /// weighted by each contribution's sum of weights, not by its sample count; the
    /// step still closes on the global batch of samples. Weights that sum to 0 move
    /// nothing.
    #[tokio::test]
    async fn sync_step_weights_contributions_by_their_sample_weights() {
        let ps = sgd_sync_shard();
        let start = ps.state.lock().dense.clone();
        let n = ps.range().len();
        let push = |w: u32, loss_weight: f64, grad: f32, base: u64| {
            let ps = ps.clone();
            async move {
                let mut req = dense_push(w, vec![grad; n], base, 3, 50);
                req.loss_weight = Some(loss_weight);
                ps.push(req).await.unwrap().dense_version
            }
        };
        let (a, b) = tokio::join!(
            tokio::spawn(push(1, 30.0, 4.0, 0)),
            tokio::spawn(push(2, 10.0, 0.0, 0))
        );
        assert_eq!((a.unwrap(), b.unwrap()), (1, 1));
        // (30 * 4 + 10 * 0) / 40 = 3, where counting samples (50 each) would give 2.
        let before = ps.state.lock().dense.clone();
        for (x, y) in before.iter().zip(&start) {
            assert!((y - x - 3.0).abs() < 1e-5, "{y} -> {x}");
        }
        let (c, d) = tokio::join!(
            tokio::spawn(push(1, 0.0, 4.0, 1)),
            tokio::spawn(push(2, 0.0, 2.0, 1))
        );
        assert_eq!((c.unwrap(), d.unwrap()), (2, 2));
        assert_eq!(ps.state.lock().dense, before);
    }

    #[tokio::test]
    async fn sync_push_waits_for_every_contributor_then_applies_once() {
        let ps = Arc::new(PsShard::new(&job("sync"), 0, 2).unwrap());
        let n = ps
            .pull(&PullRequest {
                version: rpc::version(),
                tables: vec![],
                rows: vec![],
                want_dense: true,
                layout_version: 0,
                packed: false,
            })
            .unwrap()
            .dense
            .len();
        let push = |w: u32| {
            let ps = ps.clone();
            async move {
                let req = dense_push(w, vec![1.0; n], 0, 2, 0);
                ps.push(req).await.unwrap().dense_version
            }
        };
        let (a, b) = tokio::join!(tokio::spawn(push(1)), tokio::spawn(push(2)));
        assert_eq!((a.unwrap(), b.unwrap()), (1, 1));
        assert_eq!(ps.version(), 1);
        // A missing contributor: the step is applied after the timeout.
        let t0 = std::time::Instant::now();
        let v = ps
            .push(dense_push(1, vec![1.0; n], 1, 2, 0))
            .await
            .unwrap()
            .dense_version;
        assert_eq!(v, 2);
        assert!(t0.elapsed() >= Duration::from_millis(150));
    }
}
