//! The group-commit writer's connection, on SQLite's C API, and the WAL checkpointer.

use std::sync::Arc;

use sqlx::sqlite::SqliteConnection;

use super::batch::{Batch, Table, LEDGER, META, NODES, TASKS};
use super::{role_str, state_str, MasterDb, Result};
use crate::job::Change;
use crate::tasks::TaskState;

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
pub(super) struct RawWriter {
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
    pub(super) unsafe fn new(db: *mut ffi::sqlite3) -> std::result::Result<Self, String> {
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
    pub(super) fn write(&mut self, changes: &[Change]) -> std::result::Result<(), String> {
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
pub(super) enum Value<'a> {
    Int(i64),
    Text(&'a str),
    Null,
}

/// Opens the writer's connection (taken out of the pool) and locks it for [`RawWriter`].
pub(super) async fn open_writer(store: &MasterDb) -> Result<SqliteConnection> {
    Ok(store.pool.acquire().await?.detach())
}

/// Copies the WAL back into the database file from a pool connection, at most every
/// [`Checkpointer::EVERY`] and one at a time, so that the writer's transactions never
/// wait for a checkpoint (and its two fsyncs). Commits are durable once in the WAL;
/// checkpoints only keep the WAL short.
pub(super) struct Checkpointer {
    last: std::time::Instant,
    running: Arc<std::sync::atomic::AtomicBool>,
}

impl Checkpointer {
    const EVERY: std::time::Duration = std::time::Duration::from_millis(500);

    pub(super) fn new() -> Self {
        Self {
            last: std::time::Instant::now(),
            running: Arc::default(),
        }
    }

    /// Called after each commit: starts a passive checkpoint when one is due.
    pub(super) fn after_commit(&mut self, store: &MasterDb) {
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
