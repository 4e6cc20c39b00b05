//! The dense part of DLRM: bottom MLP, interaction, top MLP, BCE loss.

use crate::attention::{AttentionActs, AttentionConfig, TargetAttention};
use crate::cross::{CrossActs, CrossNet};
use crate::error::{ModelError, Result};
use crate::interaction::{Interaction, InteractionKind};
use rayon::prelude::*;

use crate::layers::{sigmoid, Activation, Dropout, Linear, Mlp};
use crate::loss::bce_sum_with_logits;
use crate::mmoe::{Mmoe, MmoeActs, MmoeConfig, MAX_TASKS};
use crate::norm::{NormKind, NormMode};

/// Configuration of the dense DLRM.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DlrmConfig {
    /// Bottom MLP sizes including the dense-feature input, e.g. `[13, 512, 256, 64, 16]`.
    pub bottom: Vec<usize>,
    /// Top MLP sizes excluding the input (derived from the interaction), ending with 1,
    /// e.g. `[512, 256, 1]`.
    pub top: Vec<usize>,
    /// Number of embedding tables `T` (one vector per table per sample).
    pub num_tables: usize,
    /// Embedding dimension `d`.
    pub embedding_dim: usize,
    /// Interaction between bottom output and embeddings.
    #[serde(default = "default_interaction")]
    pub interaction: InteractionKind,
    /// Seed of the deterministic initialization.
    #[serde(default)]
    pub seed: u64,
    /// MTRM (Primus §5.1): sizes of the adapt tower excluding its input, ending with 1;
    /// empty for a plain DLRM. The top MLP is then the memory tower; the adapt tower reads
    /// the interaction output and the memory tower's logit (see [`Tower`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adapt: Vec<usize>,
    /// DCN-v2 cross layers between the interaction and the top MLP ([`crate::CrossNet`]);
    /// 0 for a plain DLRM. Their parameters follow every other layer's.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cross_layers: usize,
    /// DeepFM: the embeddings' factorization-machine term ([`crate::fm`]) is added to the
    /// logit of the top MLP (the deep part). No parameters of its own.
    #[serde(default, skip_serializing_if = "is_false")]
    pub fm: bool,
    /// Standardization of the dense features in front of the bottom MLP: the model reads
    /// `(x - dense_shift) * dense_scale` per feature (a training set's means and inverse
    /// standard deviations). Both empty (the default): the features as given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dense_shift: Vec<f32>,
    /// See `dense_shift`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dense_scale: Vec<f32>,
    /// Dropout rate of the top MLP's hidden activations while training (inverted
    /// dropout: kept units are scaled by `1 / (1 - p)`, so predictions use every unit
    /// unscaled). 0: none.
    #[serde(default, skip_serializing_if = "is_zero_f32")]
    pub dropout: f32,
    /// The first-order (wide, linear) term added to the logit: one weight per embedding
    /// row, stored as the row's last float (a row is `embedding_dim + 1` floats, so the
    /// weight lives, is optimized, sharded and checkpointed with its row), plus a linear
    /// layer over the dense features (`nd` weights and a bias, after every other
    /// parameter): `logit += Σ_t w[id_t] + v · x + c`. Wide & Deep's wide part and the
    /// first-order term of an FM (DeepFM).
    #[serde(default, skip_serializing_if = "is_false")]
    pub first_order: bool,
    /// Layer normalization of every hidden layer of the bottom and top MLPs
    /// (`Linear → LayerNorm → ReLU`; [`crate::norm`]); `γ`, `β` after every other
    /// parameter.
    #[serde(default, skip_serializing_if = "is_false")]
    pub layer_norm: bool,
    /// Batch normalization of the same hidden layers (`Linear → BatchNorm → ReLU`;
    /// [`crate::norm`]): statistics of each training step's row blocks, running averages
    /// for predictions; `γ`, `β` and the running mean and variance where the layer norms'
    /// parameters would be. Not with `layer_norm`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub batch_norm: bool,
    /// Multi-task MMoE head ([`crate::mmoe`]) between the interaction (or cross layers)
    /// and the towers: experts, a gate per task, and a tower per task with the top MLP's
    /// sizes (task 0's is the top MLP). `None`: one task, the top MLP reads the
    /// interaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmoe: Option<MmoeConfig>,
    /// Target-attention units ([`crate::attention`]): each pools a history into its
    /// embedding slot, scored against a query slot, before any family reads the slots.
    /// Their parameters come last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attention: Vec<AttentionConfig>,
}

