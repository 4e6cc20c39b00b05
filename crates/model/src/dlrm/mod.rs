//! The dense part of DLRM: bottom MLP, interaction, top MLP, BCE loss.

use crate::attention::{AttentionActs, TargetAttention};
use crate::cross::{CrossActs, CrossNet};
use crate::error::{ModelError, Result};
use crate::interaction::Interaction;
use rayon::prelude::*;

use crate::layers::{sigmoid, Activation, Dropout, Linear, Mlp};
use crate::loss::bce_sum_with_logits;
use crate::mmoe::{Mmoe, MmoeActs};
use crate::norm::NormMode;

mod block;
mod config;
mod workspace;

use block::{Block, BlockInputs};
pub(crate) use config::is_zero;
pub use config::{DlrmConfig, FlopCount, Tower};
pub use workspace::Workspace;

/// The dense DLRM: layer shapes plus all parameters in one flat buffer.
///
/// Layout of [`DenseDlrm::params`]: the bottom layers, then the top layers; each layer is
/// `W [out, in]` row-major followed by `b [out]` (see [`crate::Linear`] offsets). The
/// gradients live in the same layout in [`Workspace::grads`].
#[derive(Clone, Debug)]
pub struct DenseDlrm {
    config: DlrmConfig,
    bottom: Mlp,
    top: Mlp,
    /// MTRM's adapt tower (its parameters follow the top MLP's); `None` for a plain DLRM.
    adapt: Option<Mlp>,
    /// DCN-v2 cross layers on the interaction output (none for a plain DLRM); their
    /// parameters come last.
    cross: CrossNet,
    /// The first-order term's linear layer over the dense features (its parameters come
    /// after the cross layers'); `None` without [`DlrmConfig::first_order`].
    wide: Option<Linear>,
    /// The multi-task head (its parameters follow the norms'); `None` for one task.
    mmoe: Option<Mmoe>,
    /// Target-attention units (their parameters come last), and each alone (parameters
    /// at 0) for the row blocks that run in parallel.
    attention: Vec<TargetAttention>,
    attention_alone: Vec<TargetAttention>,
    interaction: Interaction,
    params: Vec<f32>,
}

