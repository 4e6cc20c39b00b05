//! Task generation over real directories: order, incremental rounds, readiness, bad input.

use std::path::Path;
use std::time::Duration;

use chrono::NaiveDateTime;
use elastrec_orchestrate::{
    parse_time, Dataset, DatasetConfig, OrchestrateError, TaskGraph, TaskLimits,
};

fn t(s: &str) -> NaiveDateTime {
    parse_time(s).unwrap()
}

/// Writes `files` TSV files (sizes 10, 20, ...) into `root/dir`, and the marker when `ready`.
fn partition(root: &Path, dir: &str, files: usize, ready: bool) {
    let p = root.join(dir);
    std::fs::create_dir_all(&p).unwrap();
    for i in 0..files {
        std::fs::write(p.join(format!("part-{i}.tsv")), vec![b'x'; 10 * (i + 1)]).unwrap();
    }
    if ready {
        std::fs::write(p.join("_SUCCESS"), b"").unwrap();
    }
}

fn hourly(root: &Path, dir: &str, hours: std::ops::Range<u32>, files: usize) {
    for h in hours {
        partition(root, &format!("{dir}/dt=20261101/hour={h:02}"), files, true);
    }
}

fn dataset(root: &Path, cfg: DatasetConfig) -> Dataset {
    Dataset::compile(&cfg, 0, root).unwrap()
}

fn clicks(window: (&str, Option<&str>)) -> DatasetConfig {
    DatasetConfig {
        name: "clicks".into(),
        path: "clicks/dt={date}/hour={hour}".into(),
        files: "*.tsv".into(),
        from: Some(window.0.into()),
        to: window.1.map(Into::into),
        ..Default::default()
    }
}

#[test]
fn tasks_leave_in_time_order_and_a_second_round_adds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    hourly(dir.path(), "clicks", 0..6, 3);
    let ds = dataset(dir.path(), clicks(("2026-11-01T00", Some("2026-11-01T06"))));
    let limits = TaskLimits {
        files: 2,
        bytes: 1 << 20,
    };
    let mut g = TaskGraph::new(vec![ds], limits);
    let round = g.plan(t("2026-11-02")).unwrap();
    // 6 hours x 3 files, cut 2 + 1.
    assert_eq!((round.tasks.len(), round.files, round.listed), (12, 18, 6));
    let starts: Vec<_> = round
        .tasks
        .iter()
        .map(|x| g.partition(x.partition).start)
        .collect();
    assert!(starts.windows(2).all(|w| w[0] <= w[1]), "{starts:?}");
    let first = g.task_paths(&round.tasks[0]);
    assert_eq!(first.len(), 2);
    assert!(
        first[0].ends_with("clicks/dt=20261101/hour=00/part-0.tsv"),
        "{first:?}"
    );
    assert_eq!(round.tasks[0].bytes, 30);
    assert_eq!(round.tasks[1].bytes, 30);
    let again = g.plan(t("2026-11-02")).unwrap();
    assert_eq!((again.tasks.len(), again.listed, again.cached), (0, 0, 0));
}

#[test]
fn a_partition_missing_its_marker_holds_back_newer_ones_until_it_lands() {
    let dir = tempfile::tempdir().unwrap();
    hourly(dir.path(), "clicks", 0..3, 1);
    partition(dir.path(), "clicks/dt=20261101/hour=03", 1, false);
    hourly(dir.path(), "clicks", 4..6, 1);
    let ds = dataset(dir.path(), clicks(("2026-11-01T00", Some("2026-11-01T06"))));
    let mut g = TaskGraph::new(vec![ds], TaskLimits::default());
    let r = g.plan(t("2026-11-02")).unwrap();
    assert_eq!(r.tasks.len(), 3, "only hours 0-2 may leave");
    assert_eq!(r.blocked_at, Some(t("2026-11-01T03")));
    assert_eq!(r.pending.len(), 1);
    assert!(r.pending[0].exists);
    std::fs::write(dir.path().join("clicks/dt=20261101/hour=03/_SUCCESS"), b"").unwrap();
    let r = g.plan(t("2026-11-02")).unwrap();
    let hours: Vec<_> = r
        .tasks
        .iter()
        .map(|x| g.partition(x.partition).start)
        .collect();
    assert_eq!(
        hours,
        vec![t("2026-11-01T03"), t("2026-11-01T04"), t("2026-11-01T05")]
    );
    // Hours 4 and 5 were ready in the first round: taken from the cache, not listed again.
    assert_eq!((r.listed, r.cached), (1, 2));
}

