//! The multi-table store: batch gather and batch sparse update over every table.

use rayon::prelude::*;

use crate::config::EmbeddingConfig;
use crate::error::{EmbeddingError, Result};
use crate::hash::{row_of, ShardSpec};
use crate::snapshot::TableSnapshot;
use crate::table::{check_len, TableScratch, TableShard};

/// Samples handled per rayon task by the batch gathers and id hashing.
const SAMPLES_PER_TASK: usize = 64;

/// Reusable buffers for [`EmbeddingStore::apply_gradients`]: allocate once, pass every step.
#[derive(Debug, Default, Clone)]
pub struct UpdateScratch {
    tables: Vec<TableScratch>,
    /// Keyed updates: the lookups of each table.
    by_table: Vec<Vec<u32>>,
}

impl UpdateScratch {
    /// An empty scratch; it grows to the batch size on first use and then stays.
    pub fn new() -> Self {
        Self::default()
    }

    /// Heap bytes held by this scratch.
    pub fn memory_bytes(&self) -> usize {
        self.tables.capacity() * std::mem::size_of::<TableScratch>()
            + self
                .tables
                .iter()
                .map(TableScratch::memory_bytes)
                .sum::<usize>()
    }
}

/// All tables of a model (or one shard of each, on a parameter server).
///
/// Batch layout everywhere: `n` samples x `T` tables, row-major, so the id of sample `s` in
/// table `t` is `ids[s * T + t]`, and its embedding / gradient is the `d` floats starting at
/// `(s * T + t) * d`.
#[derive(Debug, Clone)]
pub struct EmbeddingStore {
    config: EmbeddingConfig,
    shard: ShardSpec,
    tables: Vec<TableShard>,
}

impl EmbeddingStore {
    /// The whole store in one process ([`ShardSpec::SINGLE`]).
    pub fn new(config: EmbeddingConfig) -> Result<Self> {
        Self::new_shard(config, ShardSpec::SINGLE)
    }

    /// Shard `shard` of every table (a parameter server's part).
    pub fn new_shard(config: EmbeddingConfig, shard: ShardSpec) -> Result<Self> {
        config.validate()?;
        let tables = config
            .rows
            .iter()
            .enumerate()
            .map(|(t, &rows)| match config.dynamic {
                None => TableShard::new(t, rows, config.dim, config.optimizer, config.seed, shard),
                Some(d) => Self::dynamic_table(&config, t, rows, shard, d),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            config,
            shard,
            tables,
        })
    }

    /// Shard `shard` of every table with every float zero (see [`TableShard::new_zeroed`]):
    /// the rows are expected to be imported.
    pub fn new_shard_zeroed(config: EmbeddingConfig, shard: ShardSpec) -> Result<Self> {
        config.validate()?;
        let tables = config
            .rows
            .iter()
            .enumerate()
            .map(|(t, &rows)| match config.dynamic {
                None => TableShard::new_zeroed(t, rows, config.dim, config.optimizer, shard),
                // Empty either way.
                Some(d) => Self::dynamic_table(&config, t, rows, shard, d),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            config,
            shard,
            tables,
        })
    }

    fn dynamic_table(
        config: &EmbeddingConfig,
        t: usize,
        rows: u64,
        shard: ShardSpec,
        dynamic: crate::DynamicConfig,
    ) -> Result<TableShard> {
        let (dim, optimizer, seed) = (config.dim, config.optimizer, config.seed);
        TableShard::new_dynamic(t, rows, dim, optimizer, seed, shard, dynamic)
    }

    /// The validated configuration.
    pub fn config(&self) -> &EmbeddingConfig {
        &self.config
    }
    /// Which shard of every table this store holds.
    pub fn shard(&self) -> ShardSpec {
        self.shard
    }
    /// Number of tables `T`.
    pub fn num_tables(&self) -> usize {
        self.tables.len()
    }
    /// Embedding dimension `d`.
    pub fn dim(&self) -> usize {
        self.config.dim
    }
    /// All tables.
    pub fn tables(&self) -> &[TableShard] {
        &self.tables
    }
    /// Table `t`.
    pub fn table(&self, t: usize) -> Result<&TableShard> {
        let tables = self.tables.len();
        self.tables
            .get(t)
            .ok_or(EmbeddingError::TableOutOfRange { table: t, tables })
    }
    /// Table `t`, mutably (per-table updates, imports, counters).
    pub fn table_mut(&mut self, t: usize) -> Result<&mut TableShard> {
        let tables = self.tables.len();
        self.tables
            .get_mut(t)
            .ok_or(EmbeddingError::TableOutOfRange { table: t, tables })
    }

    fn batch_len(&self, ids: usize) -> Result<usize> {
        let t = self.tables.len();
        if !ids.is_multiple_of(t) {
            return Err(EmbeddingError::Shape {
                what: "ids (n x tables)",
                expected: ids.next_multiple_of(t),
                actual: ids,
            });
        }
        Ok(ids / t)
    }

