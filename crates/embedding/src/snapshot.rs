//! Row snapshots of a table (or of one shard of it): the unit of checkpoints and PS migration.

use crate::error::{EmbeddingError, Result};
use crate::hash::shard_of;

/// How a dynamic table's row has been used, as its eviction policy sees it: updates of the
/// table since the row's last one (LRU, TTL) and the row's update count (LFU). Carried by
/// snapshots so that a restored table evicts the rows the saved one would have, instead of
/// treating every restored row as fresh.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowUsage {
    /// Updates of the table since this row's last update.
    pub idle: u32,
    /// Updates of this row (LFU's count, halved after each eviction pass).
    pub hits: u32,
}

impl RowUsage {
    /// Both counters in one integer (`idle` high, `hits` low), as the wire carries them.
    pub fn packed(self) -> u64 {
        (u64::from(self.idle) << 32) | u64::from(self.hits)
    }

    /// The inverse of [`RowUsage::packed`].
    pub fn unpacked(v: u64) -> Self {
        Self {
            idle: (v >> 32) as u32,
            hits: v as u32,
        }
    }
}

/// A dynamic table shard's own state beside its rows, carried by checkpoint snapshots so
/// that a restore continues where the saved shard was:
/// - `clock`: the table's update count, the clock rows' idle times are relative to. Rows
///   restored from the full checkpoint of a chain then age by the updates between it and
///   the delta restored after it, as they did on the saved shard.
/// - `filter`, `filter_adds`: the admission filter's counters (ids seen but not admitted
///   yet) and the adds since its last halving; empty when every id is admitted at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DynamicState {
    /// Updates of the table so far (wrapping).
    pub clock: u32,
    /// Adds since the filter's counters were last halved.
    pub filter_adds: u64,
    /// The filter's counters (one byte each).
    pub filter: Vec<u8>,
}

/// Rows of one table with their global row indices, each row stored as `[dim weights |
/// state_len optimizer floats]` (the arena layout), in the order of `rows`.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSnapshot {
    /// Table index.
    pub table: usize,
    /// Rows of the whole table (all shards; a dynamic table's budget); guards against
    /// importing into a resized table.
    pub table_rows: u64,
    /// Embedding dimension.
    pub dim: usize,
    /// Optimizer state floats per row.
    pub state_len: usize,
    /// Global row index of each exported row.
    pub rows: Vec<u64>,
    /// `rows.len() * (dim + state_len)` floats.
    pub values: Vec<f32>,
    /// A dynamic table's [`RowUsage`], one per row; empty for a hashed table (and in
    /// snapshots written before it existed).
    pub usage: Vec<RowUsage>,
    /// A dynamic table shard's clock and admission filter, in checkpoint snapshots only
    /// (model files, deltas and moves of rows between servers do without).
    pub dynamic: Option<DynamicState>,
}

/// Magic bytes at the start of an encoded snapshot.
const MAGIC: &[u8; 4] = b"ERTS";
/// Encoding version of a snapshot without usage (so older binaries read it).
const VERSION: u32 = 1;
/// Encoding version of a snapshot with usage: `count × (idle u32, hits u32)` follow the
/// values.
const VERSION_USAGE: u32 = 2;
/// Encoding version of a snapshot with usage and a [`DynamicState`]: after the usage,
/// `clock u32 | filter_adds u64 | filter_len u64 | filter_len × u8`.
const VERSION_DYNAMIC: u32 = 3;
/// Bytes of a [`DynamicState`]'s fixed fields in the encoding.
const DYNAMIC_FIXED: usize = 4 + 8 + 8;
/// Header bytes: magic, version, table, dim, state_len (u32 each) + table_rows, count (u64).
const HEADER: usize = 4 + 4 * 4 + 8 * 2;

impl TableSnapshot {
    /// This snapshot with a table shard's [`DynamicState`] (what a checkpoint saves).
    pub fn with_dynamic(mut self, dynamic: Option<DynamicState>) -> Self {
        self.dynamic = dynamic;
        self
    }

