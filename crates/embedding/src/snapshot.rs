//! Row snapshots of a table (or of one shard of it): the unit of checkpoints and PS migration.

use crate::error::{EmbeddingError, Result};
use crate::hash::shard_of;

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
}

/// Magic bytes at the start of an encoded snapshot.
const MAGIC: &[u8; 4] = b"ERTS";
/// Encoding version.
const VERSION: u32 = 1;
/// Header bytes: magic, version, table, dim, state_len (u32 each) + table_rows, count (u64).
const HEADER: usize = 4 + 4 * 4 + 8 * 2;

impl TableSnapshot {
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
        let mut out: Vec<TableSnapshot> = (0..n)
            .map(|_| TableSnapshot {
                rows: Vec::new(),
                values: Vec::new(),
                ..self.empty_like()
            })
            .collect();
        for (i, &row) in self.rows.iter().enumerate() {
            let part = &mut out[shard_of(self.table, row, n) as usize];
            part.rows.push(row);
            part.values.extend_from_slice(self.row_values(i));
        }
        out
    }

    /// Concatenates snapshots of the same table (e.g. the exports of every old shard).
    pub fn concat(parts: &[TableSnapshot]) -> Result<TableSnapshot> {
        let first = parts.first().ok_or(EmbeddingError::CorruptSnapshot {
            reason: "no snapshot to concatenate",
        })?;
        let mut out = first.empty_like();
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
        }
    }

    /// Size of [`TableSnapshot::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        HEADER + self.rows.len() * 8 + self.values.len() * 4
    }

    /// Appends the little-endian encoding to `out`:
    /// `"ERTS" | version u32 | table u32 | dim u32 | state_len u32 | table_rows u64 |
    /// count u64 | count x row u64 | count x stride x value f32`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(self.encoded_len());
        out.extend_from_slice(MAGIC);
        for v in [
            VERSION,
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
        if u32_at(4) != VERSION {
            return Err(corrupt("unsupported version"));
        }
        let (table, dim, state_len) =
            (u32_at(8) as usize, u32_at(12) as usize, u32_at(16) as usize);
        let (table_rows, count) = (u64_at(20), u64_at(28));
        let stride = dim + state_len;
        let body = usize::try_from(count)
            .ok()
            .and_then(|c| c.checked_mul(8 + stride * 4))
            .ok_or(corrupt("row count overflows"))?;
        if bytes.len() - HEADER != body {
            return Err(corrupt("length does not match the row count"));
        }
        let count = count as usize;
        let rows_end = HEADER + count * 8;
        let rows = crate::le::get_u64s(&bytes[HEADER..rows_end]);
        let values = crate::le::get_f32s(&bytes[rows_end..]);
        Ok(TableSnapshot {
            table,
            table_rows,
            dim,
            state_len,
            rows,
            values,
        })
    }
}