#[test]
fn a_sliding_window_picks_up_the_hour_that_lands_later() {
    let dir = tempfile::tempdir().unwrap();
    hourly(dir.path(), "clicks", 0..4, 1);
    let cfg = DatasetConfig {
        from: None,
        to: None,
        last: Some("3h".into()),
        ..clicks(("unused", None))
    };
    let mut g = TaskGraph::new(vec![dataset(dir.path(), cfg)], TaskLimits::default());
    // At 04:30 the window is hours 01-03; hour 04 is not complete yet.
    let (tasks, pending) = g
        .plan_for_start(t("2026-11-01T04:30"), Duration::from_millis(1), false)
        .unwrap();
    assert_eq!(tasks.len(), 3);
    assert!(pending.is_empty());
    // At 05:10, hour 04 is in the window; it has landed.
    hourly(dir.path(), "clicks", 4..5, 2);
    let r = g.plan(t("2026-11-01T05:10")).unwrap();
    assert_eq!((r.tasks.len(), r.files), (1, 2));
    assert_eq!(g.partition(r.tasks[0].partition).start, t("2026-11-01T04"));
    // The newest hour of a growing window may be late: it is pending, not an error.
    let (tasks, pending) = g
        .plan_for_start(t("2026-11-01T06:10"), Duration::from_millis(1), false)
        .unwrap();
    assert!(tasks.is_empty());
    assert_eq!(pending[0].dir, "dt=20261101/hour=05");
    assert!(!pending[0].exists);
}

#[test]
fn a_needed_partition_that_never_lands_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    hourly(dir.path(), "clicks", 0..2, 1);
    let cfg = DatasetConfig {
        ready_timeout: "0s".into(),
        ..clicks(("2026-11-01T00", Some("2026-11-01T03")))
    };
    let mut g = TaskGraph::new(vec![dataset(dir.path(), cfg)], TaskLimits::default());
    let e = g
        .plan_for_start(t("2026-11-02"), Duration::from_millis(1), false)
        .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, OrchestrateError::NotReady { .. }), "{text}");
    assert!(text.contains("dataset `clicks`"), "{text}");
    assert!(text.contains("dt=20261101/hour=02"), "{text}");
    assert!(text.contains("does not exist"), "{text}");
    assert!(text.contains("fixed window"), "{text}");
}

#[test]
fn definitions_that_match_nothing_say_so() {
    let dir = tempfile::tempdir().unwrap();
    hourly(dir.path(), "clicks", 0..2, 1);
    let wrong_path = DatasetConfig {
        path: "click/dt={date}/hour={hour}".into(),
        ..clicks(("2026-11-01T00", Some("2026-11-01T02")))
    };
    let mut g = TaskGraph::new(vec![dataset(dir.path(), wrong_path)], TaskLimits::default());
    let text = g
        .plan_for_start(t("2026-11-02"), Duration::from_millis(1), false)
        .unwrap_err()
        .to_string();
    assert!(text.contains("matches nothing"), "{text}");
    assert!(text.contains("dt=20261101/hour=00"), "{text}");

    let wrong_files = DatasetConfig {
        files: "*.parquet".into(),
        ..clicks(("2026-11-01T00", Some("2026-11-01T02")))
    };
    let mut g = TaskGraph::new(
        vec![dataset(dir.path(), wrong_files)],
        TaskLimits::default(),
    );
    let text = g
        .plan_for_start(t("2026-11-02"), Duration::from_millis(1), false)
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("field `files`: `*.parquet` matches no file"),
        "{text}"
    );
}