impl DenseDlrm {
    /// Builds and deterministically initializes the model (Xavier-uniform weights,
    /// uniform `±1/sqrt(fan_in)` biases, one SplitMix64 stream per layer).
    pub fn new(config: DlrmConfig) -> Result<Self> {
        config.validate()?;
        let bottom = Mlp::new(&config.bottom, 0, Activation::Relu, Activation::Relu);
        let interaction = Interaction {
            kind: config.interaction,
            bottom_dim: *config.bottom.last().expect("validated"),
            num_tables: config.num_tables,
            dim: config.embedding_dim,
        };
        let mut top_sizes = Vec::with_capacity(config.top.len() + 1);
        // With an MMoE head the top MLP (task 0's tower) reads a mixture of experts.
        top_sizes.push(config.mmoe.as_ref().map_or(interaction.out_dim(), |h| {
            *h.expert.last().expect("validated")
        }));
        top_sizes.extend_from_slice(&config.top);
        let top = Mlp::new(
            &top_sizes,
            bottom.num_params(),
            Activation::Relu,
            Activation::None,
        );
        let adapt = (!config.adapt.is_empty()).then(|| {
            let mut sizes = vec![interaction.out_dim() + 1];
            sizes.extend_from_slice(&config.adapt);
            Mlp::new(
                &sizes,
                bottom.num_params() + top.num_params(),
                Activation::Relu,
                Activation::None,
            )
        });
        let adapt_params = adapt.as_ref().map_or(0, Mlp::num_params);
        let before_cross = bottom.num_params() + top.num_params() + adapt_params;
        let cross = CrossNet::new(interaction.out_dim(), config.cross_layers, before_cross);
        let after_cross = before_cross + cross.num_params();
        let wide = config
            .first_order
            .then(|| Linear::new(config.num_dense(), 1, after_cross, Activation::None));
        let after_wide = after_cross + wide.as_ref().map_or(0, Linear::num_params);
        let (bottom, top) = match config.norm() {
            Some(kind) => {
                let bottom = bottom.with_norm(kind, after_wide);
                let top_norms = after_wide + bottom.norm_params();
                (bottom, top.with_norm(kind, top_norms))
            }
            None => (bottom, top),
        };
        let after_norms = after_wide + bottom.norm_params() + top.norm_params();
        let mmoe = config.mmoe.as_ref().map(|h| {
            Mmoe::new(
                h,
                interaction.out_dim(),
                &config.top,
                after_norms,
                config.norm(),
            )
        });
        let mut offset = after_norms + mmoe.as_ref().map_or(0, Mmoe::num_params);
        let attention: Vec<TargetAttention> = config
            .attention
            .iter()
            .map(|a| {
                let unit = TargetAttention::new(
                    a.clone(),
                    config.embedding_dim,
                    config.row_width(),
                    offset,
                );
                offset += unit.num_params();
                unit
            })
            .collect();
        let mut params = vec![0.0; offset];
        let layers = bottom
            .layers
            .iter()
            .chain(&top.layers)
            .chain(adapt.iter().flat_map(|a| &a.layers))
            .chain(&cross.layers)
            .chain(&wide);
        for (i, l) in layers.enumerate() {
            l.init(&mut params, config.seed, i as u64);
        }
        // Every norm starts as the identity (no random stream).
        let norms = bottom
            .norms
            .iter()
            .chain(&top.norms)
            .chain(mmoe.iter().flat_map(Mmoe::norms));
        for norm in norms {
            norm.init(&mut params);
        }
        // Streams after every other layer's, so adding the head changes no other layer's
        // initial values.
        let others = bottom.layers.len()
            + top.layers.len()
            + adapt.as_ref().map_or(0, |a| a.layers.len())
            + cross.layers.len()
            + usize::from(wide.is_some());
        let mut stream = others as u64;
        for l in mmoe.iter().flat_map(Mmoe::layers) {
            l.init(&mut params, config.seed, stream);
            stream += 1;
        }
        for unit in &attention {
            stream += unit.init(&mut params, config.seed, stream);
        }
        Ok(Self {
            config,
            bottom,
            top,
            adapt,
            cross,
            wide,
            mmoe,
            attention_alone: attention.iter().map(TargetAttention::alone).collect(),
            attention,
            interaction,
            params,
        })
    }

    /// The offsets of [`DenseDlrm::params`] that hold running statistics (batch norms'),
    /// not weights: a training step writes there the step's statistic minus the running
    /// value, for [`crate::optim::RunningAverages`] to apply. Empty without batch norms.
    pub fn statistic_ranges(&self) -> Vec<std::ops::Range<usize>> {
        self.bottom
            .norms
            .iter()
            .chain(&self.top.norms)
            .chain(self.mmoe.iter().flat_map(Mmoe::norms))
            .map(crate::norm::Norm::statistics)
            .filter(|r| !r.is_empty())
            .collect()
    }

    /// The target-attention units, in [`DlrmConfig::attention`] order.
    pub fn attention(&self) -> &[TargetAttention] {
        &self.attention
    }

    /// Pools every attention unit's histories into its slot of `emb` (`[n, slots,
    /// row]`). `hist` holds the units' inputs one after the other (unit `a`'s is
    /// `[n, max_len_a, row]`, zero-padded), `lens` their lengths (`[n]` per unit, each
    /// at least 1). Run before a forward; [`DenseDlrm::attend_backward`] after its
    /// backward.
    pub fn attend(
        &self,
        hist: &[f32],
        lens: &[u32],
        emb: &mut [f32],
        ws: &mut Workspace,
    ) -> Result<()> {
        let n = self.check_histories(hist, lens, emb)?;
        let (slots, per_row) = (self.config.num_tables, self.emb_width());
        let mut at = 0;
        for (a, unit) in self.attention.iter().enumerate() {
            let width = unit.input_width();
            let hist = &hist[at..at + n * width];
            let lens = &lens[a * n..(a + 1) * n];
            let (alone, params) = (&self.attention_alone[a], &self.params[unit.params_range()]);
            // Row blocks in parallel, each with its own buffers.
            emb[..n * per_row]
                .par_chunks_mut(BLOCK_ROWS * per_row)
                .zip(ws.attention[a].par_iter_mut())
                .enumerate()
                .for_each(|(b, (emb, acts))| {
                    let rows = b * BLOCK_ROWS..(b * BLOCK_ROWS + emb.len() / per_row);
                    let hist = &hist[rows.start * width..rows.end * width];
                    alone.forward(params, hist, &lens[rows], emb, slots, acts);
                });
            at += n * width;
        }
        Ok(())
    }

