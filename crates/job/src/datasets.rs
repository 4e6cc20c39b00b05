//! A job's `[[data.dataset]]` definitions resolved into the files it reads.
//!
//! The trainer and the master resolve them once, at start, through the data task graph
//! (`elastrec_orchestrate`): each window is listed, partitions the job needs are waited for,
//! and the tasks' files become `data.train` / `data.eval` in chronological order. The
//! resolved job file (definitions replaced by files, `data.now` fixed) is what the master
//! stores and ships to its workers, so every process and a resumed master read the same
//! files.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::NaiveDateTime;
use elastrec_orchestrate::{
    DataTask, Dataset, DatasetRole, PendingPartition, TaskGraph, TaskLimits,
};

use crate::config::JobConfig;
use crate::error::{JobError, Result};

/// Where object-store partitions are copied, under `output.dir`.
pub const STAGING_DIR: &str = "data-cache";

/// How often a start waits between listings of a partition it needs.
const READY_POLL: Duration = Duration::from_secs(1);

/// What resolving found, per dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedDataset {
    /// The dataset's name.
    pub name: String,
    /// Its role.
    pub role: DatasetRole,
    /// Partitions whose files the job reads.
    pub partitions: usize,
    /// Files the job reads.
    pub files: usize,
    /// Data tasks the graph generated.
    pub tasks: usize,
    /// Newest partitions of a growing window that were not ready at start (not read).
    pub pending: Vec<String>,
    /// What its source's joiner did to its rows (`[data.source.join]`).
    pub join: Option<crate::join::JoinStats>,
}

/// Resolves the job's datasets (a no-op without any): fills `data.train` (and `data.eval`
/// when an `eval` dataset is given), fixes `data.now`, and removes the definitions.
/// Blocks while it waits for needed partitions (up to each dataset's `ready_timeout`).
///
/// A following job (`data.follow`) keeps its training definitions and its clock (unless
/// `data.now` was given): its master lists them again while it runs. At start it needs
/// only its oldest partition; what is not ready yet is trained when it lands.
pub fn resolve_datasets(job: &mut JobConfig) -> Result<Vec<ResolvedDataset>> {
    if job.data.dataset.is_empty() {
        return Ok(Vec::new());
    }
    let now = fixed_now(job)?.unwrap_or_else(elastrec_orchestrate::window::now_utc);
    let mut report = Vec::new();
    let mut joiners = joiners_of(job)?;
    for role in [DatasetRole::Train, DatasetRole::Eval] {
        let datasets = datasets_of(job, role)?;
        if datasets.is_empty() {
            continue;
        }
        let mut graph = TaskGraph::new(datasets, TaskLimits::default());
        let follow = job.data.follow && role == DatasetRole::Train;
        let (tasks, pending) = graph.plan_for_start(now, READY_POLL, follow)?;
        let mut found: Vec<ResolvedDataset> = graph
            .datasets()
            .iter()
            .enumerate()
            .map(|(d, ds)| ResolvedDataset {
                name: ds.name.clone(),
                role,
                partitions: 0,
                files: 0,
                tasks: 0,
                pending: pending
                    .iter()
                    .filter(|p| p.dataset == d)
                    .map(|p| p.dir.clone())
                    .collect(),
                join: None,
            })
            .collect();
        let mut files = Vec::new();
        let mut checked = std::collections::HashSet::new();
        for t in &tasks {
            let mut staged = stage(job, &graph, t)?;
            let p = graph.partition(t.partition);
            let dataset = &graph.datasets()[p.dataset];
            let source = crate::mix::dataset_source(job, &dataset.name);
            if let (DatasetRole::Train, Some(source)) = (role, source) {
                if let Some(joiner) = joiners[source].as_mut() {
                    let period = dataset.template.granularity().step();
                    let (joined, stats) = joiner.join(&p.dir, p.start, period, &staged)?;
                    staged = joined;
                    *found[p.dataset].join.get_or_insert_default() += stats;
                }
                // The resolved job names each training file's source.
                job.data.source[source].files.extend_from_slice(&staged);
            }
            let counts = &mut found[p.dataset];
            counts.tasks += 1;
            counts.files += staged.len();
            if checked.insert(t.partition) {
                counts.partitions += 1;
                if let Some(first) = staged.first() {
                    check_partition(job, &graph, t, first)?;
                }
            }
            files.extend(staged);
        }
        report.extend(found);
        match role {
            DatasetRole::Train => job.data.train = files,
            DatasetRole::Eval => job.data.eval = files,
        }
    }
    if job.data.follow {
        job.data.dataset.retain(|d| d.role == DatasetRole::Train);
    } else {
        job.data.dataset.clear();
        for s in &mut job.data.source {
            // The files are resolved (and joined): the shipped job names them only.
            s.datasets.clear();
            s.join = None;
        }
        job.data.now = Some(now.format("%Y-%m-%dT%H:%M:%S").to_string());
    }
    Ok(report)
}

