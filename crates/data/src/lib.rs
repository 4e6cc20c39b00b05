//! Data for elastrec. This crate owns:
//!
//! - the in-memory [`Batch`] every reader fills and every trainer consumes, and the raw
//!   (untransformed) row types [`RawRow`] / [`RawBatch`];
//! - the reader seam [`BatchReader`] with its [`BadRowPolicy`] and [`ReadStats`], format
//!   detection by magic bytes and row-range opening for data shards
//!   ([`open_reader_range`], [`count_rows`]);
//! - the Criteo preset ([`criteo`]): its widths and column names, the one place they live;
//! - the Criteo TSV reader (plain and gzip) with a sidecar line index for O(1) range seeks
//!   ([`tsv`], [`index`]);
//! - Parquet writer and reader with the same batch semantics ([`parquet_io`]);
//! - the synthetic Criteo-shaped generator with a hidden teacher model ([`gen`]);
//! - one error type, [`DataError`], whose bad-data variants read `file:line: field N: reason`.
//!
//! - named features ([`schema`]): a [`Schema`] of dense, categorical, bag and sequence
//!   features over any Parquet file or CSV/TSV file with a header, read by
//!   [`NamedParquetReader`] and [`NamedCsvReader`] into jagged batches, and inferred from
//!   a file by [`schema::infer`];
//! - [`RawColumns`], rows in column form for a preprocessing plan (`elastrec-preprocess`);
//! - the preprocessing operators, their text form and kernels ([`ops`]), shared by the
//!   `[[preprocess]]` graphs and the named features' own chains.

pub mod batch;
pub mod chain;
pub mod columns;
pub mod criteo;
pub mod error;
pub mod gen;
pub(crate) mod id_keys;
pub mod index;
pub mod json_rows;
pub mod named;
pub mod named_csv;
pub mod named_json;
pub mod ops;
pub mod parquet_io;
pub mod raw;
pub mod reader;
pub(crate) mod row_groups;
pub mod schema;
pub mod shuffled;
pub mod text;
pub mod tsv;

pub use batch::{check_tasks, Batch, Jagged, MISSING_CATEGORY};
pub use columns::{RawColumns, NULL_ID, NULL_INT};
pub use error::{DataError, FieldError, Result};
pub use gen::{generate, generate_with_progress, GenFile, GenReport, GenSpec, OutputFormat};
pub use named::NamedParquetReader;
pub use named_csv::NamedCsvReader;
pub use parquet_io::{ParquetOptions, ParquetReader, ParquetWriter};
pub use raw::{RawBatch, RawRow};
pub use reader::{
    count_rows, count_source_rows, detect_format, open_reader, open_reader_range, open_source,
    read_all, BadRowPolicy, BatchReader, FileFormat, ReadStats, RowSink,
};
pub use schema::{CsvFormat, FeatureKind, FeatureSource, FeatureSpec, Pooling, Schema, TableSpec};
pub use shuffled::{RowShuffle, ShuffledReader};
pub use tsv::TsvReader;
