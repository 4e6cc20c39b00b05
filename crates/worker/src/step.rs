//! One DLRM training step: gather embeddings → dense forward/backward → dense optimizer
//! step and sparse row updates. Every buffer is allocated once for the maximum batch.

use elastrec_data::Batch;
use elastrec_embedding::{EmbeddingConfig, EmbeddingStore, UpdateScratch};
use elastrec_job::config::JobConfig;
use elastrec_job::prepare::dense_config;
use elastrec_model::{DenseDlrm, DenseOptimizer, DenseOptimizerConfig, EvalAccumulator, Workspace};

use crate::error::Result;
use crate::pooling::{Lookups, SlotLayout};

/// A complete DLRM: embedding tables plus the dense part.
pub struct Dlrm {
    /// Embedding tables with their sparse optimizer state.
    pub embeddings: EmbeddingStore,
    /// Bottom MLP, interaction and top MLP (flat parameters).
    pub dense: DenseDlrm,
    /// Shared tables and pooled lists of named features; `None`: slot `t` is table `t`'s
    /// single id.
    pub layout: Option<SlotLayout>,
}

impl Dlrm {
    /// A freshly initialized model from a job's model and optimizer settings, with the
    /// given per-table row counts.
    pub fn new(job: &JobConfig, table_rows: Vec<u64>) -> Result<Self> {
        let m = &job.model;
        let dense = DenseDlrm::new(dense_config(job))?;
        let embeddings = EmbeddingStore::new(EmbeddingConfig {
            dim: m.row_width(),
            rows: table_rows,
            optimizer: job.optimizer.sparse,
            seed: m.seed,
            dynamic: m.dynamic_embeddings,
        })?;
        let layout = job.data.schema().as_ref().and_then(SlotLayout::of);
        Ok(Self {
            embeddings,
            dense,
            layout,
        })
    }

    /// Writes the embeddings of `batch`, `[n, slots, d]`, into `emb`; histories pooled by
    /// attention are pooled by the model's units (whose forward `ws` keeps).
    fn embed(
        &self,
        batch: &Batch,
        emb: &mut [f32],
        lookups: &mut Lookups,
        ws: &mut Workspace,
    ) -> Result<()> {
        match &self.layout {
            None => Ok(self.embeddings.gather(&batch.sparse, emb)?),
            Some(layout) => {
                lookups.gather(layout, &self.embeddings, batch, emb)?;
                if !self.dense.attention().is_empty() {
                    self.dense.attend(&lookups.hist, lookups.lens(), emb, ws)?;
                }
                Ok(())
            }
        }
    }

    /// After a training step's backward: the attention units' backward, which adds to
    /// the step's dense gradient and to `d_emb` (the queries'), and leaves the histories'
    /// gradient in `lookups`.
    fn attend_backward(
        &self,
        emb: &[f32],
        lookups: &mut Lookups,
        ws: &mut Workspace,
    ) -> Result<()> {
        if self.dense.attention().is_empty() {
            return Ok(());
        }
        let (hist, lens, d_hist) = lookups.histories_mut();
        self.dense.attend_backward(hist, lens, emb, d_hist, ws)?;
        Ok(())
    }

    /// Applies `d_emb`, the gradient of the embeddings [`Dlrm::embed`] last wrote for
    /// `batch`, to the embedding rows.
    fn update_embeddings(
        &mut self,
        batch: &Batch,
        d_emb: &[f32],
        lookups: &mut Lookups,
        scratch: &mut UpdateScratch,
    ) -> Result<()> {
        match &self.layout {
            None => Ok(self
                .embeddings
                .apply_gradients(&batch.sparse, d_emb, scratch)?),
            Some(_) => lookups.apply(&mut self.embeddings, d_emb, scratch),
        }
    }

    /// Embedding dimension.
    pub fn dim(&self) -> usize {
        self.embeddings.dim()
    }

    /// Embedding vectors per sample: one per sparse feature column.
    pub fn tables(&self) -> usize {
        self.dense.config().num_tables
    }
}

/// Reusable buffers for forward-only passes (evaluation, prediction).
pub struct Predictor {
    ws: Workspace,
    emb: Vec<f32>,
    lookups: Lookups,
}

impl Predictor {
    /// Buffers for batches of up to `max_batch` samples.
    pub fn new(model: &Dlrm, max_batch: usize) -> Self {
        Self {
            ws: model.dense.workspace(max_batch),
            emb: vec![0.0; max_batch * model.tables() * model.dim()],
            lookups: Lookups::default(),
        }
    }

    /// Writes click probabilities of `batch` into `probs` (resized to the batch length).
    pub fn predict(&mut self, model: &Dlrm, batch: &Batch, probs: &mut Vec<f32>) -> Result<()> {
        let n = batch.len();
        let emb = &mut self.emb[..n * model.tables() * model.dim()];
        model.embed(batch, emb, &mut self.lookups, &mut self.ws)?;
        probs.resize(n, 0.0);
        model
            .dense
            .predict(&batch.dense, emb, &mut self.ws, probs)?;
        Ok(())
    }

