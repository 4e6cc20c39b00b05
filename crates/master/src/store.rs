//! SQLite persistence of the master state (task queue, ledger, node table, job config).
//!
//! Changes produced by the state machine are written in one transaction per group of
//! requests ([`Writer`], group commit) before any of those requests is answered.

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::Row;
use tokio::sync::{mpsc, oneshot};

use crate::job::{Change, Node, NodeState, Role};
use crate::tasks::{Range, Task, TaskState};

/// A persistence failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused an operation.
    #[error("master database: {0}")]
    Db(#[from] sqlx::Error),
    /// Migrations failed.
    #[error("master database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored value does not parse.
    #[error("master database holds a bad value in {what}: {value}")]
    Corrupt {
        /// Which column or key.
        what: &'static str,
        /// The value.
        value: String,
    },
    /// The writer task is gone.
    #[error("master database writer stopped")]
    WriterGone,
}

type Result<T> = std::result::Result<T, StoreError>;

/// Everything the master needs to restart.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Scalars (JSON text) by key.
    pub meta: HashMap<String, String>,
    /// Every task.
    pub tasks: Vec<Task>,
    /// Every consumed range, in report order.
    pub ranges: Vec<Range>,
    /// The node table.
    pub nodes: Vec<Node>,
}

/// Handle on the master database.
#[derive(Clone, Debug)]
pub struct Store {
    pool: SqlitePool,
}

fn role_str(r: Role) -> &'static str {
    match r {
        Role::Ps => "ps",
        Role::Worker => "worker",
    }
}

fn state_str(s: NodeState) -> &'static str {
    match s {
        NodeState::Pending => "pending",
        NodeState::Running => "running",
        NodeState::Stopping => "stopping",
        NodeState::Exited => "exited",
        NodeState::Dead => "dead",
    }
}

fn corrupt(what: &'static str, value: &str) -> StoreError {
    StoreError::Corrupt {
        what,
        value: value.to_string(),
    }
}

