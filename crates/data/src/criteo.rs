//! The Criteo preset: the display-advertising layout of a label, 13 integer columns
//! (`I1`..`I13`) and 26 categorical ones (`C1`..`C26`, 8 hex digits each).
//!
//! It is one schema among others, kept built in so that Criteo TSV and the quickstart read
//! without a `[[data.feature]]` list. Its readers ([`crate::tsv`], [`crate::parquet_io`]),
//! raw rows ([`crate::RawRow`], [`crate::RawColumns`]) and generator ([`crate::gen`]) use
//! these widths; every other part of elastrec takes its widths from the batch, the
//! job's schema or its preprocessing plan.

use crate::Batch;

/// Integer (dense) columns of a Criteo row.
pub const DENSE: usize = 13;
/// Categorical columns of a Criteo row, one embedding table each.
pub const CATEGORICAL: usize = 26;

/// Name of integer column `i` (0-based): `I1`..`I13`.
pub fn dense_name(i: usize) -> String {
    format!("I{}", i + 1)
}

/// Name of categorical column `j` (0-based): `C1`..`C26`.
pub fn categorical_name(j: usize) -> String {
    format!("C{}", j + 1)
}

/// An empty batch of the Criteo layout with room for `rows` samples, for rows pushed
/// with [`Batch::push_raw`].
pub fn batch(rows: usize) -> Batch {
    Batch::with_widths(rows, DENSE, CATEGORICAL)
}

/// Gives `batch` the Criteo layout (its widths, no bags); a reader of the preset
/// calls it before it fills an emptied batch, whatever layout the batch had before.
pub fn set_layout(batch: &mut Batch) {
    batch.dense_width = DENSE;
    batch.sparse_width = CATEGORICAL;
    batch.bags.clear();
}
