//! Dense replicas: server `i` of a layout keeps its dense slice, with the optimizer state,
//! replicated on server `(i + 1) % n`, so that a partial recovery of `i` loses no dense
//! update.
//!
//! CPR keeps the dense model on the trainers, where a parameter-server failure cannot reach
//! it. Here the dense slices live on the servers (the workers hold parameters but no
//! optimizer state), so a relaunched server that reloaded its slice from the checkpoint
//! would rewind one slice while the others moved on. Instead the owner sends each dense
//! update, after applying it, to its successor, which replays it on an optimizer of the
//! same kind: the same gradients, learning rates and order give the same bits. A push is
//! answered only once its update is replicated, so every update a worker saw applied
//! survives the owner's death. A relaunched owner takes its slice back (`TakeReplica`).
//!
//! The replica degrades, never blocks: while the successor is unreachable (dead, being
//! relaunched, or the layout changing) pushes are answered without waiting, and the owner
//! sends a whole seed (slice and optimizer state) once it can reach it again.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use elastrec_model::DenseOptimizer;
use elastrec_proto::ps::{
    DenseSpan, DenseState, DenseUpdate, ReplicateRequest, ReplicateResponse, TakeReplicaRequest,
    TakeReplicaResponse,
};
use elastrec_rpc::{self as rpc, Ps};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch, Notify};

use crate::error::PsError;
use crate::shard::{DenseGrad, PsShard, State};

/// Longest wait for a successor's answer: past it the replica counts as down and training
/// goes on without waiting for it.
const REPLICA_TIMEOUT: Duration = Duration::from_secs(5);
/// Shortest time between two attempts to reach a successor that did not answer.
const RETRY_SPACING: Duration = Duration::from_millis(100);

/// Where the owner's replication stands, for the pushes that wait on it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Progress {
    /// The highest dense version the successor acknowledged.
    acked: u64,
    /// The successor could not be reached with the addresses known: pushes do not wait
    /// (until the addresses change, or a seed succeeds).
    down: bool,
}

/// One update as the owner applied it, in the layout it applied it in.
struct Recorded {
    layout: u64,
    update: DenseUpdate,
}

/// Both sides of replication on one server: the sender of its own updates and the replica
/// of its predecessor's slice.
pub(crate) struct Replication {
    enabled: bool,
    /// Updates are recorded only while a replica is live (seeded and answering).
    live: AtomicBool,
    tx: mpsc::UnboundedSender<Recorded>,
    rx: Mutex<Option<mpsc::UnboundedReceiver<Recorded>>>,
    /// Woken when an update is applied while no replica is live (time to seed one) or the
    /// peers changed.
    wake: Notify,
    progress: watch::Sender<Progress>,
    /// The layout version and the running servers' addresses by index ("" where down).
    peers: watch::Sender<(u64, Vec<String>)>,
    /// The replica this server keeps of its predecessor's slice.
    held: Mutex<Option<Replica>>,
    /// This server's node id, sent with its updates (0: started without a master).
    node: AtomicU32,
    /// Per server index, the oldest node whose replica requests are still taken: a
    /// request from an older one comes from a server that was declared dead and replaced.
    floors: Mutex<Vec<u32>>,
}

/// A replica of another server's dense slice.
struct Replica {
    owner: u32,
    /// The owner's node id (its generation) that sent the replica.
    owner_node: u32,
    layout: u64,
    range: Range<usize>,
    dense: Vec<f32>,
    opt: Box<dyn DenseOptimizer>,
    version: u64,
}

