//! One row block of a step: its activations, temporaries and partial gradient, and its
//! forward and backward passes.

use super::*;

/// One row block's slices of a step's inputs.
#[derive(Clone, Copy)]
pub(super) struct BlockInputs<'a> {
    pub(super) n: usize,
    pub(super) dense_x: &'a [f32],
    pub(super) emb: &'a [f32],
    pub(super) labels: &'a [f32],
    /// The labels of tasks `1..T`, `[n, T - 1]` (empty for one task).
    pub(super) task_labels: &'a [f32],
    /// Each sample's weight in the loss, `[n]` (empty: 1 each).
    pub(super) weights: &'a [f32],
    /// Factor of `dlogits` (`1 / sum of the weights`, so the blocks' gradients add up to
    /// the weighted mean's).
    pub(super) grad_scale: f32,
    /// The tower whose logit is computed (and trained).
    pub(super) tower: Tower,
    /// The top MLP's dropout in a training step (its `row0` is the block's first row);
    /// `None` when predicting.
    pub(super) dropout: Option<Dropout>,
    /// A training step (batch norms normalize with the block's statistics) rather than a
    /// prediction (with their running ones).
    pub(super) training: bool,
}

/// Activations, temporaries and the partial dense gradient of one row block.
#[derive(Clone, Debug)]
pub(super) struct Block {
    /// The standardized dense features (empty when the model does not standardize).
    pub(super) dense_in: Vec<f32>,
    /// First-order term: the embeddings without their rows' weights (`[rows, T, d]`),
    /// their gradient, and the dense linear layer's output (all empty without it).
    pub(super) emb_d: Vec<f32>,
    pub(super) d_emb_d: Vec<f32>,
    pub(super) wide_out: Vec<f32>,
    pub(super) bottom_acts: Vec<Vec<f32>>,
    /// The norms' saved rows (empty without `layer_norm` or `batch_norm`).
    pub(super) bottom_norm: Vec<crate::norm::NormActs>,
    pub(super) top_norm: Vec<crate::norm::NormActs>,
    pub(super) inter: Vec<f32>,
    /// DCN-v2: the cross layers' activations and the gradient w.r.t. their output.
    pub(super) cross: CrossActs,
    pub(super) d_cross: Vec<f32>,
    pub(super) top_acts: Vec<Vec<f32>>,
    /// MTRM: the adapt tower's input `[inter, h_M]`, its activations, and the gradient
    /// w.r.t. its input.
    pub(super) adapt_in: Vec<f32>,
    pub(super) adapt_acts: Vec<Vec<f32>>,
    pub(super) d_adapt_in: Vec<f32>,
    /// The MMoE head's buffers (`None` for one task).
    pub(super) mmoe: Option<MmoeActs>,
    pub(super) dlogits: Vec<f32>,
    pub(super) d_inter: Vec<f32>,
    pub(super) d_bottom: Vec<f32>,
    pub(super) ga: Vec<f32>,
    pub(super) gb: Vec<f32>,
    pub(super) grads: Vec<f32>,
    /// Summed loss of the block's rows in the last `backward`.
    pub(super) loss_sum: f64,
}

