//! The joiner of a `[[data.source]]` (Primus §4.2's joiner, by key and time): impressions
//! (the source's datasets, Criteo rows) are labelled by events (clicks, conversions) that
//! name the same key within an attribution window after the impression's partition.
//!
//! An impression of the partition starting at `t` (period `p`) is positive when an event
//! row `key <TAB> unix seconds` with its key falls in `[t, t + p + within)`. The events
//! are a partitioned path like a dataset's; the partitions covering that range must be
//! ready before the impressions are joined (the label delay), or the start waits for
//! them up to `ready_timeout` and fails naming the partition. The joined rows are written
//! beside the job (`output.dir/data-cache/join-<source>/…`) and are the files the job
//! trains.

use std::collections::HashSet;
use std::io::{BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::NaiveDateTime;
use elastrec_orchestrate::{Dataset, DatasetConfig, OrchestrateError, TaskGraph, TaskLimits};
use serde::{Deserialize, Serialize};

use crate::error::{JobError, Result};

/// How long a start waits between listings of event partitions it needs.
const READY_POLL: Duration = Duration::from_secs(1);

/// `[data.source.join]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct JoinConfig {
    /// Event partitions, a path template like a dataset's (`logs/clicks/dt={date}/hour={hour}`,
    /// or an `s3://` URL). Rows are `key <TAB> unix seconds`.
    pub events: String,
    /// File-name pattern of event files inside a partition.
    pub files: String,
    /// An event partition is ready when this marker exists (`""`: when it holds a file).
    pub ready: String,
    /// How long to wait for an event partition the join needs.
    pub ready_timeout: String,
    /// The impressions' column holding the key (`C1` … `C26`).
    pub key: String,
    /// Attribution window: events this long after an impression's partition ends still
    /// label it.
    pub within: String,
}

impl Default for JoinConfig {
    fn default() -> Self {
        Self {
            events: String::new(),
            files: "*".into(),
            ready: "_SUCCESS".into(),
            ready_timeout: "10m".into(),
            key: String::new(),
            within: "1h".into(),
        }
    }
}

impl JoinConfig {
    /// The events as a dataset definition over `[from, to)`.
    fn events_dataset(
        &self,
        source: &str,
        from: NaiveDateTime,
        to: NaiveDateTime,
    ) -> DatasetConfig {
        DatasetConfig {
            name: format!("{source} (join events)"),
            path: self.events.clone(),
            files: self.files.clone(),
            ready: self.ready.clone(),
            ready_timeout: self.ready_timeout.clone(),
            from: Some(from.format("%Y-%m-%dT%H:%M:%S").to_string()),
            to: Some(to.format("%Y-%m-%dT%H:%M:%S").to_string()),
            ..DatasetConfig::default()
        }
    }

    /// Checks the section of source `source` without touching storage; `Err(reason)`.
    pub fn check(&self, source: &str) -> std::result::Result<(), String> {
        key_field(&self.key).map_err(|r| format!("source `{source}`, join.key: {r}"))?;
        humantime::parse_duration(&self.within)
            .map_err(|e| format!("source `{source}`, join.within: `{}`: {e}", self.within))?;
        let t = elastrec_orchestrate::window::now_utc();
        self.events_dataset(source, t, t + chrono::Duration::hours(1))
            .check(0)
            .map_err(|e| format!("source `{source}`, join.events: {e}"))
    }

    /// Makes a relative local events path absolute against `base` (the job file's
    /// directory), as a dataset's root.
    pub fn resolve_root(&mut self, base: &Path) {
        let mut d = DatasetConfig {
            path: std::mem::take(&mut self.events),
            ..DatasetConfig::default()
        };
        d.resolve_root(base);
        self.events = d.path;
    }
}

/// The TSV field of key column `key` of the Criteo preset (`C1` is field 14: label,
/// I1..I13, C1..C26).
fn key_field(key: &str) -> std::result::Result<usize, String> {
    use elastrec_data::criteo;
    let n: usize = key
        .strip_prefix('C')
        .and_then(|n| n.parse().ok())
        .filter(|n| (1..=criteo::CATEGORICAL).contains(n))
        .ok_or_else(|| {
            format!(
                "`{key}` is not a categorical column; name one of C1 … C{}",
                criteo::CATEGORICAL
            )
        })?;
    Ok(criteo::DENSE + n)
}

/// What one source's join did, for the log and the summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinStats {
    /// Impressions joined.
    pub rows: u64,
    /// Of those, labelled positive by an event.
    pub positives: u64,
    /// Event rows read (each partition once).
    pub events: u64,
}