impl Replication {
    /// Replication that runs when `enabled` (a job whose failed servers may be recovered
    /// partially).
    pub(crate) fn new(enabled: bool) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            enabled,
            live: AtomicBool::new(false),
            tx,
            rx: Mutex::new(Some(rx)),
            wake: Notify::new(),
            progress: watch::channel(Progress {
                acked: 0,
                down: true,
            })
            .0,
            peers: watch::channel((0, Vec::new())).0,
            held: Mutex::new(None),
            node: AtomicU32::new(0),
            floors: Mutex::new(Vec::new()),
        }
    }

    /// This server's node id, which the master assigned to its process.
    pub(crate) fn set_node(&self, node: u32) {
        self.node.store(node, Ordering::Release);
    }

    /// This server's node id (0: started without a master).
    pub(crate) fn node(&self) -> u32 {
        self.node.load(Ordering::Acquire)
    }

    /// The master published the node of each index (0 where none runs; see
    /// `HeartbeatResponse.ps_nodes`). A running node fences every older node of its index;
    /// an index where none runs fences the node this server holds a replica from, which
    /// the master no longer counts as running.
    pub(crate) fn fence(&self, nodes: &[u32]) {
        let held = self.held.lock().as_ref().map(|r| (r.owner, r.owner_node));
        let mut floors = self.floors.lock();
        if floors.len() < nodes.len() {
            floors.resize(nodes.len(), 0);
        }
        for (i, &n) in nodes.iter().enumerate() {
            let floor = match held {
                Some((owner, owner_node)) if n == 0 && owner as usize == i && owner_node > 0 => {
                    owner_node + 1
                }
                _ => n,
            };
            floors[i] = floors[i].max(floor);
        }
    }

    /// Refuses a request of `node` for index `index` when a newer node of that index is
    /// known; otherwise `node` becomes the oldest one taken.
    pub(crate) fn admit(&self, index: u32, node: u32) -> Result<(), PsError> {
        let mut floors = self.floors.lock();
        let i = index as usize;
        if floors.len() <= i {
            floors.resize(i + 1, 0);
        }
        if node < floors[i] {
            return Err(PsError::StaleGeneration {
                index,
                node,
                current: floors[i],
            });
        }
        floors[i] = node;
        Ok(())
    }

    /// The master published the servers of layout `layout` (by index, "" where one is not
    /// running).
    pub(crate) fn set_peers(&self, layout: u64, addrs: Vec<String>) {
        if !self.enabled || addrs.is_empty() {
            return;
        }
        let changed = self.peers.send_if_modified(|p| {
            let new = (layout, addrs);
            (*p != new).then(|| *p = new).is_some()
        });
        if changed {
            // Worth a try again: pushes wait for its outcome.
            self.progress.send_modify(|p| p.down = false);
            self.wake.notify_one();
        }
    }

    /// Hands the queue to the sender task: until then, no push waits.
    fn start(&self) -> Option<mpsc::UnboundedReceiver<Recorded>> {
        let rx = self.rx.lock().take().filter(|_| self.enabled)?;
        self.progress.send_modify(|p| p.down = false);
        Some(rx)
    }

    /// Called by a lock holder that applied a dense update (`st` is the state after it,
    /// `version` its dense version): queues it for the successor.
    pub(crate) fn record(&self, st: &State, version: u64, grad: &DenseGrad<'_>) {
        if !self.enabled {
            return;
        }
        if !self.live.load(Ordering::Acquire) {
            self.wake.notify_one();
            return;
        }
        let (spans, grad) = match grad {
            DenseGrad::Whole(g) => (Vec::new(), g.to_vec()),
            DenseGrad::Spans(spans) => (
                spans
                    .iter()
                    .map(|(offset, g)| DenseSpan {
                        start: *offset as u64,
                        len: g.len() as u64,
                    })
                    .collect(),
                spans.iter().flat_map(|(_, g)| g.iter().copied()).collect(),
            ),
        };
        let _ = self.tx.send(Recorded {
            layout: st.layout.version,
            update: DenseUpdate {
                dense_version: version,
                lr: st.dense_lr,
                spans,
                grad,
            },
        });
    }

    /// The state was replaced (restore, new layout): the replica must be seeded again.
    pub(crate) fn invalidate(&self) {
        self.live.store(false, Ordering::Release);
        self.wake.notify_one();
    }

    /// The successor could not be reached: the replica must be seeded again, and pushes
    /// stop waiting for it.
    fn lost(&self) {
        self.live.store(false, Ordering::Release);
        self.progress.send_modify(|p| p.down = true);
    }

    /// Waits until dense version `version` is replicated, or no replica is live.
    pub(crate) async fn replicated(&self, version: u64) {
        if !self.enabled {
            return;
        }
        let mut rx = self.progress.subscribe();
        let _ = rx.wait_for(|p| p.down || p.acked >= version).await;
    }

    /// Applies a `Replicate` request from the predecessor to the replica held.
    pub(crate) fn apply(
        &self,
        shard: &PsShard,
        req: ReplicateRequest,
    ) -> Result<ReplicateResponse, PsError> {
        let mut held = self.held.lock();
        self.admit(req.owner, req.owner_node)?;
        if let Some(seed) = req.seed {
            let range = check_range(shard, &seed)?;
            let mut opt = shard.config.dense_optimizer_for(&range);
            put_state(opt.as_mut(), &seed, range.len())?;
            *held = Some(Replica {
                owner: req.owner,
                owner_node: req.owner_node,
                layout: req.layout_version,
                range,
                dense: seed.dense,
                opt,
                version: seed.dense_version,
            });
        }
        let needs_seed = ReplicateResponse {
            dense_version: 0,
            needs_seed: true,
        };
        // Updates apply only to a replica their own node seeded: a new node of the index
        // seeds its own first.
        let Some(r) = held.as_mut().filter(|r| {
            r.owner == req.owner && r.owner_node == req.owner_node && r.layout == req.layout_version
        }) else {
            return Ok(needs_seed);
        };
        for u in &req.updates {
            if u.dense_version <= r.version {
                continue;
            }
            if u.dense_version != r.version + 1 {
                return Ok(needs_seed);
            }
            r.apply(u)?;
        }
        Ok(ReplicateResponse {
            dense_version: r.version,
            needs_seed: false,
        })
    }

    /// The replica of `owner`'s slice in layout `layout`, if this server keeps it.
    pub(crate) fn take(&self, req: &TakeReplicaRequest) -> TakeReplicaResponse {
        let held = self.held.lock();
        TakeReplicaResponse {
            state: held
                .as_ref()
                .filter(|r| r.owner == req.owner && r.layout == req.layout_version)
                .map(|r| dense_state(&r.range, &r.dense, r.opt.as_ref(), r.version)),
        }
    }
}

