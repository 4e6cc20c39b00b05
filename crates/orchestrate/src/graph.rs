//! Data task graph generation (DTGG, Primus §4.2): datasets and time windows in, data tasks
//! out, in chronological order.
//!
//! One planning round runs the four operator kinds of the paper:
//! * **timer**: one per partition start time in each dataset's window that has not been
//!   sunk yet (a sliding window adds new timers as the clock moves);
//! * **source**: lists the partition directory (or takes it from the listing cache) and
//!   cuts its files into tasks. Sources run in parallel (rayon). A ready partition is
//!   immutable, so it is listed once per job (the cache is keyed by dataset and time); two
//!   datasets over the same directory are still listed separately (Primus's fusion of
//!   sources is not built);
//! * **joiner**: a time is complete when every dataset's partition at that time is ready;
//! * **sink**: appends the tasks of complete times, oldest first, and stops at the first
//!   incomplete time, so tasks always leave in chronological order whatever finished first.
//!
//! A round is incremental: partitions sunk earlier are never listed or emitted again, ready
//! partitions waiting behind an incomplete time stay cached.

use std::collections::HashMap;
use std::time::Duration;

use chrono::NaiveDateTime;
use rayon::prelude::*;

use crate::definition::Dataset;
use crate::error::{OrchestrateError, Result};
use crate::listing::{FileList, Listing};
use crate::window::Window;

/// How large one data task may grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskLimits {
    /// Files per task (at least 1).
    pub files: u32,
    /// Bytes per task; a single larger file is a task of its own.
    pub bytes: u64,
}

impl Default for TaskLimits {
    fn default() -> Self {
        Self {
            files: 16,
            bytes: 256 << 20,
        }
    }
}

/// A listed, ready partition.
#[derive(Debug, Clone)]
pub struct Partition {
    /// Index of its dataset in the graph.
    pub dataset: usize,
    /// Start of the partition's period (UTC).
    pub start: NaiveDateTime,
    /// Directory relative to the dataset's root.
    pub dir: String,
    /// Its data files, in name order.
    pub files: FileList,
}

/// One data task: files `first..end` of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataTask {
    /// Unique in the graph, increasing in sink order.
    pub id: u64,
    /// Index of the partition ([`TaskGraph::partition`]).
    pub partition: u32,
    /// First file (index in the partition's list).
    pub first: u32,
    /// One past the last file.
    pub end: u32,
    /// Bytes of its files.
    pub bytes: u64,
}

/// A partition of a window that is not ready yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingPartition {
    /// Index of its dataset.
    pub dataset: usize,
    /// Start of its period.
    pub start: NaiveDateTime,
    /// Directory relative to the dataset's root.
    pub dir: String,
    /// The directory exists (it is only missing its marker).
    pub exists: bool,
}

/// What one round saw of one dataset's window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DatasetRound {
    /// The window at this round's `now`.
    pub window: Option<Window>,
    /// Partitions in the window not sunk before this round.
    pub partitions: usize,
    /// Of those, how many exist.
    pub existing: usize,
    /// Of those, how many are ready.
    pub ready: usize,
    /// Files in the ready ones.
    pub files: u64,
    /// The first partition directory of the window (for messages).
    pub first_dir: String,
}

/// The result of one planning round.
#[derive(Debug, Clone, Default)]
pub struct Round {
    /// New tasks, in chronological (sink) order.
    pub tasks: Vec<DataTask>,
    /// Partitions listed from storage in this round.
    pub listed: usize,
    /// Partitions taken from the listing cache.
    pub cached: usize,
    /// Files in the new tasks.
    pub files: u64,
    /// Partitions not ready, oldest first.
    pub pending: Vec<PendingPartition>,
    /// The oldest time the sink could not pass (its partitions are pending).
    pub blocked_at: Option<NaiveDateTime>,
    /// Per dataset, in graph order.
    pub datasets: Vec<DatasetRound>,
}

/// A task cut from a partition: files `first..end`, `bytes` in all.
#[derive(Debug, Clone, Copy)]
struct Cut {
    first: u32,
    end: u32,
    bytes: u64,
}

