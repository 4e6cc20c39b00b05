//! Online re-sharding: moving the job's rows and dense slices from one layout of parameter
//! servers to another while training runs (the protocol is in `ps.proto`).
//!
//! The sending side lives here. A server of the old layout freezes (a flag set under the
//! state lock: from then on pulls and pushes are refused before they reach the lock, so
//! nothing changes the state), then reads each message's rows out of the frozen state and
//! sends every server of the new layout what that layout routes to it, one message in
//! flight per target: no copy of the shard is made, and the extra memory is one message per
//! target. With pre-copy, every row is sent first while the server still serves (each
//! message's rows copied under a short hold of the lock), pushes mark the rows they update
//! afterwards, and the frozen pass sends only the marked rows and the dense values.
//!
//! The receiving side (staging, commit, abort) is in `stage.rs`; batches applied by the old
//! servers, which the new ones must not apply again, in `inherit.rs`.

mod inherit;
mod stage;

pub(crate) use inherit::{inherited_part, Inherited};
pub(crate) use stage::Staged;

use std::sync::Arc;
use std::time::{Duration, Instant};

use elastrec_embedding::{global_row, shard_of, shard_rows};
use elastrec_job::distributed::SyncMode;
use elastrec_proto::ps::{
    ImportDone, ImportRequest, ImportResponse, ReshardRequest, ReshardResponse, WorkerBatch,
};
use elastrec_rpc::{self as rpc, dense_slice, is_transient, Ps};
use tokio::task::JoinSet;

use crate::error::PsError;
use crate::layout::{Bitset, Layout, Phase, Target};
use crate::shard::{PsShard, State};

/// Bytes of a message beyond its payload (field tags and lengths, the scalar fields), with
/// room to spare.
const MESSAGE_OVERHEAD: usize = 4096;

/// Bytes a pre-copy message copies under the state lock at most: pushes wait that long.
const PRECOPY_MESSAGE_BYTES: usize = 4 << 20;

/// Worst-case encoded bytes of a row id (a varint).
const ROW_ID_BYTES: usize = 10;
/// Wire bytes of a dynamic row's packed usage, at most.
const USAGE_BYTES: usize = 10;

/// Where a server sends what the new layout routes to another server.
#[tonic::async_trait]
pub trait Peers: Send + Sync {
    /// Delivers `req` to server `target` of the new layout.
    async fn import(&self, target: u32, req: ImportRequest) -> Result<ImportResponse, PsError>;
}

/// The servers of the new layout over gRPC; this server's own share is imported directly.
pub struct GrpcPeers {
    me: Arc<PsShard>,
    addrs: Vec<String>,
    /// By index; `None` for this server.
    clients: Vec<Option<Ps>>,
}