impl Replica {
    /// Replays one update exactly as the owner applied it (`PsShard::apply_all`).
    fn apply(&mut self, u: &DenseUpdate) -> Result<(), PsError> {
        let n = self.dense.len();
        let bad = |detail: String| PsError::BadField {
            message: "Replicate",
            field: "updates",
            detail,
        };
        self.opt.set_lr(u.lr);
        if u.spans.is_empty() {
            if u.grad.len() != n {
                return Err(bad(format!(
                    "a gradient of {} values for a slice of {n}",
                    u.grad.len()
                )));
            }
            self.opt.step(&mut self.dense, &u.grad);
        } else {
            let mut at = 0usize;
            for s in &u.spans {
                let (start, len) = (s.start as usize, s.len as usize);
                let end = start.checked_add(len).filter(|&e| e <= n);
                let to = at.checked_add(len).filter(|&e| e <= u.grad.len());
                let (Some(_), Some(to)) = (end, to) else {
                    return Err(bad(format!(
                        "span {start}+{len} outside a slice of {n} or its gradient"
                    )));
                };
                self.opt.step_range(&mut self.dense, &u.grad[at..to], start);
                at = to;
            }
        }
        self.version = u.dense_version;
        Ok(())
    }
}

/// The range of a seed, checked against this job's dense vector.
fn check_range(shard: &PsShard, seed: &DenseState) -> Result<Range<usize>, PsError> {
    let (start, end) = (seed.dense_start as usize, seed.dense_end as usize);
    if start > end || end > shard.config.dense_total || seed.dense.len() != end - start {
        return Err(PsError::BadField {
            message: "Replicate",
            field: "seed",
            detail: format!(
                "a slice {start}..{end} with {} values of a dense vector of {}",
                seed.dense.len(),
                shard.config.dense_total
            ),
        });
    }
    Ok(start..end)
}

/// Writes a seed's optimizer buffers and step count into `opt` (built for `n` values).
pub(crate) fn put_state(
    opt: &mut dyn DenseOptimizer,
    seed: &DenseState,
    n: usize,
) -> Result<(), PsError> {
    let mut bufs = opt.state_mut();
    if seed.state_buffers as usize != bufs.len() || seed.state.len() != bufs.len() * n {
        return Err(PsError::BadField {
            message: "Replicate",
            field: "seed.state",
            detail: format!(
                "{} buffers of {} values in all; this job's dense optimizer has {} of {n}",
                seed.state_buffers,
                seed.state.len(),
                bufs.len()
            ),
        });
    }
    for (b, chunk) in bufs.iter_mut().zip(seed.state.chunks_exact(n.max(1))) {
        b.copy_from_slice(chunk);
    }
    opt.set_steps(seed.optimizer_steps);
    Ok(())
}

/// A slice and its optimizer state, as sent on the wire.
pub(crate) fn dense_state(
    range: &Range<usize>,
    dense: &[f32],
    opt: &dyn DenseOptimizer,
    version: u64,
) -> DenseState {
    let bufs = opt.state();
    DenseState {
        dense_start: range.start as u64,
        dense_end: range.end as u64,
        dense_version: version,
        optimizer_steps: opt.steps(),
        dense: dense.to_vec(),
        state: bufs.iter().flat_map(|b| b.iter().copied()).collect(),
        state_buffers: bufs.len() as u32,
    }
}

/// Why a request did not reach the successor.
enum SendError {
    /// The successor answered but holds no matching replica: seed it.
    NeedsSeed,
    /// The addresses changed while it was under way: try again at once.
    PeersChanged,
    /// It could not be reached (the message says why).
    Unreachable(String),
}

