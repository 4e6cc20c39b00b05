//! The parameter-server process (`elastrec ps`, started by the job master).
//!
//! PS `i` of `n` holds shard `i` of every embedding table (rows routed by the embedding
//! crate's stable `shard_of`) and the slice `dense_slice(num_params, n, i)` of the flat
//! dense parameters, each with its optimizer state. Asynchronous mode applies every push
//! at once; synchronous mode averages the pushes of one global step (one per active
//! worker) before applying them, waiting at most `cluster.sync_timeout_ms` for stragglers.

pub mod checkpoint;
pub mod error;
mod fail_points;
pub mod image;
pub mod layout;
pub mod lease;
pub mod metrics;
pub mod process;
mod replica;
pub mod reshard;
pub mod service;
pub mod shard;

pub use error::PsError;
pub use process::{run_ps, PsArgs};
pub use shard::PsShard;
