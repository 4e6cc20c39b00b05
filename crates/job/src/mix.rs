//! Mixing a job's data sources (Primus §4.1 and §5, `docs/data.md`).
//!
//! * `[[data.source]]`: the training data split into named sources (datasets or files),
//!   each served from its own buffer with a weight: recent days weighted over older ones,
//!   a small clean set over a large noisy one.
//! * `[data.mix]`: how the buffers are served. A job with a `[stream]` and this section
//!   trains its history (the `data.train` files, its training datasets or its sources)
//!   and its stream in one job, one model and one ledger.
//!
//! [`serving`] turns both into the policy that the master's queue and `elastrec train`'s
//! reader apply (`elastrec_control::serving`).

use serde::{Deserialize, Serialize};

use elastrec_control::serving::Serving;

use crate::config::JobConfig;

/// The name a stream's buffer has in status and results; no source may take it.
pub const STREAM_SOURCE: &str = "stream";

/// The name of the history's one buffer in a job without `[[data.source]]`.
pub const HISTORY_SOURCE: &str = "history";

/// One `[[data.source]]`: part of the training data, served from its own buffer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SourceConfig {
    /// Name in status, results and messages (unique; not `stream`).
    pub name: String,
    /// Training datasets (`[[data.dataset]]` names) whose files this source serves.
    pub datasets: Vec<String>,
    /// `data.train` files this source serves (as `data.train` spells them). When the job
    /// starts, its datasets' files are added here and `datasets` is emptied, so the job
    /// file the master ships names every file's source.
    pub files: Vec<String>,
    /// Share of the rows served while every source has data (`weighted`), or Primus's
    /// `w` (`priority`). Positive.
    pub weight: f64,
    /// Label the source's impressions by events of the same key within a window after
    /// their partition (`[data.source.join]`, [`crate::join`]); done when the job starts,
    /// and dropped from the job file the master ships, which names the joined files.
    pub join: Option<crate::join::JoinConfig>,
}

impl Default for SourceConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            datasets: Vec::new(),
            files: Vec::new(),
            weight: 1.0,
            join: None,
        }
    }
}

/// The `[data.mix]` section.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MixConfig {
    /// How the history's and the stream's serving buffers are served:
    /// `"sequential"` (all of the history first, then the stream),
    /// `"weighted"` (rows in proportion to `history_weight : stream_weight` while both
    /// have data) or `"priority"` (Primus Eq. 4: the buffer with the highest
    /// `weight · sigmoid(queued tasks − target_tasks)`).
    pub mode: MixMode,
    /// Weight of the history's buffer (`weighted`, `priority`); with `[[data.source]]`
    /// each source's `weight` takes its place.
    pub history_weight: f64,
    /// Weight of the stream's buffer (`weighted`, `priority`); Primus gives the stream
    /// the larger weight, so that fresh data is not starved by a backlog of history.
    pub stream_weight: f64,
    /// `priority`: queued tasks at which a buffer has half its weight. The stream waits
    /// for about this many tasks before it preempts the history when its weight is not
    /// much larger (`docs/data.md`).
    pub target_tasks: f64,
}

/// How the mixture's buffers are served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MixMode {
    /// History first, then the stream.
    Sequential,
    /// Proportional to the weights.
    Weighted,
    /// Primus Eq. 4.
    #[default]
    Priority,
}

impl Default for MixConfig {
    fn default() -> Self {
        Self {
            mode: MixMode::Priority,
            history_weight: 1.0,
            stream_weight: 4.0,
            target_tasks: 2.0,
        }
    }
}

impl MixConfig {
    /// Checks the section; `Err((field, reason))`.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        for (field, w) in [
            ("data.mix.history_weight", self.history_weight),
            ("data.mix.stream_weight", self.stream_weight),
        ] {
            if !(w.is_finite() && w > 0.0) {
                return Err((field, format!("must be a positive number, got {w}")));
            }
        }
        if !(self.target_tasks.is_finite() && self.target_tasks >= 0.0) {
            return Err((
                "data.mix.target_tasks",
                format!("must be 0 or a positive number, got {}", self.target_tasks),
            ));
        }
        Ok(())
    }
}

