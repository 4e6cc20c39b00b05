//! Errors of the parameter server's request handling.
//!
//! Everything a request carries comes from the network, so every id and length is checked
//! before it indexes a table or sizes an allocation; each refusal names the values involved
//! so the worker's log says what was wrong. The gRPC handlers turn these into
//! [`tonic::Status`] (see the `From` impl): the shard's own methods stay free of transport
//! types and tests can match on the variant.

use elastrec_checkpoint::error::CheckpointError;
use elastrec_embedding::EmbeddingError;
use tonic::Status;

/// What a parameter-server request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum PsError {
    /// `tables` and `rows` are parallel arrays of one entry per row.
    #[error("{tables} table ids for {rows} row ids (one table id per row expected)")]
    ParallelArrays {
        /// Entries of `tables`.
        tables: usize,
        /// Entries of `rows`.
        rows: usize,
    },

    /// A table id the job does not have.
    #[error("table {table} does not exist (the job has {tables} tables)")]
    UnknownTable {
        /// The id asked for.
        table: u32,
        /// Tables of the job.
        tables: usize,
    },

    /// A row past the end of its table.
    #[error("row {row} of table {table} is out of range (the table has {rows} rows)")]
    RowOutOfRange {
        /// Table id.
        table: u32,
        /// The row asked for.
        row: u64,
        /// Rows of the table.
        rows: u64,
    },

    /// A row another server holds (the client routed with a stale server count).
    #[error("row {row} of table {table} is not held by PS {ps} of {count}")]
    RowNotHeld {
        /// Table id.
        table: u32,
        /// The row asked for.
        row: u64,
        /// This server's index.
        ps: u32,
        /// Servers of the job.
        count: u32,
    },

    /// A push whose gradient array does not hold `dim` values per row.
    #[error(
        "{values} gradient values for {rows} rows of dimension {dim} (expected {rows} x {dim})"
    )]
    GradientLength {
        /// Values sent.
        values: usize,
        /// Rows sent.
        rows: usize,
        /// The job's embedding dimension.
        dim: usize,
    },

    /// A dense gradient that is not exactly this server's dense slice.
    #[error("dense gradient has {values} values, PS {ps} holds a slice of {held}")]
    DenseGradientLength {
        /// Values sent.
        values: usize,
        /// This server's index.
        ps: u32,
        /// Length of its dense slice.
        held: usize,
    },

    /// NaN or infinity in a gradient: applying it would poison the parameters for good.
    #[error("non-finite gradient value at position {at} of the {what} gradient")]
    NonFiniteGradient {
        /// `sparse` or `dense`.
        what: &'static str,
        /// Index of the first non-finite value.
        at: usize,
    },

    /// A pull whose reply could not be sent: refused before anything is allocated for it.
    #[error(
        "pull of {rows} rows of dimension {dim}{} needs a reply of about {bytes} bytes, \
         over the {limit}-byte message limit (cluster.max_message_bytes); pull fewer rows per request",
        if *.dense > 0 { format!(" and the dense slice of {} values", .dense) } else { String::new() }
    )]
    ReplyTooLarge {
        /// Rows asked for.
        rows: usize,
        /// The job's embedding dimension.
        dim: usize,
        /// Dense values asked for (0 without the dense slice).
        dense: usize,
        /// Encoded size of the reply (an upper bound).
        bytes: u64,
        /// The configured limit.
        limit: usize,
    },

    /// A request routed by a layout this server does not serve (see `ps.proto`): the
    /// client waits for the current layout and routes again. `ABORTED`, with a message
    /// starting with [`elastrec_rpc::LAYOUT_REFUSAL`].
    #[error("{detail}")]
    LayoutRefused {
        /// Which layouts.
        detail: String,
        /// A newer committed layout the server knows (version and addresses), named in
        /// the refusal so the client can switch at once.
        known: Option<(u64, std::sync::Arc<Vec<String>>)>,
    },

    /// A field of a request that cannot be right (re-sharding messages, dense spans):
    /// names the message and the field.
    #[error("{message} field `{field}`: {detail}")]
    BadField {
        /// The message, e.g. `ImportShard`.
        message: &'static str,
        /// The field, e.g. `rows`.
        field: &'static str,
        /// What is wrong with it.
        detail: String,
    },

    /// A re-sharding step this server cannot take now (synchronous mode, another
    /// re-sharding in progress, a commit before every row arrived, ...).
    #[error("re-sharding: {0}")]
    Reshard(String),

    /// A server of the new layout did not take the rows sent to it.
    #[error("sending rows to PS {target} of the new layout ({addr}): {message}")]
    Peer {
        /// Its index in the new layout.
        target: u32,
        /// Its address.
        addr: String,
        /// Transient (the server is unreachable or timed out): the master may retry.
        transient: bool,
        /// What it answered.
        message: String,
    },

    /// A delta checkpoint needs the share of rows it saves.
    #[error("checkpoint ratio {0} is not in (0, 1]")]
    BadRatio(f64),

    /// Checkpoint storage (or the shared-memory image on restore) failed.
    #[error("checkpoint storage: {0}")]
    Storage(#[from] CheckpointError),

    /// The embedding store refused an operation the checks above let through (a bug).
    #[error("embedding store: {0}")]
    Embedding(#[from] EmbeddingError),

    /// This server's lease from the master ran out (see `lease.rs`): it may have been
    /// declared dead and replaced, so it changes and serves nothing until the master
    /// acknowledges it again. `UNAVAILABLE`, with a message starting with
    /// [`elastrec_rpc::FENCE_REFUSAL`]: the caller retries, or follows a replacement.
    #[error(
        "the master has not acknowledged this server for {since_ms} ms, past its lease; \
         it serves nothing until the master answers again (or a replacement takes over)"
    )]
    Fenced {
        /// Since the last acknowledged heartbeat was sent.
        since_ms: u64,
    },

    /// A server's request that an older generation of that server sent: the master
    /// replaced it since (`replica.rs`).
    #[error("PS {index}'s node {node} was replaced by node {current}; its request is refused")]
    StaleGeneration {
        /// The server index the request speaks for.
        index: u32,
        /// The node that sent it.
        node: u32,
        /// The oldest node this server still accepts for that index.
        current: u32,
    },

    /// A background (blocking) task of the request panicked or was cancelled.
    #[error("background task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl From<PsError> for Status {
    fn from(e: PsError) -> Self {
        let msg = e.to_string();
        match e {
            PsError::ReplyTooLarge { .. } => Status::resource_exhausted(msg),
            PsError::LayoutRefused {
                known: Some((v, addrs)),
                ..
            } => elastrec_rpc::layout_refusal_naming(msg, (v, &addrs)),
            PsError::LayoutRefused { .. } => elastrec_rpc::layout_refusal(msg),
            PsError::Fenced { .. } => elastrec_rpc::fence_refusal(msg),
            PsError::Reshard(_) | PsError::StaleGeneration { .. } => {
                Status::failed_precondition(msg)
            }
            PsError::Peer {
                transient: true, ..
            } => Status::unavailable(msg),
            PsError::Peer { .. } => Status::failed_precondition(msg),
            PsError::ParallelArrays { .. }
            | PsError::UnknownTable { .. }
            | PsError::RowOutOfRange { .. }
            | PsError::RowNotHeld { .. }
            | PsError::GradientLength { .. }
            | PsError::DenseGradientLength { .. }
            | PsError::NonFiniteGradient { .. }
            | PsError::BadField { .. }
            | PsError::BadRatio(_) => Status::invalid_argument(msg),
            PsError::Storage(_) | PsError::Embedding(_) | PsError::Task(_) => Status::internal(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_mistakes_and_server_failures_get_distinct_codes() {
        let too_big = PsError::ReplyTooLarge {
            rows: 10,
            dim: 4,
            dense: 3,
            bytes: 200,
            limit: 100,
        };
        let s = Status::from(too_big);
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        assert!(
            s.message().contains("10 rows") && s.message().contains("100-byte"),
            "{}",
            s.message()
        );
        let bad = PsError::GradientLength {
            values: 3,
            rows: 1,
            dim: 4,
        };
        assert_eq!(Status::from(bad).code(), tonic::Code::InvalidArgument);
        let bug = PsError::Embedding(EmbeddingError::ZeroDim);
        assert_eq!(Status::from(bug).code(), tonic::Code::Internal);
        let moved = Status::from(PsError::LayoutRefused {
            detail: "PS 1 serves layout 2".into(),
            known: None,
        });
        assert!(elastrec_rpc::is_layout_refusal(&moved), "{moved:?}");
        let named = Status::from(PsError::LayoutRefused {
            detail: "PS 1 serves layout 2".into(),
            known: Some((2, std::sync::Arc::new(vec!["h:1".into()]))),
        });
        assert_eq!(
            elastrec_rpc::refusal_layout(&named),
            Some((2, vec!["h:1".to_string()]))
        );
        let field = Status::from(PsError::BadField {
            message: "ImportShard",
            field: "rows",
            detail: "row 3 is not yours".into(),
        });
        assert_eq!(field.code(), tonic::Code::InvalidArgument);
        assert!(field.message().starts_with("ImportShard field `rows`: "));
        let fenced = Status::from(PsError::Fenced { since_ms: 4200 });
        assert!(elastrec_rpc::is_fence_refusal(&fenced), "{fenced:?}");
        assert!(elastrec_rpc::is_transient(&fenced));
        assert!(fenced.message().contains("4200 ms"), "{fenced:?}");
        let stale = Status::from(PsError::StaleGeneration {
            index: 1,
            node: 4,
            current: 9,
        });
        assert_eq!(stale.code(), tonic::Code::FailedPrecondition);
        assert!(!elastrec_rpc::is_fence_refusal(&stale));
    }
}
