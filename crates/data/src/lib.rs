//! Data for elastrec: the Criteo-layout batch, readers (Criteo TSV plain/gzip, Parquet),
//! the synthetic Criteo-shaped generator, and (later) dataset/stream/source definitions,
//! preprocessing plans and data-task generation.

pub mod batch;

pub use batch::{Batch, MISSING_CATEGORY, NUM_DENSE, NUM_SPARSE};
