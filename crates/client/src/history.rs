//! A job's history for its charts: one [`Point`] per reading of its status. The master
//! appends one to `JOB_DIR/history.jsonl` with every progress line, so that a dashboard
//! opened mid-job (or after it) draws the job from its start; the dashboard adds its own
//! readings after those.

use std::io::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One reading of a job, kept for its charts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Point {
    /// When it was read, seconds since the Unix epoch.
    pub t_s: f64,
    /// Samples trained per second (the master's recent rate).
    pub samples_per_s: f64,
    /// Workers running.
    pub workers: u32,
    /// Workers the job wants.
    pub target_workers: u32,
    /// Parameter servers running.
    pub ps: u32,
    /// Online jobs: messages arriving per second and the lag of the oldest untrained
    /// one; every job: the progressive AUC and logloss (`train.progressive_window`,
    /// `stream.eval_window`).
    pub arrival_rate: Option<f64>,
    /// See `arrival_rate`.
    pub lag_s: Option<f64>,
    /// See `arrival_rate`.
    pub auc: Option<f64>,
    /// See `arrival_rate`.
    pub logloss: Option<f64>,
    /// Portion of lost samples so far (CPR).
    pub pls: Option<f64>,
    /// A multi-task model's progressive figures of every task, task 0 first (whose are
    /// also `auc` and `logloss`); empty for one task.
    pub tasks: Vec<TaskPoint>,
}

/// One task's progressive figures in a [`Point`].
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct TaskPoint {
    /// AUC over the window (`None` while it holds one class of the task's label).
    pub auc: Option<f64>,
    /// Mean logloss over the window.
    pub logloss: Option<f64>,
}

/// The point a status reading adds to a job's history.
pub fn point_of(status: &Value, t_s: f64) -> Point {
    let nodes = status["nodes"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let running = |role: &str| {
        nodes
            .iter()
            .filter(|n| n["role"] == role && n["state"] == "running")
            .count() as u32
    };
    let stream = &status["stream"];
    // An online job's window is its stream's; a batch job's is the status's own.
    let window = if stream["progressive"].is_object() {
        &stream["progressive"]
    } else {
        &status["progressive"]
    };
    let num = |v: &Value| v.as_f64().filter(|x| x.is_finite());
    Point {
        t_s,
        samples_per_s: num(&status["samples_per_sec"]).unwrap_or(0.0),
        workers: running("worker"),
        target_workers: status["target_workers"].as_u64().unwrap_or(0) as u32,
        ps: running("ps"),
        arrival_rate: num(&stream["arrival_rate"]),
        lag_s: num(&stream["lag_s"]),
        auc: num(&window["auc"]),
        logloss: num(&window["logloss"]),
        pls: num(&status["checkpoint"]["pls"]),
        tasks: window["tasks"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[])
            .iter()
            .map(|t| TaskPoint {
                auc: num(&t["auc"]),
                logloss: num(&t["logloss"]),
            })
            .collect(),
    }
}

/// The history file of the job directory `dir`.
pub fn path(dir: &Path) -> std::path::PathBuf {
    dir.join("history.jsonl")
}

/// Appends `point` to the history of the job directory `dir`, as one JSON line.
pub fn append(dir: &Path, point: &Point) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(point).map_err(std::io::Error::other)?;
    line.push(b'\n');
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path(dir))?
        .write_all(&line)
}

/// The last `keep` points of the history of the job directory `dir` (none without one),
/// and how many lines were not points (a line cut short by a crash, another tool's).
pub fn read(dir: &Path, keep: usize) -> std::io::Result<(Vec<Point>, usize)> {
    let text = match std::fs::read_to_string(path(dir)) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(e) => return Err(e),
    };
    let mut skipped = 0;
    let mut points: Vec<Point> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let p = serde_json::from_str::<Point>(l).ok();
            skipped += usize::from(p.is_none());
            p
        })
        .collect();
    let cut = points.len().saturating_sub(keep);
    points.drain(..cut);
    Ok((points, skipped))
}

/// Seconds since the Unix epoch, now.
pub fn unix_now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_reads_back_its_last_points_and_counts_lines_that_are_not() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path(), 10).unwrap(), (Vec::new(), 0));
        let status = serde_json::json!({
            "samples_per_sec": 1234.5,
            "target_workers": 2,
            "nodes": [{"role": "worker", "state": "running"}, {"role": "ps", "state": "running"}],
            "progressive": {"auc": 0.75, "logloss": 0.45},
        });
        for t in 0..5 {
            append(
                dir.path(),
                &point_of(&status, 1_700_000_000.0 + f64::from(t)),
            )
            .unwrap();
        }
        // A line cut short by a crash mid-write.
        std::fs::OpenOptions::new()
            .append(true)
            .open(path(dir.path()))
            .unwrap()
            .write_all(b"{\"t_s\": 17")
            .unwrap();
        let (points, skipped) = read(dir.path(), 3).unwrap();
        assert_eq!(skipped, 1);
        assert_eq!(points.len(), 3);
        assert_eq!(points[0].t_s, 1_700_000_002.0);
        assert_eq!(points[2].workers, 1);
        assert_eq!(points[2].auc, Some(0.75));
    }

    #[test]
    fn a_reading_becomes_a_point_with_running_nodes_counted() {
        let status = serde_json::json!({
            "samples_per_sec": 1500.0, "target_workers": 3,
            "nodes": [
                {"role": "worker", "state": "running"},
                {"role": "worker", "state": "running"},
                {"role": "worker", "state": "dead"},
                {"role": "ps", "state": "running"},
            ],
            "checkpoint": {"pls": 0.02},
            "stream": {"arrival_rate": 800.0, "lag_s": 1.5, "progressive": {"auc": 0.71, "logloss": 0.5}},
        });
        let p = point_of(&status, 4.0);
        assert_eq!((p.workers, p.target_workers, p.ps), (2, 3, 1));
        assert_eq!(p.samples_per_s, 1500.0);
        assert_eq!(
            (p.arrival_rate, p.lag_s, p.auc),
            (Some(800.0), Some(1.5), Some(0.71))
        );
        assert_eq!(p.pls, Some(0.02));
        let batch = point_of(
            &serde_json::json!({"samples_per_sec": 10.0, "nodes": []}),
            1.0,
        );
        assert_eq!(
            (batch.arrival_rate, batch.pls, batch.auc),
            (None, None, None)
        );
        // A batch job's progressive window is the status's own.
        let batch = point_of(
            &serde_json::json!({"samples_per_sec": 10.0, "nodes": [],
                "progressive": {"auc": 0.75, "logloss": 0.45}}),
            2.0,
        );
        assert_eq!((batch.auc, batch.logloss), (Some(0.75), Some(0.45)));
        assert!(batch.tasks.is_empty());
        // A multi-task job's point holds every task's window.
        let mmoe = point_of(
            &serde_json::json!({"samples_per_sec": 10.0, "nodes": [],
                "progressive": {"auc": 0.75, "logloss": 0.45, "tasks": [
                    {"auc": 0.75, "logloss": 0.45, "positive_rate": 0.2},
                    {"auc": null, "logloss": 0.1, "positive_rate": 0.0}]}}),
            3.0,
        );
        assert_eq!(
            mmoe.tasks,
            vec![
                TaskPoint {
                    auc: Some(0.75),
                    logloss: Some(0.45)
                },
                TaskPoint {
                    auc: None,
                    logloss: Some(0.1)
                }
            ]
        );
    }
}