    /// The backward of [`DenseDlrm::attend`] after a training step's backward, with the
    /// same inputs: adds each query's gradient to [`Workspace::d_emb`], writes the
    /// units' parameter gradients into [`Workspace::grads`] (the row blocks' summed in
    /// block order, so a step does not depend on the thread count) and the histories'
    /// gradient into `d_hist` (the layout of `hist`).
    pub fn attend_backward(
        &self,
        hist: &[f32],
        lens: &[u32],
        emb: &[f32],
        d_hist: &mut [f32],
        ws: &mut Workspace,
    ) -> Result<()> {
        let n = self.check_histories(hist, lens, emb)?;
        if d_hist.len() != hist.len() {
            return Err(ModelError::Shape {
                what: "d_hist",
                expected: hist.len(),
                got: d_hist.len(),
            });
        }
        let (slots, per_row) = (self.config.num_tables, self.emb_width());
        let per = ws.d_emb.len() / ws.capacity.max(1);
        let d_emb = &mut ws.d_emb[..n * per];
        let mut at = 0;
        for (a, unit) in self.attention.iter().enumerate() {
            let width = unit.input_width();
            let hist = &hist[at..at + n * width];
            let d_hist = &mut d_hist[at..at + n * width];
            let lens = &lens[a * n..(a + 1) * n];
            let (alone, params) = (&self.attention_alone[a], &self.params[unit.params_range()]);
            let blocks = &mut ws.attention[a];
            d_emb
                .par_chunks_mut(BLOCK_ROWS * per_row)
                .zip(d_hist.par_chunks_mut(BLOCK_ROWS * width))
                .zip(blocks.par_iter_mut())
                .enumerate()
                .for_each(|(b, ((d_emb, d_hist), acts))| {
                    let rows = b * BLOCK_ROWS..(b * BLOCK_ROWS + d_emb.len() / per_row);
                    let hist = &hist[rows.start * width..rows.end * width];
                    let emb = &emb[rows.start * per_row..rows.end * per_row];
                    let mut grads = std::mem::take(&mut acts.grads);
                    grads.resize(alone.num_params(), 0.0);
                    alone.backward(
                        params,
                        &mut grads,
                        hist,
                        &lens[rows],
                        emb,
                        d_emb,
                        d_hist,
                        slots,
                        acts,
                    );
                    acts.grads = grads;
                });
            let out = &mut ws.grads[unit.params_range()];
            out.fill(0.0);
            for acts in &blocks[..n.div_ceil(BLOCK_ROWS)] {
                for (o, g) in out.iter_mut().zip(&acts.grads) {
                    *o += g;
                }
            }
            at += n * width;
        }
        Ok(())
    }

    /// Floats of the attention units' inputs per row (`Σ max_len · row`).
    pub fn history_width(&self) -> usize {
        self.attention
            .iter()
            .map(TargetAttention::input_width)
            .sum()
    }

    fn check_histories(&self, hist: &[f32], lens: &[u32], emb: &[f32]) -> Result<usize> {
        let n = emb.len() / self.emb_width();
        let shape = |what, expected: usize, got: usize| {
            if expected == got {
                Ok(())
            } else {
                Err(ModelError::Shape {
                    what,
                    expected,
                    got,
                })
            }
        };
        shape("emb", n * self.emb_width(), emb.len())?;
        shape("hist", n * self.history_width(), hist.len())?;
        shape("lens", n * self.attention.len(), lens.len())?;
        for (a, unit) in self.attention.iter().enumerate() {
            let max = unit.config.max_len as u32;
            if let Some(&l) = lens[a * n..(a + 1) * n]
                .iter()
                .find(|&&l| l == 0 || l > max)
            {
                return Err(ModelError::BadAttention {
                    why: format!("a history of {l} items; unit {a} takes 1 to {max}"),
                });
            }
        }
        Ok(n)
    }