impl std::ops::AddAssign for JoinStats {
    fn add_assign(&mut self, other: Self) {
        self.rows += other.rows;
        self.positives += other.positives;
        self.events += other.events;
    }
}

/// A time range `[from, to)`.
type Range = (NaiveDateTime, NaiveDateTime);

/// Joins the impressions of one source, partition by partition.
pub struct Joiner {
    source: String,
    cfg: JoinConfig,
    key_field: usize,
    within: chrono::Duration,
    /// `output.dir/data-cache`: joined files go under `join-<source>`, event files
    /// copied from an object store under `join-<source>-events`.
    root: PathBuf,
    /// The event partitions' period.
    granularity: elastrec_orchestrate::Granularity,
    /// The keys of the last event range read, to reuse across a partition's tasks.
    last: Option<(Range, HashSet<Vec<u8>>)>,
}

impl Joiner {
    /// A joiner for source `source`, writing under `root` (`output.dir/data-cache`).
    pub fn new(source: &str, cfg: &JoinConfig, root: &Path) -> Result<Self> {
        cfg.check(source)
            .map_err(|reason| definition(source, reason))?;
        let within = humantime::parse_duration(&cfg.within).expect("checked");
        let t = elastrec_orchestrate::window::now_utc();
        let probe = cfg.events_dataset(source, t, t + chrono::Duration::hours(1));
        let granularity = Dataset::compile(&probe, 0, Path::new("."))?
            .template
            .granularity();
        Ok(Self {
            granularity,
            source: source.into(),
            cfg: cfg.clone(),
            key_field: key_field(&cfg.key).expect("checked"),
            within: chrono::Duration::from_std(within)
                .map_err(|e| definition(source, format!("join.within: {e}")))?,
            root: root.to_path_buf(),
            last: None,
        })
    }

    /// Labels `files` (impressions of the partition `dir` starting at `start`, one
    /// `period` long) by the events in `[start, start + period + within)`; returns the
    /// joined files and what this call did (events are read once per range, so a
    /// partition's later tasks read none).
    pub fn join(
        &mut self,
        dir: &str,
        start: NaiveDateTime,
        period: chrono::Duration,
        files: &[String],
    ) -> Result<(Vec<String>, JoinStats)> {
        let mut stats = JoinStats::default();
        let range = (start, start + period + self.within);
        if self.last.as_ref().is_none_or(|(r, _)| *r != range) {
            let (keys, events) = self.events_in(range)?;
            stats.events = events;
            self.last = Some((range, keys));
        }
        let keys = &self.last.as_ref().expect("just read").1;
        let out_dir = self.root.join(format!("join-{}", self.source)).join(dir);
        std::fs::create_dir_all(&out_dir).map_err(|e| io(&out_dir, e))?;
        let mut joined = Vec::with_capacity(files.len());
        for f in files {
            let src = Path::new(f);
            let name = src.file_name().unwrap_or_default();
            let dest = out_dir.join(name).with_extension("tsv");
            let (rows, positives) = label_file(src, &dest, self.key_field, keys)?;
            stats.rows += rows;
            stats.positives += positives;
            joined.push(dest.display().to_string());
        }
        Ok((joined, stats))
    }

    /// The keys of every event in `range`, read from the event partitions that cover it
    /// (waiting for them to be ready), and the event rows read.
    fn events_in(&self, (from, to): Range) -> Result<(HashSet<Vec<u8>>, u64)> {
        // Every event partition that overlaps the range: `to` up to a partition boundary.
        let step = self.granularity;
        let to_partition = step.floor(to - chrono::Duration::seconds(1)) + step.step();
        let def = self
            .cfg
            .events_dataset(&self.source, step.floor(from), to_partition);
        let dataset = Dataset::compile(&def, 0, Path::new("."))?;
        let mut graph = TaskGraph::new(vec![dataset], TaskLimits::default());
        let (tasks, _) = graph.plan_for_start(to_partition, READY_POLL, false)?;
        let (from_s, to_s) = (from.and_utc().timestamp(), to.and_utc().timestamp());
        let staging = self.root.join(format!("join-{}-events", self.source));
        let (mut keys, mut events) = (HashSet::new(), 0);
        for t in &tasks {
            for path in graph.stage_task(t, &staging)? {
                events += read_events(Path::new(&path), from_s, to_s, &mut keys)?;
            }
        }
        Ok((keys, events))
    }
}