impl Block {
    pub(super) fn new(model: &DenseDlrm, rows: usize) -> Self {
        let acts = |m: &Mlp| -> Vec<Vec<f32>> {
            m.layers
                .iter()
                .map(|l| vec![0.0; rows * l.out_dim])
                .collect()
        };
        let adapt_w = model.adapt.as_ref().map_or(0, Mlp::max_width);
        let max_w = model
            .bottom
            .max_width()
            .max(model.top.max_width())
            .max(adapt_w)
            .max(model.mmoe.as_ref().map_or(0, Mmoe::max_width));
        let adapt_in = model.adapt.as_ref().map_or(0, |a| rows * a.in_dim());
        let standardizes = !model.config.dense_scale.is_empty();
        Self {
            dense_in: if standardizes {
                vec![0.0; rows * model.config.num_dense()]
            } else {
                Vec::new()
            },
            emb_d: first_order_buf(model, rows),
            d_emb_d: first_order_buf(model, rows),
            wide_out: if model.config.first_order {
                vec![0.0; rows]
            } else {
                Vec::new()
            },
            bottom_acts: acts(&model.bottom),
            bottom_norm: model.bottom.norm_acts(rows),
            top_norm: model.top.norm_acts(rows),
            inter: vec![0.0; rows * model.interaction.out_dim()],
            cross: model.cross.acts(rows),
            d_cross: if model.cross.layers.is_empty() {
                Vec::new()
            } else {
                vec![0.0; rows * model.interaction.out_dim()]
            },
            top_acts: acts(&model.top),
            adapt_in: vec![0.0; adapt_in],
            adapt_acts: model.adapt.as_ref().map_or_else(Vec::new, acts),
            d_adapt_in: vec![0.0; adapt_in],
            mmoe: model.mmoe.as_ref().map(|h| h.acts(rows)),
            dlogits: vec![0.0; rows],
            d_inter: vec![0.0; rows * model.interaction.out_dim()],
            d_bottom: vec![0.0; rows * model.bottom.out_dim()],
            ga: vec![0.0; rows * max_w],
            gb: vec![0.0; rows * max_w],
            grads: vec![0.0; model.num_params()],
            loss_sum: 0.0,
        }
    }

    pub(super) fn forward(&mut self, m: &DenseDlrm, x: BlockInputs<'_>) {
        let p = &m.params;
        let c = &m.config;
        // A block's statistics weigh in a step's running averages by its share of rows.
        let mode = if x.training {
            NormMode::Training {
                weight: x.n as f32 * x.grad_scale,
            }
        } else {
            NormMode::Inference
        };
        let dense_x = if c.dense_scale.is_empty() {
            x.dense_x
        } else {
            let nd = c.num_dense();
            let out = &mut self.dense_in[..x.n * nd];
            for (o, row) in out.chunks_exact_mut(nd).zip(x.dense_x.chunks_exact(nd)) {
                for (((o, &v), &shift), &scale) in o
                    .iter_mut()
                    .zip(row)
                    .zip(&c.dense_shift)
                    .zip(&c.dense_scale)
                {
                    *o = (v - shift) * scale;
                }
            }
            &*out
        };
        m.bottom.forward_full(
            p,
            dense_x,
            x.n,
            &mut self.bottom_acts,
            &mut self.bottom_norm,
            None,
            mode,
        );
        let (t, d) = (c.num_tables, c.embedding_dim);
        let emb = if c.first_order {
            // The interaction and the FM term read `[n, T, d]`: the rows without weights.
            let out = &mut self.emb_d[..x.n * t * d];
            for (o, row) in out.chunks_exact_mut(d).zip(x.emb.chunks_exact(d + 1)) {
                o.copy_from_slice(&row[..d]);
            }
            &*out
        } else {
            x.emb
        };
        let z = self.bottom_acts.last().expect("nonempty");
        m.interaction.forward(z, emb, x.n, &mut self.inter);
        m.cross.forward(p, &self.inter, x.n, &mut self.cross);
        let mut top_in = m.cross.output(&self.cross, &self.inter);
        let dropout = x.dropout.filter(|_| x.tower == Tower::Memory);
        if let (Some(head), Some(a)) = (&m.mmoe, &mut self.mmoe) {
            head.forward(p, top_in, x.n, a, dropout, mode);
            top_in = &a.mixes[0];
        }
        m.top.forward_full(
            p,
            top_in,
            x.n,
            &mut self.top_acts,
            &mut self.top_norm,
            dropout,
            mode,
        );
        if c.fm {
            let logits = self.top_acts.last_mut().expect("nonempty");
            crate::fm::forward(emb, x.n, t, d, &mut logits[..x.n]);
        }
        if let Some(wide) = &m.wide {
            wide.forward(p, dense_x, x.n, &mut self.wide_out);
            let logits = self.top_acts.last_mut().expect("nonempty");
            for ((l, &w), rows) in logits[..x.n]
                .iter_mut()
                .zip(&self.wide_out)
                .zip(x.emb.chunks_exact(t * (d + 1)))
            {
                *l += w + rows.chunks_exact(d + 1).map(|r| r[d]).sum::<f32>();
            }
        }
        if let (Tower::Adapt, Some(adapt)) = (x.tower, &m.adapt) {
            // [inter, h_M] per row: the interaction output and the memory tower's logit.
            let w = m.interaction.out_dim();
            let h_m = self.top_acts.last().expect("nonempty");
            for (r, row) in self.adapt_in[..x.n * (w + 1)]
                .chunks_exact_mut(w + 1)
                .enumerate()
            {
                row[..w].copy_from_slice(&self.inter[r * w..(r + 1) * w]);
                row[w] = h_m[r];
            }
            adapt.forward(p, &self.adapt_in, x.n, &mut self.adapt_acts);
        }
    }

