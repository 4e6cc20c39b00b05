//! Integration tests of `elastrec-data`, one module per area.

mod bad_rows;
mod corrupt_parquet;
mod feature_ops;
mod gen;
mod json_rows;
mod named;
mod named_csv;
mod parquet_input;
mod ranges;
mod roundtrip;
mod sample_weights;
mod util;
