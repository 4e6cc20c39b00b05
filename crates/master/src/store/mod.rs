//! SQLite persistence of the master state (task queue, ledger, node table, job config).
//!
//! Changes produced by the state machine are written in one transaction per group of
//! requests ([`Writer`], group commit) before any of those requests is answered.
//!
//! * this module: [`MasterDb`] (open, load a [`Snapshot`], one-off writes);
//! * `batch`: a group of changes folded into the rows each table ends up with;
//! * `raw`: the writer's connection on SQLite's C API, and the WAL checkpointer;
//! * `writer`: the group-commit queue with its barriers.

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::Row;

mod batch;
mod raw;
mod writer;

pub use writer::{Barrier, Depends, Writer, WriterStats};

use raw::{open_writer, RawWriter};

use crate::job::{Change, Node, NodeState, Role};
use crate::ledger::ConsumedRange;
use crate::tasks::{Task, TaskState};

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
    /// A group of changes could not be written; the master acknowledges nothing after it.
    #[error("master database write failed: {0}")]
    Write(String),
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
    pub ranges: Vec<ConsumedRange>,
    /// The node table.
    pub nodes: Vec<Node>,
}

/// Handle on the master database.
#[derive(Clone, Debug)]
pub struct MasterDb {
    pool: SqlitePool,
}

fn role_str(r: Role) -> &'static str {
    match r {
        Role::Ps => "ps",
        Role::Worker => "worker",
        Role::Executor => "executor",
    }
}

/// The stored (and displayed) name of a node state.
pub(crate) fn state_str(s: NodeState) -> &'static str {
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

/// How far a commit of the master database goes before the reply it backs is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Durability {
    /// The WAL is fsynced at every commit (`synchronous = FULL`): a reply's state survives
    /// a power loss or kernel crash. The master's default.
    Full,
    /// The WAL is written but fsynced only at WAL checkpoints (`synchronous = NORMAL`):
    /// survives a crash of the master process, not of the machine.
    Process,
}

impl MasterDb {
    /// Opens (creating when `create`) the database at `path` with [`Durability::Full`] and
    /// applies migrations.
    pub async fn open(path: &Path, create: bool) -> Result<Self> {
        Self::open_with(path, create, Durability::Full).await
    }

    /// [`MasterDb::open`] with the given durability.
    pub async fn open_with(path: &Path, create: bool, durability: Durability) -> Result<Self> {
        let opts = SqliteConnectOptions::from_str("sqlite://")?
            .filename(path)
            .create_if_missing(create)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match durability {
                Durability::Full => SqliteSynchronous::Full,
                Durability::Process => SqliteSynchronous::Normal,
            })
            .statement_cache_capacity(512)
            .busy_timeout(std::time::Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(opts)
            .await?;
        elastrec_brain::db::embedded_migrator(&[
            (
                1,
                "master state",
                include_str!("../../migrations/0001_master_state.sql"),
            ),
            (
                2,
                "node metrics addr",
                include_str!("../../migrations/0002_node_metrics_addr.sql"),
            ),
        ])
        .run(&pool)
        .await?;
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

    /// Writes `changes` in one transaction, with the same code as the group-commit writer
    /// (`raw::RawWriter`) on a connection of its own (closed afterwards, so a failed
    /// transaction can never be left open in the pool). For the few writes made before
    /// the writer runs (job start, resume) and for tests.
    pub async fn apply(&self, changes: &[Change]) -> Result<()> {
        let mut conn = open_writer(self).await?;
        let mut locked = conn.lock_handle().await?;
        // SAFETY: the handle stays valid and locked while `locked` lives, and the writer
        // is dropped at the end of this statement, before `locked`.
        let res = unsafe { RawWriter::new(locked.as_raw_handle().as_ptr()) }
            .and_then(|mut w| w.write(changes));
        drop(locked);
        res.map_err(StoreError::Write)
    }

    /// Sets one scalar.
    pub async fn set_meta(&self, key: &'static str, value: String) -> Result<()> {
        self.apply(&[Change::Meta(key, value)]).await
    }

    /// One `meta` value, without reading the rest of the state (tasks, ledger and nodes,
    /// which grow with the job).
    pub async fn meta(&self, key: &str) -> Result<Option<String>> {
        Ok(sqlx::query("SELECT value FROM meta WHERE key = ?")
            .bind(key)
            .fetch_optional(&self.pool)
            .await?
            .map(|r| r.try_get(0))
            .transpose()?)
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
            snap.ranges.push(ConsumedRange {
                epoch: r.try_get::<i64, _>(0)? as u32,
                file: r.try_get::<i64, _>(1)? as u32,
                start: r.try_get::<i64, _>(2)? as u64,
                end: r.try_get::<i64, _>(3)? as u64,
            });
        }
        for r in sqlx::query(
            "SELECT id, role, idx, state, pid, addr, last_seen_ms, started_ms, samples, step, restarts, metrics_addr FROM nodes ORDER BY id",
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
                    "executor" => Role::Executor,
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
                metrics_addr: r.try_get(11)?,
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

#[cfg(test)]
mod tests;
