//! Errors of data orchestration: each names the dataset, and the field or partition at fault.

use std::time::Duration;

use crate::listing::ListError;

/// What went wrong planning a job's data.
#[derive(Debug, thiserror::Error)]
pub enum OrchestrateError {
    /// A definition in the job file cannot be used.
    #[error("dataset `{dataset}`, field `{field}`: {reason}")]
    Definition {
        /// The dataset's name (or its position when it has none).
        dataset: String,
        /// The field at fault, e.g. `path`, `from`.
        field: &'static str,
        /// What is wrong and what to write instead.
        reason: String,
    },
    /// Storage could not be listed.
    #[error("dataset `{dataset}`: {source}")]
    Listing {
        /// The dataset being listed.
        dataset: String,
        /// The listing's error.
        #[source]
        source: ListError,
    },
    /// No partition of the window exists: most likely `path` is wrong.
    #[error(
        "dataset `{dataset}`: the pattern matches nothing: none of the {partitions} partitions of the window \
         {window} exists under {root} (the first would be `{first}`); check `path` and the window"
    )]
    NothingMatches {
        /// The dataset.
        dataset: String,
        /// The root listed.
        root: String,
        /// Partitions the window holds.
        partitions: usize,
        /// The first partition directory expected.
        first: String,
        /// The window, `[start, end)`.
        window: String,
    },
    /// Partitions exist but no file in them matches the file pattern.
    #[error(
        "dataset `{dataset}`, field `files`: `{pattern}` matches no file in the {partitions} ready partitions \
         of the window (e.g. `{example}`)"
    )]
    NoFiles {
        /// The dataset.
        dataset: String,
        /// The file pattern.
        pattern: String,
        /// Ready partitions in the window.
        partitions: usize,
        /// One of them.
        example: String,
    },
    /// A partition the job needs did not become ready in time.
    #[error(
        "dataset `{dataset}`: partition `{dir}` is not ready after {waited:?} ({why}); the job needs it because \
         {because}. Check the job that writes it, or raise `ready_timeout`"
    )]
    NotReady {
        /// The dataset.
        dataset: String,
        /// The partition directory.
        dir: String,
        /// How long the planner waited.
        waited: Duration,
        /// `does not exist`, `no _SUCCESS marker`, ...
        why: String,
        /// Why it cannot be skipped.
        because: String,
    },
}

/// Results of this crate.
pub type Result<T, E = OrchestrateError> = std::result::Result<T, E>;
