//! The one error type of the brain. Each variant says who is at fault.

/// Errors of the brain crate.
#[derive(Debug, thiserror::Error)]
pub enum BrainError {
    /// The caller sent a value the brain cannot use (NaN, negative, absurd size...).
    /// `field` names the offending input.
    #[error("invalid input `{field}`: {reason}")]
    InvalidInput { field: String, reason: String },
    /// A runtime profile cannot support a fit (too few samples, degenerate data).
    #[error("unusable profile: {0}")]
    Profile(String),
    /// No allocation inside the configured bounds satisfies the request.
    #[error("infeasible: {0}")]
    Infeasible(String),
    /// The brain's own configuration is wrong (operator's fault).
    #[error("configuration: {0}")]
    Config(String),
    /// A job the caller refers to is not in the config database.
    #[error("unknown job `{0}`")]
    UnknownJob(String),
    /// The config database failed.
    #[cfg(feature = "service")]
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// Applying the schema migrations failed.
    #[cfg(feature = "service")]
    #[error("database migration: {0}")]
    Migration(#[from] sqlx::migrate::MigrateError),
    /// Reading a file failed.
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The gRPC transport failed (bind, serve).
    #[cfg(feature = "service")]
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// An invariant of the brain broke: likely a bug.
    #[error("internal error (likely a bug): {0}")]
    Internal(String),
}

/// Result with [`BrainError`].
pub type Result<T, E = BrainError> = std::result::Result<T, E>;

impl BrainError {
    /// Shorthand for [`BrainError::InvalidInput`].
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidInput {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Rejects NaN, infinities and negative values.
pub(crate) fn check_non_negative(field: &str, v: f64) -> Result<()> {
    if !v.is_finite() {
        return Err(BrainError::invalid(
            field,
            format!("must be finite, got {v}"),
        ));
    }
    if v < 0.0 {
        return Err(BrainError::invalid(field, format!("must be >= 0, got {v}")));
    }
    Ok(())
}

/// [`check_non_negative`] whose field name is built only for a bad value: hot paths check
/// every element of long inputs.
pub(crate) fn check_non_negative_at(field: impl FnOnce() -> String, v: f64) -> Result<()> {
    if v.is_finite() && v >= 0.0 {
        return Ok(());
    }
    check_non_negative(&field(), v)
}

/// Rejects NaN, infinities, zero and negative values.
pub(crate) fn check_positive(field: &str, v: f64) -> Result<()> {
    if !v.is_finite() || v <= 0.0 {
        return Err(BrainError::invalid(
            field,
            format!("must be finite and > 0, got {v}"),
        ));
    }
    Ok(())
}