/// One timer: the partition of dataset `dataset` starting at `start`, in directory `dir`.
struct Timer {
    start: NaiveDateTime,
    dataset: usize,
    dir: String,
}

/// One source operator's outcome.
enum Source {
    Cached(u32),
    Listed(Listing),
}

impl Source {
    fn is_ready(&self) -> bool {
        match self {
            Source::Cached(_) => true,
            Source::Listed(l) => l.ready,
        }
    }
}

/// The task generator of a job's datasets.
pub struct TaskGraph {
    datasets: Vec<Dataset>,
    limits: TaskLimits,
    partitions: Vec<Partition>,
    cache: HashMap<(usize, NaiveDateTime), u32>,
    /// Per dataset: the newest partition start already sunk.
    sunk: Vec<Option<NaiveDateTime>>,
    next_id: u64,
}

impl TaskGraph {
    /// A graph over `datasets` cutting tasks at `limits`.
    pub fn new(datasets: Vec<Dataset>, limits: TaskLimits) -> Self {
        let n = datasets.len();
        Self {
            datasets,
            limits: TaskLimits {
                files: limits.files.max(1),
                bytes: limits.bytes.max(1),
            },
            partitions: Vec::new(),
            cache: HashMap::new(),
            sunk: vec![None; n],
            next_id: 0,
        }
    }

    /// The datasets, in job order.
    pub fn datasets(&self) -> &[Dataset] {
        &self.datasets
    }

    /// Partition `i` of a task.
    pub fn partition(&self, i: u32) -> &Partition {
        &self.partitions[i as usize]
    }

    /// Every listed partition (sunk or cached), for memory reports.
    pub fn partitions(&self) -> &[Partition] {
        &self.partitions
    }

    /// The paths of a task's files, as readers open them.
    pub fn task_paths(&self, t: &DataTask) -> Vec<String> {
        let p = self.partition(t.partition);
        let lister = &self.datasets[p.dataset].lister;
        (t.first..t.end)
            .map(|i| lister.file_path(&p.dir, p.files.name(i as usize)))
            .collect()
    }

    /// Local paths of a task's files: the files themselves on local storage; on an object
    /// store, copies under `cache/<dir>/` (fetched once; a copy of the listed size is
    /// reused, since a ready partition never changes).
    pub fn stage_task(&self, t: &DataTask, cache: &std::path::Path) -> Result<Vec<String>> {
        let p = self.partition(t.partition);
        let ds = &self.datasets[p.dataset];
        if ds.lister.is_local() {
            return Ok(self.task_paths(t));
        }
        (t.first..t.end)
            .map(|i| {
                let name = p.files.name(i as usize);
                let dest = cache.join(&p.dir).join(name);
                let whole =
                    std::fs::metadata(&dest).is_ok_and(|m| m.len() == p.files.size(i as usize));
                if !whole {
                    ds.lister.fetch(&p.dir, name, &dest).map_err(|source| {
                        OrchestrateError::Listing {
                            dataset: ds.name.clone(),
                            source,
                        }
                    })?;
                }
                Ok(dest.display().to_string())
            })
            .collect()
    }

    /// Bytes held by the listing cache.
    pub fn listing_bytes(&self) -> usize {
        self.partitions
            .iter()
            .map(|p| p.files.heap_bytes() + p.dir.capacity())
            .sum()
    }

    /// True when no round at `now` or later can add a task: every window is bounded and
    /// closed at `now`, and its last partition has been sunk.
    pub fn is_exhausted(&self, now: NaiveDateTime) -> bool {
        self.datasets.iter().enumerate().all(|(d, ds)| {
            let g = ds.template.granularity();
            ds.window.is_closed_at(now, g)
                && ds
                    .window
                    .at(now, g)
                    .partitions(g)
                    .last()
                    .is_none_or(|last| self.sunk[d].is_some_and(|s| s >= last))
        })
    }