    /// Hashes a batch of raw ids (`n x T`) to global rows with [`row_of`] (parallel).
    pub fn ids_to_rows(&self, ids: &[u64], rows_out: &mut [u64]) -> Result<()> {
        check_len("rows_out", ids.len(), rows_out.len())?;
        let t = self.tables.len();
        let chunk = SAMPLES_PER_TASK * t;
        rows_out
            .par_chunks_mut(chunk)
            .zip(ids.par_chunks(chunk))
            .for_each(|(rows, ids)| {
                for (row, (i, &id)) in rows.iter_mut().zip(ids.iter().enumerate()) {
                    let table = i % t;
                    *row = row_of(table, id, self.tables[table].rows());
                }
            });
        Ok(())
    }

    /// Looks up a batch of raw ids (`n x T`): hashes each with [`row_of`] and copies the row's
    /// weights into `out` (`n x T x d`). Parallel over samples. Every id must hash to a row of
    /// this shard. On error `out` may be partly written.
    pub fn gather(&self, ids: &[u64], out: &mut [f32]) -> Result<()> {
        self.gather_impl(ids, out, |t, id| row_of(t, id, self.tables[t].rows()))
    }

    /// Like [`EmbeddingStore::gather`] but takes global rows (already hashed, e.g. received over
    /// the wire or from [`EmbeddingStore::ids_to_rows`]).
    pub fn gather_rows(&self, rows: &[u64], out: &mut [f32]) -> Result<()> {
        self.gather_impl(rows, out, |_, row| row)
    }

    fn gather_impl(
        &self,
        keys: &[u64],
        out: &mut [f32],
        to_row: impl Fn(usize, u64) -> u64 + Sync,
    ) -> Result<()> {
        let n = self.batch_len(keys.len())?;
        let (t, d) = (self.tables.len(), self.config.dim);
        check_len("out (n x tables x dim)", n * t * d, out.len())?;
        out.par_chunks_mut(SAMPLES_PER_TASK * t * d)
            .zip(keys.par_chunks(SAMPLES_PER_TASK * t))
            .try_for_each(|(out, keys)| {
                for (o, (i, &key)) in out.chunks_exact_mut(d).zip(keys.iter().enumerate()) {
                    self.tables[i % t].read_weights(to_row(i % t, key), o)?;
                }
                Ok(())
            })
    }

    /// Applies a batch of gradients (`grads`: `n x T x d`, matching `ids`: `n x T` raw ids).
    /// Per table, rows hit by several samples get the sum of their gradients (coalesced, as a
    /// PyTorch sparse gradient), then the optimizer runs once per unique row. Parallel across
    /// tables; each table's update is sequential in row order, so results are bit-identical
    /// for any thread count. All ids are validated first: on error nothing is modified.
    pub fn apply_gradients(
        &mut self,
        ids: &[u64],
        grads: &[f32],
        scratch: &mut UpdateScratch,
    ) -> Result<()> {
        let rows = |t: usize, tables: &[TableShard], id: u64| row_of(t, id, tables[t].rows());
        self.apply_impl(ids, grads, scratch, rows)
    }

    /// Like [`EmbeddingStore::apply_gradients`] but takes global rows.
    pub fn apply_gradients_rows(
        &mut self,
        rows: &[u64],
        grads: &[f32],
        scratch: &mut UpdateScratch,
    ) -> Result<()> {
        self.apply_impl(rows, grads, scratch, |_, _, row| row)
    }

    fn apply_impl(
        &mut self,
        keys: &[u64],
        grads: &[f32],
        scratch: &mut UpdateScratch,
        to_row: impl Fn(usize, &[TableShard], u64) -> u64 + Sync,
    ) -> Result<()> {
        let n = self.batch_len(keys.len())?;
        let (t, d) = (self.tables.len(), self.config.dim);
        check_len("grads (n x tables x dim)", n * t * d, grads.len())?;
        scratch.tables.resize_with(t, TableScratch::default);
        let tables = &self.tables;
        tables
            .par_iter()
            .zip(scratch.tables.par_iter_mut())
            .enumerate()
            .try_for_each(|(ti, (table, sc))| {
                table.prepare(n, |s| to_row(ti, tables, keys[s * t + ti]), sc)
            })?;
        self.tables
            .par_iter_mut()
            .zip(scratch.tables.par_iter_mut())
            .enumerate()
            .for_each(|(ti, (table, sc))| {
                table.apply_prepared(|s| &grads[(s * t + ti) * d..(s * t + ti + 1) * d], sc)
            });
        Ok(())
    }