    /// The logits of the tower the last forward ran for.
    pub(super) fn logits(&self, tower: Tower) -> &[f32] {
        tower_logits(&self.top_acts, &self.adapt_acts, tower)
    }

    /// Backward of the block's share of the mean loss, after [`Block::forward`]: the
    /// block's partial dense gradient into `self.grads`, its embedding gradient into
    /// `d_emb`, its summed loss into `self.loss_sum`.
    pub(super) fn backward(&mut self, m: &DenseDlrm, x: BlockInputs<'_>, d_emb: &mut [f32]) {
        let (p, n) = (&m.params, x.n);
        // Not `self.logits`: `dlogits` is borrowed mutably beside it.
        let logits = tower_logits(&self.top_acts, &self.adapt_acts, x.tower);
        // Task 0's weight in a multi-task loss (1 for every other model).
        let w0 = m.mmoe.as_ref().map_or(1.0, |h| h.weights[0]);
        self.loss_sum = f64::from(w0)
            * bce_sum_with_logits(
                &logits[..n],
                x.labels,
                x.weights,
                x.grad_scale * w0,
                &mut self.dlogits[..n],
            );
        match (x.tower, &m.adapt) {
            (Tower::Adapt, Some(adapt)) => self.backward_adapt(m, adapt, n),
            _ => {
                let crossed = !m.cross.layers.is_empty();
                let d_top_in = if crossed {
                    &mut self.d_cross
                } else {
                    &mut self.d_inter
                };
                // The top MLP reads the interaction (or cross layers') output, or, with
                // an MMoE head, task 0's mixture of the experts.
                let head_in = m.cross.output(&self.cross, &self.inter);
                let (top_in, d_top): (&[f32], &mut [f32]) = match &mut self.mmoe {
                    Some(a) => (&a.mixes[0], &mut a.d_mixes[0]),
                    None => (head_in, &mut *d_top_in),
                };
                m.top.backward_full(
                    p,
                    &mut self.grads,
                    top_in,
                    &self.top_acts,
                    &self.top_norm,
                    &mut self.dlogits,
                    &mut self.ga,
                    &mut self.gb,
                    Some(d_top),
                    n,
                    x.dropout,
                );
                if let (Some(head), Some(a)) = (&m.mmoe, &mut self.mmoe) {
                    self.loss_sum += head.backward(
                        p,
                        &mut self.grads,
                        head_in,
                        a,
                        (x.task_labels, x.weights, x.grad_scale),
                        d_top_in,
                        &mut self.ga,
                        &mut self.gb,
                        n,
                        x.dropout,
                    );
                }
                if crossed {
                    m.cross.backward(
                        p,
                        &mut self.grads,
                        &self.inter,
                        &mut self.cross,
                        &self.d_cross,
                        &mut self.d_inter,
                        n,
                    );
                }
                if m.adapt.is_some() {
                    self.grads[m.tower_range(Tower::Adapt)].fill(0.0);
                }
            }
        }
        let z = self.bottom_acts.last().expect("nonempty");
        let c = &m.config;
        let (t, d) = (c.num_tables, c.embedding_dim);
        // Without the first-order term the embedding gradient is written in place; with
        // it, into `[n, T, d]` first, then spread over the `d + 1`-float rows.
        let (emb, d_emb_d): (&[f32], &mut [f32]) = if c.first_order {
            (&self.emb_d[..n * t * d], &mut self.d_emb_d[..n * t * d])
        } else {
            (x.emb, &mut *d_emb)
        };
        m.interaction
            .backward(z, emb, &self.d_inter, n, &mut self.d_bottom, d_emb_d);
        if c.fm {
            // The FM term reads the embeddings directly: its gradient joins theirs.
            crate::fm::backward(emb, &self.dlogits[..n], n, t, d, d_emb_d);
        }
        let dense_x = if c.dense_scale.is_empty() {
            x.dense_x
        } else {
            &self.dense_in[..n * c.num_dense()]
        };
        if let Some(wide) = &m.wide {
            // ∂logit/∂w[id_t] = 1: each row's weight gets the sample's dlogit.
            for ((rows, grads), &g) in d_emb[..n * t * (d + 1)]
                .chunks_exact_mut(t * (d + 1))
                .zip(self.d_emb_d.chunks_exact(t * d))
                .zip(&self.dlogits[..n])
            {
                for (row, gd) in rows.chunks_exact_mut(d + 1).zip(grads.chunks_exact(d)) {
                    row[..d].copy_from_slice(gd);
                    row[d] = g;
                }
            }
            // Activation `None`: the layer leaves `dlogits` as it is.
            wide.backward(
                p,
                &mut self.grads,
                dense_x,
                &self.wide_out,
                &mut self.dlogits,
                None,
                n,
            );
        }
        m.bottom.backward_full(
            p,
            &mut self.grads,
            dense_x,
            &self.bottom_acts,
            &self.bottom_norm,
            &mut self.d_bottom,
            &mut self.ga,
            &mut self.gb,
            None,
            n,
            None,
        );
    }