    /// Runs one round at time `now` (UTC). Sources run on the current rayon pool.
    pub fn plan(&mut self, now: NaiveDateTime) -> Result<Round> {
        // Timers: every partition time of every window not sunk yet.
        let mut round = Round::default();
        let mut timers: Vec<Timer> = Vec::new();
        for (d, ds) in self.datasets.iter().enumerate() {
            let g = ds.template.granularity();
            let window = ds.window.at(now, g);
            let mut seen = DatasetRound {
                window: Some(window),
                ..Default::default()
            };
            for t in window.partitions(g) {
                if seen.first_dir.is_empty() {
                    seen.first_dir = ds.template.render(t);
                }
                if self.sunk[d].is_some_and(|s| t <= s) {
                    continue;
                }
                seen.partitions += 1;
                timers.push(Timer {
                    start: t,
                    dataset: d,
                    dir: ds.template.render(t),
                });
            }
            round.datasets.push(seen);
        }
        timers.sort_unstable_by_key(|u| (u.start, u.dataset));

        // Sources, in parallel: a cached partition is not listed again.
        let this = &*self;
        let outcomes: Vec<(Source, Vec<Cut>)> = timers
            .par_iter()
            .map(|u| {
                if let Some(&i) = this.cache.get(&(u.dataset, u.start)) {
                    let cuts = cut(&this.partitions[i as usize].files, this.limits);
                    return Ok((Source::Cached(i), cuts));
                }
                let ds = &this.datasets[u.dataset];
                let listing = ds
                    .lister
                    .list(&u.dir, &ds.filter, &ds.marker)
                    .map_err(|source| OrchestrateError::Listing {
                        dataset: ds.name.clone(),
                        source,
                    })?;
                let cuts = if listing.ready {
                    cut(&listing.files, this.limits)
                } else {
                    Vec::new()
                };
                Ok((Source::Listed(listing), cuts))
            })
            .collect::<Result<_>>()?;

        // Joiners, in time order: the oldest time with a pending partition blocks the sink.
        for (u, (source, _)) in timers.iter().zip(&outcomes) {
            let stats = &mut round.datasets[u.dataset];
            let (exists, is_ready, files) = match source {
                Source::Cached(i) => {
                    round.cached += 1;
                    (true, true, self.partitions[*i as usize].files.len())
                }
                Source::Listed(l) => {
                    round.listed += 1;
                    (l.exists, l.ready, l.files.len())
                }
            };
            stats.existing += usize::from(exists);
            if is_ready {
                stats.ready += 1;
                stats.files += files as u64;
            } else {
                round.pending.push(PendingPartition {
                    dataset: u.dataset,
                    start: u.start,
                    dir: u.dir.clone(),
                    exists,
                });
                // Timers are sorted: the first pending one is the oldest.
                round.blocked_at.get_or_insert(u.start);
            }
        }
        // The sink: ready partitions are cached; those before the blocked time leave.
        for (u, (source, cuts)) in timers.into_iter().zip(outcomes) {
            if !source.is_ready() {
                continue;
            }
            let (t, d) = (u.start, u.dataset);
            let index = match source {
                Source::Cached(i) => i,
                Source::Listed(listing) => {
                    let i = u32::try_from(self.partitions.len()).expect("under 4G partitions");
                    self.partitions.push(Partition {
                        dataset: d,
                        start: t,
                        dir: u.dir,
                        files: listing.files,
                    });
                    self.cache.insert((d, t), i);
                    i
                }
            };
            if round.blocked_at.is_some_and(|b| t >= b) {
                continue; // behind an incomplete time: stays cached for a later round
            }
            for c in cuts {
                round.tasks.push(DataTask {
                    id: self.next_id,
                    partition: index,
                    first: c.first,
                    end: c.end,
                    bytes: c.bytes,
                });
                self.next_id += 1;
                round.files += u64::from(c.end - c.first);
            }
            self.cache.remove(&(d, t));
            self.sunk[d] = Some(t);
        }
        Ok(round)
    }

