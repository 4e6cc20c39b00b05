//! The crate's error enum: every variant says who is at fault.

use thiserror::Error;

/// Errors of the embedding store.
///
/// `Config*` variants are the user's configuration; `Shape`, `RowOutOfRange`, `WrongShard` and
/// `TableOutOfRange` are a caller passing inconsistent inputs (a bug or a routing mismatch
/// between processes); `Snapshot*` variants are bad checkpoint / migration data.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum EmbeddingError {
    /// `dim` must be at least 1.
    #[error("invalid embedding config: dim must be > 0")]
    ZeroDim,
    /// The config lists no table.
    #[error("invalid embedding config: no tables (rows is empty)")]
    NoTables,
    /// A table has zero rows.
    #[error("invalid embedding config: table {table} has 0 rows")]
    ZeroRows {
        /// Offending table.
        table: usize,
    },
    /// A shard would hold more rows than a `u32` local index can address.
    #[error("invalid embedding config: table {table} shard holds {rows} rows (max {max})")]
    TooManyRows {
        /// Offending table.
        table: usize,
        /// Rows the shard would hold.
        rows: u64,
        /// Largest supported number of rows per shard.
        max: u64,
    },
    /// An optimizer hyper-parameter is out of range.
    #[error("invalid sparse optimizer config: {reason}")]
    Optimizer {
        /// What is wrong.
        reason: String,
    },
    /// Shard index not below shard count, or zero shards.
    #[error("invalid shard {index} of {count}")]
    InvalidShard {
        /// Shard index.
        index: u32,
        /// Shard count.
        count: u32,
    },
    /// A buffer has the wrong length.
    #[error("shape mismatch for {what}: expected {expected} elements, got {actual}")]
    Shape {
        /// Which buffer.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Actual length.
        actual: usize,
    },
    /// A row index is not below the table's row count.
    #[error("row {row} out of range for table {table} with {rows} rows")]
    RowOutOfRange {
        /// Table.
        table: usize,
        /// Offending global row.
        row: u64,
        /// Rows of the table.
        rows: u64,
    },
    /// A row was sent to a shard that does not own it.
    #[error("row {row} of table {table} belongs to shard {owner}, not shard {shard}")]
    WrongShard {
        /// Table.
        table: usize,
        /// Global row.
        row: u64,
        /// Shard that owns the row.
        owner: u32,
        /// Shard that received it.
        shard: u32,
    },
    /// A dynamic table holds no row for this key (never admitted, or evicted).
    #[error("row {row} of dynamic table {table} is not stored (not admitted yet, or evicted)")]
    NotStored {
        /// Table.
        table: usize,
        /// The key.
        row: u64,
    },
    /// A dynamic-embedding option is out of range.
    #[error("invalid dynamic embedding config: {reason}")]
    Dynamic {
        /// What is wrong.
        reason: String,
    },
    /// A table index is not below the number of tables.
    #[error("table {table} out of range ({tables} tables)")]
    TableOutOfRange {
        /// Offending table.
        table: usize,
        /// Number of tables.
        tables: usize,
    },
    /// A snapshot does not match the table it is imported into.
    #[error("snapshot mismatch: {reason}")]
    SnapshotMismatch {
        /// What differs.
        reason: String,
    },
    /// Snapshot bytes could not be decoded.
    #[error("corrupt snapshot: {reason}")]
    CorruptSnapshot {
        /// What is wrong.
        reason: &'static str,
    },
}

/// Result alias of this crate.
pub type Result<T, E = EmbeddingError> = std::result::Result<T, E>;