    /// The multi-task MMoE head, if the model has one.
    pub fn mmoe(&self) -> Option<&Mmoe> {
        self.mmoe.as_ref()
    }

    /// Tasks (labels) the model predicts: 1 unless it has an MMoE head.
    pub fn tasks(&self) -> usize {
        self.config.tasks()
    }

    /// The first-order term's linear layer over the dense features (Wide & Deep's wide
    /// part); `None` without [`DlrmConfig::first_order`].
    pub fn wide(&self) -> Option<&Linear> {
        self.wide.as_ref()
    }

    /// MTRM's adapt tower, if this is one.
    pub fn adapt(&self) -> Option<&Mlp> {
        self.adapt.as_ref()
    }

    /// The tower predictions come from: the adapt tower of an MTRM, else the top MLP.
    pub fn serving_tower(&self) -> Tower {
        if self.adapt.is_some() {
            Tower::Adapt
        } else {
            Tower::Memory
        }
    }

    /// The tower that trains on history batches (the top MLP) or on stream batches (the
    /// adapt tower of an MTRM; the top MLP of a plain DLRM).
    pub fn tower_for(&self, stream: bool) -> Tower {
        if stream {
            self.serving_tower()
        } else {
            Tower::Memory
        }
    }

    /// Parameter range of a tower's layers in the flat buffer.
    fn tower_range(&self, tower: Tower) -> std::ops::Range<usize> {
        let mlp = match tower {
            Tower::Memory => &self.top,
            Tower::Adapt => self.adapt.as_ref().expect("an MTRM"),
        };
        let first = mlp.layers.first().expect("nonempty");
        let last = mlp.layers.last().expect("nonempty");
        first.w_offset..last.end_offset()
    }

    /// The configuration.
    pub fn config(&self) -> &DlrmConfig {
        &self.config
    }

    /// Bottom MLP (layer shapes and offsets).
    pub fn bottom(&self) -> &Mlp {
        &self.bottom
    }

    /// Top MLP (layer shapes and offsets).
    pub fn top(&self) -> &Mlp {
        &self.top
    }

    /// The DCN-v2 cross layers (empty for a plain DLRM).
    pub fn cross(&self) -> &CrossNet {
        &self.cross
    }

    /// The interaction.
    pub fn interaction(&self) -> &Interaction {
        &self.interaction
    }

    /// Number of dense parameters.
    pub fn num_params(&self) -> usize {
        self.params.len()
    }

    /// All dense parameters, flat.
    pub fn params(&self) -> &[f32] {
        &self.params
    }

    /// All dense parameters, flat, mutable (optimizer steps, parameter-server pulls).
    pub fn params_mut(&mut self) -> &mut [f32] {
        &mut self.params
    }

    /// Analytic FLOPs per sample of one `forward_backward`.
    pub fn flops_per_sample(&self) -> FlopCount {
        let fwd = self.bottom.forward_flops()
            + self.top.forward_flops()
            + self.cross.forward_flops()
            + self.mmoe.as_ref().map_or(0, Mmoe::forward_flops);
        // An MTRM's history step runs only the memory tower; the figure is its cost.
        let first = self.bottom.layers[0].forward_flops();
        FlopCount {
            forward_gemm: fwd,
            backward_gemm: 2 * fwd - first,
            interaction: self.interaction.forward_flops()
                + self.interaction.backward_flops()
                + if self.config.fm {
                    crate::fm::flops(self.config.num_tables, self.config.embedding_dim)
                } else {
                    0
                }
                + self.wide.as_ref().map_or(0, |w| 3 * w.forward_flops()),
        }
    }

    /// A workspace for batches of up to `max_batch` samples.
    pub fn workspace(&self, max_batch: usize) -> Workspace {
        Workspace::new(self, max_batch)
    }