    /// Plans at `now` for a job about to start: waits (polling every `poll`) for partitions
    /// the job cannot do without, and fails with a message naming the dataset when the
    /// definitions match nothing. Needed are the partitions of a bounded window (`to` set)
    /// and any partition older than a ready one; the newest partitions of a growing window
    /// that are not ready yet are left for later rounds and returned as pending.
    ///
    /// A job that `follow`s its datasets (lists them again while it runs) needs only a
    /// first task: it waits for its oldest partition when nothing could leave.
    pub fn plan_for_start(
        &mut self,
        now: NaiveDateTime,
        poll: Duration,
        follow: bool,
    ) -> Result<(Vec<DataTask>, Vec<PendingPartition>)> {
        let started = std::time::Instant::now();
        let mut tasks = Vec::new();
        let mut files_by_dataset = vec![0u64; self.datasets.len()];
        loop {
            let round = self.plan(now)?;
            tasks.extend_from_slice(&round.tasks);
            for t in &round.tasks {
                let p = self.partition(t.partition);
                files_by_dataset[p.dataset] += u64::from(t.end - t.first);
            }
            for (d, seen) in round.datasets.iter().enumerate() {
                let ds = &self.datasets[d];
                let window = seen.window.expect("every round sets the window");
                let never_sunk = self.sunk[d].is_none();
                if never_sunk && seen.existing == 0 {
                    return Err(OrchestrateError::NothingMatches {
                        dataset: ds.name.clone(),
                        root: ds.lister.root(),
                        partitions: seen.partitions,
                        first: if seen.first_dir.is_empty() {
                            ds.template.render(window.start)
                        } else {
                            seen.first_dir.clone()
                        },
                        window: format!("[{}, {})", window.start, window.end),
                    });
                }
                let all_ready = seen.ready > 0 && !round.pending.iter().any(|p| p.dataset == d);
                if all_ready && files_by_dataset[d] == 0 && seen.files == 0 {
                    return Err(OrchestrateError::NoFiles {
                        dataset: ds.name.clone(),
                        pattern: ds.filter.pattern().to_string(),
                        partitions: seen.ready,
                        example: seen.first_dir.clone(),
                    });
                }
            }
            let newest_ready = self.sunk.iter().flatten().max().copied();
            let needed: Vec<&PendingPartition> = round
                .pending
                .iter()
                .filter(|p| {
                    if follow {
                        return tasks.is_empty();
                    }
                    self.datasets[p.dataset].window.is_bounded()
                        || newest_ready.is_some_and(|n| p.start < n)
                        || self.cache.keys().any(|&(_, t)| p.start < t)
                })
                .collect();
            let Some(first) = needed.first() else {
                return Ok((tasks, round.pending));
            };
            let ds = &self.datasets[first.dataset];
            let waited = started.elapsed();
            if waited >= ds.ready_timeout {
                return Err(OrchestrateError::NotReady {
                    dataset: ds.name.clone(),
                    dir: format!("{}/{}", ds.lister.root(), first.dir),
                    waited,
                    why: if !first.exists {
                        "it does not exist".into()
                    } else if ds.marker.is_empty() {
                        "it holds no matching file".into()
                    } else {
                        format!("no `{}` marker", ds.marker)
                    },
                    because: if follow {
                        "a following job starts once its oldest partition is ready".into()
                    } else if ds.window.is_bounded() {
                        "it lies in the dataset's fixed window".into()
                    } else {
                        "newer partitions are ready and tasks are served in time order".into()
                    },
                });
            }
            std::thread::sleep(poll.min(ds.ready_timeout.saturating_sub(waited)));
        }
    }
}

/// Cuts a partition's files into consecutive tasks within `limits`.
fn cut(files: &FileList, limits: TaskLimits) -> Vec<Cut> {
    let mut out = Vec::with_capacity(files.len() / limits.files as usize + 1);
    let (mut first, mut count, mut bytes) = (0u32, 0u32, 0u64);
    for i in 0..files.len() as u32 {
        let size = files.size(i as usize);
        if count > 0 && (count == limits.files || bytes.saturating_add(size) > limits.bytes) {
            out.push(Cut {
                first,
                end: i,
                bytes,
            });
            (first, count, bytes) = (i, 0, 0);
        }
        count += 1;
        bytes = bytes.saturating_add(size);
    }
    if count > 0 {
        out.push(Cut {
            first,
            end: first + count,
            bytes,
        });
    }
    out
}
