//! SQLite persistence of the master state (task queue, ledger, node table, job config).
//!
//! Changes produced by the state machine are written in one transaction per group of
//! requests ([`Writer`], group commit) before any of those requests is answered.

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::Row;
use tokio::sync::{mpsc, oneshot, watch};

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

/// A table written by [`Batch`]: `INSERT INTO {head} VALUES (?, …), … {tail}`.
struct Table {
    head: &'static str,
    cols: usize,
    tail: &'static str,
}

const TASKS: Table = Table {
    head: "tasks (id, epoch, file, start_row, end_row, offset_rows, state, worker, ord)",
    cols: 9,
    tail: "ON CONFLICT(id) DO UPDATE SET epoch=excluded.epoch, file=excluded.file,
  start_row=excluded.start_row, end_row=excluded.end_row, offset_rows=excluded.offset_rows,
  state=excluded.state, worker=excluded.worker, ord=excluded.ord",
};
const LEDGER: Table = Table {
    head: "ledger (epoch, file, start_row, end_row)",
    cols: 4,
    tail: "",
};
const NODES: Table = Table {
    head:
        "nodes (id, role, idx, state, pid, addr, last_seen_ms, started_ms, samples, step, restarts, metrics_addr)",
    cols: 12,
    tail: "ON CONFLICT(id) DO UPDATE SET role=excluded.role, idx=excluded.idx,
  state=excluded.state, pid=excluded.pid, addr=excluded.addr, metrics_addr=excluded.metrics_addr,
  last_seen_ms=excluded.last_seen_ms, started_ms=excluded.started_ms,
  samples=excluded.samples, step=excluded.step, restarts=excluded.restarts",
};
const META: Table = Table {
    head: "meta (key, value)",
    cols: 2,
    tail: "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
};

/// A group of changes folded into the rows each table ends up with: the last version of
/// each task, node and meta key, every ledger range in order, and whether a
/// [`Change::ResetData`] first empties `tasks` and `ledger` (rows written before the
/// reset in the same group would be deleted by it, so they are dropped).
#[derive(Default)]
struct Batch<'a> {
    reset: bool,
    tasks: Vec<&'a Task>,
    task_pos: HashMap<u64, usize>,
    ranges: Vec<ConsumedRange>,
    nodes: Vec<&'a Node>,
    node_pos: HashMap<u32, usize>,
    meta: Vec<(&'static str, &'a str)>,
}

impl<'a> Batch<'a> {
    fn fold(changes: &'a [Change]) -> Self {
        let mut b = Self::default();
        for c in changes {
            match c {
                Change::ResetData(tasks, ranges) => {
                    b.reset = true;
                    b.tasks.clear();
                    b.task_pos.clear();
                    b.ranges.clear();
                    tasks.iter().for_each(|t| b.task(t));
                    b.ranges.extend_from_slice(ranges);
                }
                Change::Task(t) => b.task(t),
                Change::Range(r) => b.ranges.push(*r),
                Change::Node(n) => match b.node_pos.get(&n.id) {
                    Some(&i) => b.nodes[i] = n,
                    None => {
                        b.node_pos.insert(n.id, b.nodes.len());
                        b.nodes.push(n);
                    }
                },
                Change::Meta(k, v) => match b.meta.iter_mut().find(|(key, _)| key == k) {
                    Some(slot) => slot.1 = v,
                    None => b.meta.push((k, v)),
                },
            }
        }
        b
    }

    fn task(&mut self, t: &'a Task) {
        match self.task_pos.get(&t.id) {
            Some(&i) => self.tasks[i] = t,
            None => {
                self.task_pos.insert(t.id, self.tasks.len());
                self.tasks.push(t);
            }
        }
    }