fn is_zero_f32(v: &f32) -> bool {
    *v == 0.0
}

fn is_false(v: &bool) -> bool {
    !*v
}

pub(crate) fn is_zero(v: &usize) -> bool {
    *v == 0
}

/// Which tower a step trains and which logit it returns. A plain DLRM has only the top
/// MLP ([`Tower::Memory`]). An MTRM trains its memory tower (the top MLP) on history
/// batches and its adapt tower on stream batches: the adapt tower reads the interaction
/// output and the memory tower's logit `h_M`, and no gradient flows into the memory tower
/// through `h_M` (Algorithm 1). Predictions of an MTRM come from the adapt tower.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tower {
    /// The top MLP (the memory tower of an MTRM).
    Memory,
    /// The adapt tower of an MTRM.
    Adapt,
}

fn default_interaction() -> InteractionKind {
    InteractionKind::Dot
}

impl DlrmConfig {
    /// The Criteo-Kaggle model of the DLRM paper: bottom 13-512-256-64-16, 26 tables of
    /// dim 16, dot interaction, top 512-256-1.
    pub fn criteo_kaggle() -> Self {
        Self {
            bottom: vec![13, 512, 256, 64, 16],
            top: vec![512, 256, 1],
            num_tables: 26,
            embedding_dim: 16,
            interaction: InteractionKind::Dot,
            seed: 0,
            adapt: Vec::new(),
            cross_layers: 0,
            fm: false,
            dense_shift: Vec::new(),
            dense_scale: Vec::new(),
            dropout: 0.0,
            first_order: false,
            layer_norm: false,
            batch_norm: false,
            mmoe: None,
            attention: Vec::new(),
        }
    }

    /// Checks the configuration.
    pub fn validate(&self) -> Result<()> {
        if self.bottom.len() < 2 {
            return Err(ModelError::MlpTooShort {
                mlp: "bottom",
                min: 2,
                got: self.bottom.len(),
            });
        }
        if self.top.is_empty() {
            return Err(ModelError::MlpTooShort {
                mlp: "top",
                min: 1,
                got: 0,
            });
        }
        if let Some(index) = self.bottom.iter().position(|&s| s == 0) {
            return Err(ModelError::ZeroWidth {
                mlp: "bottom",
                index,
            });
        }
        if let Some(index) = self.top.iter().position(|&s| s == 0) {
            return Err(ModelError::ZeroWidth { mlp: "top", index });
        }
        if let Some(index) = self.adapt.iter().position(|&s| s == 0) {
            return Err(ModelError::ZeroWidth {
                mlp: "adapt",
                index,
            });
        }
        if let Some(&last) = self.adapt.last() {
            if last != 1 {
                return Err(ModelError::TopOutputNotOne { got: last });
            }
        }
        let extras = self.cross_layers > 0
            || self.fm
            || self.first_order
            || self.layer_norm
            || self.batch_norm;
        if extras && !self.adapt.is_empty() {
            return Err(ModelError::CrossWithAdapt);
        }
        if self.layer_norm && self.batch_norm {
            return Err(ModelError::TwoNorms);
        }
        if let Some(h) = &self.mmoe {
            if !(1..=MAX_TASKS).contains(&h.tasks) {
                return Err(ModelError::BadMmoe {
                    why: format!("tasks must be 1 to {MAX_TASKS}, got {}", h.tasks),
                });
            }
            if h.experts == 0 || h.expert.is_empty() || h.expert.contains(&0) {
                return Err(ModelError::BadMmoe {
                    why: "it needs at least one expert of at least one layer, each at least 1 wide"
                        .into(),
                });
            }
            h.check_weights()
                .map_err(|why| ModelError::BadMmoe { why })?;
            if !self.adapt.is_empty() || self.fm || self.first_order {
                return Err(ModelError::BadMmoe {
                    why: "an MMoE does not combine with an MTRM adapt tower, the FM term or \
                          the first-order term (they would reach task 0 only)"
                        .into(),
                });
            }
        }
        if self.num_tables == 0 {
            return Err(ModelError::ZeroEmbedding { what: "num_tables" });
        }
        if self.embedding_dim == 0 {
            return Err(ModelError::ZeroEmbedding {
                what: "embedding_dim",
            });
        }
        let last = *self.top.last().expect("nonempty");
        if last != 1 {
            return Err(ModelError::TopOutputNotOne { got: last });
        }
        self.validate_attention()?;
        let nd = self.bottom[0];
        for (what, v) in [
            ("dense_shift", &self.dense_shift),
            ("dense_scale", &self.dense_scale),
        ] {
            if v.len() != nd && !(self.dense_shift.is_empty() && self.dense_scale.is_empty()) {
                return Err(ModelError::Shape {
                    what,
                    expected: nd,
                    got: v.len(),
                });
            }
            if let Some(index) = v.iter().position(|x| !x.is_finite()) {
                return Err(ModelError::BadNormalization { what, index });
            }
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(ModelError::BadDropout {
                got: self.dropout.to_string(),
            });
        }
        let bottom_out = *self.bottom.last().expect("nonempty");
        if self.interaction == InteractionKind::Dot && bottom_out != self.embedding_dim {
            return Err(ModelError::DotDimMismatch {
                bottom_out,
                embedding_dim: self.embedding_dim,
            });
        }
        Ok(())
    }