impl Store {
    /// Opens (creating when `create`) the database at `path` and applies migrations.
    pub async fn open(path: &Path, create: bool) -> Result<Self> {
        let opts = SqliteConnectOptions::from_str("sqlite://")?
            .filename(path)
            .create_if_missing(create)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(std::time::Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(opts)
            .await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        Ok(Self { pool })
    }

    /// Opens an existing database read-only (for `elastrec status`).
    pub async fn open_read_only(path: &Path) -> Result<Self> {
        let opts = SqliteConnectOptions::from_str("sqlite://")?
            .filename(path)
            .read_only(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(opts)
            .await?;
        Ok(Self { pool })
    }

    /// Writes `changes` in one transaction.
    pub async fn apply(&self, changes: &[Change]) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        for c in changes {
            match c {
                Change::ResetData(tasks, ranges) => {
                    sqlx::query("DELETE FROM tasks").execute(&mut *tx).await?;
                    sqlx::query("DELETE FROM ledger").execute(&mut *tx).await?;
                    for t in tasks {
                        Self::put_task(&mut tx, t).await?;
                    }
                    for &(e, f, s, t) in ranges {
                        Self::put_range(&mut tx, e, f, s, t).await?;
                    }
                }
                Change::Task(t) => Self::put_task(&mut tx, t).await?,
                Change::Range(e, f, s, t) => Self::put_range(&mut tx, *e, *f, *s, *t).await?,
                Change::Node(n) => {
                    sqlx::query(
                        "INSERT INTO nodes (id, role, idx, state, pid, addr, last_seen_ms, started_ms, samples, step, restarts)
                         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                         ON CONFLICT(id) DO UPDATE SET role=excluded.role, idx=excluded.idx,
                           state=excluded.state, pid=excluded.pid, addr=excluded.addr,
                           last_seen_ms=excluded.last_seen_ms, started_ms=excluded.started_ms,
                           samples=excluded.samples, step=excluded.step, restarts=excluded.restarts",
                    )
                    .bind(n.id as i64)
                    .bind(role_str(n.role))
                    .bind(n.index as i64)
                    .bind(state_str(n.state))
                    .bind(n.pid as i64)
                    .bind(&n.addr)
                    .bind(n.last_seen_ms as i64)
                    .bind(n.started_ms as i64)
                    .bind(n.samples as i64)
                    .bind(n.step as i64)
                    .bind(n.restarts as i64)
                    .execute(&mut *tx)
                    .await?;
                }
                Change::Meta(k, v) => {
                    sqlx::query(
                        "INSERT INTO meta (key, value) VALUES (?, ?)
                         ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                    )
                    .bind(*k)
                    .bind(v)
                    .execute(&mut *tx)
                    .await?;
                }
            }
        }
        tx.commit().await?;
        Ok(())
    }

    async fn put_task(
        tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
        t: &Task,
    ) -> std::result::Result<(), sqlx::Error> {
        let (state, worker) = match t.state {
            TaskState::Todo => ("todo", None),
            TaskState::Doing(w) => ("doing", Some(w as i64)),
            TaskState::Done => ("done", None),
        };
        sqlx::query(
            "INSERT INTO tasks (id, epoch, file, start_row, end_row, offset_rows, state, worker, ord)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
             ON CONFLICT(id) DO UPDATE SET epoch=excluded.epoch, file=excluded.file,
               start_row=excluded.start_row, end_row=excluded.end_row,
               offset_rows=excluded.offset_rows, state=excluded.state,
               worker=excluded.worker, ord=excluded.ord",
        )
        .bind(t.id as i64)
        .bind(t.epoch as i64)
        .bind(t.file as i64)
        .bind(t.start as i64)
        .bind(t.end as i64)
        .bind(t.offset as i64)
        .bind(state)
        .bind(worker)
        .bind(t.order)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    async fn put_range(
        tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
        e: u32,
        f: u32,
        s: u64,
        t: u64,
    ) -> std::result::Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO ledger (epoch, file, start_row, end_row) VALUES (?, ?, ?, ?)")
            .bind(e as i64)
            .bind(f as i64)
            .bind(s as i64)
            .bind(t as i64)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// Sets one scalar.
    pub async fn set_meta(&self, key: &'static str, value: String) -> Result<()> {
        self.apply(&[Change::Meta(key, value)]).await
    }

    /// Reads the whole state back.
    pub async fn load(&self) -> Result<Snapshot> {
        let mut snap = Snapshot::default();
        for r in sqlx::query("SELECT key, value FROM meta")
            .fetch_all(&self.pool)
            .await?
        {
            snap.meta.insert(r.try_get(0)?, r.try_get(1)?);
        }
        for r in sqlx::query(
            "SELECT id, epoch, file, start_row, end_row, offset_rows, state, worker, ord FROM tasks",
        )
        .fetch_all(&self.pool)
        .await?
        {
            let state: String = r.try_get(6)?;
            let worker: Option<i64> = r.try_get(7)?;
            let state = match (state.as_str(), worker) {
                ("todo", _) => TaskState::Todo,
                ("doing", Some(w)) => TaskState::Doing(w as u32),
                ("done", _) => TaskState::Done,
                _ => return Err(corrupt("tasks.state", &state)),
            };
            snap.tasks.push(Task {
                id: r.try_get::<i64, _>(0)? as u64,
                epoch: r.try_get::<i64, _>(1)? as u32,
                file: r.try_get::<i64, _>(2)? as u32,
                start: r.try_get::<i64, _>(3)? as u64,
                end: r.try_get::<i64, _>(4)? as u64,
                offset: r.try_get::<i64, _>(5)? as u64,
                state,
                order: r.try_get(8)?,
            });
        }
        for r in sqlx::query("SELECT epoch, file, start_row, end_row FROM ledger ORDER BY seq")
            .fetch_all(&self.pool)
            .await?
        {
            snap.ranges.push((
                r.try_get::<i64, _>(0)? as u32,
                r.try_get::<i64, _>(1)? as u32,
                r.try_get::<i64, _>(2)? as u64,
                r.try_get::<i64, _>(3)? as u64,
            ));
        }
        for r in sqlx::query(
            "SELECT id, role, idx, state, pid, addr, last_seen_ms, started_ms, samples, step, restarts FROM nodes ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await?
        {
            let role: String = r.try_get(1)?;
            let state: String = r.try_get(3)?;
            snap.nodes.push(Node {
                id: r.try_get::<i64, _>(0)? as u32,
                role: match role.as_str() {
                    "ps" => Role::Ps,
                    "worker" => Role::Worker,
                    _ => return Err(corrupt("nodes.role", &role)),
                },
                index: r.try_get::<i64, _>(2)? as u32,
                state: match state.as_str() {
                    "pending" => NodeState::Pending,
                    "running" => NodeState::Running,
                    "stopping" => NodeState::Stopping,
                    "exited" => NodeState::Exited,
                    "dead" => NodeState::Dead,
                    _ => return Err(corrupt("nodes.state", &state)),
                },
                pid: r.try_get::<i64, _>(4)? as u32,
                addr: r.try_get(5)?,
                last_seen_ms: r.try_get::<i64, _>(6)? as u64,
                started_ms: r.try_get::<i64, _>(7)? as u64,
                samples: r.try_get::<i64, _>(8)? as u64,
                step: r.try_get::<i64, _>(9)? as u64,
                restarts: r.try_get::<i64, _>(10)? as u32,
            });
        }
        Ok(snap)
    }
}

type Pending = (
    Vec<Change>,
    oneshot::Sender<std::result::Result<(), String>>,
);

/// Group-commit writer: requests queue their changes in mutation order; one transaction
/// writes everything queued so far, then every waiting request is acknowledged.
#[derive(Clone, Debug)]
pub struct Writer {
    tx: mpsc::UnboundedSender<Pending>,
}

impl Writer {
    /// Starts the writer task on the current runtime.
    pub fn spawn(store: Store) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Pending>();
        tokio::spawn(async move {
            let mut batch: Vec<Pending> = Vec::new();
            let mut all: Vec<Change> = Vec::new();
            while let Some(first) = rx.recv().await {
                batch.push(first);
                while batch.len() < 4096 {
                    match rx.try_recv() {
                        Ok(p) => batch.push(p),
                        Err(_) => break,
                    }
                }
                all.clear();
                for (c, _) in &mut batch {
                    all.append(c);
                }
                let res = if all.is_empty() {
                    Ok(())
                } else {
                    store.apply(&all).await.map_err(|e| e.to_string())
                };
                for (_, ack) in batch.drain(..) {
                    let _ = ack.send(res.clone());
                }
            }
        });
        Self { tx }
    }

    /// Queues `changes` (call while still holding the state lock, so order is kept) and
    /// returns a future that resolves once they are durable.
    pub fn submit(
        &self,
        changes: Vec<Change>,
    ) -> impl std::future::Future<Output = std::result::Result<(), StoreError>> + use<> {
        let (ack, done) = oneshot::channel();
        let sent = self.tx.send((changes, ack)).is_ok();
        async move {
            if !sent {
                return Err(StoreError::WriterGone);
            }
            match done.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(StoreError::Corrupt {
                    what: "write",
                    value: e,
                }),
                Err(_) => Err(StoreError::WriterGone),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Context, Event, Job, Policy, TaskReply};
    use crate::tasks::{ShardSpec, TaskQueue};

    #[derive(Default)]
    struct Cx {
        now: u64,
        changes: Vec<Change>,
        launched: Vec<Node>,
    }
    impl Context for Cx {
        fn now_ms(&self) -> u64 {
            self.now
        }
        fn persist(&mut self, c: Change) {
            self.changes.push(c);
        }
        fn launch(&mut self, n: &Node) {
            self.launched.push(n.clone());
        }
        fn kill(&mut self, _: &Node) {}
        fn event(&mut self, _: Event) {}
    }

    fn spec() -> ShardSpec {
        ShardSpec {
            rows_per_shard: 50,
            min_rows: 10,
            epochs: 2,
            seed: 9,
            shuffle: true,
        }
    }

    fn policy() -> Policy {
        Policy {
            num_ps: 1,
            dead_after_ms: 1000,
            max_worker_restarts: 3,
            straggler_ratio: 0.5,
            evaluate: false,
            recover_ps: false,
        }
    }

    /// Runs part of a job, persists through SQLite, restarts from the file several times
    /// (dropping the in-memory state each time) and checks the ledger at the end.
    #[tokio::test]
    async fn master_restart_from_sqlite_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("master.db");
        let files = vec![333u64, 120];
        let store = Store::open(&path, true).await.unwrap();
        let mut cx = Cx::default();
        let mut job = Job::start(policy(), TaskQueue::new(spec(), files.clone()), 2, &mut cx);
        for n in cx.launched.clone() {
            job.register(n.id, n.role, "127.0.0.1:1", 1, &mut cx)
                .unwrap();
        }
        store.apply(&std::mem::take(&mut cx.changes)).await.unwrap();
        drop(store);
        let mut round = 0;
        loop {
            let store = Store::open(&path, false).await.unwrap();
            let snap = store.load().await.unwrap();
            let gen: u32 = snap.meta["generated_epochs"].parse().unwrap();
            let q = TaskQueue::restore(spec(), files.clone(), snap.tasks, &snap.ranges, gen);
            let mut job = Job::restore(
                policy(),
                q,
                snap.nodes,
                snap.meta["target_workers"].parse().unwrap(),
                0,
                serde_json::from_str(&snap.meta["phase"]).unwrap(),
                None,
                serde_json::from_str(&snap.meta["epochs_closed"]).unwrap(),
                &mut cx,
            );
            // A few partial reports by each worker, then "crash".
            let mut finished = false;
            for _ in 0..7 {
                for w in [2u32, 3] {
                    match job.get_task(w, &mut cx) {
                        Ok(TaskReply::Task(t)) => {
                            let off = (t.offset + 17).min(t.len());
                            job.report(w, t.id, off, &mut cx).unwrap();
                        }
                        // Finished: the worker left (a second call finds it gone).
                        Ok(TaskReply::Finished { .. }) | Err(_) => finished = true,
                        Ok(_) => {}
                    }
                    store.apply(&std::mem::take(&mut cx.changes)).await.unwrap();
                }
            }
            round += 1;
            if finished {
                for e in 0..2 {
                    let s = job.tasks().ledger().summary(e);
                    assert_eq!(s.to_string(), "consumed 453, duplicated 0, missing 0");
                }
                assert_eq!(job.epochs_closed().len(), 2);
                break;
            }
            assert!(round < 100);
        }
        assert!(round > 2, "the job should span several restarts");
    }
}