    fn is_empty(&self) -> bool {
        !self.reset
            && self.tasks.is_empty()
            && self.ranges.is_empty()
            && self.nodes.is_empty()
            && self.meta.is_empty()
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

    /// Writes `changes` in one transaction, with the same code as the group-commit writer
    /// ([`RawWriter`]) on a connection of its own (closed afterwards, so a failed
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

/// SQLite's C API for the writer's connection: the bindings of the `libsqlite3-sys` that
/// sqlx links (same crate and version), so the raw handle sqlx lends is of this type.
use libsqlite3_sys as ffi;

/// The group-commit writer's connection, driven through SQLite's C API on the writer task
/// itself: one prepared single-row statement per table, a group written as `BEGIN
/// IMMEDIATE`, the rows each table ends up with ([`Batch`]), `COMMIT`.
///
/// Through sqlx every group cost a hand-off to the connection's own thread and back (two
/// thread switches per transaction, more than SQLite's work for a group) plus building and
/// hashing a script whose text changes with the group's row counts; here a group is a few
/// microseconds of SQLite work on the thread that already runs the writer, plus, with
/// `synchronous=FULL` (the default), one fsync of the WAL per group: the price of a reply
/// that survives a power loss, shared by every request of the group. WAL checkpoints
/// (their fsyncs) stay on another connection ([`Checkpointer`]).
struct RawWriter {
    db: *mut ffi::sqlite3,
    /// `BEGIN IMMEDIATE` and `COMMIT`.
    begin: *mut ffi::sqlite3_stmt,
    commit: *mut ffi::sqlite3_stmt,
    /// Upserts of a task, a node, a meta key, and the ledger insert.
    tasks: *mut ffi::sqlite3_stmt,
    ledger: *mut ffi::sqlite3_stmt,
    nodes: *mut ffi::sqlite3_stmt,
    meta: *mut ffi::sqlite3_stmt,
}

// SAFETY: the connection is locked for the writer (sqlx's worker thread does not touch it
// while the `LockedSqliteHandle` lives, which outlives this), and only the writer task uses
// it, from one thread at a time.
unsafe impl Send for RawWriter {}

impl RawWriter {
    /// Prepares the statements on `db`, a connection that stays open and locked for as
    /// long as the returned writer lives.
    ///
    /// # Safety
    /// `db` must be a valid connection, used by nothing else while the writer lives.
    unsafe fn new(db: *mut ffi::sqlite3) -> std::result::Result<Self, String> {
        let mut w = Self {
            db,
            begin: std::ptr::null_mut(),
            commit: std::ptr::null_mut(),
            tasks: std::ptr::null_mut(),
            ledger: std::ptr::null_mut(),
            nodes: std::ptr::null_mut(),
            meta: std::ptr::null_mut(),
        };
        // Checkpoints normally run beside the writer (see `Checkpointer`); this only bounds
        // the WAL should they fall behind.
        w.exec("PRAGMA wal_autocheckpoint = 16384")?;
        w.begin = w.prepare_sql("BEGIN IMMEDIATE")?;
        w.commit = w.prepare_sql("COMMIT")?;
        w.tasks = w.prepare(&TASKS)?;
        w.ledger = w.prepare(&LEDGER)?;
        w.nodes = w.prepare(&NODES)?;
        w.meta = w.prepare(&META)?;
        Ok(w)
    }

    fn error(&self, what: &str) -> String {
        // SAFETY: `db` is valid; the message is a NUL-terminated string SQLite owns.
        let msg = unsafe { std::ffi::CStr::from_ptr(ffi::sqlite3_errmsg(self.db)) };
        format!("{what}: {}", msg.to_string_lossy())
    }

    fn prepare(&self, t: &Table) -> std::result::Result<*mut ffi::sqlite3_stmt, String> {
        let sql = format!(
            "INSERT INTO {} VALUES ({}) {}",
            t.head,
            vec!["?"; t.cols].join(","),
            t.tail
        );
        self.prepare_sql(&sql)
    }

    fn prepare_sql(&self, sql: &str) -> std::result::Result<*mut ffi::sqlite3_stmt, String> {
        let mut stmt = std::ptr::null_mut();
        // SAFETY: `db` is valid; `sql` outlives the call and its length is passed.
        let rc = unsafe {
            ffi::sqlite3_prepare_v3(
                self.db,
                sql.as_ptr().cast(),
                sql.len() as i32,
                ffi::SQLITE_PREPARE_PERSISTENT,
                &mut stmt,
                std::ptr::null_mut(),
            )
        };
        if rc != ffi::SQLITE_OK || stmt.is_null() {
            return Err(self.error("preparing the group statements"));
        }
        Ok(stmt)
    }

    fn exec(&self, sql: &str) -> std::result::Result<(), String> {
        let sql = std::ffi::CString::new(sql).expect("no NUL in fixed SQL");
        // SAFETY: `db` is valid; no callback.
        let rc = unsafe {
            ffi::sqlite3_exec(
                self.db,
                sql.as_ptr(),
                None,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        if rc == ffi::SQLITE_OK {
            Ok(())
        } else {
            Err(self.error(&format!("{sql:?}")))
        }
    }

    /// Binds `values` to `stmt` (parameters 1, 2, …), runs it, and resets it.
    fn run(
        &self,
        stmt: *mut ffi::sqlite3_stmt,
        values: &[Value],
    ) -> std::result::Result<(), String> {
        for (i, v) in values.iter().enumerate() {
            let i = i as i32 + 1;
            // SAFETY: `stmt` is a statement of `db`; strings are copied (TRANSIENT) and
            // their length is passed.
            let rc = unsafe {
                match v {
                    Value::Int(x) => ffi::sqlite3_bind_int64(stmt, i, *x),
                    Value::Text(s) => ffi::sqlite3_bind_text(
                        stmt,
                        i,
                        s.as_ptr().cast(),
                        s.len() as i32,
                        ffi::SQLITE_TRANSIENT(),
                    ),
                    Value::Null => ffi::sqlite3_bind_null(stmt, i),
                }
            };
            if rc != ffi::SQLITE_OK {
                // SAFETY: as above.
                unsafe { ffi::sqlite3_reset(stmt) };
                return Err(self.error("binding a row"));
            }
        }
        // SAFETY: `stmt` is a statement of `db` with every parameter bound.
        let rc = unsafe { ffi::sqlite3_step(stmt) };
        let res = if rc == ffi::SQLITE_DONE {
            Ok(())
        } else {
            Err(self.error("writing the group"))
        };
        // SAFETY: as above (resetting also releases the statement's read/write locks).
        unsafe { ffi::sqlite3_reset(stmt) };
        res
    }

    /// Writes `changes` in one transaction (rolled back when any part fails).
    fn write(&mut self, changes: &[Change]) -> std::result::Result<(), String> {
        let batch = Batch::fold(changes);
        if batch.is_empty() {
            return Ok(());
        }
        self.run(self.begin, &[])?;
        let res = self.rows(&batch).and_then(|()| self.run(self.commit, &[]));
        if res.is_err() {
            // Nothing of the group stays (the writer fails every later group anyway).
            let _ = self.exec("ROLLBACK");
        }
        res
    }

    fn rows(&self, b: &Batch<'_>) -> std::result::Result<(), String> {
        use Value::{Int, Null, Text};
        if b.reset {
            self.exec("DELETE FROM tasks; DELETE FROM ledger")?;
        }
        for t in &b.tasks {
            let (state, worker) = match t.state {
                TaskState::Todo => ("todo", Null),
                TaskState::Doing(w) => ("doing", Int(w as i64)),
                TaskState::Done => ("done", Null),
            };
            self.run(
                self.tasks,
                &[
                    Int(t.id as i64),
                    Int(t.epoch as i64),
                    Int(t.file as i64),
                    Int(t.start as i64),
                    Int(t.end as i64),
                    Int(t.offset as i64),
                    Text(state),
                    worker,
                    Int(t.order),
                ],
            )?;
        }
        for r in &b.ranges {
            self.run(
                self.ledger,
                &[
                    Int(r.epoch as i64),
                    Int(r.file as i64),
                    Int(r.start as i64),
                    Int(r.end as i64),
                ],
            )?;
        }
        for n in &b.nodes {
            self.run(
                self.nodes,
                &[
                    Int(n.id as i64),
                    Text(role_str(n.role)),
                    Int(n.index as i64),
                    Text(state_str(n.state)),
                    Int(n.pid as i64),
                    Text(&n.addr),
                    Int(n.last_seen_ms as i64),
                    Int(n.started_ms as i64),
                    Int(n.samples as i64),
                    Int(n.step as i64),
                    Int(n.restarts as i64),
                    Text(&n.metrics_addr),
                ],
            )?;
        }
        for &(k, v) in &b.meta {
            self.run(self.meta, &[Text(k), Text(v)])?;
        }
        Ok(())
    }
}

impl Drop for RawWriter {
    fn drop(&mut self) {
        for s in [
            self.begin,
            self.commit,
            self.tasks,
            self.ledger,
            self.nodes,
            self.meta,
        ] {
            // SAFETY: each is null or a statement of `db`, finalized once.
            unsafe { ffi::sqlite3_finalize(s) };
        }
    }
}

/// A value bound by [`RawWriter::run`].
enum Value<'a> {
    Int(i64),
    Text(&'a str),
    Null,
}

/// Opens the writer's connection (taken out of the pool) and locks it for [`RawWriter`].
async fn open_writer(store: &MasterDb) -> Result<SqliteConnection> {
    Ok(store.pool.acquire().await?.detach())
}

/// Copies the WAL back into the database file from a pool connection, at most every
/// [`Checkpointer::EVERY`] and one at a time, so that the writer's transactions never
/// wait for a checkpoint (and its two fsyncs). Commits are durable once in the WAL;
/// checkpoints only keep the WAL short.
struct Checkpointer {
    last: std::time::Instant,
    running: Arc<std::sync::atomic::AtomicBool>,
}

impl Checkpointer {
    const EVERY: std::time::Duration = std::time::Duration::from_millis(500);

    fn new() -> Self {
        Self {
            last: std::time::Instant::now(),
            running: Arc::default(),
        }
    }

    /// Called after each commit: starts a passive checkpoint when one is due.
    fn after_commit(&mut self, store: &MasterDb) {
        use std::sync::atomic::Ordering;
        if self.last.elapsed() < Self::EVERY || self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        self.last = std::time::Instant::now();
        let (pool, running) = (store.pool.clone(), self.running.clone());
        tokio::spawn(async move {
            if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                .execute(&pool)
                .await
            {
                tracing::warn!(error = %e, "master database: WAL checkpoint failed");
            }
            running.store(false, Ordering::Release);
        });
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Context, Event, Job, Policy, TaskReply};
    use crate::tasks::{DataSharding, TaskQueue};

    /// Ranges as `(epoch, file, start, end)`, for short assertions.
    fn tuples(ranges: &[ConsumedRange]) -> Vec<(u32, u32, u64, u64)> {
        ranges.iter().map(|&r| r.into()).collect()
    }

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

    fn spec() -> DataSharding {
        DataSharding {
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
            warmup_samples: 0,
        }
    }

    fn task(id: u64, offset: u64, state: TaskState) -> Task {
        Task {
            id,
            epoch: 0,
            file: 1,
            start: 100,
            end: 200,
            offset,
            state,
            order: -(id as i64),
        }
    }

    fn node(id: u32, addr: &str, samples: u64) -> Node {
        Node {
            id,
            role: Role::Ps,
            index: 0,
            state: NodeState::Running,
            pid: 7,
            addr: addr.to_string(),
            metrics_addr: format!("{addr}9"),
            last_seen_ms: u64::from(u32::MAX) + 5,
            started_ms: 3,
            samples,
            step: 9,
            restarts: 1,
        }
    }

    /// One group holding several versions of the same rows, strings that need escaping
    /// and a reset: what is loaded back is what applying the changes one by one gives.
    #[tokio::test]
    async fn group_writes_equal_one_by_one_writes() {
        let dir = tempfile::tempdir().unwrap();
        let store = MasterDb::open(&dir.path().join("master.db"), true)
            .await
            .unwrap();
        let odd = "host\"'\\ \u{e9}\n:1";
        store.apply(&updates_of_one_job(odd)).await.unwrap();
        let snap = store.load().await.unwrap();
        let mut tasks = snap.tasks.clone();
        tasks.sort_by_key(|t| t.id);
        assert_eq!(
            tasks,
            vec![task(1, 50, TaskState::Done), task(2, 0, TaskState::Todo)]
        );
        assert_eq!(
            tuples(&snap.ranges),
            vec![(0, 1, 100, 110), (0, 1, 110, 150)]
        );
        assert_eq!(snap.nodes, vec![node(4, odd, 2)]);
        assert_eq!(snap.meta["phase"], "\"finished\"");

        // Rows written before a reset in the same group are gone; rows after it stay.
        store
            .apply(&[
                Change::Task(task(3, 0, TaskState::Todo)),
                Change::Range((0, 1, 150, 160).into()),
                Change::ResetData(
                    vec![task(5, 0, TaskState::Todo)],
                    vec![(0, 1, 0, 20).into()],
                ),
                Change::Range((0, 1, 20, 30).into()),
                Change::Task(task(6, 0, TaskState::Todo)),
            ])
            .await
            .unwrap();
        let snap = store.load().await.unwrap();
        let mut tasks = snap.tasks.clone();
        tasks.sort_by_key(|t| t.id);
        assert_eq!(
            tasks,
            vec![task(5, 0, TaskState::Todo), task(6, 0, TaskState::Todo)]
        );
        assert_eq!(tuples(&snap.ranges), vec![(0, 1, 0, 20), (0, 1, 20, 30)]);
        assert_eq!(snap.nodes.len(), 1);
    }

    /// A group that rewrites the same task, node and meta key several times and adds
    /// ledger ranges: the last write of each row must win.
    fn updates_of_one_job(odd: &str) -> Vec<Change> {
        vec![
            Change::Task(task(1, 0, TaskState::Doing(4))),
            Change::Range((0, 1, 100, 110).into()),
            Change::Node(node(4, "a", 1)),
            Change::Task(task(1, 10, TaskState::Doing(4))),
            Change::Task(task(2, 0, TaskState::Todo)),
            Change::Meta("phase", "\"training\"".into()),
            Change::Range((0, 1, 110, 150).into()),
            Change::Meta("phase", "\"finished\"".into()),
            Change::Node(node(4, odd, 2)),
            Change::Task(task(1, 50, TaskState::Done)),
        ]
    }

    /// Groups submitted to the group-commit writer (folded together when they queue up)
    /// leave exactly the state that applying them one by one leaves, resets and odd
    /// strings included.
    #[tokio::test]
    async fn writer_groups_equal_apply() {
        let odd = "host\"'\\ \u{e9}\n:1";
        let groups = vec![
            updates_of_one_job(odd),
            vec![
                Change::Node(node(5, "", 0)),
                Change::Range((0, 1, 150, 151).into()),
            ],
            vec![
                Change::Task(task(3, 0, TaskState::Todo)),
                Change::Range((0, 1, 150, 160).into()),
                Change::ResetData(
                    vec![task(5, 0, TaskState::Todo)],
                    vec![(0, 1, 0, 20).into()],
                ),
                Change::Range((0, 1, 20, 30).into()),
                Change::Task(task(6, 0, TaskState::Doing(5))),
            ],
        ];
        let dir = tempfile::tempdir().unwrap();
        let by_apply = MasterDb::open(&dir.path().join("a.db"), true)
            .await
            .unwrap();
        let by_writer = MasterDb::open(&dir.path().join("w.db"), true)
            .await
            .unwrap();
        let writer = Writer::spawn(by_writer.clone());
        for g in groups {
            by_apply.apply(&g).await.unwrap();
            writer.submit(g).await.unwrap();
        }
        let (a, w) = (
            by_apply.load().await.unwrap(),
            by_writer.load().await.unwrap(),
        );
        let sorted = |mut t: Vec<Task>| {
            t.sort_by_key(|t| t.id);
            t
        };
        assert_eq!(sorted(w.tasks), sorted(a.tasks));
        assert_eq!(w.ranges, a.ranges);
        assert_eq!(w.nodes, a.nodes);
        assert_eq!(w.meta, a.meta);
        assert_eq!(tuples(&w.ranges), vec![(0, 1, 0, 20), (0, 1, 20, 30)]);
        assert_eq!(writer.stats().transactions, 3);
    }

    /// Groups larger than one statement takes are split, and keep the ledger's order.
    #[tokio::test]
    async fn large_groups_are_written_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = MasterDb::open(&dir.path().join("master.db"), true)
            .await
            .unwrap();
        let tasks: Vec<Task> = (0..2500).map(|i| task(i, 0, TaskState::Todo)).collect();
        let ranges: Vec<ConsumedRange> = (0..2100)
            .map(|i| (0, 1, 10 * i, 10 * i + 5).into())
            .collect();
        store
            .apply(&[Change::ResetData(tasks.clone(), ranges.clone())])
            .await
            .unwrap();
        let snap = store.load().await.unwrap();
        let mut got = snap.tasks;
        got.sort_by_key(|t| t.id);
        assert_eq!(got, tasks);
        assert_eq!(snap.ranges, ranges);
    }

    /// A reply that changed nothing waits for the pending writes it depends on, and only
    /// for those; after a failed write nothing more is acknowledged.
    #[tokio::test]
    async fn reads_wait_for_what_they_depend_on_and_failures_stop_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let store = MasterDb::open(&dir.path().join("master.db"), true)
            .await
            .unwrap();
        let writer = Writer::spawn(store.clone());
        // Polls the wait once: the writer task cannot run in between.
        let ready = |b| {
            let mut wait = std::pin::pin!(writer.wait(b));
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            std::future::Future::poll(wait.as_mut(), &mut cx).is_ready()
        };
        // Nothing queued: nothing to wait for.
        assert!(ready(writer.barrier(Depends::All)));

        // Queued task and ledger rows hold back a task reply, not a heartbeat.
        let pending = writer.submit(vec![
            Change::Task(task(1, 5, TaskState::Doing(2))),
            Change::Range((0, 1, 100, 105).into()),
        ]);
        assert!(ready(writer.barrier(Depends::Nodes)));
        let all = writer.barrier(Depends::All);
        assert!(!ready(all));
        writer.wait(all).await.unwrap();
        assert_eq!(
            tuples(&store.load().await.unwrap().ranges),
            vec![(0, 1, 100, 105)]
        );
        pending.await.unwrap();

        // A queued node row holds back heartbeats too.
        let pending = writer.submit(vec![Change::Node(node(3, "x", 0))]);
        let nodes = writer.barrier(Depends::Nodes);
        assert!(!ready(nodes));
        writer.wait(nodes).await.unwrap();
        pending.await.unwrap();

        // A failed write fails its requests, every later one and every waiting read.
        sqlx::query("DROP TABLE ledger")
            .execute(&store.pool)
            .await
            .unwrap();
        let failed = writer.submit(vec![Change::Range((0, 1, 200, 210).into())]);
        let later = writer.submit(vec![Change::Node(node(3, "y", 1))]);
        assert!(matches!(failed.await, Err(StoreError::Write(_))));
        assert!(matches!(later.await, Err(StoreError::Write(_))));
        assert!(matches!(
            writer.wait(writer.barrier(Depends::Nodes)).await,
            Err(StoreError::Write(_))
        ));
        let addr: String = sqlx::query_scalar("SELECT addr FROM nodes WHERE id = 3")
            .fetch_one(&store.pool)
            .await
            .unwrap();
        assert_eq!(addr, "x");
    }

    /// Runs part of a job, persists through SQLite, restarts from the file several times
    /// (dropping the in-memory state each time) and checks the ledger at the end.
    #[tokio::test]
    async fn master_restart_from_sqlite_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("master.db");
        let files = vec![333u64, 120];
        let store = MasterDb::open(&path, true).await.unwrap();
        let mut cx = Cx::default();
        let mut job = Job::start(policy(), TaskQueue::new(spec(), files.clone()), 2, &mut cx);
        for n in cx.launched.clone() {
            job.register(n.id, n.role, "127.0.0.1:1", "", 1, &mut cx)
                .unwrap();
        }
        store.apply(&std::mem::take(&mut cx.changes)).await.unwrap();
        drop(store);
        let mut round = 0;
        loop {
            let store = MasterDb::open(&path, false).await.unwrap();
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