/// Adds the keys of `path`'s events in `[from, to)` (unix seconds) to `keys`; returns the
/// event rows read. A malformed row fails naming the file and line.
fn read_events(path: &Path, from: i64, to: i64, keys: &mut HashSet<Vec<u8>>) -> Result<u64> {
    let reader = open_lines(path)?;
    let mut rows = 0;
    for (i, line) in reader.split(b'\n').enumerate() {
        let line = line.map_err(|e| io(path, e))?;
        let line = line.strip_suffix(b"\r").unwrap_or(&line);
        if line.is_empty() {
            continue;
        }
        let bad = |reason: &str| JobError::Join {
            file: path.to_path_buf(),
            line: i + 1,
            reason: reason.into(),
        };
        let mut fields = line.split(|&b| b == b'\t');
        let key = fields
            .next()
            .filter(|k| !k.is_empty())
            .ok_or_else(|| bad("no key"))?;
        let time: i64 = fields
            .next()
            .and_then(|t| std::str::from_utf8(t).ok())
            .and_then(|t| t.trim().parse().ok())
            .ok_or_else(|| bad("the second field is not unix seconds"))?;
        if fields.next().is_some() {
            return Err(bad(
                "more than two fields (an event is `key <TAB> unix seconds`)",
            ));
        }
        rows += 1;
        if (from..to).contains(&time) {
            keys.insert(key.to_vec());
        }
    }
    Ok(rows)
}

/// Writes `src`'s rows to `dest` with the label set by whether their key field is in
/// `keys`; returns (rows, positives). Written to a temporary name, then renamed: a
/// killed start never leaves a half-joined file under the final name.
fn label_file(
    src: &Path,
    dest: &Path,
    key_field: usize,
    keys: &HashSet<Vec<u8>>,
) -> Result<(u64, u64)> {
    if elastrec_data::detect_format(src)? == elastrec_data::FileFormat::Parquet {
        return Err(JobError::Join {
            file: src.to_path_buf(),
            line: 0,
            reason: "is Parquet; the joiner labels TSV impressions (plain or gzip)".into(),
        });
    }
    let reader = open_lines(src)?;
    let tmp = dest.with_extension("tsv.part");
    let file = std::fs::File::create(&tmp).map_err(|e| io(&tmp, e))?;
    let mut out = BufWriter::new(file);
    let (mut rows, mut positives) = (0, 0);
    for (i, line) in reader.split(b'\n').enumerate() {
        let line = line.map_err(|e| io(src, e))?;
        let line = line.strip_suffix(b"\r").unwrap_or(&line);
        if line.is_empty() {
            continue;
        }
        let Some(tab) = line.iter().position(|&b| b == b'\t') else {
            return Err(JobError::Join {
                file: src.to_path_buf(),
                line: i + 1,
                reason: "one field only; impressions are Criteo rows".into(),
            });
        };
        let key = line[tab + 1..].split(|&b| b == b'\t').nth(key_field - 1);
        let Some(key) = key else {
            return Err(JobError::Join {
                file: src.to_path_buf(),
                line: i + 1,
                reason: format!(
                    "no field {} (the join key); impressions are Criteo rows",
                    key_field + 1
                ),
            });
        };
        let positive = !key.is_empty() && keys.contains(key);
        rows += 1;
        positives += u64::from(positive);
        out.write_all(if positive { b"1" } else { b"0" })
            .and_then(|()| out.write_all(&line[tab..]))
            .and_then(|()| out.write_all(b"\n"))
            .map_err(|e| io(&tmp, e))?;
    }
    out.into_inner()
        .map_err(|e| io(&tmp, e.into_error()))?
        .sync_all()
        .map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, dest).map_err(|e| io(dest, e))?;
    Ok((rows, positives))
}

/// `path`'s bytes, through gzip when it starts with gzip's magic.
fn open_lines(path: &Path) -> Result<Box<dyn BufRead>> {
    let file = std::fs::File::open(path).map_err(|e| io(path, e))?;
    let gz = elastrec_data::detect_format(path)? == elastrec_data::FileFormat::TsvGzip;
    Ok(if gz {
        Box::new(std::io::BufReader::new(flate2::read::MultiGzDecoder::new(
            file,
        )))
    } else {
        Box::new(std::io::BufReader::new(file))
    })
}

fn io(path: &Path, e: std::io::Error) -> JobError {
    JobError::Io {
        path: path.to_path_buf(),
        source: e,
    }
}