    /// Writes every task's probabilities of `batch` into `probs`, row-major `[n, T]`
    /// (resized); for a one-task model the same as [`Predictor::predict`].
    pub fn predict_tasks(
        &mut self,
        model: &Dlrm,
        batch: &Batch,
        probs: &mut Vec<f32>,
    ) -> Result<()> {
        let n = batch.len();
        let emb = &mut self.emb[..n * model.tables() * model.dim()];
        model.embed(batch, emb, &mut self.lookups, &mut self.ws)?;
        probs.resize(n * model.dense.tasks(), 0.0);
        model
            .dense
            .predict_tasks(&batch.dense, emb, &mut self.ws, probs)?;
        Ok(())
    }
}

/// Adds a batch's predictions of every task (`probs [n, T]`, row-major, as
/// [`Predictor::predict_tasks`] writes them) to each task's accumulator (`accs[t]`), with
/// that task's labels, the samples' weights, and their users (the single-id column
/// `user`, for GAUC).
pub(crate) fn push_task_figures(
    accs: &mut [EvalAccumulator],
    probs: &[f32],
    batch: &Batch,
    user: Option<usize>,
) {
    let tasks = accs.len();
    let users: Vec<u64> = user.map_or_else(Vec::new, |k| {
        batch
            .sparse
            .iter()
            .skip(k)
            .step_by(batch.sparse_width.max(1))
            .copied()
            .collect()
    });
    let mut column = Vec::with_capacity(batch.len());
    let mut labels = Vec::with_capacity(batch.len());
    for (t, acc) in accs.iter_mut().enumerate() {
        column.clear();
        column.extend(probs.iter().skip(t).step_by(tasks));
        labels.clear();
        if t == 0 {
            labels.extend_from_slice(&batch.labels);
        } else {
            labels.extend(batch.task_labels.iter().skip(t - 1).step_by(tasks - 1));
        }
        acc.push_rows(&column, &labels, &batch.weights, &users);
    }
}

/// Training state: the model, its dense optimizer and the step's buffers.
pub struct TrainStep {
    /// The model being trained.
    pub model: Dlrm,
    dense_opt: Box<dyn DenseOptimizer>,
    /// The configured dense rate, which a schedule scales.
    dense_lr: f32,
    ws: Workspace,
    emb: Vec<f32>,
    scratch: UpdateScratch,
    lookups: Lookups,
    max_batch: usize,
}

impl TrainStep {
    /// Training state for batches of up to `max_batch` samples.
    pub fn new(model: Dlrm, dense_opt: &DenseOptimizerConfig, max_batch: usize) -> Self {
        let dense_lr = dense_opt.lr();
        let dense_opt = dense_opt
            .build_with_statistics(model.dense.num_params(), model.dense.statistic_ranges());
        let ws = model.dense.workspace(max_batch);
        let emb = vec![0.0; max_batch * model.tables() * model.dim()];
        Self {
            model,
            dense_opt,
            dense_lr,
            ws,
            emb,
            scratch: UpdateScratch::new(),
            lookups: Lookups::default(),
            max_batch,
        }
    }

    /// Largest batch this state accepts.
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// The dense optimizer (its state is part of a checkpoint).
    pub fn dense_optimizer(&self) -> &dyn DenseOptimizer {
        self.dense_opt.as_ref()
    }

    /// The dense optimizer, mutably (to restore its state).
    pub fn dense_optimizer_mut(&mut self) -> &mut dyn DenseOptimizer {
        self.dense_opt.as_mut()
    }

    /// Multiplies the configured dense and sparse learning rates by `scale` from the
    /// next batch on.
    pub fn set_lr_scale(&mut self, scale: f32) {
        self.dense_opt.set_lr(self.dense_lr * scale);
        self.model.embeddings.set_lr_scale(scale);
    }

    /// Trains on one batch; returns its mean log loss (before the update).
    pub fn train_batch(&mut self, batch: &Batch) -> Result<f32> {
        let n = batch.len();
        let emb = &mut self.emb[..n * self.model.tables() * self.model.dim()];
        self.model
            .embed(batch, emb, &mut self.lookups, &mut self.ws)?;
        let labels = elastrec_model::Labels {
            labels: &batch.labels,
            task_labels: &batch.task_labels,
            weights: &batch.weights,
        };
        let loss = self.model.dense.forward_backward_weighted(
            &batch.dense,
            emb,
            labels,
            elastrec_model::Tower::Memory,
            &mut self.ws,
        )?;
        self.model
            .attend_backward(emb, &mut self.lookups, &mut self.ws)?;
        self.dense_opt
            .step(self.model.dense.params_mut(), self.ws.grads());
        self.model.update_embeddings(
            batch,
            self.ws.d_emb(),
            &mut self.lookups,
            &mut self.scratch,
        )?;
        Ok(loss)
    }
}