impl GrpcPeers {
    /// Clients for `addrs` (by index in the new layout), with the job token `serve` gave
    /// `me`.
    pub fn new(me: &Arc<PsShard>, addrs: &[String]) -> Result<Self, PsError> {
        let token = me.peer_token.get().ok_or_else(|| {
            PsError::Reshard("this server has no job token to call the other servers".into())
        })?;
        let index = me.index() as usize;
        let clients = addrs
            .iter()
            .enumerate()
            .map(|(j, a)| {
                if j == index {
                    return Ok(None);
                }
                rpc::ps_client(a, token, me.max_message_bytes, me.call_timeout)
                    .map(Some)
                    .map_err(|e| PsError::BadField {
                        message: "Reshard",
                        field: "addrs",
                        detail: format!("address {j} ({a:?}): {e}"),
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            me: me.clone(),
            addrs: addrs.to_vec(),
            clients,
        })
    }
}

#[tonic::async_trait]
impl Peers for GrpcPeers {
    async fn import(&self, target: u32, req: ImportRequest) -> Result<ImportResponse, PsError> {
        match self.clients.get(target as usize) {
            Some(Some(c)) => {
                let mut c = c.clone();
                c.import_shard(req)
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(|s| PsError::Peer {
                        target,
                        addr: self.addrs[target as usize].clone(),
                        transient: is_transient(&s),
                        message: s.to_string(),
                    })
            }
            Some(None) => {
                let me = self.me.clone();
                tokio::task::spawn_blocking(move || me.import(req)).await?
            }
            None => Err(PsError::Reshard(format!(
                "no server {target} in a layout of {}",
                self.clients.len()
            ))),
        }
    }
}

/// Which of this server's rows each server of the new layout gets.
struct Plan {
    /// The layout left and the one moved to.
    old: Layout,
    target: Target,
    /// By target, by table: local rows of this server.
    rows: Vec<Vec<Vec<u32>>>,
}

impl Plan {
    fn new(table_rows: &[u64], old: Layout, target: Target) -> Self {
        let mut rows = vec![vec![Vec::new(); table_rows.len()]; target.count as usize];
        for (t, &n) in table_rows.iter().enumerate() {
            for l in 0..shard_rows(t, n, old.index, old.count) {
                let g = global_row(t, l, old.index, old.count);
                // Local indices fit 32 bits (`MAX_SHARD_ROWS`).
                rows[shard_of(t, g, target.count) as usize][t].push(l as u32);
            }
        }
        Self { old, target, rows }
    }
}

/// How far the messages to one target got.
#[derive(Debug, Clone, Copy, Default)]
struct Cursor {
    table: usize,
    pos: usize,
    dense: usize,
    finished: bool,
    /// Rows sent so far.
    rows: u64,
}

/// Which rows a sending pass sends.
enum Pass {
    /// While serving: every row, clearing its mark (rows updated later are sent again).
    Precopy,
    /// Frozen: the rows marked since the pre-copy (`Some`), or every row; then the dense
    /// values and the sender's end.
    Frozen(Option<Vec<Bitset>>),
}

/// What a pass sent.
#[derive(Debug, Default, Clone, Copy)]
struct Sent {
    rows: u64,
    dense: u64,
    bytes: u64,
    messages: u64,
}

impl Sent {
    fn add(&mut self, m: &ImportRequest) {
        self.rows += m.rows.len() as u64;
        self.dense += m.dense.len() as u64;
        self.bytes +=
            (m.rows.len() * 8 + (m.values.len() + m.dense.len() + m.dense_state.len()) * 4) as u64;
        self.messages += 1;
    }

    fn merge(&mut self, o: Sent) {
        self.rows += o.rows;
        self.dense += o.dense;
        self.bytes += o.bytes;
        self.messages += o.messages;
    }
}

impl PsShard {
    /// Serves a `Reshard` request (see `ps.proto`): pre-copies while serving (`precopy`),
    /// or freezes and sends every server of the new layout its rows (those updated since
    /// the pre-copy, after one) and dense values through `peers`. Replies once all of them
    /// acknowledged everything.
    pub async fn reshard(
        self: &Arc<Self>,
        req: ReshardRequest,
        peers: Arc<dyn Peers>,
    ) -> Result<ReshardResponse, PsError> {
        if self.mode != SyncMode::Async {
            return Err(PsError::Reshard(
                "the job trains in synchronous mode (cluster.mode = \"sync\"); the servers \
                 can be re-sharded in asynchronous mode only"
                    .into(),
            ));
        }
        let bad = |field, detail| PsError::BadField {
            message: "Reshard",
            field,
            detail,
        };
        if req.num_ps == 0 || req.addrs.len() != req.num_ps as usize {
            return Err(bad(
                "addrs",
                format!(
                    "{} addresses for a layout of {} servers",
                    req.addrs.len(),
                    req.num_ps
                ),
            ));
        }
        let old = self.layout().layout;
        if req.layout_version <= old.version {
            return Err(bad(
                "layout_version",
                format!(
                    "PS {} serves layout {} already; layout {} is not a next one",
                    old.index, old.version, req.layout_version
                ),
            ));
        }
        let target = Target {
            version: req.layout_version,
            count: req.num_ps,
        };
        // A dynamic table's rows are found by key, and its slots move while it serves: its
        // plan is made once the server is frozen, and nothing is pre-copied.
        let dynamic = self.config.embedding.dynamic.is_some();
        let table_rows = self.table_rows.clone();
        let plan = Arc::new(if dynamic {
            Plan {
                old,
                target,
                rows: Vec::new(),
            }
        } else {
            tokio::task::spawn_blocking(move || Plan::new(&table_rows, old, target)).await?
        });
        let mut out = ReshardResponse::default();
        if req.precopy && dynamic {
            return Ok(out);
        }
        if req.precopy {
            // A pre-copy after the freeze (a late retry) has nothing to do.
            if self.begin_precopy(&plan)? {
                let t0 = Instant::now();
                let sent = self
                    .send_pass(&peers, &plan, Arc::new(Pass::Precopy))
                    .await?;
                out.precopy_rows = sent.rows;
                out.precopy_bytes = sent.bytes;
                out.precopy_us = t0.elapsed().as_micros() as u64;
                eprintln!(
                    "PS {}: pre-copied layout {}'s share ({} rows, {} bytes) in {:.3} ms \
                     while serving",
                    plan.old.index,
                    target.version,
                    sent.rows,
                    sent.bytes,
                    out.precopy_us as f64 / 1e3
                );
            }
            return Ok(out);
        }
        let (shard, p) = (self.clone(), plan.clone());
        let (dirty, held, dense_version) =
            tokio::task::spawn_blocking(move || shard.freeze(&p)).await??;
        let frozen_at = Instant::now();
        let plan = if dynamic {
            let (shard, p) = (self.clone(), plan.clone());
            Arc::new(tokio::task::spawn_blocking(move || shard.plan_stored(&p)).await??)
        } else {
            plan
        };
        out.freeze_us = held.as_micros() as u64;
        out.dense_version = dense_version;
        let sent = self
            .send_pass(&peers, &plan, Arc::new(Pass::Frozen(dirty)))
            .await?;
        out.frozen_us = frozen_at.elapsed().as_micros() as u64;
        out.rows = sent.rows;
        out.dense_values = sent.dense;
        out.bytes = sent.bytes;
        out.messages = sent.messages;
        eprintln!(
            "PS {}: sent layout {}'s share ({} rows, {} dense values, {} bytes in {} \
             messages) in {:.3} ms frozen",
            plan.old.index,
            target.version,
            out.rows,
            out.dense_values,
            out.bytes,
            out.messages,
            out.frozen_us as f64 / 1e3,
        );
        Ok(out)
    }

    /// The plan of a frozen server of dynamic tables: its stored rows, by the server of
    /// the new layout each key routes to (slots do not move while frozen).
    fn plan_stored(&self, plan: &Plan) -> Result<Plan, PsError> {
        let st = self.state.lock();
        Self::check_plan_layout(&st, plan)?;
        if st.phase != Phase::Frozen(plan.target) {
            return Err(self.busy(&st, st.phase, plan));
        }
        let tables = st.store.num_tables();
        let mut rows = vec![vec![Vec::new(); tables]; plan.target.count as usize];
        for (t, table) in st.store.tables().iter().enumerate() {
            for l in 0..table.local_rows() {
                let to = shard_of(t, table.global_of(l), plan.target.count) as usize;
                // Slots fit 32 bits (`MAX_SHARD_ROWS`).
                rows[to][t].push(l as u32);
            }
        }
        Ok(Plan {
            old: plan.old.clone(),
            target: plan.target,
            rows,
        })
    }

    /// Checks that `st` still serves the layout `plan` leaves.
    fn check_plan_layout(st: &State, plan: &Plan) -> Result<(), PsError> {
        if st.layout != plan.old {
            return Err(PsError::Reshard(format!(
                "PS {} changed layout (now {}) while re-sharding to layout {}",
                st.layout.index, st.layout.version, plan.target.version
            )));
        }
        Ok(())
    }

    /// Starts marking updated rows for a pre-copy. False when the server is frozen for
    /// this re-sharding already (a retried Reshard): every row is sent frozen then.
    fn begin_precopy(&self, plan: &Plan) -> Result<bool, PsError> {
        let mut st = self.state.lock();
        Self::check_plan_layout(&st, plan)?;
        match st.phase {
            Phase::Frozen(t) if t == plan.target => return Ok(false),
            Phase::Serving { precopy: None } => {}
            Phase::Serving { precopy: Some(t) } if t == plan.target => {}
            phase => return Err(self.busy(&st, phase, plan)),
        }
        let marks = st
            .store
            .tables()
            .iter()
            .map(|t| Bitset::new(t.local_rows()))
            .collect();
        st.dirty = Some(marks);
        st.phase = Phase::Serving {
            precopy: Some(plan.target),
        };
        self.publish(&st);
        Ok(true)
    }

    /// The refusal of a re-sharding while the server is in `phase`.
    fn busy(&self, st: &State, phase: Phase, plan: &Plan) -> PsError {
        PsError::Reshard(format!(
            "PS {} cannot move to layout {}: it is {:?} (layout {}{})",
            st.layout.index,
            plan.target.version,
            phase.state(),
            st.layout.version,
            match phase {
                Phase::Frozen(t) | Phase::Serving { precopy: Some(t) } =>
                    format!(", moving to layout {}", t.version),
                _ => String::new(),
            }
        ))
    }

    /// Freezes the state for `plan` (runs on the blocking pool: it may wait for a
    /// checkpoint's copy). Returns the rows marked since the pre-copy (`None`: send every
    /// row), how long the lock was held, and the dense version frozen.
    fn freeze(&self, plan: &Plan) -> Result<(Option<Vec<Bitset>>, Duration, u64), PsError> {
        let mut st = self.state.lock();
        let t0 = Instant::now();
        Self::check_plan_layout(&st, plan)?;
        let dirty = match st.phase {
            Phase::Frozen(t) if t == plan.target => None,
            Phase::Serving { precopy: None } => None,
            Phase::Serving { precopy: Some(t) } if t == plan.target => st.dirty.take(),
            phase => return Err(self.busy(&st, phase, plan)),
        };
        st.dirty = None;
        st.phase = Phase::Frozen(plan.target);
        self.publish(&st);
        let version = self.version_locked(&st);
        drop(st);
        Ok((dirty, t0.elapsed(), version))
    }

    /// Sends one pass to every target concurrently; the first failure ends them all.
    async fn send_pass(
        self: &Arc<Self>,
        peers: &Arc<dyn Peers>,
        plan: &Arc<Plan>,
        pass: Arc<Pass>,
    ) -> Result<Sent, PsError> {
        let mut tasks = JoinSet::new();
        for j in 0..plan.target.count {
            let (me, peers, plan, pass) = (self.clone(), peers.clone(), plan.clone(), pass.clone());
            tasks.spawn(async move { me.send_to(peers, plan, pass, j).await });
        }
        let mut total = Sent::default();
        while let Some(r) = tasks.join_next().await {
            total.merge(r??);
        }
        Ok(total)
    }

    /// Sends one pass to target `j`: the next message is built while the previous one is
    /// on its way (two in flight at most).
    async fn send_to(
        self: Arc<Self>,
        peers: Arc<dyn Peers>,
        plan: Arc<Plan>,
        pass: Arc<Pass>,
        j: u32,
    ) -> Result<Sent, PsError> {
        type Delivery = tokio::task::JoinHandle<Result<ImportResponse, PsError>>;
        let mut cursor = Cursor::default();
        let mut sent = Sent::default();
        let mut in_flight: Option<Delivery> = None;
        loop {
            let (me, p, ps) = (self.clone(), plan.clone(), pass.clone());
            let built = tokio::task::spawn_blocking(move || {
                let mut st = me.state.lock();
                let mut c = cursor;
                me.next_message(&mut st, &p, &ps, j, &mut c).map(|m| (m, c))
            })
            .await;
            if let Some(previous) = in_flight.take() {
                previous.await??;
            }
            let (msg, next) = built??;
            cursor = next;
            let Some(msg) = msg else {
                return Ok(sent);
            };
            // A server past the master's lease may have been replaced: it sends nothing.
            self.lease.check()?;
            sent.add(&msg);
            let peers = peers.clone();
            in_flight = Some(tokio::spawn(async move { peers.import(j, msg).await }));
        }
    }

    /// The next message of `pass` to target `j` after `cursor` (`None`: the pass is done
    /// with `j`), read from the state under the lock.
    fn next_message(
        &self,
        st: &mut State,
        plan: &Plan,
        pass: &Pass,
        j: u32,
        cursor: &mut Cursor,
    ) -> Result<Option<ImportRequest>, PsError> {
        let still = match pass {
            Pass::Precopy => {
                st.phase
                    == Phase::Serving {
                        precopy: Some(plan.target),
                    }
            }
            Pass::Frozen(_) => st.phase == Phase::Frozen(plan.target),
        };
        if !still || st.layout != plan.old {
            return Err(PsError::Reshard(format!(
                "the re-sharding of PS {} to layout {} was abandoned while sending",
                plan.old.index, plan.target.version
            )));
        }
        let mut budget = self.max_message_bytes.saturating_sub(MESSAGE_OVERHEAD);
        if matches!(pass, Pass::Precopy) {
            budget = budget.min(PRECOPY_MESSAGE_BYTES);
        }
        let base = ImportRequest {
            version: rpc::version(),
            layout_version: plan.target.version,
            num_ps: plan.target.count,
            target: j,
            source: plan.old.index,
            source_count: plan.old.count,
            source_node: self.replication.node(),
            ..Default::default()
        };
        let per_table = &plan.rows[j as usize];
        while cursor.table < per_table.len() {
            let t = cursor.table;
            let locals = &per_table[t];
            let table = st.store.table(t)?;
            let stride = table.stride();
            let max_rows = (budget / (stride * 4 + ROW_ID_BYTES + USAGE_BYTES)).max(1);
            let (mut rows, mut values, mut usage) = (Vec::new(), Vec::new(), Vec::new());
            while cursor.pos < locals.len() && rows.len() < max_rows {
                let l = locals[cursor.pos] as usize;
                cursor.pos += 1;
                if let Pass::Frozen(Some(marked)) = pass {
                    if !marked[t].contains(l) {
                        continue;
                    }
                }
                rows.push(table.global_of(l));
                values.extend_from_slice(&table.data()[l * stride..(l + 1) * stride]);
                if let Some(u) = table.usage_of(l) {
                    usage.push(u.packed());
                }
            }
            if cursor.pos >= locals.len() {
                cursor.table += 1;
                cursor.pos = 0;
            }
            if rows.is_empty() {
                continue;
            }
            if matches!(pass, Pass::Frozen(_)) {
                cursor.rows += rows.len() as u64;
            }
            if let (Pass::Precopy, Some(dirty)) = (pass, st.dirty.as_mut()) {
                for &r in &rows {
                    dirty[t].remove((r / u64::from(plan.old.count)) as usize);
                }
            }
            return Ok(Some(ImportRequest {
                table: t as u32,
                rows,
                values,
                usage,
                ..base
            }));
        }
        if matches!(pass, Pass::Precopy) {
            return Ok(None);
        }
        let mine = &st.layout.range;
        let next = dense_slice(
            self.config.dense_total,
            plan.target.count as usize,
            j as usize,
        );
        let (lo, hi) = (mine.start.max(next.start), mine.end.min(next.end));
        if lo + cursor.dense < hi {
            let buffers = st.opt.state();
            let max = (budget / ((1 + buffers.len()) * 4)).max(1);
            let a = lo + cursor.dense;
            let b = hi.min(a + max);
            let local = a - mine.start..b - mine.start;
            let mut dense_state = Vec::with_capacity(buffers.len() * local.len());
            for buf in &buffers {
                dense_state.extend_from_slice(&buf[local.clone()]);
            }
            cursor.dense += b - a;
            return Ok(Some(ImportRequest {
                dense_start: a as u64,
                dense: st.dense[local].to_vec(),
                dense_state,
                ..base
            }));
        }
        if cursor.finished {
            return Ok(None);
        }
        cursor.finished = true;
        let last_batches = st
            .last_batch
            .iter()
            .map(|(&worker_id, &b)| WorkerBatch {
                worker_id,
                batch: Some(b),
            })
            .collect();
        Ok(Some(ImportRequest {
            done: Some(ImportDone {
                dense_version: self.version_locked(st),
                optimizer_steps: st.opt.steps(),
                last_batches,
                rows_sent: cursor.rows,
            }),
            ..base
        }))
    }
}