/// A joiner per `[[data.source]]` (by position), for those with a `join`.
fn joiners_of(job: &JobConfig) -> Result<Vec<Option<crate::join::Joiner>>> {
    let cache = job.output.dir.join(STAGING_DIR);
    job.data
        .source
        .iter()
        .map(|s| {
            s.join
                .as_ref()
                .map(|j| crate::join::Joiner::new(&s.name, j, &cache))
                .transpose()
        })
        .collect()
}

/// `data.now`, when the job fixes its clock.
fn fixed_now(job: &JobConfig) -> Result<Option<NaiveDateTime>> {
    job.data
        .now
        .as_deref()
        .map(elastrec_orchestrate::parse_time)
        .transpose()
        .map_err(|reason| {
            JobError::Datasets(elastrec_orchestrate::OrchestrateError::Definition {
                dataset: "(all)".into(),
                field: "data.now",
                reason,
            })
        })
}

/// The job's datasets of `role`, compiled, in job order.
fn datasets_of(job: &JobConfig, role: DatasetRole) -> Result<Vec<Dataset>> {
    let mut out = Vec::new();
    for (i, cfg) in job.data.dataset.iter().enumerate() {
        if cfg.role == role {
            // Local roots were made absolute when the job file was loaded.
            out.push(Dataset::compile(cfg, i, Path::new("."))?);
        }
    }
    Ok(out)
}

/// Local paths of task `t`'s files: object-store partitions are copied under the run
/// directory, which the job's workers share; local ones are read in place.
fn stage(job: &JobConfig, graph: &TaskGraph, t: &DataTask) -> Result<Vec<String>> {
    let dataset = &graph.datasets()[graph.partition(t.partition).dataset].name;
    let cache = job.output.dir.join(STAGING_DIR).join(dataset);
    Ok(graph.stage_task(t, &cache)?)
}

/// Checks that `file`, of task `t`'s partition, holds the job's samples; the error names
/// the dataset and partition.
fn check_partition(job: &JobConfig, graph: &TaskGraph, t: &DataTask, file: &str) -> Result<()> {
    let p = graph.partition(t.partition);
    check_schema(file, job.data.on_bad_row).map_err(|source| JobError::PartitionSchema {
        dataset: graph.datasets()[p.dataset].name.clone(),
        partition: p.dir.clone(),
        source: Box::new(source),
    })
}

/// Directories a following job's workers may read data files from: each training
/// dataset's root on local storage, its copy under `output.dir` on an object store. A
/// worker refuses a task naming a file elsewhere.
pub fn follow_roots(job: &JobConfig) -> Result<Vec<PathBuf>> {
    Ok(datasets_of(job, DatasetRole::Train)?
        .into_iter()
        .map(|ds| {
            if ds.lister.is_local() {
                PathBuf::from(ds.lister.root())
            } else {
                job.output.dir.join(STAGING_DIR).join(&ds.name)
            }
        })
        .collect())
}

/// What one look at a following job's datasets found.
#[derive(Debug, Default)]
pub struct Landed {
    /// New files and their rows, in time order.
    pub files: Vec<(String, u64)>,
    /// The `[[data.source]]` of each new file (all 0 without sources).
    pub sources: Vec<u32>,
    /// The partitions those files came from, as `dataset/dir`.
    pub partitions: Vec<String>,
    /// Partitions of the windows not ready yet, oldest first.
    pub pending: Vec<PendingPartition>,
    /// No later look can find anything: every window is bounded, closed and read.
    pub exhausted: bool,
}

/// The master's view of a following job's datasets: lists their windows again on each
/// [`Follower::poll`] and returns the files of the partitions that landed since. Files
/// the job already has (given at start, or found before a master restart) are skipped.
pub struct Follower {
    job: JobConfig,
    graph: TaskGraph,
    known: HashSet<String>,
    now: Option<NaiveDateTime>,
}