    /// Floats per row.
    pub fn stride(&self) -> usize {
        self.dim + self.state_len
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True when the snapshot holds no row.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Weights and state of the `i`-th row of the snapshot.
    pub fn row_values(&self, i: usize) -> &[f32] {
        &self.values[i * self.stride()..(i + 1) * self.stride()]
    }

    /// Splits the rows by the shard that owns them under `num_shards` shards (one snapshot
    /// per shard, index = shard). Routing depends on `(table, row)` alone, so this is how
    /// checkpoints written by N parameter servers are restored onto M.
    pub fn route(&self, num_shards: u32) -> Vec<TableSnapshot> {
        let n = num_shards.max(1);
        // Each part keeps the saved clock; the filter's counters cannot be split by key (a
        // count-min filter does not store its keys), so a new layout starts without them.
        let clock = self.dynamic.as_ref().map(|d| DynamicState {
            clock: d.clock,
            ..DynamicState::default()
        });
        let mut out: Vec<TableSnapshot> = (0..n)
            .map(|_| TableSnapshot {
                dynamic: clock.clone(),
                ..self.empty_like()
            })
            .collect();
        for (i, &row) in self.rows.iter().enumerate() {
            let part = &mut out[shard_of(self.table, row, n) as usize];
            part.rows.push(row);
            part.values.extend_from_slice(self.row_values(i));
            if let Some(u) = self.usage.get(i) {
                part.usage.push(*u);
            }
        }
        out
    }

    /// Concatenates snapshots of the same table (e.g. the exports of every old shard). The
    /// parts' [`DynamicState`]s are left out: each belongs to the shard that saved it.
    pub fn concat(parts: &[TableSnapshot]) -> Result<TableSnapshot> {
        let first = parts.first().ok_or(EmbeddingError::CorruptSnapshot {
            reason: "no snapshot to concatenate",
        })?;
        let mut out = first.empty_like();
        // Usage only when every part has it (rows must not take another row's).
        let usage = parts.iter().all(|p| p.usage.len() == p.rows.len());
        for p in parts {
            if (p.table, p.table_rows, p.dim, p.state_len)
                != (first.table, first.table_rows, first.dim, first.state_len)
            {
                return Err(EmbeddingError::SnapshotMismatch {
                    reason: format!(
                        "cannot concatenate snapshots of table {} and table {}",
                        first.table, p.table
                    ),
                });
            }
            out.rows.extend_from_slice(&p.rows);
            out.values.extend_from_slice(&p.values);
            if usage {
                out.usage.extend_from_slice(&p.usage);
            }
        }
        Ok(out)
    }

    fn empty_like(&self) -> TableSnapshot {
        TableSnapshot {
            table: self.table,
            table_rows: self.table_rows,
            dim: self.dim,
            state_len: self.state_len,
            rows: Vec::new(),
            values: Vec::new(),
            usage: Vec::new(),
            dynamic: None,
        }
    }

    /// True when every row carries its usage (a dynamic table's snapshot).
    fn has_usage(&self) -> bool {
        !self.usage.is_empty() && self.usage.len() == self.rows.len()
    }

    /// Size of [`TableSnapshot::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        let usage = if self.has_usage() || self.dynamic.is_some() {
            self.rows.len() * 8
        } else {
            0
        };
        let dynamic = self
            .dynamic
            .as_ref()
            .map_or(0, |d| DYNAMIC_FIXED + d.filter.len());
        HEADER + self.rows.len() * 8 + self.values.len() * 4 + usage + dynamic
    }

    /// The encoding version this snapshot is written in (the lowest that holds it, so
    /// older binaries read what they can).
    fn version(&self) -> u32 {
        if self.dynamic.is_some() {
            VERSION_DYNAMIC
        } else if self.has_usage() {
            VERSION_USAGE
        } else {
            VERSION
        }
    }

    /// Appends the little-endian encoding to `out`:
    /// `"ERTS" | version u32 | table u32 | dim u32 | state_len u32 | table_rows u64 |
    /// count u64 | count x row u64 | count x stride x value f32`, then, in version 2 (rows
    /// with their usage), `count x (idle u32, hits u32)`, and in version 3 the usage and a
    /// [`DynamicState`]: `clock u32 | filter_adds u64 | filter_len u64 | filter u8s`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(self.encoded_len());
        out.extend_from_slice(MAGIC);
        let version = self.version();
        for v in [
            version,
            self.table as u32,
            self.dim as u32,
            self.state_len as u32,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.table_rows.to_le_bytes());
        out.extend_from_slice(&(self.rows.len() as u64).to_le_bytes());
        crate::le::put_u64s(out, &self.rows);
        crate::le::put_f32s(out, &self.values);
        if version >= VERSION_USAGE {
            // A version-3 snapshot of rows saved without usage writes zeros (used now).
            for i in 0..self.rows.len() {
                let u = self.usage.get(i).copied().unwrap_or_default();
                out.extend_from_slice(&u.idle.to_le_bytes());
                out.extend_from_slice(&u.hits.to_le_bytes());
            }
        }
        if let Some(d) = &self.dynamic {
            out.extend_from_slice(&d.clock.to_le_bytes());
            out.extend_from_slice(&d.filter_adds.to_le_bytes());
            out.extend_from_slice(&(d.filter.len() as u64).to_le_bytes());
            out.extend_from_slice(&d.filter);
        }
    }

    /// The encoding as a fresh buffer.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }

    /// Decodes [`TableSnapshot::encode`]'s output (exactly one snapshot, no trailing bytes).
    pub fn from_bytes(bytes: &[u8]) -> Result<TableSnapshot> {
        let corrupt = |reason| EmbeddingError::CorruptSnapshot { reason };
        if bytes.len() < HEADER {
            return Err(corrupt("shorter than the header"));
        }
        if &bytes[..4] != MAGIC {
            return Err(corrupt("bad magic"));
        }
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
        let version = u32_at(4);
        let usage_bytes = match version {
            VERSION => 0,
            VERSION_USAGE | VERSION_DYNAMIC => 8,
            _ => return Err(corrupt("unsupported version")),
        };
        let (table, dim, state_len) =
            (u32_at(8) as usize, u32_at(12) as usize, u32_at(16) as usize);
        let (table_rows, count) = (u64_at(20), u64_at(28));
        let row_bytes = (stride_bytes(dim, state_len))
            .and_then(|b| b.checked_add(8 + usage_bytes))
            .ok_or(corrupt("row layout overflows"))?;
        let body = usize::try_from(count)
            .ok()
            .and_then(|c| c.checked_mul(row_bytes))
            .ok_or(corrupt("row count overflows"))?;
        let rows_part_end = HEADER
            .checked_add(body)
            .ok_or(corrupt("row count overflows"))?;
        // Version 3's dynamic state follows the rows; its filter length is read, never
        // trusted: it must be exactly what remains.
        let dynamic = if version == VERSION_DYNAMIC {
            let fixed = bytes
                .get(rows_part_end..rows_part_end.saturating_add(DYNAMIC_FIXED))
                .filter(|f| f.len() == DYNAMIC_FIXED)
                .ok_or(corrupt("length does not match the row count"))?;
            let filter_len = u64::from_le_bytes(fixed[12..20].try_into().expect("8 bytes"));
            let filter = &bytes[rows_part_end + DYNAMIC_FIXED..];
            if filter.len() as u64 != filter_len {
                return Err(corrupt("admission filter length does not match"));
            }
            Some(DynamicState {
                clock: u32::from_le_bytes(fixed[..4].try_into().expect("4 bytes")),
                filter_adds: u64::from_le_bytes(fixed[4..12].try_into().expect("8 bytes")),
                filter: filter.to_vec(),
            })
        } else {
            if bytes.len() != rows_part_end {
                return Err(corrupt("length does not match the row count"));
            }
            None
        };
        let count = count as usize;
        let rows_end = HEADER + count * 8;
        let values_end = rows_part_end - count * usage_bytes;
        let rows = crate::le::get_u64s(&bytes[HEADER..rows_end]);
        let values = crate::le::get_f32s(&bytes[rows_end..values_end]);
        let usage = bytes[values_end..rows_part_end]
            .chunks_exact(8)
            .map(|c| RowUsage {
                idle: u32::from_le_bytes(c[..4].try_into().expect("4 bytes")),
                hits: u32::from_le_bytes(c[4..].try_into().expect("4 bytes")),
            })
            .collect();
        Ok(TableSnapshot {
            table,
            table_rows,
            dim,
            state_len,
            rows,
            values,
            usage,
            dynamic,
        })
    }
}

/// Bytes of one row's floats, unless a header from the wire overflows it.
fn stride_bytes(dim: usize, state_len: usize) -> Option<usize> {
    dim.checked_add(state_len)?.checked_mul(4)
}