    fn validate_attention(&self) -> Result<()> {
        let bad = |why: String| Err(ModelError::BadAttention { why });
        let mut pooled = std::collections::HashSet::new();
        for a in &self.attention {
            if a.slot >= self.num_tables || a.query >= self.num_tables {
                return bad(format!(
                    "slot {} or query {} is not one of the model's {} embedding slots",
                    a.slot, a.query, self.num_tables
                ));
            }
            if a.slot == a.query {
                return bad(format!("slot {} attends to itself", a.slot));
            }
            if !pooled.insert(a.slot) {
                return bad(format!("slot {} is pooled by two units", a.slot));
            }
            if a.max_len == 0 || a.mlp.contains(&0) {
                return bad("max_len and every MLP width must be at least 1".into());
            }
            if let Some(why) = a
                .transformer
                .as_ref()
                .and_then(|t| t.check(self.embedding_dim))
            {
                return bad(format!("the transformer of slot {}: {why}", a.slot));
            }
        }
        if let Some(a) = self.attention.iter().find(|a| pooled.contains(&a.query)) {
            return bad(format!(
                "the query of slot {} is slot {}, itself a pooled history",
                a.slot, a.query
            ));
        }
        Ok(())
    }

    /// Number of dense input features (`bottom[0]`).
    pub fn num_dense(&self) -> usize {
        self.bottom[0]
    }

    /// Floats per embedding row the model reads: `embedding_dim`, plus the row's
    /// first-order weight when [`DlrmConfig::first_order`].
    pub fn row_width(&self) -> usize {
        self.embedding_dim + usize::from(self.first_order)
    }

    /// Tasks (labels) the model predicts: 1 unless it has an MMoE head.
    pub fn tasks(&self) -> usize {
        self.mmoe.as_ref().map_or(1, |h| h.tasks)
    }

    /// The norm of the hidden layers, if any.
    pub fn norm(&self) -> Option<NormKind> {
        if self.batch_norm {
            Some(NormKind::Batch)
        } else if self.layer_norm {
            Some(NormKind::Layer)
        } else {
            None
        }
    }
}

/// Analytic FLOP count per sample (multiply-add = 2 FLOPs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlopCount {
    /// GEMM FLOPs of the forward pass.
    pub forward_gemm: u64,
    /// GEMM FLOPs of the backward pass (weight grads everywhere, input grads except
    /// for the first bottom layer).
    pub backward_gemm: u64,
    /// Interaction FLOPs, forward + backward.
    pub interaction: u64,
}

