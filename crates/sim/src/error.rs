//! Errors of the simulator.

/// What can go wrong in a simulation.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A simulation setting is out of range (the message names it).
    #[error("simulation setting `{field}`: {reason}")]
    Config {
        /// The setting, as named in the configuration struct.
        field: &'static str,
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// Training, evaluation or data loading failed.
    #[error(transparent)]
    Worker(#[from] elastrec_worker::WorkerError),
    /// Generating the job's data failed.
    #[error(transparent)]
    Job(#[from] elastrec_job::JobError),
    /// The embedding store rejected a snapshot or shape (likely a bug).
    #[error("embeddings: {0}")]
    Embedding(#[from] elastrec_embedding::EmbeddingError),
    /// The dense model rejected a shape (likely a bug).
    #[error("model: {0}")]
    Model(#[from] elastrec_model::ModelError),
}

/// Result with [`SimError`].
pub type Result<T, E = SimError> = std::result::Result<T, E>;