#[test]
fn two_datasets_are_joined_by_time() {
    let dir = tempfile::tempdir().unwrap();
    hourly(dir.path(), "clicks", 0..24, 1);
    partition(dir.path(), "views/day=2026-11-01", 2, true);
    let views = DatasetConfig {
        name: "views".into(),
        path: "views/day={time:%Y-%m-%d}".into(),
        from: Some("2026-11-01".into()),
        to: Some("2026-11-02".into()),
        ..Default::default()
    };
    let a = dataset(dir.path(), clicks(("2026-11-01", Some("2026-11-02"))));
    let b = Dataset::compile(&views, 1, dir.path()).unwrap();
    let mut g = TaskGraph::new(vec![a, b], TaskLimits::default());
    let r = g.plan(t("2026-11-03")).unwrap();
    let order: Vec<_> = r
        .tasks
        .iter()
        .map(|x| {
            let p = g.partition(x.partition);
            (p.start, p.dataset)
        })
        .collect();
    // The daily partition starts at midnight, with the first hour.
    assert_eq!(order[0], (t("2026-11-01T00"), 0));
    assert_eq!(order[1], (t("2026-11-01T00"), 1));
    assert_eq!(order.len(), 25);
}

#[test]
fn a_bounded_window_is_exhausted_only_once_its_last_hour_is_sunk() {
    let dir = tempfile::tempdir().unwrap();
    hourly(dir.path(), "clicks", 0..2, 1);
    let ds = dataset(dir.path(), clicks(("2026-11-01T00", Some("2026-11-01T03"))));
    let mut g = TaskGraph::new(vec![ds], TaskLimits::default());
    // At 02:30 hour 02 is not over: the window has not reached its `to`.
    assert_eq!(g.plan(t("2026-11-01T02:30")).unwrap().tasks.len(), 2);
    assert!(!g.is_exhausted(t("2026-11-01T02:30")));
    // At 04:00 it is, but hour 02 has not landed.
    let r = g.plan(t("2026-11-01T04")).unwrap();
    assert_eq!((r.tasks.len(), r.pending.len()), (0, 1));
    assert!(!g.is_exhausted(t("2026-11-01T04")));
    hourly(dir.path(), "clicks", 2..3, 1);
    assert_eq!(g.plan(t("2026-11-01T04")).unwrap().tasks.len(), 1);
    assert!(g.is_exhausted(t("2026-11-01T04")));
    // A window without `to` never is.
    let open = dataset(dir.path(), clicks(("2026-11-01T00", None)));
    let mut g = TaskGraph::new(vec![open], TaskLimits::default());
    g.plan(t("2026-11-01T03")).unwrap();
    assert!(!g.is_exhausted(t("2026-11-01T03")));
}

#[test]
fn a_following_start_needs_only_its_oldest_partition() {
    let dir = tempfile::tempdir().unwrap();
    hourly(dir.path(), "clicks", 0..2, 1);
    partition(dir.path(), "clicks/dt=20261101/hour=02", 1, false);
    let window = ("2026-11-01T00", Some("2026-11-01T03"));
    // A fixed window waits for its last hour (and gives up here, at once).
    let strict = DatasetConfig {
        ready_timeout: "0s".into(),
        ..clicks(window)
    };
    let mut g = TaskGraph::new(
        vec![dataset(dir.path(), strict.clone())],
        TaskLimits::default(),
    );
    let err = g
        .plan_for_start(t("2026-11-02"), Duration::from_millis(1), false)
        .unwrap_err();
    assert!(matches!(err, OrchestrateError::NotReady { .. }), "{err}");
    // A following job starts with hours 0-1 and leaves hour 2 for later.
    let mut g = TaskGraph::new(vec![dataset(dir.path(), strict)], TaskLimits::default());
    let (tasks, pending) = g
        .plan_for_start(t("2026-11-02"), Duration::from_millis(1), true)
        .unwrap();
    assert_eq!((tasks.len(), pending.len()), (2, 1));
    assert_eq!(pending[0].dir, "dt=20261101/hour=02");
}
