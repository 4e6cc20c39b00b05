//! The group-commit writer: one transaction per group of requests, each request answered
//! once its changes are durable.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, watch};

use super::raw::{open_writer, Checkpointer, RawWriter};
use super::{MasterDb, StoreError};
use crate::job::Change;

/// One request's changes in the writer's queue.
struct Pending {
    /// Position in the queue (1, 2, …).
    seq: u64,
    changes: Vec<Change>,
    ack: oneshot::Sender<std::result::Result<(), String>>,
}

/// How far the writer got.
#[derive(Clone, Debug, Default)]
struct Written {
    /// Every submission up to this sequence number is durable.
    seq: u64,
    /// Why a write failed. From then on nothing is acknowledged (fail-stop): the database
    /// no longer holds what the state in memory says.
    failed: Option<String>,
}

/// The tail of the writer's queue, as seen by submitters (which hold the state lock).
#[derive(Debug, Default)]
struct Tail {
    /// Sequence number of the last submission.
    seq: u64,
    /// Sequence number of the last submission that changed a node row, a scalar or reset
    /// the data (everything but task rows and ledger ranges).
    nodes_seq: u64,
}

/// What a reply that changes nothing itself depends on (see [`Writer::barrier`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Depends {
    /// Everything queued before it (e.g. a task reply reads task rows another request
    /// just changed).
    All,
    /// Only node rows and scalars: node states, phase, PS addresses (heartbeats).
    Nodes,
}

/// A position in the writer's queue that a reply must not overtake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Barrier(u64);

/// Group-commit writer: requests queue their changes in mutation order; one transaction
/// writes everything queued so far, then every waiting request is acknowledged.
///
/// A request that changed nothing may still have read state that another request changed
/// and whose write is still queued; it takes a [`Barrier`] under the state lock and waits
/// for it ([`Writer::wait`]) before replying. When nothing it depends on is pending (the
/// usual case for heartbeats) that costs no waiting at all.
#[derive(Clone, Debug)]
pub struct Writer {
    tx: mpsc::UnboundedSender<Pending>,
    tail: Arc<parking_lot::Mutex<Tail>>,
    written: Arc<watch::Sender<Written>>,
    stats: Arc<Counters>,
}

/// Counters of the writer's work (see [`Writer::stats`]).
#[derive(Debug, Default)]
struct Counters {
    transactions: std::sync::atomic::AtomicU64,
    submissions: std::sync::atomic::AtomicU64,
}

/// What the writer did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Transactions committed (one per group).
    pub transactions: u64,
    /// Requests' change sets they held.
    pub submissions: u64,
}

impl Writer {
    /// Starts the writer task on the current runtime.
    pub fn spawn(store: MasterDb) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Pending>();
        let written = Arc::new(watch::Sender::new(Written::default()));
        let progress = written.clone();
        let stats = Arc::new(Counters::default());
        let counters = stats.clone();
        tokio::spawn(async move {
            // A connection of its own, taken out of the pool and locked for the writer: every
            // write goes through it, on this task, with one warm page cache. An error while
            // opening fails every group (as a failed write does).
            let mut conn = open_writer(&store).await.map_err(|e| e.to_string());
            let mut locked = match &mut conn {
                Ok(c) => c.lock_handle().await.map_err(|e| e.to_string()),
                Err(e) => Err(e.clone()),
            };
            let mut raw = match &mut locked {
                // SAFETY: the handle stays valid and locked for us while `locked` lives,
                // which outlives `raw` (dropped first, in reverse order of declaration).
                Ok(h) => unsafe { RawWriter::new(h.as_raw_handle().as_ptr()) },
                Err(e) => Err(e.clone()),
            };
            let mut checkpoints = Checkpointer::new();
            let mut batch: Vec<Pending> = Vec::new();
            let mut all: Vec<Change> = Vec::new();
            while let Some(first) = rx.recv().await {
                batch.push(first);
                // Let the requests that are ready to run now queue their changes first: the
                // group then takes them all (a commit costs about as much for one request
                // as for dozens, and replies wait for it anyway).
                tokio::task::yield_now().await;
                while batch.len() < 4096 {
                    match rx.try_recv() {
                        Ok(p) => batch.push(p),
                        Err(_) => break,
                    }
                }
                all.clear();
                for p in &mut batch {
                    all.append(&mut p.changes);
                }
                let failed = progress.borrow().failed.clone();
                let res = match failed {
                    Some(e) => Err(e),
                    None if all.is_empty() => Ok(()),
                    None => {
                        let res = match &mut raw {
                            Ok(w) => w.write(&all),
                            Err(e) => Err(format!("master database: opening the writer: {e}")),
                        };
                        if res.is_ok() {
                            use std::sync::atomic::Ordering::Relaxed;
                            checkpoints.after_commit(&store);
                            counters.transactions.fetch_add(1, Relaxed);
                            counters.submissions.fetch_add(batch.len() as u64, Relaxed);
                        }
                        res
                    }
                };
                let last = batch.last().map_or(0, |p| p.seq);
                progress.send_modify(|w| {
                    w.seq = last;
                    if let Err(e) = &res {
                        w.failed.get_or_insert_with(|| e.clone());
                    }
                });
                for p in batch.drain(..) {
                    let _ = p.ack.send(res.clone());
                }
            }
        });
        Self {
            tx,
            tail: Arc::default(),
            written,
            stats,
        }
    }

    /// What the writer did so far.
    pub fn stats(&self) -> WriterStats {
        use std::sync::atomic::Ordering::Relaxed;
        WriterStats {
            transactions: self.stats.transactions.load(Relaxed),
            submissions: self.stats.submissions.load(Relaxed),
        }
    }

    /// Queues `changes` (call while still holding the state lock, so order is kept) and
    /// returns a future that resolves once they are durable.
    pub fn submit(
        &self,
        changes: Vec<Change>,
    ) -> impl std::future::Future<Output = std::result::Result<(), StoreError>> + use<> {
        let (ack, done) = oneshot::channel();
        let sent = {
            let mut tail = self.tail.lock();
            tail.seq += 1;
            if changes
                .iter()
                .any(|c| !matches!(c, Change::Task(_) | Change::Range(..)))
            {
                tail.nodes_seq = tail.seq;
            }
            let seq = tail.seq;
            // Sent under the tail lock: queue order is sequence order.
            self.tx.send(Pending { seq, changes, ack }).is_ok()
        };
        async move {
            if !sent {
                return Err(StoreError::WriterGone);
            }
            match done.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(StoreError::Write(e)),
                Err(_) => Err(StoreError::WriterGone),
            }
        }
    }

    /// The queue position a reply that changed nothing, built from the state as it is
    /// now, must wait for (call while holding the state lock).
    pub fn barrier(&self, depends: Depends) -> Barrier {
        let tail = self.tail.lock();
        Barrier(match depends {
            Depends::All => tail.seq,
            Depends::Nodes => tail.nodes_seq,
        })
    }

    /// Resolves once everything up to `barrier` is durable (at once when it already is).
    pub async fn wait(&self, barrier: Barrier) -> std::result::Result<(), StoreError> {
        let check = |w: &Written| match &w.failed {
            Some(e) => Some(Err(StoreError::Write(e.clone()))),
            None => (w.seq >= barrier.0).then_some(Ok(())),
        };
        if let Some(r) = check(&self.written.borrow()) {
            return r;
        }
        let mut rx = self.written.subscribe();
        let w = rx
            .wait_for(|w| check(w).is_some())
            .await
            .map_err(|_| StoreError::WriterGone)?;
        check(&w).expect("waited for it")
    }
}
