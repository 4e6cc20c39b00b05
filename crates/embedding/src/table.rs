//! One shard of one embedding table: a dense arena of `[d weights | optimizer state]` rows.

use rayon::prelude::*;

use crate::config::SparseOptimizerConfig;
use crate::error::{EmbeddingError, Result};
use crate::hash::{
    global_row, init_bound, init_row, shard_of, shard_residue, shard_rows, ShardSpec,
};
use crate::optim::{dispatch_update, RowUpdate};
use crate::snapshot::TableSnapshot;

/// Rows initialized per rayon task.
const INIT_CHUNK_ROWS: usize = 4096;

/// Largest number of rows one shard of one table may hold (local indices are packed in 32 bits
/// inside the update sort keys).
pub const MAX_SHARD_ROWS: u64 = u32::MAX as u64;

/// Reusable buffers for one table's sparse update; keep one per table (see
/// [`crate::UpdateScratch`]) and pass it to every step so steps allocate nothing once warm.
#[derive(Debug, Default, Clone)]
pub struct TableScratch {
    /// `(local_row << 32) | sample` for every sample of the batch, sorted.
    keys: Vec<u64>,
    /// Summed gradient of the current duplicated row.
    gsum: Vec<f32>,
}

impl TableScratch {
    /// Heap bytes held by this scratch.
    pub fn memory_bytes(&self) -> usize {
        self.keys.capacity() * 8 + self.gsum.capacity() * 4
    }
}

/// Shard `shard` of table `table`: its rows, stored densely by local index
/// ([`crate::local_index`]), each as `dim` weights followed by `state_len` optimizer floats.
#[derive(Debug, Clone)]
pub struct TableShard {
    table: usize,
    rows: u64,
    shard: ShardSpec,
    residue: u64,
    local_rows: usize,
    dim: usize,
    stride: usize,
    optimizer: SparseOptimizerConfig,
    /// Multiplier of the optimizer's learning rate (a schedule's); not part of the
    /// table's state.
    lr_scale: f32,
    data: Vec<f32>,
    /// Optional per-row access counters (MFU statistics), indexed by local row.
    counters: Option<Vec<u32>>,
}

impl TableShard {
    /// Builds shard `shard` of table `table` (a `rows`-row table) and initializes every row
    /// deterministically from `seed` (see [`crate::init_row`]; the optimizer state starts at
    /// [`SparseOptimizerConfig::init_state`]).
    pub fn new(
        table: usize,
        rows: u64,
        dim: usize,
        optimizer: SparseOptimizerConfig,
        seed: u64,
        shard: ShardSpec,
    ) -> Result<Self> {
        let mut me = Self::new_zeroed(table, rows, dim, optimizer, shard)?;
        me.reinitialize(seed);
        Ok(me)
    }

    /// Like [`TableShard::new`] but every float is zero instead of its seeded value: for a
    /// shard whose rows are all about to be imported (a parameter server receiving its rows
    /// when the servers are re-sharded). The zeroed arena comes from the allocator's
    /// zeroed pages, so it costs no time until rows are written.
    pub fn new_zeroed(
        table: usize,
        rows: u64,
        dim: usize,
        optimizer: SparseOptimizerConfig,
        shard: ShardSpec,
    ) -> Result<Self> {
        if dim == 0 {
            return Err(EmbeddingError::ZeroDim);
        }
        if rows == 0 {
            return Err(EmbeddingError::ZeroRows { table });
        }
        optimizer.validate()?;
        let shard = ShardSpec::new(shard.index, shard.count)?;
        let local = shard_rows(table, rows, shard.index, shard.count);
        if local > MAX_SHARD_ROWS {
            return Err(EmbeddingError::TooManyRows {
                table,
                rows: local,
                max: MAX_SHARD_ROWS,
            });
        }
        let local_rows = local as usize;
        let stride = dim + optimizer.state_len(dim);
        Ok(Self {
            table,
            rows,
            shard,
            residue: shard_residue(table, shard.index, shard.count),
            local_rows,
            dim,
            stride,
            optimizer,
            lr_scale: 1.0,
            data: vec![0.0; local_rows * stride],
            counters: None,
        })
    }

    /// Resets every row to its seeded initial value and state.
    pub fn reinitialize(&mut self, seed: u64) {
        let (table, dim, stride) = (self.table, self.dim, self.stride);
        let (shard, bound, optimizer) = (self.shard, init_bound(self.rows), self.optimizer);
        self.data
            .par_chunks_mut(stride * INIT_CHUNK_ROWS)
            .enumerate()
            .for_each(|(chunk, data)| {
                for (i, row) in data.chunks_exact_mut(stride).enumerate() {
                    let local = (chunk * INIT_CHUNK_ROWS + i) as u64;
                    let global = global_row(table, local, shard.index, shard.count);
                    let (w, state) = row.split_at_mut(dim);
                    init_row(seed, table, global, bound, w);
                    optimizer.init_state(state);
                }
            });
    }

