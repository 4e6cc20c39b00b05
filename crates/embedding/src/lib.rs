//! Embedding store of elastrec: hashed embedding tables with their sparse optimizer state,
//! used by the single-process trainer and, one shard per process, by parameter servers.
//!
//! # Ids, rows and shards (stable formulas)
//!
//! Every formula below is frozen by tests: checkpoints and cross-process routing depend on
//! them being identical in every process, on every platform, forever.
//!
//! * **Row of an id.** A categorical feature value (`u64`) of table `t` with `rows` rows lives
//!   in row
//!   `row_of(t, id, rows) = xxh3_64_with_seed(id.to_le_bytes(), HASH_SALT ^ t) % rows`
//!   ([`row_of`], [`HASH_SALT`] = `"elastrec"` in ASCII). The data crate's
//!   `MISSING_CATEGORY` (`1 << 32`, an empty field) is hashed like any other value: all empty
//!   fields of a table share one learned row, which is what DLRM does with its "missing"
//!   bucket and keeps this crate independent of the data layer.
//! * **Shard of a row.** With `n` shards, `shard_of(t, row, n) = (row % n + t % n) % n`
//!   ([`shard_of`]) and the row sits at local index `row / n` ([`local_index`]) of that
//!   shard's dense arena: no per-row hash map, and the rows alone are enough to re-route a
//!   checkpoint onto a different number of shards ([`TableSnapshot::route`]).
//! * **Initial values.** Weights are uniform in `(-1/sqrt(rows), 1/sqrt(rows))` from a
//!   counter-based hash of `(seed, t, global row, component)` ([`init_row`]), so they do not
//!   depend on sharding or initialization order.
//!
//! # Storage
//! One [`TableShard`] per table holds a single `Vec<f32>` arena; row `l` occupies
//! `[l * stride, (l + 1) * stride)` with `stride = dim + state_len`: the weights followed by
//! the optimizer state (SGD: none; row-wise Adagrad: one accumulator; Adagrad: `dim`;
//! lazy Adam: `2·dim + 1`; FTRL: `2·dim`). Overhead beyond the raw
//! row bytes is a few hundred bytes per table ([`EmbeddingStore::memory_bytes`] vs
//! [`EmbeddingStore::raw_bytes`]); optional 4-byte-per-row access counters (for CPR-style MFU
//! checkpointing) are off by default.
//!
//! # Operations
//! [`EmbeddingStore::gather`] / [`EmbeddingStore::gather_rows`] copy a batch's rows out in
//! parallel; [`EmbeddingStore::apply_gradients`] / [`EmbeddingStore::apply_gradients_rows`]
//! coalesce duplicate rows per table (summing gradients in sample order), then run the sparse
//! optimizer ([`SparseOptimizerConfig`]) once per unique row, parallel across tables and
//! bit-identical for any thread count. Steps allocate nothing once [`UpdateScratch`] is warm.
//! [`TableShard::export`] / [`TableShard::import`] move rows with their state
//! ([`TableSnapshot`], with a little-endian byte encoding) for checkpoints and migration.
//!
//! # Dynamic tables
//! With [`EmbeddingConfig::dynamic`] set, every table is a collision-free key → row map
//! under the memory of the hashed table it replaces, with admission and eviction (see
//! [`DynamicConfig`]; the design is in the `dynamic` module). Its keys are its global rows
//! ([`DYNAMIC_KEY_SPACE`] of them), so routing, the wire and snapshots are unchanged.

mod config;
mod criteo;
mod dynamic;
mod error;
mod hash;
pub mod le;
mod optim;
mod snapshot;
mod store;
mod table;

pub use config::{EmbeddingConfig, SparseOptimizerConfig};
pub use criteo::{capped_rows, CRITEO_KAGGLE_CARDINALITIES};
pub use dynamic::{
    slots_within, DynamicConfig, DynamicStats, DynamicSummary, Eviction, DYNAMIC_KEY_SPACE,
    MIN_SLOTS,
};
pub use error::{EmbeddingError, Result};
pub use hash::{
    global_row, init_bound, init_row, local_index, row_of, shard_of, shard_residue, shard_rows,
    ShardSpec, HASH_SALT, INIT_SALT,
};
pub use snapshot::{DynamicState, RowUsage, TableSnapshot};
pub use store::{EmbeddingStore, UpdateScratch};
pub use table::{TableScratch, TableShard, MAX_SHARD_ROWS};