impl FlopCount {
    /// Everything.
    pub fn total(&self) -> u64 {
        self.forward_gemm + self.backward_gemm + self.interaction
    }
}

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

/// One row block's slices of a step's inputs.
#[derive(Clone, Copy)]
struct BlockInputs<'a> {
    n: usize,
    dense_x: &'a [f32],
    emb: &'a [f32],
    labels: &'a [f32],
    /// The labels of tasks `1..T`, `[n, T - 1]` (empty for one task).
    task_labels: &'a [f32],
    /// Each sample's weight in the loss, `[n]` (empty: 1 each).
    weights: &'a [f32],
    /// Factor of `dlogits` (`1 / sum of the weights`, so the blocks' gradients add up to
    /// the weighted mean's).
    grad_scale: f32,
    /// The tower whose logit is computed (and trained).
    tower: Tower,
    /// The top MLP's dropout in a training step (its `row0` is the block's first row);
    /// `None` when predicting.
    dropout: Option<Dropout>,
    /// A training step (batch norms normalize with the block's statistics) rather than a
    /// prediction (with their running ones).
    training: bool,
}

/// Activations, temporaries and the partial dense gradient of one row block.
#[derive(Clone, Debug)]
struct Block {
    /// The standardized dense features (empty when the model does not standardize).
    dense_in: Vec<f32>,
    /// First-order term: the embeddings without their rows' weights (`[rows, T, d]`),
    /// their gradient, and the dense linear layer's output (all empty without it).
    emb_d: Vec<f32>,
    d_emb_d: Vec<f32>,
    wide_out: Vec<f32>,
    bottom_acts: Vec<Vec<f32>>,
    /// The norms' saved rows (empty without `layer_norm` or `batch_norm`).
    bottom_norm: Vec<crate::norm::NormActs>,
    top_norm: Vec<crate::norm::NormActs>,
    inter: Vec<f32>,
    /// DCN-v2: the cross layers' activations and the gradient w.r.t. their output.
    cross: CrossActs,
    d_cross: Vec<f32>,
    top_acts: Vec<Vec<f32>>,
    /// MTRM: the adapt tower's input `[inter, h_M]`, its activations, and the gradient
    /// w.r.t. its input.
    adapt_in: Vec<f32>,
    adapt_acts: Vec<Vec<f32>>,
    d_adapt_in: Vec<f32>,
    /// The MMoE head's buffers (`None` for one task).
    mmoe: Option<MmoeActs>,
    dlogits: Vec<f32>,
    d_inter: Vec<f32>,
    d_bottom: Vec<f32>,
    ga: Vec<f32>,
    gb: Vec<f32>,
    grads: Vec<f32>,
    /// Summed loss of the block's rows in the last `backward`.
    loss_sum: f64,
}