    /// The adapt tower's share of [`Block::backward`]: its gradient, and the
    /// interaction's from it (the memory tower's `h_M` column gets none).
    pub(super) fn backward_adapt(&mut self, m: &DenseDlrm, adapt: &Mlp, n: usize) {
        adapt.backward(
            &m.params,
            &mut self.grads,
            &self.adapt_in,
            &self.adapt_acts,
            &mut self.dlogits,
            &mut self.ga,
            &mut self.gb,
            Some(&mut self.d_adapt_in),
            n,
        );
        let w = m.interaction.out_dim();
        for (d, g) in self.d_inter[..n * w]
            .chunks_exact_mut(w)
            .zip(self.d_adapt_in.chunks_exact(w + 1))
        {
            d.copy_from_slice(&g[..w]);
        }
        self.grads[m.tower_range(Tower::Memory)].fill(0.0);
    }

    /// Rows this block holds activations for.
    pub(super) fn rows(&self) -> usize {
        self.dlogits.len()
    }
}

/// A first-order buffer of `rows` samples' embeddings without weights (`[rows, T, d]`);
/// empty for a model without the term.
pub(super) fn first_order_buf(model: &DenseDlrm, rows: usize) -> Vec<f32> {
    let c = &model.config;
    if c.first_order {
        vec![0.0; rows * c.num_tables * c.embedding_dim]
    } else {
        Vec::new()
    }
}

/// The last layer's output (the logits) of `tower`, from a block's activations.
pub(super) fn tower_logits<'a>(
    top: &'a [Vec<f32>],
    adapt: &'a [Vec<f32>],
    tower: Tower,
) -> &'a [f32] {
    match tower {
        Tower::Memory => top.last().expect("nonempty"),
        Tower::Adapt => adapt.last().expect("an MTRM"),
    }
}