/// Checks the job's `[[data.source]]` list against its training data: every source named
/// once and weighted, naming training datasets and `data.train` files that exist, and
/// every training dataset and file in exactly one source. `Err((field, reason))`.
pub fn check_sources(job: &JobConfig) -> Result<(), (&'static str, String)> {
    let sources = &job.data.source;
    if sources.is_empty() {
        return Ok(());
    }
    let mut names = std::collections::HashSet::new();
    // Where each dataset and file went, to refuse one named twice.
    let mut owner: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
    for (i, s) in sources.iter().enumerate() {
        let what = format!("[[data.source]] entry {}", i + 1);
        if s.name.is_empty() {
            return Err(("data.source", format!("{what} has no `name`")));
        }
        if s.name == STREAM_SOURCE || !names.insert(s.name.as_str()) {
            return Err((
                "data.source",
                format!(
                    "{what}: the name `{}` is taken (names are unique, and `{STREAM_SOURCE}` is the stream's)",
                    s.name
                ),
            ));
        }
        if !(s.weight.is_finite() && s.weight > 0.0) {
            return Err((
                "data.source",
                format!(
                    "source `{}`: weight must be a positive number, got {}",
                    s.name, s.weight
                ),
            ));
        }
        if s.datasets.is_empty() && s.files.is_empty() {
            return Err((
                "data.source",
                format!("source `{}` names no datasets and no files", s.name),
            ));
        }
        if let Some(join) = &s.join {
            join.check(&s.name).map_err(|r| ("data.source", r))?;
            if !s.files.is_empty() || s.datasets.is_empty() {
                return Err((
                    "data.source",
                    format!(
                        "source `{}` joins events by time, and only datasets have a time: name its impressions in `datasets`, not `files`",
                        s.name
                    ),
                ));
            }
            if job.data.follow {
                return Err((
                    "data.follow",
                    format!(
                        "source `{}` joins events when the job starts; joining the partitions a following job finds later is not built",
                        s.name
                    ),
                ));
            }
        }
        for d in &s.datasets {
            let known = job.data.dataset.iter().enumerate().any(|(i, ds)| {
                ds.role == elastrec_orchestrate::DatasetRole::Train && ds.display_name(i) == *d
            });
            if !known {
                return Err((
                    "data.source",
                    format!(
                        "source `{}` names dataset `{d}`, which is not a [[data.dataset]] with role = \"train\"",
                        s.name
                    ),
                ));
            }
        }
        for f in &s.files {
            if !job.data.train.contains(f) {
                return Err((
                    "data.source",
                    format!(
                        "source `{}` names file `{f}`, which is not in data.train",
                        s.name
                    ),
                ));
            }
        }
        for item in s.datasets.iter().chain(&s.files) {
            if let Some(first) = owner.insert(item, &s.name) {
                return Err((
                    "data.source",
                    format!(
                        "`{item}` is in two sources (`{first}` and `{}`); put it in one",
                        s.name
                    ),
                ));
            }
        }
    }
    let datasets: Vec<String> = job
        .data
        .dataset
        .iter()
        .enumerate()
        .filter(|(_, d)| d.role == elastrec_orchestrate::DatasetRole::Train)
        .map(|(i, d)| d.display_name(i))
        .collect();
    // Training datasets replace `data.train` (its default included) when the job starts.
    let files = if datasets.is_empty() {
        job.data.train.clone()
    } else {
        Vec::new()
    };
    for item in datasets.into_iter().chain(files) {
        if !owner.contains_key(item.as_str()) {
            return Err((
                "data.source",
                format!(
                    "`{item}` is training data in no [[data.source]]; add it to one (with sources, every training dataset and file is in exactly one)"
                ),
            ));
        }
    }
    Ok(())
}

/// The buffers' names: the history's sources (one, `history`, without `[[data.source]]`),
/// then the stream's.
pub fn source_names(job: &JobConfig) -> Vec<String> {
    let mut names: Vec<String> = if job.data.source.is_empty() {
        vec![HISTORY_SOURCE.into()]
    } else {
        job.data.source.iter().map(|s| s.name.clone()).collect()
    };
    names.push(STREAM_SOURCE.into());
    names
}

/// The history source of each `data.train` file, by index (all 0 without sources). A
/// file that no source names (not possible in a checked job) is source 0.
pub fn train_file_sources(job: &JobConfig) -> Vec<u32> {
    job.data
        .train
        .iter()
        .map(|f| {
            job.data
                .source
                .iter()
                .position(|s| s.files.contains(f))
                .unwrap_or(0) as u32
        })
        .collect()
}

/// The position of the `[[data.source]]` that serves dataset `name`, if one does.
pub fn dataset_source(job: &JobConfig, name: &str) -> Option<usize> {
    job.data
        .source
        .iter()
        .position(|s| s.datasets.iter().any(|d| d == name))
}

/// True when the job serves more than one buffer: a batch + stream mixture, or more than
/// one `[[data.source]]`.
pub fn is_mixed(job: &JobConfig) -> bool {
    job.is_mixture() || job.data.source.len() > 1
}

/// How the job's buffers are served: `data.mix.mode` over the sources' weights (or the
/// history's) and the stream's; `weighted` for sources without a `[data.mix]`; sequential
/// for a job with one source.
pub fn serving(job: &JobConfig) -> Serving {
    if !is_mixed(job) {
        return Serving::Sequential;
    }
    let mix = job.data.mix.clone().unwrap_or(MixConfig {
        mode: MixMode::Weighted,
        ..MixConfig::default()
    });
    let mut weights: Vec<f64> = if job.data.source.is_empty() {
        vec![mix.history_weight]
    } else {
        job.data.source.iter().map(|s| s.weight).collect()
    };
    // A job without a stream has no stream buffer to weigh (its empty buffer is never
    // picked, and status shows the sources' weights only).
    if job.stream.is_some() {
        weights.push(mix.stream_weight);
    }
    match mix.mode {
        MixMode::Sequential => Serving::Sequential,
        MixMode::Weighted => Serving::Weighted { weights },
        MixMode::Priority => Serving::Priority {
            weights,
            target: mix.target_tasks,
        },
    }
}