impl Follower {
    /// A follower of `job`'s training datasets that already has `known` files.
    pub fn new(job: &JobConfig, known: impl IntoIterator<Item = String>) -> Result<Self> {
        Ok(Self {
            graph: TaskGraph::new(datasets_of(job, DatasetRole::Train)?, TaskLimits::default()),
            job: job.clone(),
            known: known.into_iter().collect(),
            now: fixed_now(job)?,
        })
    }

    /// The name of dataset `d` (graph order, as in [`PendingPartition::dataset`]).
    pub fn dataset_name(&self, d: usize) -> &str {
        &self.graph.datasets()[d].name
    }

    /// How long dataset `d` lets a partition stay unready before it is reported.
    pub fn ready_timeout(&self, d: usize) -> Duration {
        self.graph.datasets()[d].ready_timeout
    }

    /// Lists the windows (at `data.now`, or the wall clock) and returns what landed.
    /// On an error (storage unreachable, a new file unreadable) nothing is taken and the
    /// next poll starts over, so a partition is never skipped.
    pub fn poll(&mut self) -> Result<Landed> {
        let result = self.poll_once();
        if result.is_err() {
            self.graph = TaskGraph::new(
                datasets_of(&self.job, DatasetRole::Train)?,
                TaskLimits::default(),
            );
        }
        result
    }

    fn poll_once(&mut self) -> Result<Landed> {
        let now = self
            .now
            .unwrap_or_else(elastrec_orchestrate::window::now_utc);
        let round = self.graph.plan(now)?;
        let mut landed = Landed {
            pending: round.pending,
            ..Landed::default()
        };
        // A partition is checked, and named, at its first file the job does not have.
        let mut new_partitions = HashSet::new();
        for t in &round.tasks {
            for path in stage(&self.job, &self.graph, t)? {
                if self.known.contains(&path) {
                    continue;
                }
                if new_partitions.insert(t.partition) {
                    check_partition(&self.job, &self.graph, t, &path)?;
                    let p = self.graph.partition(t.partition);
                    landed
                        .partitions
                        .push(format!("{}/{}", self.dataset_name(p.dataset), p.dir));
                }
                let rows =
                    elastrec_data::count_source_rows(Path::new(&path), self.job.data.is_named())?;
                let dataset = self.dataset_name(self.graph.partition(t.partition).dataset);
                let source = crate::mix::dataset_source(&self.job, dataset).unwrap_or(0);
                landed.sources.push(source as u32);
                landed.files.push((path, rows));
            }
        }
        self.known
            .extend(landed.files.iter().map(|(f, _)| f.clone()));
        landed.exhausted = self.graph.is_exhausted(now);
        Ok(landed)
    }
}

/// Opens `file` and reads its first row: a partition written with another schema (a
/// Parquet column missing, TSV rows of another width) fails the start, naming the dataset
/// and partition, instead of a worker once it reaches that hour.
fn check_schema(
    file: &str,
    policy: elastrec_data::BadRowPolicy,
) -> std::result::Result<(), elastrec_data::DataError> {
    let mut reader = elastrec_data::open_reader(std::path::Path::new(file), policy)?;
    let mut batch = elastrec_data::Batch::default();
    reader.next_batch(&mut batch, 1)?;
    Ok(())
}

/// One line per dataset for the log: what the job reads and what it left for later.
pub fn describe(resolved: &[ResolvedDataset]) -> Vec<String> {
    resolved
        .iter()
        .map(|r| {
            let mut line = format!(
                "dataset `{}` ({}): {} partitions, {} files in {} tasks",
                r.name,
                match r.role {
                    DatasetRole::Train => "train",
                    DatasetRole::Eval => "eval",
                },
                r.partitions,
                r.files,
                r.tasks
            );
            if let Some(j) = r.join {
                line.push_str(&format!(
                    "; joined with events: {} rows, {} positive ({:.1}%), {} events read",
                    j.rows,
                    j.positives,
                    100.0 * j.positives as f64 / j.rows.max(1) as f64,
                    j.events
                ));
            }
            if !r.pending.is_empty() {
                line.push_str(&format!(
                    "; {} newest partition(s) not ready at start and not read ({})",
                    r.pending.len(),
                    r.pending.join(", ")
                ));
            }
            line
        })
        .collect()
}
