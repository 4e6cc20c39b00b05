//! The crate's error type.

/// What can be wrong with a `[[preprocess]]` graph.
#[derive(Debug, thiserror::Error)]
pub enum PreprocessError {
    /// An entry is wrong: its number, its name, the op (when one is at fault) and why.
    #[error("[[preprocess]] entry {entry} ({name}){}: {reason}", .op.as_ref().map(|o| format!(", {o}")).unwrap_or_default())]
    Entry {
        /// 1-based position of the entry in the job file.
        entry: usize,
        /// The entry's name (or its input columns).
        name: String,
        /// `op N \`text\`` when an op is at fault.
        op: Option<String>,
        /// What is wrong and what to do.
        reason: String,
    },
    /// A `[[preprocess]]` section with no entry.
    #[error("[[preprocess]] is empty: list the features, or remove the section for the default Criteo graph")]
    Empty,
    /// No entry produces ids; the model needs at least one embedding table.
    #[error("[[preprocess]] produces no sparse feature: the model needs at least one chain that ends with ids (a C column, bucketize, sigrid_hash, ...)")]
    NoSparse,
}

/// Result with [`PreprocessError`].
pub type Result<T, E = PreprocessError> = std::result::Result<T, E>;