    /// Table index.
    pub fn table(&self) -> usize {
        self.table
    }
    /// Rows of the whole table (all shards).
    pub fn rows(&self) -> u64 {
        self.rows
    }
    /// Rows held by this shard.
    pub fn local_rows(&self) -> usize {
        self.local_rows
    }
    /// Which shard this is.
    pub fn shard(&self) -> ShardSpec {
        self.shard
    }
    /// Embedding dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }
    /// Floats per stored row: `dim + state_len`.
    pub fn stride(&self) -> usize {
        self.stride
    }
    /// Optimizer state floats per row.
    pub fn state_len(&self) -> usize {
        self.stride - self.dim
    }
    /// The sparse optimizer of this table.
    pub fn optimizer(&self) -> SparseOptimizerConfig {
        self.optimizer
    }
    /// The whole arena, `local_rows * stride` floats.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// True when this shard owns global `row` (which must be `< rows()` to be valid at all).
    #[inline]
    pub fn owns(&self, row: u64) -> bool {
        row < self.rows && shard_of(self.table, row, self.shard.count) == self.shard.index
    }

    /// Local index of global `row`, or why this shard cannot serve it.
    #[inline]
    pub fn local_of(&self, row: u64) -> Result<usize> {
        if row >= self.rows {
            return Err(EmbeddingError::RowOutOfRange {
                table: self.table,
                row,
                rows: self.rows,
            });
        }
        if self.shard.count == 1 {
            return Ok(row as usize);
        }
        let n = u64::from(self.shard.count);
        if row % n != self.residue {
            return Err(EmbeddingError::WrongShard {
                table: self.table,
                row,
                owner: shard_of(self.table, row, self.shard.count),
                shard: self.shard.index,
            });
        }
        Ok((row / n) as usize)
    }

    /// Global row stored at local index `local`.
    #[inline]
    pub fn global_of(&self, local: usize) -> u64 {
        local as u64 * u64::from(self.shard.count) + self.residue
    }

    /// Weights and state of global `row`: `stride()` floats.
    pub fn row(&self, row: u64) -> Result<&[f32]> {
        let l = self.local_of(row)?;
        Ok(&self.data[l * self.stride..(l + 1) * self.stride])
    }

    /// Weights of global `row`: `dim()` floats.
    pub fn weights(&self, row: u64) -> Result<&[f32]> {
        Ok(&self.row(row)?[..self.dim])
    }

    #[inline]
    pub(crate) fn weights_local(&self, local: usize) -> &[f32] {
        &self.data[local * self.stride..local * self.stride + self.dim]
    }

    /// Copies the weights of each global row in `rows` into `out` (`rows.len() * dim` floats,
    /// row-major). Sequential: the parameter server parallelizes across requests/tables.
    pub fn gather_rows(&self, rows: &[u64], out: &mut [f32]) -> Result<()> {
        check_len("out", rows.len() * self.dim, out.len())?;
        for (&row, o) in rows.iter().zip(out.chunks_exact_mut(self.dim)) {
            o.copy_from_slice(self.weights_local(self.local_of(row)?));
        }
        Ok(())
    }

    /// Sums the gradients of duplicate rows in `rows` and applies the optimizer once per unique
    /// row. `grads` holds `rows.len() * dim` floats, row-major. On error nothing is modified.
    pub fn apply_rows(
        &mut self,
        rows: &[u64],
        grads: &[f32],
        scratch: &mut TableScratch,
    ) -> Result<()> {
        let d = self.dim;
        check_len("grads", rows.len() * d, grads.len())?;
        self.prepare(rows.len(), |s| rows[s], scratch)?;
        self.apply_prepared(|s| &grads[s * d..(s + 1) * d], scratch);
        Ok(())
    }

    /// Validates every row and fills `scratch.keys` with sorted `(local << 32) | sample` keys.
    pub(crate) fn prepare(
        &self,
        n: usize,
        row_at: impl Fn(usize) -> u64,
        scratch: &mut TableScratch,
    ) -> Result<()> {
        if n > u32::MAX as usize {
            return Err(EmbeddingError::Shape {
                what: "batch (samples)",
                expected: u32::MAX as usize,
                actual: n,
            });
        }
        scratch.keys.clear();
        scratch.keys.reserve(n);
        for s in 0..n {
            let local = self.local_of(row_at(s))? as u64;
            scratch.keys.push((local << 32) | s as u64);
        }
        scratch.keys.sort_unstable();
        Ok(())
    }