    /// Looks up `ids[k]` in table `tables[k]` for every `k` and copies the row's weights to
    /// `out[k * d..(k + 1) * d]`: the lookups of a batch whose features share tables or
    /// hold lists of ids (see `elastrec_data::schema`). Parallel over lookups.
    pub fn gather_keyed(&self, tables: &[u32], ids: &[u64], out: &mut [f32]) -> Result<()> {
        check_len("ids (one per lookup)", tables.len(), ids.len())?;
        let d = self.config.dim;
        check_len("out (lookups x dim)", ids.len() * d, out.len())?;
        self.check_tables(tables)?;
        let per_task = SAMPLES_PER_TASK * 8;
        out.par_chunks_mut(per_task * d)
            .zip(tables.par_chunks(per_task).zip(ids.par_chunks(per_task)))
            .try_for_each(|(out, (tables, ids))| {
                for (o, (&t, &id)) in out.chunks_exact_mut(d).zip(tables.iter().zip(ids)) {
                    let t = t as usize;
                    self.tables[t].read_weights(row_of(t, id, self.tables[t].rows()), o)?;
                }
                Ok(())
            })
    }

    /// Applies one gradient per lookup (`grads`: `lookups x d`, lookup `k` being `ids[k]`
    /// in table `tables[k]`). Per table, rows hit by several lookups get the sum of their
    /// gradients in lookup order, then the optimizer runs once per unique row, as
    /// [`EmbeddingStore::apply_gradients`]. On error nothing is modified.
    pub fn apply_gradients_keyed(
        &mut self,
        tables: &[u32],
        ids: &[u64],
        grads: &[f32],
        scratch: &mut UpdateScratch,
    ) -> Result<()> {
        check_len("ids (one per lookup)", tables.len(), ids.len())?;
        let d = self.config.dim;
        check_len("grads (lookups x dim)", ids.len() * d, grads.len())?;
        self.check_tables(tables)?;
        let t = self.tables.len();
        scratch.tables.resize_with(t, TableScratch::default);
        scratch.by_table.resize_with(t, Vec::new);
        scratch.by_table.iter_mut().for_each(Vec::clear);
        for (k, &table) in tables.iter().enumerate() {
            scratch.by_table[table as usize].push(k as u32);
        }
        let store = &self.tables;
        store
            .par_iter()
            .zip(scratch.tables.par_iter_mut().zip(&scratch.by_table))
            .enumerate()
            .try_for_each(|(ti, (table, (sc, mine)))| {
                table.prepare(
                    mine.len(),
                    |s| row_of(ti, ids[mine[s] as usize], store[ti].rows()),
                    sc,
                )
            })?;
        self.tables
            .par_iter_mut()
            .zip(scratch.tables.par_iter_mut().zip(&scratch.by_table))
            .for_each(|(table, (sc, mine))| {
                table.apply_prepared(
                    |s| {
                        let k = mine[s] as usize;
                        &grads[k * d..(k + 1) * d]
                    },
                    sc,
                )
            });
        Ok(())
    }

    fn check_tables(&self, tables: &[u32]) -> Result<()> {
        let count = self.tables.len();
        match tables.iter().find(|&&t| t as usize >= count) {
            Some(&t) => Err(EmbeddingError::TableOutOfRange {
                table: t as usize,
                tables: count,
            }),
            None => Ok(()),
        }
    }

    /// Multiplies every table's learning rate by `scale` from the next update on.
    pub fn set_lr_scale(&mut self, scale: f32) {
        for t in &mut self.tables {
            t.set_lr_scale(scale);
        }
    }

    /// Turns on per-row access counters in every table (see
    /// [`TableShard::enable_access_counters`]).
    pub fn enable_access_counters(&mut self) {
        self.tables
            .iter_mut()
            .for_each(TableShard::enable_access_counters);
    }

    /// Exports every row this store holds of table `t`.
    pub fn export_table(&self, t: usize) -> Result<TableSnapshot> {
        Ok(self.table(t)?.export())
    }

    /// Imports rows into their table (`snap.table`); all must belong to this shard.
    pub fn import_table(&mut self, snap: &TableSnapshot) -> Result<usize> {
        self.table_mut(snap.table)?.import(snap)
    }

    /// Bytes held by the store: arenas, counters, table structs and the store itself.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.config.rows.capacity() * 8
            + (self.tables.capacity() - self.tables.len()) * std::mem::size_of::<TableShard>()
            + self
                .tables
                .iter()
                .map(TableShard::memory_bytes)
                .sum::<usize>()
    }

    /// What the dynamic tables hold and did (`None` for hashed tables).
    pub fn dynamic_summary(&self) -> Option<crate::DynamicSummary> {
        self.config.dynamic?;
        let mut sum = crate::DynamicSummary::default();
        for t in &self.tables {
            if let Some(s) = t.dynamic_stats() {
                sum.add(t.local_rows(), t.row_capacity(), s);
            }
        }
        Some(sum)
    }

    /// Bytes of the rows and optimizer state alone.
    pub fn raw_bytes(&self) -> usize {
        self.tables.iter().map(TableShard::raw_bytes).sum()
    }
}
