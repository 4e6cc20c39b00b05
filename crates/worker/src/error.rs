//! The worker crate's error type: says which layer is at fault.

use std::path::PathBuf;

/// Errors of training, evaluation and model files.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The job file is wrong (the message names the field).
    #[error(transparent)]
    Config(#[from] elastrec_job::config::ConfigError),
    /// Preparing the job's data or writing a file of the run directory failed (the
    /// message names the file).
    #[error(transparent)]
    Job(#[from] elastrec_job::JobError),
    /// Reading or generating data failed (bad rows name file, line and field).
    #[error(transparent)]
    Data(#[from] elastrec_data::DataError),
    /// The dense model rejected a shape or configuration.
    #[error("model: {0}")]
    Model(#[from] elastrec_model::ModelError),
    /// The embedding store rejected a shape or configuration.
    #[error("embeddings: {0}")]
    Embedding(#[from] elastrec_embedding::EmbeddingError),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A saved model file is not valid.
    #[error("{path}: not a valid elastrec model file: {reason}")]
    ModelFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A batch does not fit the model it is fed to (features of another schema).
    #[error("batch layout: {0}")]
    Layout(String),
    /// Training diverged (a non-finite loss).
    #[error("training diverged at step {step}: loss is {loss}; lower the learning rates")]
    Diverged {
        /// Step at which the loss became non-finite.
        step: u64,
        /// The loss value.
        loss: f32,
    },
}

impl WorkerError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        WorkerError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Result with [`WorkerError`].
pub type Result<T, E = WorkerError> = std::result::Result<T, E>;