    fn check(&self, dense_x: &[f32], emb: &[f32], ws: &Workspace) -> Result<usize> {
        let shape_differs = ws.blocks.first().is_some_and(|b| {
            b.bottom_acts.len() != self.bottom.layers.len()
                || b.top_acts.len() != self.top.layers.len()
                || b.adapt_acts.len() != self.adapt.as_ref().map_or(0, |a| a.layers.len())
                || b.mmoe.as_ref().map_or(0, |a| a.gates.len())
                    != self.mmoe.as_ref().map_or(0, Mmoe::tasks)
        });
        if ws.num_params != self.params.len() || shape_differs {
            return Err(ModelError::WorkspaceMismatch);
        }
        let nd = self.config.num_dense();
        let n = dense_x.len() / nd;
        if n * nd != dense_x.len() {
            return Err(ModelError::Shape {
                what: "dense_x",
                expected: n * nd,
                got: dense_x.len(),
            });
        }
        if n > ws.capacity {
            return Err(ModelError::BatchTooLarge {
                batch: n,
                capacity: ws.capacity,
            });
        }
        let te = n * self.emb_width();
        if emb.len() != te {
            return Err(ModelError::Shape {
                what: "emb",
                expected: te,
                got: emb.len(),
            });
        }
        Ok(n)
    }

