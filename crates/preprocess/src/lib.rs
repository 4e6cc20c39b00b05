//! Input preprocessing (RAP, `../shared/papers/004`): per-feature operator chains from the
//! raw Criteo columns to the model's dense and sparse features.
//!
//! - [`spec`]: the `[[preprocess]]` entries of a job file and the default graph;
//! - [`ops`]: the operators of RAP's Table 1 (and what Criteo pipelines use), their
//!   arguments and typing rules; [`syntax`] reads their text form (both in
//!   `elastrec-data`, shared with the named features' chains);
//! - [`plan`]: a graph compiled into a fused, cache-blocked [`Plan`];
//! - [`kernels`]: the per-column passes the plan runs;
//! - [`reader`]: any reader of raw rows through a plan;
//! - [`materialize`]: preprocessed features written to Parquet (`elastrec preprocess`);
//! - [`types`]: value types and how a null is held.

pub mod error;
pub mod materialize;
pub mod plan;
pub mod reader;
pub mod spec;

/// The operators live in `elastrec-data` (a named feature's own chain uses them too).
pub use elastrec_data::ops::{self, kernels, syntax, types};

pub use error::{PreprocessError, Result};
pub use ops::Op;
pub use plan::{Feature, FeatureKind, Plan, Scratch, TableSize, BLOCK_ROWS};
pub use reader::PreprocessedReader;
pub use spec::{default_graph, FeatureSpec, Input};
pub use types::{ValueType, NULL_ID, NULL_INT};
