//! Training state of one emulated run and the checkpoint images it restores from.

use elastrec_data::Batch;
use elastrec_embedding::{shard_of, shard_residue, EmbeddingStore};
use elastrec_job::config::JobConfig;
use elastrec_worker::step::{Dlrm, TrainStep};

use crate::error::Result;

/// The worker's training step plus the global rows of the last batch (which virtual PS a
/// failure hits).
pub(crate) struct Trainee {
    pub(crate) step: TrainStep,
    /// Global rows of the last batch (`n x T`), filled by [`Trainee::batch_rows`].
    rows: Vec<u64>,
}

impl Trainee {
    /// A freshly initialized model (the same for every run: seeds come from the job).
    pub(crate) fn new(job: &JobConfig, table_rows: Vec<u64>) -> Result<Self> {
        let model = Dlrm::new(job, table_rows)?;
        Ok(Self {
            step: TrainStep::new(model, &job.optimizer.dense, job.train.batch_size),
            rows: Vec::new(),
        })
    }

    /// The model.
    pub(crate) fn model(&self) -> &Dlrm {
        &self.step.model
    }

    /// One training step; returns the batch's mean log loss.
    pub(crate) fn train_batch(&mut self, batch: &Batch) -> Result<f32> {
        Ok(self.step.train_batch(batch)?)
    }

    /// Global rows of `batch` (`n x T`, sample-major), as the parameter servers see them.
    pub(crate) fn batch_rows(&mut self, batch: &Batch) -> Result<&[u64]> {
        self.rows.resize(batch.sparse.len(), 0);
        self.step
            .model
            .embeddings
            .ids_to_rows(&batch.sparse, &mut self.rows)?;
        Ok(&self.rows)
    }
}

/// Everything full recovery rewinds: embeddings with their optimizer state, dense
/// parameters, dense optimizer state and the data position.
pub(crate) struct FullImage {
    embeddings: EmbeddingStore,
    dense: Vec<f32>,
    opt_state: Vec<Vec<f32>>,
    /// Batches trained when the image was taken.
    pub(crate) batch: usize,
    /// Samples trained when the image was taken.
    pub(crate) samples: u64,
}

impl FullImage {
    pub(crate) fn capture(t: &Trainee, batch: usize, samples: u64) -> Self {
        Self {
            embeddings: t.step.model.embeddings.clone(),
            dense: t.step.model.dense.params().to_vec(),
            opt_state: t
                .step
                .dense_optimizer()
                .state()
                .iter()
                .map(|s| s.to_vec())
                .collect(),
            batch,
            samples,
        }
    }

    /// Overwrites the image with `t`'s current state (reusing the buffers).
    pub(crate) fn update(&mut self, t: &Trainee, batch: usize, samples: u64) {
        self.embeddings.clone_from(&t.step.model.embeddings);
        self.dense.copy_from_slice(t.step.model.dense.params());
        for (dst, src) in self
            .opt_state
            .iter_mut()
            .zip(t.step.dense_optimizer().state())
        {
            dst.copy_from_slice(src);
        }
        self.batch = batch;
        self.samples = samples;
    }

    pub(crate) fn restore(&self, t: &mut Trainee) {
        t.step.model.embeddings.clone_from(&self.embeddings);
        t.step.model.dense.params_mut().copy_from_slice(&self.dense);
        for (dst, src) in t
            .step
            .dense_optimizer_mut()
            .state_mut()
            .into_iter()
            .zip(&self.opt_state)
        {
            dst.copy_from_slice(src);
        }
    }
}

/// Rows of table `t` (of `rows` rows) that server `shard` of `n` owns:
/// `shard_residue, shard_residue + n, …`.
fn shard_row_list(t: usize, rows: u64, shard: u32, n: u32) -> Vec<u64> {
    let residue = shard_residue(t, shard, n);
    let rows: Vec<u64> = (residue..rows).step_by(n as usize).collect();
    debug_assert!(rows.iter().all(|&r| shard_of(t, r, n) == shard));
    rows
}

/// Partial recovery of server `shard` of `n`: every row it owns, in every table, goes back
/// to its value (weights and optimizer state) in `image`. Returns how many rows actually
/// changed: the rows whose updates since their last save were lost.
pub(crate) fn restore_shard(
    live: &mut EmbeddingStore,
    image: &EmbeddingStore,
    shard: u32,
    n: u32,
) -> Result<u64> {
    let mut stale = 0u64;
    for t in 0..live.num_tables() {
        let table = live.table(t)?;
        let rows = shard_row_list(t, table.rows(), shard, n);
        let saved = image.table(t)?.export_rows(&rows)?;
        for (i, &r) in rows.iter().enumerate() {
            if table.row(r)? != saved.row_values(i) {
                stale += 1;
            }
        }
        live.import_table(&saved)?;
    }
    Ok(stale)
}

/// Saves `rows` of table `t` from `live` into `image`.
pub(crate) fn save_rows(
    live: &EmbeddingStore,
    image: &mut EmbeddingStore,
    t: usize,
    rows: &[u64],
) -> Result<()> {
    if !rows.is_empty() {
        image.import_table(&live.table(t)?.export_rows(rows)?)?;
    }
    Ok(())
}

/// Saves the whole of table `t` from `live` into `image`.
pub(crate) fn save_table(
    live: &EmbeddingStore,
    image: &mut EmbeddingStore,
    t: usize,
) -> Result<()> {
    image.import_table(&live.export_table(t)?)?;
    Ok(())
}
