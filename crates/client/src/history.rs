//! A job's history for its charts: one [`Point`] per reading of its status. The master
//! appends one to `JOB_DIR/history.jsonl` with every progress line, so that a dashboard
//! opened mid-job (or after it) draws the job from its start; the dashboard adds its own
//! readings after those.

use std::io::Write as _;
use std::path::{Path, PathBuf};

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

/// Size past which the history file is rotated: about a day of an online job's points
/// (one every 2 s, about 200 bytes each). One rotated file is kept, so a job that runs for
/// months holds at most twice this on disk, and the dashboard still finds the last hour
/// right after a rotation.
pub const ROTATE_BYTES: u64 = 8 << 20;

/// The history file of the job directory `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join("history.jsonl")
}

/// The history file's previous generation, the points before its last rotation.
pub fn rotated_path(dir: &Path) -> PathBuf {
    dir.join("history.1.jsonl")
}

/// Appends `point` to the history of the job directory `dir`, as one JSON line; a file
/// that would grow past [`ROTATE_BYTES`] becomes [`rotated_path`] first (replacing the
/// generation before it).
pub fn append(dir: &Path, point: &Point) -> std::io::Result<()> {
    append_within(dir, point, ROTATE_BYTES)
}

fn append_within(dir: &Path, point: &Point, limit: u64) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(point).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let open = || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path(dir))
    };
    let mut file = open()?;
    let len = file.metadata()?.len();
    if len > 0 && len + line.len() as u64 > limit {
        drop(file);
        std::fs::rename(path(dir), rotated_path(dir))?;
        file = open()?;
    }
    file.write_all(&line)
}

/// The last `keep` points of the history of the job directory `dir` (from the rotated
/// generation too when the current file holds fewer; none without a history), and how
/// many lines were not points (a line cut short by a crash, another tool's).
pub fn read(dir: &Path, keep: usize) -> std::io::Result<(Vec<Point>, usize)> {
    let (mut points, mut skipped) = read_file(&path(dir))?;
    if points.len() < keep {
        let (mut earlier, bad) = read_file(&rotated_path(dir))?;
        skipped += bad;
        earlier.append(&mut points);
        points = earlier;
    }
    let cut = points.len().saturating_sub(keep);
    points.drain(..cut);
    Ok((points, skipped))
}

/// Every point of one history file, and its lines that are not points.
fn read_file(file: &Path) -> std::io::Result<(Vec<Point>, usize)> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(e) => return Err(e),
    };
    let mut skipped = 0;
    let points = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let p = serde_json::from_str::<Point>(l).ok();
            skipped += usize::from(p.is_none());
            p
        })
        .collect();
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

    /// A history past its size limit moves to one rotated file: the disk holds at most
    /// two files' worth, and the last points read back in order across the boundary.
    #[test]
    fn a_long_history_rotates_and_reads_back_across_the_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let status = serde_json::json!({"samples_per_sec": 1.0, "nodes": []});
        let point = |t: u32| point_of(&status, f64::from(t));
        let line = serde_json::to_vec(&point(1_000)).unwrap().len() as u64 + 1;
        let limit = 10 * line;
        for t in 1_000..1_025 {
            append_within(dir.path(), &point(t), limit).unwrap();
        }
        let size = |p: PathBuf| std::fs::metadata(p).unwrap().len();
        // 25 points of 10 a file: two rotations, the 5 newest in the current file.
        assert_eq!(size(path(dir.path())), 5 * line);
        assert_eq!(size(rotated_path(dir.path())), 10 * line);
        let (points, skipped) = read(dir.path(), 12).unwrap();
        assert_eq!(skipped, 0);
        let times: Vec<f64> = points.iter().map(|p| p.t_s).collect();
        let want: Vec<f64> = (1_013..1_025).map(f64::from).collect();
        assert_eq!(times, want);
        // What the current file holds is enough: the rotated one is not read.
        std::fs::write(rotated_path(dir.path()), "not a point\n").unwrap();
        assert_eq!(read(dir.path(), 5).unwrap().1, 0);
        assert_eq!(read(dir.path(), 6).unwrap().1, 1);
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
