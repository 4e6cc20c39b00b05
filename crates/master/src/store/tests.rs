//! The database and the group-commit writer against each other and against a restart.

use super::*;
use crate::job::Recorder;
use crate::job::{Job, Policy, TaskReply};
use crate::tasks::{DataSharding, TaskQueue};

/// Ranges as `(epoch, file, start, end)`, for short assertions.
fn tuples(ranges: &[ConsumedRange]) -> Vec<(u32, u32, u64, u64)> {
    ranges.iter().map(|&r| r.into()).collect()
}

fn spec() -> DataSharding {
    DataSharding {
        rows_per_shard: 50,
        min_rows: 10,
        epochs: 2,
        seed: 9,
        shuffle: true,
        shuffle_rows: false,
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
        pin_partitions: false,
        executors: 0,
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
        .apply(&reset_between_writes(TaskState::Todo))
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

/// A group with a data reset between writes: a task and a range before it (which the
/// reset deletes), then a range and task 6 (in `last`) after it (which stay).
fn reset_between_writes(last: TaskState) -> Vec<Change> {
    vec![
        Change::Task(task(3, 0, TaskState::Todo)),
        Change::Range((0, 1, 150, 160).into()),
        Change::ResetData(
            vec![task(5, 0, TaskState::Todo)],
            vec![(0, 1, 0, 20).into()],
        ),
        Change::Range((0, 1, 20, 30).into()),
        Change::Task(task(6, 0, last)),
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
        reset_between_writes(TaskState::Doing(5)),
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
    let mut cx = Recorder::default();
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

/// One meta value is read on its own, read-only, as `load` would give it; a key never
/// written is `None`.
#[tokio::test]
async fn one_meta_value_is_read_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("master.db");
    let store = MasterDb::open(&path, true).await.unwrap();
    store
        .set_meta("job_toml", "[model]\n".into())
        .await
        .unwrap();
    drop(store);
    let ro = MasterDb::open_read_only(&path).await.unwrap();
    assert_eq!(
        ro.meta("job_toml").await.unwrap().as_deref(),
        Some("[model]\n")
    );
    assert_eq!(
        ro.load()
            .await
            .unwrap()
            .meta
            .get("job_toml")
            .map(String::as_str),
        Some("[model]\n")
    );
    assert_eq!(ro.meta("job_id").await.unwrap(), None);
}
