//! One shard of one embedding table: a dense arena of `[d weights | optimizer state]` rows.

use rayon::prelude::*;

use crate::config::SparseOptimizerConfig;
use crate::dynamic::{
    growth, slots_within, DynamicConfig, DynamicRows, DynamicStats, DYNAMIC_KEY_SPACE,
};
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
    /// A dynamic table's keys of the batch, by sample (validated, not yet admitted).
    pending: Vec<u64>,
    /// Their slots (`u32::MAX`: none), found before admissions.
    slots: Vec<u32>,
}

impl TableScratch {
    /// Heap bytes held by this scratch.
    pub fn memory_bytes(&self) -> usize {
        (self.keys.capacity() + self.pending.capacity()) * 8
            + (self.gsum.capacity() + self.slots.capacity()) * 4
    }
}

/// Shard `shard` of table `table`: its rows, stored densely by local index
/// ([`crate::local_index`]), each as `dim` weights followed by `state_len` optimizer floats.
///
/// A dynamic table ([`TableShard::new_dynamic`]) stores its rows the same way, by slot
/// instead of by local index, and maps keys to slots (see the `dynamic` module).
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
    /// The key → slot map of a dynamic table.
    dynamic: Option<Box<DynamicRows>>,
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
        let shard = check_shape(table, rows, dim, &optimizer, shard)?;
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
            dynamic: None,
        })
    }

    /// An empty dynamic shard of table `table` with the memory of the `budget_rows`-row
    /// hashed table it replaces (its share on this shard; see [`crate::slots_within`]).
    /// Every key reads as its initial value from `seed` until it is admitted.
    pub fn new_dynamic(
        table: usize,
        budget_rows: u64,
        dim: usize,
        optimizer: SparseOptimizerConfig,
        seed: u64,
        shard: ShardSpec,
        config: DynamicConfig,
    ) -> Result<Self> {
        let shard = check_shape(table, budget_rows, dim, &optimizer, shard)?;
        config.validate()?;
        let stride = dim + optimizer.state_len(dim);
        let share = shard_rows(table, budget_rows, shard.index, shard.count).max(1);
        let capacity = slots_within(share, stride, config.admit_count);
        if capacity > MAX_SHARD_ROWS {
            return Err(EmbeddingError::TooManyRows {
                table,
                rows: capacity,
                max: MAX_SHARD_ROWS,
            });
        }
        // The initial values are those of the hashed table of `budget_rows` rows.
        let bound = init_bound(budget_rows);
        Ok(Self {
            table,
            rows: DYNAMIC_KEY_SPACE,
            shard,
            residue: shard_residue(table, shard.index, shard.count),
            local_rows: 0,
            dim,
            stride,
            optimizer,
            lr_scale: 1.0,
            data: Vec::new(),
            counters: None,
            dynamic: Some(Box::new(DynamicRows::new(
                config,
                budget_rows,
                capacity as usize,
                (seed, bound),
            ))),
        })
    }

    /// Resets every row to its seeded initial value and state.
    pub fn reinitialize(&mut self, seed: u64) {
        if let Some(d) = &mut self.dynamic {
            d.clear();
            d.seed = seed;
            self.data.clear();
            self.local_rows = 0;
            if let Some(c) = &mut self.counters {
                c.clear();
            }
            return;
        }
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
    /// Rows of the whole table (all shards); a dynamic table's key space,
    /// [`crate::DYNAMIC_KEY_SPACE`].
    pub fn rows(&self) -> u64 {
        self.rows
    }
    /// Rows held by this shard (a dynamic table's: those admitted and not evicted).
    pub fn local_rows(&self) -> usize {
        self.local_rows
    }
    /// The table size its snapshots record: its rows, or a dynamic table's budget (the
    /// rows of the hashed table it replaces), which a model rebuilt from the snapshots
    /// needs for its capacity and initial values.
    pub fn snapshot_rows(&self) -> u64 {
        self.dynamic.as_ref().map_or(self.rows, |d| d.budget_rows)
    }
    /// Rows this shard can hold: all its rows, or a dynamic table's slots.
    pub fn row_capacity(&self) -> usize {
        self.dynamic
            .as_ref()
            .map_or(self.local_rows, |d| d.capacity)
    }
    /// True for a dynamic table.
    pub fn is_dynamic(&self) -> bool {
        self.dynamic.is_some()
    }
    /// What a dynamic table has admitted, evicted and filtered (`None` for a hashed one).
    pub fn dynamic_stats(&self) -> Option<DynamicStats> {
        self.dynamic.as_ref().map(|d| d.stats)
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

    /// Local index of global `row` (a dynamic table's slot of key `row`), or why this shard
    /// cannot serve it: out of range, another shard's, or (a dynamic table's key without a
    /// slot) [`EmbeddingError::NotStored`].
    #[inline]
    pub fn local_of(&self, row: u64) -> Result<usize> {
        self.find(row)?.ok_or(EmbeddingError::NotStored {
            table: self.table,
            row,
        })
    }

    /// A hashed table's local index of `row`: `row / shards` once it is checked.
    #[inline]
    fn hashed_local(&self, row: u64) -> Result<usize> {
        self.check_owned(row)?;
        if self.shard.count == 1 {
            return Ok(row as usize);
        }
        Ok((row / u64::from(self.shard.count)) as usize)
    }

    /// Where `row` lives in the arena: `Some(local)`, or `None` for a dynamic table's key
    /// without a slot (its value is the initial one).
    #[inline]
    fn find(&self, row: u64) -> Result<Option<usize>> {
        match &self.dynamic {
            None => self.hashed_local(row).map(Some),
            Some(d) => {
                self.check_owned(row)?;
                Ok(d.slot(row))
            }
        }
    }

    /// Checks that `row` is in range and this shard's.
    #[inline]
    fn check_owned(&self, row: u64) -> Result<()> {
        if row >= self.rows {
            return Err(EmbeddingError::RowOutOfRange {
                table: self.table,
                row,
                rows: self.rows,
            });
        }
        let n = u64::from(self.shard.count);
        if n > 1 && row % n != self.residue {
            return Err(EmbeddingError::WrongShard {
                table: self.table,
                row,
                owner: shard_of(self.table, row, self.shard.count),
                shard: self.shard.index,
            });
        }
        Ok(())
    }

    /// Global row stored at local index `local` (a dynamic table's key in slot `local`).
    #[inline]
    pub fn global_of(&self, local: usize) -> u64 {
        match &self.dynamic {
            None => local as u64 * u64::from(self.shard.count) + self.residue,
            Some(d) => d.keys[local],
        }
    }

    /// Weights and state of global `row`: `stride()` floats. A dynamic table's key without
    /// a slot is [`EmbeddingError::NotStored`].
    pub fn row(&self, row: u64) -> Result<&[f32]> {
        let l = self.local_of(row)?;
        Ok(&self.data[l * self.stride..(l + 1) * self.stride])
    }

    /// Copies the weights of global `row` into `out` (`dim()` floats): a dynamic table's
    /// key without a slot reads as its initial value.
    #[inline]
    pub fn read_weights(&self, row: u64, out: &mut [f32]) -> Result<()> {
        match self.find(row)? {
            Some(l) => out.copy_from_slice(self.weights_local(l)),
            None => self.write_initial(row, out),
        }
        Ok(())
    }

    /// The initial weights of a dynamic table's key (as the hashed table it replaces).
    fn write_initial(&self, row: u64, out: &mut [f32]) {
        if let Some(d) = &self.dynamic {
            init_row(d.seed, self.table, row, d.bound, out);
        }
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
            self.read_weights(row, o)?;
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
        if self.dynamic.is_some() {
            // Slots are found (and keys admitted) when the update runs.
            scratch.pending.clear();
            scratch.pending.reserve(n);
            for s in 0..n {
                let row = row_at(s);
                self.check_owned(row)?;
                scratch.pending.push(row);
            }
            return Ok(());
        }
        scratch.keys.reserve(n);
        for s in 0..n {
            let local = self.hashed_local(row_at(s))? as u64;
            scratch.keys.push((local << 32) | s as u64);
        }
        scratch.keys.sort_unstable();
        Ok(())
    }

    /// A dynamic table's part of an update: advances its clock, drops expired rows, counts
    /// and admits the batch's new keys (evicting when full), then fills `scratch.keys` with
    /// the sorted `(slot << 32) | sample` keys of every sample whose key has a slot.
    fn admit_batch(&mut self, scratch: &mut TableScratch) {
        let Some(d) = self.dynamic.as_mut() else {
            return;
        };
        for slot in d.begin_update() {
            self.remove_slot(slot);
        }
        let TableScratch {
            keys,
            pending,
            slots,
            ..
        } = scratch;
        let d = self.dynamic.as_mut().expect("dynamic");
        // `keys` first holds the keys to admit.
        slots.clear();
        for &key in pending.iter() {
            match d.slot(key) {
                Some(slot) => {
                    d.touch(slot);
                    slots.push(slot as u32);
                }
                None => {
                    slots.push(u32::MAX);
                    if d.count_toward_admission(key) {
                        keys.push(key);
                    }
                }
            }
        }
        keys.sort_unstable();
        keys.dedup();
        let free = d.capacity.saturating_sub(d.len());
        let mut moved = false;
        if keys.len() > free {
            let victims = d.choose_victims(keys.len() - free);
            moved = !victims.is_empty();
            for slot in victims {
                self.remove_slot(slot);
            }
        }
        let free = self.row_capacity().saturating_sub(self.local_rows);
        for &key in keys.iter().take(free) {
            self.push_row(key);
        }
        keys.clear();
        let d = self.dynamic.as_mut().expect("dynamic");
        let mut filtered = 0;
        for (s, (&key, &slot)) in pending.iter().zip(slots.iter()).enumerate() {
            // Evictions move slots (never a slot of this batch's keys away from its key);
            // without one the slots found above still hold.
            let slot = match slot {
                u32::MAX => d.slot(key),
                _ if moved => d.slot(key),
                slot => Some(slot as usize),
            };
            match slot {
                Some(slot) => {
                    if slots[s] == u32::MAX {
                        d.touch(slot);
                    }
                    keys.push(((slot as u64) << 32) | s as u64);
                }
                None => filtered += 1,
            }
        }
        d.stats.filtered += filtered;
        keys.sort_unstable();
    }

    /// Appends a slot for `key` with its initial weights and state.
    fn push_row(&mut self, key: u64) {
        let d = self.dynamic.as_mut().expect("dynamic");
        d.push(key);
        let (seed, bound, capacity) = (d.seed, d.bound, d.capacity);
        let at = self.data.len();
        if at == self.data.capacity() {
            let more = growth(self.local_rows, capacity);
            self.data.reserve_exact(more * self.stride);
        }
        self.data.resize(at + self.stride, 0.0);
        let (w, state) = self.data[at..].split_at_mut(self.dim);
        init_row(seed, self.table, key, bound, w);
        self.optimizer.init_state(state);
        if let Some(c) = &mut self.counters {
            if c.len() == c.capacity() {
                c.reserve_exact(growth(c.len(), capacity));
            }
            c.push(0);
        }
        self.local_rows += 1;
    }

    /// Drops the rows of a dynamic table's `keys` (a served model following a training
    /// job that evicted them); keys without a slot are skipped. Returns the rows dropped.
    /// A hashed table stores every row ([`EmbeddingError::Dynamic`]), and a key out of
    /// range or of another shard is refused; either way nothing is changed.
    pub fn remove_keys(&mut self, keys: &[u64]) -> Result<usize> {
        if self.dynamic.is_none() {
            return Err(EmbeddingError::Dynamic {
                reason: format!("table {} is hashed: its rows cannot be removed", self.table),
            });
        }
        for &key in keys {
            self.check_owned(key)?;
        }
        let mut removed = 0;
        for &key in keys {
            if let Some(slot) = self.find(key)? {
                self.remove_slot(slot);
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes a dynamic table's `slot`; the last slot's row moves into it.
    fn remove_slot(&mut self, slot: usize) {
        let d = self.dynamic.as_mut().expect("dynamic");
        let stride = self.stride;
        if let Some(last) = d.swap_remove(slot) {
            self.data
                .copy_within(last * stride..(last + 1) * stride, slot * stride);
        }
        self.local_rows -= 1;
        self.data.truncate(self.local_rows * stride);
        if let Some(c) = &mut self.counters {
            c.swap_remove(slot);
        }
    }

    /// Applies the optimizer to every unique row of prepared `scratch.keys`, summing the
    /// gradients of duplicates in ascending sample order (so results never depend on threads).
    pub(crate) fn apply_prepared<'g>(
        &mut self,
        grad_at: impl Fn(usize) -> &'g [f32],
        scratch: &mut TableScratch,
    ) {
        self.admit_batch(scratch);
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
        let TableScratch { keys, gsum, .. } = scratch;
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

    /// A dynamic table's usage of local row (slot) `local`; `None` for a hashed table.
    pub fn usage_of(&self, local: usize) -> Option<crate::RowUsage> {
        self.dynamic.as_ref().map(|d| d.usage(local))
    }

    /// A dynamic table shard's clock and admission filter (`None` for a hashed table), for
    /// a checkpoint's snapshot ([`TableSnapshot::dynamic`]).
    pub fn dynamic_state(&self) -> Option<crate::DynamicState> {
        self.dynamic.as_ref().map(|d| d.state())
    }

    /// Exports every row of this shard (weights + state) with its global row index.
    pub fn export(&self) -> TableSnapshot {
        TableSnapshot {
            table: self.table,
            table_rows: self.snapshot_rows(),
            dim: self.dim,
            state_len: self.state_len(),
            rows: (0..self.local_rows).map(|l| self.global_of(l)).collect(),
            values: self.data.clone(),
            usage: self.dynamic.as_ref().map_or_else(Vec::new, |d| {
                (0..self.local_rows).map(|s| d.usage(s)).collect()
            }),
            dynamic: None,
        }
    }

    /// Exports the given global rows (e.g. the most-frequently-used ones) of this shard. A
    /// dynamic table leaves out keys without a slot (evicted since they were chosen).
    pub fn export_rows(&self, rows: &[u64]) -> Result<TableSnapshot> {
        let mut values = Vec::with_capacity(rows.len() * self.stride);
        let mut kept = Vec::with_capacity(rows.len());
        let mut usage = Vec::new();
        for &row in rows {
            // `find` refuses rows out of range or of another shard.
            if let Some(l) = self.find(row)? {
                values.extend_from_slice(&self.data[l * self.stride..(l + 1) * self.stride]);
                kept.push(row);
                if let Some(d) = &self.dynamic {
                    usage.push(d.usage(l));
                }
            }
        }
        Ok(TableSnapshot {
            table: self.table,
            table_rows: self.snapshot_rows(),
            dim: self.dim,
            state_len: self.state_len(),
            rows: kept,
            values,
            usage,
            dynamic: None,
        })
    }

    /// Overwrites the rows in `snap` (weights + state). Every row must belong to this shard
    /// (use [`TableSnapshot::route`] to split a snapshot for another shard count). Validates
    /// everything first: on error nothing is modified. Returns the number of rows written.
    pub fn import(&mut self, snap: &TableSnapshot) -> Result<usize> {
        let mismatch = |reason: String| Err(EmbeddingError::SnapshotMismatch { reason });
        if snap.table != self.table || snap.table_rows != self.snapshot_rows() {
            return mismatch(format!(
                "snapshot of table {} ({} rows) imported into table {} ({} rows)",
                snap.table,
                snap.table_rows,
                self.table,
                self.snapshot_rows()
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
        if !snap.usage.is_empty() {
            check_len("snapshot usage", snap.rows.len(), snap.usage.len())?;
        }
        for &row in &snap.rows {
            self.check_owned(row)?;
        }
        // The saved clock first: the rows' usage below is relative to it.
        if let (Some(d), Some(saved)) = (&mut self.dynamic, &snap.dynamic) {
            d.restore_state(saved);
        }
        let stride = self.stride;
        for (i, (&row, v)) in snap
            .rows
            .iter()
            .zip(snap.values.chunks_exact(stride))
            .enumerate()
        {
            let l = match self.find(row)? {
                Some(l) => l,
                // A dynamic table keeps every row it is given, past its budget if need be
                // (admissions evict back down to it).
                None => {
                    self.push_row(row);
                    self.local_rows - 1
                }
            };
            self.data[l * stride..(l + 1) * stride].copy_from_slice(v);
            // A row saved without usage (an older snapshot) counts as used now.
            if let (Some(d), Some(&u)) = (&mut self.dynamic, snap.usage.get(i)) {
                d.set_usage(l, u);
            }
        }
        Ok(snap.rows.len())
    }

    /// Bytes this shard holds: the arena, the counters when enabled, and the struct itself.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.data.capacity() * 4
            + self.counters.as_ref().map_or(0, |c| c.capacity() * 4)
            + self.dynamic.as_ref().map_or(0, |d| d.memory_bytes())
    }

    /// Bytes of the rows and their optimizer state alone: `local_rows * stride * 4`.
    pub fn raw_bytes(&self) -> usize {
        self.local_rows * self.stride * 4
    }
}

/// Checks what every table shard needs: a dimension, rows, a valid optimizer and shard.
fn check_shape(
    table: usize,
    rows: u64,
    dim: usize,
    optimizer: &SparseOptimizerConfig,
    shard: ShardSpec,
) -> Result<ShardSpec> {
    if dim == 0 {
        return Err(EmbeddingError::ZeroDim);
    }
    if rows == 0 {
        return Err(EmbeddingError::ZeroRows { table });
    }
    optimizer.validate()?;
    ShardSpec::new(shard.index, shard.count)
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