    /// Runs `f` on every row block of the batch in parallel: block `i` gets rows
    /// `i * BLOCK_ROWS ..` of `dense_x`, `emb`, the labels (empty when not given) and the
    /// workspace's `d_emb`. Allocates nothing: results stay in the blocks.
    fn for_blocks(
        &self,
        inputs: BlockInputs<'_>,
        ws: &mut Workspace,
        f: impl Fn(&Self, &mut Block, BlockInputs<'_>, &mut [f32]) + Sync,
    ) {
        ws.tower = inputs.tower;
        let n = inputs.n;
        let (nd, te) = (self.config.num_dense(), self.emb_width());
        let extra = self.tasks() - 1;
        let used = n.div_ceil(BLOCK_ROWS);
        // `te > 0` (validated), so there is one `d_emb` chunk per used block.
        ws.blocks[..used]
            .par_iter_mut()
            .zip(ws.d_emb[..n * te].par_chunks_mut(BLOCK_ROWS * te))
            .enumerate()
            .for_each(|(i, (block, d_emb))| {
                let r0 = i * BLOCK_ROWS;
                let r1 = (r0 + BLOCK_ROWS).min(n);
                let part = BlockInputs {
                    n: r1 - r0,
                    dense_x: &inputs.dense_x[r0 * nd..r1 * nd],
                    emb: &inputs.emb[r0 * te..r1 * te],
                    labels: inputs.labels.get(r0..r1).unwrap_or(&[]),
                    task_labels: inputs
                        .task_labels
                        .get(r0 * extra..r1 * extra)
                        .unwrap_or(&[]),
                    weights: inputs.weights.get(r0..r1).unwrap_or(&[]),
                    grad_scale: inputs.grad_scale,
                    tower: inputs.tower,
                    dropout: inputs.dropout.map(|d| Dropout {
                        row0: r0 as u64,
                        ..d
                    }),
                    training: inputs.training,
                };
                f(self, block, part, d_emb)
            });
    }

    /// Floats of one sample's embedding input (`T * d`).
    fn emb_width(&self) -> usize {
        self.config.num_tables * self.config.row_width()
    }

    fn forward_inner(
        &self,
        dense_x: &[f32],
        emb: &[f32],
        n: usize,
        tower: Tower,
        ws: &mut Workspace,
    ) {
        let inputs = BlockInputs {
            n,
            dense_x,
            emb,
            labels: &[],
            task_labels: &[],
            weights: &[],
            grad_scale: 0.0,
            tower,
            dropout: None,
            training: false,
        };
        self.for_blocks(inputs, ws, |m, block, part, _| block.forward(m, part));
        ws.gather_logits(n);
    }

    /// Forward pass for `n = dense_x.len() / num_dense` samples: `dense_x [n, num_dense]`,
    /// `emb [n, T, d]`. Returns the logits `[n]` (stored in the workspace) of the serving
    /// tower ([`DenseDlrm::serving_tower`]).
    pub fn forward<'w>(
        &self,
        dense_x: &[f32],
        emb: &[f32],
        ws: &'w mut Workspace,
    ) -> Result<&'w [f32]> {
        self.forward_tower(dense_x, emb, self.serving_tower(), ws)
    }

    /// [`DenseDlrm::forward`] to the logits of `tower`.
    pub fn forward_tower<'w>(
        &self,
        dense_x: &[f32],
        emb: &[f32],
        tower: Tower,
        ws: &'w mut Workspace,
    ) -> Result<&'w [f32]> {
        if tower == Tower::Adapt && self.adapt.is_none() {
            return Err(ModelError::NoAdaptTower);
        }
        let n = self.check(dense_x, emb, ws)?;
        self.forward_inner(dense_x, emb, n, tower, ws);
        Ok(ws.logits())
    }

    /// Forward pass writing probabilities `sigmoid(logit)` into `probs [n]`.
    pub fn predict(
        &self,
        dense_x: &[f32],
        emb: &[f32],
        ws: &mut Workspace,
        probs: &mut [f32],
    ) -> Result<()> {
        self.predict_first_tasks(dense_x, emb, ws, probs, 1)
    }

    /// Forward pass writing every task's probabilities, row-major `[n, T]`, into `probs`
    /// (for one task the same as [`DenseDlrm::predict`]).
    pub fn predict_tasks(
        &self,
        dense_x: &[f32],
        emb: &[f32],
        ws: &mut Workspace,
        probs: &mut [f32],
    ) -> Result<()> {
        self.predict_first_tasks(dense_x, emb, ws, probs, self.tasks())
    }

    /// Forward pass writing the probabilities of tasks `0..tasks`, row-major
    /// `[n, tasks]`, into `probs` (task 0's are the serving tower's).
    fn predict_first_tasks(
        &self,
        dense_x: &[f32],
        emb: &[f32],
        ws: &mut Workspace,
        probs: &mut [f32],
        tasks: usize,
    ) -> Result<()> {
        let n = self.forward(dense_x, emb, ws)?.len();
        if probs.len() != n * tasks {
            return Err(ModelError::Shape {
                what: "probs",
                expected: n * tasks,
                got: probs.len(),
            });
        }
        for t in 0..tasks {
            for (row, &l) in probs.chunks_exact_mut(tasks).zip(ws.task_logits(t)) {
                row[t] = sigmoid(l);
            }
        }
        Ok(())
    }

    /// Forward + backward of the mean BCE loss. Returns the loss; afterwards
    /// [`Workspace::grads`] holds the dense gradient (flat, same layout as the params,
    /// overwritten, not accumulated), [`Workspace::d_emb`] the gradient w.r.t. `emb`
    /// (`[n, T, d]`, for the sparse update) and [`Workspace::logits`] the logits.
    pub fn forward_backward(
        &self,
        dense_x: &[f32],
        emb: &[f32],
        labels: &[f32],
        ws: &mut Workspace,
    ) -> Result<f32> {
        self.forward_backward_tasks(dense_x, emb, labels, &[], ws)
    }

    /// [`DenseDlrm::forward_backward`] of a multi-task model: `labels [n]` are task 0's,
    /// `task_labels [n, T - 1]` (row-major) the other tasks'; empty for one task. The
    /// loss (returned, and differentiated) is the sum of the tasks' mean BCE.
    pub fn forward_backward_tasks(
        &self,
        dense_x: &[f32],
        emb: &[f32],
        labels: &[f32],
        task_labels: &[f32],
        ws: &mut Workspace,
    ) -> Result<f32> {
        self.forward_backward_tower(dense_x, emb, labels, task_labels, Tower::Memory, ws)
    }

    /// [`DenseDlrm::forward_backward_tasks`] of one tower: `Tower::Memory` trains the top
    /// MLP (and a multi-task model's other towers), `Tower::Adapt` an MTRM's adapt tower
    /// (see [`Tower`]). The other tower's gradient is zero, and so is, in an adapt step,
    /// everything that reaches the memory tower only through `h_M`.
    pub fn forward_backward_tower(
        &self,
        dense_x: &[f32],
        emb: &[f32],
        labels: &[f32],
        task_labels: &[f32],
        tower: Tower,
        ws: &mut Workspace,
    ) -> Result<f32> {
        let labels = Labels {
            labels,
            task_labels,
            weights: &[],
        };
        self.forward_backward_weighted(dense_x, emb, labels, tower, ws)
    }

    /// [`DenseDlrm::forward_backward_tower`] of a weighted loss: each sample's BCE counts
    /// `labels.weights[i]` times (empty: once), and the loss (returned, and differentiated)
    /// is the weighted mean, `sum(w l) / sum(w)` per task. Scaling every weight by the
    /// same factor leaves the step unchanged; a weight of 0 leaves its sample out of the
    /// gradient. A batch whose weights sum to 0 has loss 0 and a zero gradient.
    pub fn forward_backward_weighted(
        &self,
        dense_x: &[f32],
        emb: &[f32],
        labels: Labels<'_>,
        tower: Tower,
        ws: &mut Workspace,
    ) -> Result<f32> {
        let Labels {
            labels,
            task_labels,
            weights,
        } = labels;
        if tower == Tower::Adapt && self.adapt.is_none() {
            return Err(ModelError::NoAdaptTower);
        }
        let n = self.check(dense_x, emb, ws)?;
        if labels.len() != n {
            return Err(ModelError::Shape {
                what: "labels",
                expected: n,
                got: labels.len(),
            });
        }
        if task_labels.len() != n * (self.tasks() - 1) {
            return Err(ModelError::Shape {
                what: "task_labels (the labels of tasks 1.. of a multi-task model)",
                expected: n * (self.tasks() - 1),
                got: task_labels.len(),
            });
        }
        if !weights.is_empty() && weights.len() != n {
            return Err(ModelError::Shape {
                what: "weights (one per sample)",
                expected: n,
                got: weights.len(),
            });
        }
        if let Some(i) = weights.iter().position(|w| !(w.is_finite() && *w >= 0.0)) {
            return Err(ModelError::BadWeight {
                row: i,
                value: weights[i].to_string(),
            });
        }
        let total_weight = if weights.is_empty() {
            n as f64
        } else {
            weights.iter().map(|&w| f64::from(w)).sum()
        };
        // Every training step draws new dropout masks (a function of the workspace's
        // stream and step count, so runs repeat exactly).
        ws.steps += 1;
        let dropout = (self.config.dropout > 0.0).then(|| Dropout {
            rate: self.config.dropout,
            seed: elastrec_common::splitmix::derive(ws.dropout_stream, ws.steps),
            row0: 0,
        });
        let inputs = BlockInputs {
            n,
            dense_x,
            emb,
            labels,
            task_labels,
            weights,
            grad_scale: if total_weight > 0.0 {
                (1.0 / total_weight) as f32
            } else {
                0.0
            },
            tower,
            dropout,
            training: true,
        };
        self.for_blocks(inputs, ws, |m, block, part, d_emb| {
            block.forward(m, part);
            block.backward(m, part, d_emb);
        });
        let used = n.div_ceil(BLOCK_ROWS);
        ws.gather_logits(n);
        ws.reduce_grads(used);
        // Block order, so the sum does not depend on the thread count.
        let loss_sum: f64 = ws.blocks[..used].iter().map(|b| b.loss_sum).sum();
        Ok(if total_weight > 0.0 {
            (loss_sum / total_weight) as f32
        } else {
            0.0
        })
    }
}

/// What a training step learns from: task 0's labels `[n]`, the other tasks' `[n, T - 1]`
/// (empty for one task) and each sample's weight `[n]` (empty: 1 each).
#[derive(Clone, Copy, Debug, Default)]
pub struct Labels<'a> {
    /// Task 0's labels.
    pub labels: &'a [f32],
    /// Tasks `1..T`, row-major.
    pub task_labels: &'a [f32],
    /// Sample weights.
    pub weights: &'a [f32],
}

/// Rows of the batch one task computes start to finish on one thread (a multiple of the
/// interaction kernels' sample lanes). Fixed rather than derived from the thread count, so
/// a step gives bit-identical results on any number of threads: blocks only differ in
/// which thread runs them, and their gradients are summed in block order.
pub const BLOCK_ROWS: usize = 256;
