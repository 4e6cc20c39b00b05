//! The worker crate's error type: says which layer is at fault.

use std::path::PathBuf;

/// Errors of training, evaluation and model files.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The job file is wrong (the message names the field).
    #[error(transparent)]
    Config(#[from] elastrec_job::config::ConfigError),
    /// Writing a file of the run directory failed (the message names the file).
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
    /// The training files hold no sample: training would run no step and still report an
    /// evaluation of the untrained model as if it were a result.
    #[error("no training data in {}: {reason}", show_files(files))]
    NoTrainingData {
        /// The training files (`data.train`).
        files: Vec<PathBuf>,
        /// Why there is nothing to train on.
        reason: String,
    },
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

/// Result with [`WorkerError`].
pub type Result<T, E = WorkerError> = std::result::Result<T, E>;