/// Starts sending `shard`'s updates to its successor (once; on the current runtime).
pub(crate) fn start(shard: &Arc<PsShard>) {
    if let Some(queue) = shard.replication.start() {
        tokio::spawn(forward(shard.clone(), queue));
    }
}

/// The sender of a server's updates to its successor; runs as long as the process.
async fn forward(me: Arc<PsShard>, mut rx: mpsc::UnboundedReceiver<Recorded>) {
    let rep = &me.replication;
    let mut link: Option<(String, Ps)> = None;
    let mut seeded_layout = None;
    let mut last_error = String::new();
    let mut report = |why: &str| {
        if !why.is_empty() && why != last_error {
            me.metrics.replica_failures.inc();
            eprintln!("PS {}: dense replica not live: {why}", me.index());
        }
        last_error = why.to_string();
    };
    loop {
        if !rep.live.load(Ordering::Acquire) {
            rep.wake.notified().await;
            match seed(&me, &mut rx, &mut link).await {
                Ok(layout) => {
                    seeded_layout = Some(layout);
                    report("");
                }
                Err(SendError::Unreachable(why)) => {
                    rep.lost();
                    report(&why);
                    tokio::time::sleep(RETRY_SPACING).await;
                }
                Err(SendError::NeedsSeed | SendError::PeersChanged) => rep.invalidate(),
            }
            continue;
        }
        let first = tokio::select! {
            r = rx.recv() => match r {
                Some(r) => r,
                None => return,
            },
            () = rep.wake.notified() => continue,
        };
        let mut batch = vec![first];
        let mut bytes = batch[0].update.grad.len() * 4;
        while bytes < me.max_message_bytes / 2 {
            match rx.try_recv() {
                Ok(r) => {
                    bytes += r.update.grad.len() * 4;
                    batch.push(r);
                }
                Err(_) => break,
            }
        }
        let layout = batch[0].layout;
        if Some(layout) != seeded_layout || batch.iter().any(|r| r.layout != layout) {
            rep.invalidate();
            continue;
        }
        let req = ReplicateRequest {
            version: rpc::version(),
            owner: me.index(),
            layout_version: layout,
            seed: None,
            updates: batch.into_iter().map(|r| r.update).collect(),
            owner_node: rep.node.load(Ordering::Acquire),
        };
        match send(&me, &mut link, layout, req).await {
            Ok(()) => {}
            Err(SendError::Unreachable(why)) => {
                rep.lost();
                report(&why);
            }
            // The next update seeds the successor again.
            Err(SendError::NeedsSeed | SendError::PeersChanged) => rep.invalidate(),
        }
    }
}

/// Seeds the successor with the whole slice and marks the replica live; returns the
/// layout it was seeded for.
async fn seed(
    me: &Arc<PsShard>,
    rx: &mut mpsc::UnboundedReceiver<Recorded>,
    link: &mut Option<(String, Ps)>,
) -> Result<u64, SendError> {
    let (layout, state) = {
        let st = me.state.lock();
        let version = me.version_locked(&st);
        let state = dense_state(&st.layout.range, &st.dense, st.opt.as_ref(), version);
        // Everything queued so far is in the seed; updates queued from now on follow it.
        while rx.try_recv().is_ok() {}
        me.replication.live.store(true, Ordering::Release);
        (st.layout.version, state)
    };
    let version = state.dense_version;
    let req = ReplicateRequest {
        version: rpc::version(),
        owner: me.index(),
        layout_version: layout,
        seed: Some(state),
        updates: Vec::new(),
        owner_node: me.replication.node.load(Ordering::Acquire),
    };
    send(me, link, layout, req).await?;
    me.replication.progress.send_modify(|p| {
        p.down = false;
        p.acked = p.acked.max(version);
    });
    Ok(layout)
}