    /// Applies the optimizer to every unique row of prepared `scratch.keys`, summing the
    /// gradients of duplicates in ascending sample order (so results never depend on threads).
    pub(crate) fn apply_prepared<'g>(
        &mut self,
        grad_at: impl Fn(usize) -> &'g [f32],
        scratch: &mut TableScratch,
    ) {
        // A scale of 1 leaves the rate's bits as they are.
        let opt = self.optimizer.with_lr_scale(self.lr_scale);
        dispatch_update!(opt, |u| self.apply_prepared_with(u, grad_at, scratch))
    }

    fn apply_prepared_with<'g, U: RowUpdate>(
        &mut self,
        u: U,
        grad_at: impl Fn(usize) -> &'g [f32],
        scratch: &mut TableScratch,
    ) {
        let (d, stride) = (self.dim, self.stride);
        let TableScratch { keys, gsum } = scratch;
        gsum.resize(d, 0.0);
        let mut i = 0;
        while i < keys.len() {
            let local = (keys[i] >> 32) as usize;
            let first = grad_at(keys[i] as u32 as usize);
            let mut j = i + 1;
            while j < keys.len() && (keys[j] >> 32) as usize == local {
                j += 1;
            }
            let row = &mut self.data[local * stride..(local + 1) * stride];
            if j == i + 1 {
                u.apply(row, first);
            } else {
                gsum.copy_from_slice(first);
                for &k in &keys[i + 1..j] {
                    for (a, g) in gsum.iter_mut().zip(grad_at(k as u32 as usize)) {
                        *a += g;
                    }
                }
                u.apply(row, gsum);
            }
            if let Some(c) = &mut self.counters {
                c[local] = c[local].saturating_add((j - i) as u32);
            }
            i = j;
        }
    }

    /// Multiplies the optimizer's learning rate by `scale` from the next update on.
    pub fn set_lr_scale(&mut self, scale: f32) {
        self.lr_scale = scale;
    }

    /// Turns on per-row access counters (4 bytes per row, for MFU checkpointing): every
    /// sample that updates a row adds one to its counter (saturating). Off by default.
    pub fn enable_access_counters(&mut self) {
        if self.counters.is_none() {
            self.counters = Some(vec![0; self.local_rows]);
        }
    }

    /// Turns the access counters off and frees them.
    pub fn disable_access_counters(&mut self) {
        self.counters = None;
    }

    /// Access counters by local row, when enabled.
    pub fn access_counts(&self) -> Option<&[u32]> {
        self.counters.as_deref()
    }

    /// Mutable access counters by local row (e.g. to clear the counters of saved rows).
    pub fn access_counts_mut(&mut self) -> Option<&mut [u32]> {
        self.counters.as_deref_mut()
    }

    /// Exports every row of this shard (weights + state) with its global row index.
    pub fn export(&self) -> TableSnapshot {
        TableSnapshot {
            table: self.table,
            table_rows: self.rows,
            dim: self.dim,
            state_len: self.state_len(),
            rows: (0..self.local_rows).map(|l| self.global_of(l)).collect(),
            values: self.data.clone(),
        }
    }

    /// Exports the given global rows (e.g. the most-frequently-used ones) of this shard.
    pub fn export_rows(&self, rows: &[u64]) -> Result<TableSnapshot> {
        let mut values = Vec::with_capacity(rows.len() * self.stride);
        for &row in rows {
            values.extend_from_slice(self.row(row)?);
        }
        Ok(TableSnapshot {
            table: self.table,
            table_rows: self.rows,
            dim: self.dim,
            state_len: self.state_len(),
            rows: rows.to_vec(),
            values,
        })
    }

    /// Overwrites the rows in `snap` (weights + state). Every row must belong to this shard
    /// (use [`TableSnapshot::route`] to split a snapshot for another shard count). Validates
    /// everything first: on error nothing is modified. Returns the number of rows written.
    pub fn import(&mut self, snap: &TableSnapshot) -> Result<usize> {
        let mismatch = |reason: String| Err(EmbeddingError::SnapshotMismatch { reason });
        if snap.table != self.table || snap.table_rows != self.rows {
            return mismatch(format!(
                "snapshot of table {} ({} rows) imported into table {} ({} rows)",
                snap.table, snap.table_rows, self.table, self.rows
            ));
        }
        if snap.dim != self.dim || snap.state_len != self.state_len() {
            return mismatch(format!(
                "snapshot row layout dim {} + state {} differs from table layout dim {} + state {}",
                snap.dim,
                snap.state_len,
                self.dim,
                self.state_len()
            ));
        }
        check_len(
            "snapshot values",
            snap.rows.len() * self.stride,
            snap.values.len(),
        )?;
        for &row in &snap.rows {
            self.local_of(row)?;
        }
        let stride = self.stride;
        for (&row, v) in snap.rows.iter().zip(snap.values.chunks_exact(stride)) {
            let l = self.local_of(row)?;
            self.data[l * stride..(l + 1) * stride].copy_from_slice(v);
        }
        Ok(snap.rows.len())
    }

    /// Bytes this shard holds: the arena, the counters when enabled, and the struct itself.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.data.capacity() * 4
            + self.counters.as_ref().map_or(0, |c| c.capacity() * 4)
    }

    /// Bytes of the rows and their optimizer state alone: `local_rows * stride * 4`.
    pub fn raw_bytes(&self) -> usize {
        self.local_rows * self.stride * 4
    }
}

pub(crate) fn check_len(what: &'static str, expected: usize, actual: usize) -> Result<()> {
    if expected != actual {
        return Err(EmbeddingError::Shape {
            what,
            expected,
            actual,
        });
    }
    Ok(())
}