fn definition(source: &str, reason: String) -> JobError {
    JobError::Datasets(OrchestrateError::Definition {
        dataset: source.into(),
        field: "join",
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(label: u8, key: &str) -> String {
        let ints = vec!["1"; 13].join("\t");
        let mut cats = vec!["0000000a"; 26];
        cats[2] = key; // C3
        format!("{label}\t{ints}\t{}\n", cats.join("\t"))
    }

    /// Hour 10's impressions joined with events within 30 minutes of the hour's end: an
    /// event inside the range labels its key, one before it or past it does not, and the
    /// impression's own label is replaced.
    #[test]
    fn events_label_the_impressions_of_their_key_within_the_window() {
        let tmp = tempfile::tempdir().unwrap();
        let imp = tmp.path().join("imp/dt=20261101/hour=10");
        std::fs::create_dir_all(&imp).unwrap();
        let rows: String = ["00000001", "00000002", "00000003", "00000004", ""]
            .iter()
            .map(|k| row(1, k))
            .collect();
        std::fs::write(imp.join("part-0.tsv"), rows).unwrap();
        let t10 = chrono::NaiveDate::from_ymd_opt(2026, 11, 1)
            .unwrap()
            .and_hms_opt(10, 0, 0)
            .unwrap()
            .and_utc()
            .timestamp();
        for (hour, events) in [
            (9, format!("00000004\t{}\n", t10 - 60)),
            (
                10,
                format!("00000001\t{}\n00000002\t{}\n", t10 + 5, t10 + 3599),
            ),
            (
                11,
                format!(
                    "00000003\t{}\n00000004\t{}\n",
                    t10 + 3600 + 1799,
                    t10 + 3600 + 1800
                ),
            ),
        ] {
            let d = tmp.path().join(format!("ev/dt=20261101/hour={hour}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("e.tsv"), events).unwrap();
            std::fs::write(d.join("_SUCCESS"), "").unwrap();
        }
        let cfg = JoinConfig {
            events: format!("{}/ev/dt={{date}}/hour={{hour}}", tmp.path().display()),
            key: "C3".into(),
            within: "30m".into(),
            ready_timeout: "0s".into(),
            ..JoinConfig::default()
        };
        let mut j = Joiner::new("clicks", &cfg, &tmp.path().join("cache")).unwrap();
        let start = chrono::DateTime::from_timestamp(t10, 0)
            .unwrap()
            .naive_utc();
        let (out, stats) = j
            .join(
                "dt=20261101/hour=10",
                start,
                chrono::Duration::hours(1),
                &[imp.join("part-0.tsv").display().to_string()],
            )
            .unwrap();
        let text = std::fs::read_to_string(&out[0]).unwrap();
        let labels: Vec<&str> = text.lines().map(|l| &l[..1]).collect();
        // 1 and 2 in hour 10, 3 at 29:59 past the hour's end; 4 before it and at 30:00.
        assert_eq!(labels, ["1", "1", "1", "0", "0"]);
        assert_eq!(
            stats,
            JoinStats {
                rows: 5,
                positives: 3,
                events: 4
            }
        );
        // The rows themselves are unchanged past the label.
        assert!(text.lines().all(|l| l.split('\t').count() == 40));

        // An event partition the window needs is not ready: a clear error naming it.
        std::fs::remove_file(tmp.path().join("ev/dt=20261101/hour=11/_SUCCESS")).unwrap();
        let mut j = Joiner::new("clicks", &cfg, &tmp.path().join("cache")).unwrap();
        let err = j
            .join(
                "dt=20261101/hour=10",
                start,
                chrono::Duration::hours(1),
                &[imp.join("part-0.tsv").display().to_string()],
            )
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("hour=11") && err.contains("not ready"),
            "{err}"
        );
    }

    #[test]
    fn a_malformed_event_names_its_file_and_line() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("e.tsv");
        std::fs::write(&f, "00000001\t100\n00000002\tsoon\n").unwrap();
        let err = read_events(&f, 0, 1000, &mut HashSet::new())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("e.tsv:2") && err.contains("unix seconds"),
            "{err}"
        );
    }

    #[test]
    fn bad_sections_are_refused_naming_the_field() {
        let cfg = |key: &str, within: &str, events: &str| JoinConfig {
            events: events.into(),
            key: key.into(),
            within: within.into(),
            ..JoinConfig::default()
        };
        let ok = "ev/dt={date}/hour={hour}";
        assert!(cfg("C3", "1h", ok).check("s").is_ok());
        let e = cfg("I3", "1h", ok).check("s").unwrap_err();
        assert!(e.contains("join.key") && e.contains("C1 … C26"), "{e}");
        let e = cfg("C3", "soon", ok).check("s").unwrap_err();
        assert!(e.contains("join.within"), "{e}");
        let e = cfg("C3", "1h", "ev/hourly").check("s").unwrap_err();
        assert!(e.contains("join.events"), "{e}");
    }
}