/// Sends one request to the successor in layout `layout` and records what it acknowledged.
async fn send(
    me: &Arc<PsShard>,
    link: &mut Option<(String, Ps)>,
    layout: u64,
    req: ReplicateRequest,
) -> Result<(), SendError> {
    // A server whose lease ran out may have been replaced: it sends nothing.
    me.lease
        .check()
        .map_err(|e| SendError::Unreachable(e.to_string()))?;
    let view = me.layout();
    let (index, count) = (view.layout.index, view.layout.count);
    if count < 2 {
        return Err(SendError::Unreachable(
            "a single server has no successor".into(),
        ));
    }
    let next = (index + 1) % count;
    let peers = me.replication.peers.borrow().clone();
    if peers.0 != layout {
        return Err(SendError::Unreachable(format!(
            "the addresses of layout {layout} are not known yet (known: layout {})",
            peers.0
        )));
    }
    let addr = peers.1.get(next as usize).cloned().unwrap_or_default();
    if addr.is_empty() {
        return Err(SendError::Unreachable(format!(
            "server {next} is not running"
        )));
    }
    if link.as_ref().is_none_or(|(a, _)| *a != addr) {
        let token = me.peer_token.get().ok_or_else(|| {
            SendError::Unreachable("this server has no job token to call the others".into())
        })?;
        let client = rpc::ps_client(&addr, token, me.max_message_bytes, REPLICA_TIMEOUT)
            .map_err(|e| SendError::Unreachable(format!("server {next} at {addr}: {e}")))?;
        *link = Some((addr.clone(), client));
    }
    let (_, client) = link.as_mut().expect("set above");
    let sent = tokio::time::timeout(REPLICA_TIMEOUT, client.replicate(req)).await;
    let resp = match sent {
        Ok(Ok(r)) => r.into_inner(),
        _ if *me.replication.peers.borrow() != peers => return Err(SendError::PeersChanged),
        Ok(Err(s)) => {
            return Err(SendError::Unreachable(format!(
                "server {next} at {addr}: {}",
                s.message()
            )))
        }
        Err(_) => {
            return Err(SendError::Unreachable(format!(
                "server {next} at {addr} did not answer in {REPLICA_TIMEOUT:?}"
            )))
        }
    };
    if resp.needs_seed {
        return Err(SendError::NeedsSeed);
    }
    me.replication
        .progress
        .send_modify(|p| p.acked = p.acked.max(resp.dense_version));
    Ok(())
}

impl PsShard {
    /// The master published the servers of layout `layout` (by index, "" where one is not
    /// running): where this server's dense replica goes.
    pub fn set_peers(&self, layout: u64, addrs: Vec<String>) {
        self.replication.set_peers(layout, addrs);
    }

    /// This server's node id (its generation), which the master assigned to its process.
    pub fn set_node(&self, node: u32) {
        self.replication.set_node(node);
    }

    /// The master published the node of each server index (0 where none runs): replica
    /// requests from older nodes of an index are refused from now on.
    pub fn fence_peers(&self, nodes: &[u32]) {
        self.replication.fence(nodes);
    }

    /// A server relaunched by a partial recovery takes its dense slice and optimizer state
    /// from the replica its successor keeps (`addrs`: the running servers by index), when
    /// that replica is at least as new as what the checkpoint restored (`token`: the job's,
    /// to call the successor). Returns the dense
    /// version it now holds, or why the slice stays as the checkpoint left it.
    pub async fn take_dense_replica(&self, addrs: &[String], token: &str) -> Result<u64, String> {
        let layout = self.layout().layout;
        if layout.count < 2 {
            return Err("a single server has no replica".into());
        }
        let next = (layout.index + 1) % layout.count;
        let addr = addrs
            .get(next as usize)
            .filter(|a| !a.is_empty())
            .ok_or_else(|| format!("server {next}, which keeps the replica, is not running"))?;
        let mut client = rpc::ps_client(addr, token, self.max_message_bytes, REPLICA_TIMEOUT)
            .map_err(|e| format!("server {next} at {addr}: {e}"))?;
        let resp = client
            .take_replica(TakeReplicaRequest {
                version: rpc::version(),
                owner: layout.index,
                layout_version: layout.version,
            })
            .await
            .map_err(|s| format!("server {next} at {addr}: {}", s.message()))?
            .into_inner();
        let state = resp.state.ok_or_else(|| {
            format!(
                "server {next} holds no replica of this slice in layout {}",
                layout.version
            )
        })?;
        let mut st = self.state.lock();
        let restored = self.version_locked(&st);
        if (state.dense_start as usize, state.dense_end as usize)
            != (layout.range.start, layout.range.end)
            || state.dense.len() != st.dense.len()
        {
            return Err(format!(
                "the replica covers {}..{}, this server {:?}",
                state.dense_start, state.dense_end, layout.range
            ));
        }
        if state.dense_version < restored {
            return Err(format!(
                "the replica (version {}) is older than the checkpoint (version {restored})",
                state.dense_version
            ));
        }
        let n = st.dense.len();
        put_state(st.opt.as_mut(), &state, n).map_err(|e| e.to_string())?;
        st.dense.copy_from_slice(&state.dense);
        self.set_version(&mut st, state.dense_version);
        drop(st);
        self.version_tx.send_replace(state.dense_version);
        Ok(state.dense_version)
    }
}
