//! The job crate's error type (the job file's own errors are
//! [`ConfigError`](crate::config::ConfigError), which name the field at fault).

use std::path::PathBuf;

/// Errors of the run directory's files.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
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

/// Result with [`JobError`].
pub type Result<T, E = JobError> = std::result::Result<T, E>;
