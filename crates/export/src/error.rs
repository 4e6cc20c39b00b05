//! Why an export failed.

use std::path::PathBuf;

/// An export error.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The model has a part the format cannot express yet.
    #[error("{0}")]
    Unsupported(String),
    /// The model's parts disagree (a schema of another model).
    #[error("the model does not fit its description: {0}")]
    Shape(String),
    /// Reading the model's tables.
    #[error("reading the embedding tables: {0}")]
    Embedding(#[from] elastrec_embedding::EmbeddingError),
    /// Writing a file.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Writing a file in place (`elastrec_job::fsio`).
    #[error(transparent)]
    File(#[from] elastrec_job::JobError),
    /// The safetensors writer refused the tensors.
    #[error("writing {path}: {reason}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// An export result.
pub type Result<T, E = ExportError> = std::result::Result<T, E>;

/// Attaches the path to an I/O error.
pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> ExportError + '_ {
    move |source| ExportError::Io {
        path: path.to_path_buf(),
        source,
    }
}
