//! Errors of the checkpoint crate.

/// What can go wrong with a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Any other failure, described.
    #[error("{0}")]
    Other(String),
}

/// Result with [`CheckpointError`].
pub type Result<T> = std::result::Result<T, CheckpointError>;
