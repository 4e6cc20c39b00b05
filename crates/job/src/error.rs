//! The job crate's error type: data that cannot be prepared, a run-directory file that
//! cannot be written. (The job file's own errors are
//! [`ConfigError`](crate::config::ConfigError), which name the field at fault.)

use std::path::PathBuf;

/// Errors of a job's data and of the run directory's files.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The job's `[[preprocess]]` graph does not compile.
    #[error(transparent)]
    Preprocess(#[from] elastrec_preprocess::PreprocessError),
    /// Reading or generating data failed (bad rows name file, line and field).
    #[error(transparent)]
    Data(#[from] elastrec_data::DataError),
    /// The job's `[[data.dataset]]` definitions could not be resolved into files.
    #[error(transparent)]
    Datasets(#[from] elastrec_orchestrate::OrchestrateError),
    /// A partition's first file cannot be read as the job's samples.
    #[error("dataset `{dataset}`, partition `{partition}`: its schema differs from the job's samples: {source}")]
    PartitionSchema {
        /// The dataset.
        dataset: String,
        /// The partition directory.
        partition: String,
        /// The reader's error (file, line or row, field).
        source: Box<elastrec_data::DataError>,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A joined source's events or impressions cannot be read (line 0: the whole file).
    #[error("{}: {reason}", if *line == 0 { file.display().to_string() } else { format!("{}:{line}", file.display()) })]
    Join {
        /// The event or impression file.
        file: PathBuf,
        /// Its line (1-based), 0 for the file as a whole.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The training files hold no sample: training would run no step and still report an
    /// evaluation of the untrained model as if it were a result.
    #[error("no training data in {}: {reason}", show_files(files))]
    NoTrainingData {
        /// The training files (`data.train`).
        files: Vec<PathBuf>,
        /// Why there is nothing to train on.
        reason: String,
    },
}

impl JobError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        JobError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Files named in an error: all of them up to a handful, then a count (a job may list
/// hundreds of day files).
fn show_files(files: &[PathBuf]) -> String {
    const SHOWN: usize = 5;
    let mut out = files
        .iter()
        .take(SHOWN)
        .map(|f| f.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if files.len() > SHOWN {
        out.push_str(&format!(" and {} more", files.len() - SHOWN));
    }
    out
}

/// Result with [`JobError`].
pub type Result<T, E = JobError> = std::result::Result<T, E>;