impl Block {
    fn new(model: &DenseDlrm, rows: usize) -> Self {
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

    fn forward(&mut self, m: &DenseDlrm, x: BlockInputs<'_>) {
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
    fn logits(&self, tower: Tower) -> &[f32] {
        tower_logits(&self.top_acts, &self.adapt_acts, tower)
    }

    /// Backward of the block's share of the mean loss, after [`Block::forward`]: the
    /// block's partial dense gradient into `self.grads`, its embedding gradient into
    /// `d_emb`, its summed loss into `self.loss_sum`.
    fn backward(&mut self, m: &DenseDlrm, x: BlockInputs<'_>, d_emb: &mut [f32]) {
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
    fn backward_adapt(&mut self, m: &DenseDlrm, adapt: &Mlp, n: usize) {
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
    fn rows(&self) -> usize {
        self.dlogits.len()
    }
}

/// A first-order buffer of `rows` samples' embeddings without weights (`[rows, T, d]`);
/// empty for a model without the term.
fn first_order_buf(model: &DenseDlrm, rows: usize) -> Vec<f32> {
    let c = &model.config;
    if c.first_order {
        vec![0.0; rows * c.num_tables * c.embedding_dim]
    } else {
        Vec::new()
    }
}

/// The last layer's output (the logits) of `tower`, from a block's activations.
fn tower_logits<'a>(top: &'a [Vec<f32>], adapt: &'a [Vec<f32>], tower: Tower) -> &'a [f32] {
    match tower {
        Tower::Memory => top.last().expect("nonempty"),
        Tower::Adapt => adapt.last().expect("an MTRM"),
    }
}

/// Every activation and temporary of a step, allocated once for a maximum batch size:
/// steps do not allocate. Per row block ([`BLOCK_ROWS`]) it holds that block's
/// activations and partial gradient; it also holds the outputs of the last step: logits,
/// the flat dense gradient (the blocks' sum) and the embedding gradient.
#[derive(Clone, Debug)]
pub struct Workspace {
    capacity: usize,
    n: usize,
    /// The tower of the last forward.
    tower: Tower,
    num_params: usize,
    blocks: Vec<Block>,
    logits: Vec<f32>,
    /// The logits of tasks `1..T` of a multi-task model, task after task (`capacity`
    /// each).
    task_logits: Vec<f32>,
    d_emb: Vec<f32>,
    grads: Vec<f32>,
    /// What each attention unit's forward keeps for its backward, per row block.
    attention: Vec<Vec<AttentionActs>>,
    /// Training steps taken with this workspace, and the stream that, with the count,
    /// seeds each step's dropout masks.
    steps: u64,
    dropout_stream: u64,
}

impl Workspace {
    /// Workspace for `model` and batches of at most `capacity` samples.
    pub fn new(model: &DenseDlrm, capacity: usize) -> Self {
        let blocks = (0..capacity.div_ceil(BLOCK_ROWS))
            .map(|i| Block::new(model, (capacity - i * BLOCK_ROWS).min(BLOCK_ROWS)))
            .collect();
        Self {
            capacity,
            n: 0,
            tower: Tower::Memory,
            num_params: model.num_params(),
            blocks,
            logits: vec![0.0; capacity],
            task_logits: vec![0.0; capacity * (model.tasks() - 1)],
            d_emb: vec![0.0; capacity * model.emb_width()],
            grads: vec![0.0; model.num_params()],
            attention: vec![
                vec![AttentionActs::default(); capacity.div_ceil(BLOCK_ROWS)];
                model.attention.len()
            ],
            steps: 0,
            dropout_stream: model.config.seed,
        }
    }

    /// Sets the stream of this workspace's dropout masks and restarts its step count:
    /// trainers that compute gradients side by side (workers of one job) give each a
    /// stream of its own so that their masks differ.
    pub fn set_dropout_stream(&mut self, stream: u64) {
        self.dropout_stream = stream;
        self.steps = 0;
    }

    /// Copies the blocks' logits of the last forward into one `[n]` vector.
    fn gather_logits(&mut self, n: usize) {
        self.n = n;
        for (i, chunk) in self.logits[..n].chunks_mut(BLOCK_ROWS).enumerate() {
            let last = self.blocks[i].logits(self.tower);
            chunk.copy_from_slice(&last[..chunk.len()]);
        }
        let cap = self.capacity;
        for (t, out) in self.task_logits.chunks_exact_mut(cap.max(1)).enumerate() {
            for (i, chunk) in out[..n].chunks_mut(BLOCK_ROWS).enumerate() {
                let a = self.blocks[i].mmoe.as_ref().expect("a multi-task model");
                let last = a.towers[t].last().expect("nonempty");
                chunk.copy_from_slice(&last[..chunk.len()]);
            }
        }
    }

    /// `grads = sum of the first `used` blocks' gradients`, added in block order (so the
    /// result does not depend on the thread count), parallel over parameter chunks.
    fn reduce_grads(&mut self, used: usize) {
        const CHUNK: usize = 16 * 1024;
        let blocks = &self.blocks[..used];
        self.grads
            .par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(c, out)| {
                let range = c * CHUNK..c * CHUNK + out.len();
                match blocks.split_first() {
                    None => out.fill(0.0),
                    Some((first, rest)) => {
                        out.copy_from_slice(&first.grads[range.clone()]);
                        for b in rest {
                            for (o, g) in out.iter_mut().zip(&b.grads[range.clone()]) {
                                *o += g;
                            }
                        }
                    }
                }
            });
    }

    /// Concatenates one activation of every block used by the last forward.
    fn concat(&self, pick: impl Fn(&Block) -> &[f32]) -> Vec<f32> {
        let mut out = Vec::new();
        let mut left = self.n;
        for b in &self.blocks {
            if left == 0 {
                break;
            }
            let rows = left.min(b.rows());
            let a = pick(b);
            out.extend_from_slice(&a[..rows * (a.len() / b.rows())]);
            left -= rows;
        }
        out
    }

    /// Maximum batch size.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Batch size of the last call.
    pub fn batch(&self) -> usize {
        self.n
    }

    /// Logits of the last forward (`[n]`; task 0's for a multi-task model).
    pub fn logits(&self) -> &[f32] {
        &self.logits[..self.n]
    }

    /// Task `task`'s logits of the last forward (`[n]`); task 0's are [`Workspace::logits`].
    ///
    /// # Panics
    /// If the model has no such task.
    pub fn task_logits(&self, task: usize) -> &[f32] {
        if task == 0 {
            return self.logits();
        }
        let start = (task - 1) * self.capacity;
        &self.task_logits[start..start + self.n]
    }

    /// Flat dense gradient of the last `forward_backward` (params layout).
    pub fn grads(&self) -> &[f32] {
        &self.grads
    }

    /// Mutable flat dense gradient (e.g. to average across workers in place).
    pub fn grads_mut(&mut self) -> &mut [f32] {
        &mut self.grads
    }

    /// The whole embedding-gradient buffer (`[capacity, T, d]`), for a caller that
    /// drives [`DenseDlrm::attend_backward`] from a gradient of its own (a bench of the
    /// attention units alone).
    pub fn d_emb_mut(&mut self) -> &mut [f32] {
        &mut self.d_emb
    }

    /// Gradient w.r.t. the embedding input of the last `forward_backward` (`[n, T, d]`).
    pub fn d_emb(&self) -> &[f32] {
        let per = self.d_emb.len() / self.capacity.max(1);
        &self.d_emb[..self.n * per]
    }

    /// Output of bottom-MLP layer `i` for the last forward (`[n, width]`, copied out of
    /// the row blocks).
    pub fn bottom_activation(&self, i: usize) -> Vec<f32> {
        self.concat(|b| &b.bottom_acts[i])
    }

    /// Output of top-MLP layer `i` for the last forward (`[n, width]`, copied).
    pub fn top_activation(&self, i: usize) -> Vec<f32> {
        self.concat(|b| &b.top_acts[i])
    }

    /// Output of adapt-tower layer `i` (an MTRM's) for the last forward (`[n, width]`,
    /// copied).
    pub fn adapt_activation(&self, i: usize) -> Vec<f32> {
        self.concat(|b| &b.adapt_acts[i])
    }

    /// Interaction output of the last forward (`[n, width]`, copied).
    pub fn interaction_output(&self) -> Vec<f32> {
        self.concat(|b| &b.inter)
    }

    /// Output of layer `layer` of MMoE expert `expert` for the last forward (`[n, width]`,
    /// copied).
    pub fn expert_activation(&self, expert: usize, layer: usize) -> Vec<f32> {
        self.concat(|b| &b.mmoe.as_ref().expect("an MMoE").experts[expert][layer])
    }

    /// Output of layer `layer` of task `task`'s tower (`task ≥ 1`; task 0's is the top
    /// MLP) for the last forward (`[n, width]`, copied).
    pub fn task_tower_activation(&self, task: usize, layer: usize) -> Vec<f32> {
        self.concat(|b| &b.mmoe.as_ref().expect("an MMoE").towers[task - 1][layer])
    }

    /// Task `task`'s gate weights over the experts for the last forward (`[n, K]`,
    /// copied).
    pub fn gate_weights(&self, task: usize) -> Vec<f32> {
        self.concat(|b| &b.mmoe.as_ref().expect("an MMoE").gates[task])
    }
}
