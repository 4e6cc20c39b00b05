//! The dense part of DLRM: bottom MLP, interaction, top MLP, BCE loss.

use crate::error::{ModelError, Result};
use crate::interaction::{Interaction, InteractionKind};
use crate::layers::{sigmoid, Activation, Mlp};
use crate::loss::bce_with_logits;

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
        let bottom_out = *self.bottom.last().expect("nonempty");
        if self.interaction == InteractionKind::Dot && bottom_out != self.embedding_dim {
            return Err(ModelError::DotDimMismatch {
                bottom_out,
                embedding_dim: self.embedding_dim,
            });
        }
        Ok(())
    }

    /// Number of dense input features (`bottom[0]`).
    pub fn num_dense(&self) -> usize {
        self.bottom[0]
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
        top_sizes.push(interaction.out_dim());
        top_sizes.extend_from_slice(&config.top);
        let top = Mlp::new(
            &top_sizes,
            bottom.num_params(),
            Activation::Relu,
            Activation::None,
        );
        let mut params = vec![0.0; bottom.num_params() + top.num_params()];
        for (i, l) in bottom.layers.iter().chain(&top.layers).enumerate() {
            l.init(&mut params, config.seed, i as u64);
        }
        Ok(Self {
            config,
            bottom,
            top,
            interaction,
            params,
        })
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
        let fwd = self.bottom.forward_flops() + self.top.forward_flops();
        let first = self.bottom.layers[0].forward_flops();
        FlopCount {
            forward_gemm: fwd,
            backward_gemm: 2 * fwd - first,
            interaction: self.interaction.forward_flops() + self.interaction.backward_flops(),
        }
    }

    /// A workspace for batches of up to `max_batch` samples.
    pub fn workspace(&self, max_batch: usize) -> Workspace {
        Workspace::new(self, max_batch)
    }

    fn check(&self, dense_x: &[f32], emb: &[f32], ws: &Workspace) -> Result<usize> {
        if ws.num_params != self.params.len() || ws.bottom_acts.len() != self.bottom.layers.len() {
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
        let te = n * self.config.num_tables * self.config.embedding_dim;
        if emb.len() != te {
            return Err(ModelError::Shape {
                what: "emb",
                expected: te,
                got: emb.len(),
            });
        }
        Ok(n)
    }

    fn forward_inner(&self, dense_x: &[f32], emb: &[f32], n: usize, ws: &mut Workspace) {
        let p = &self.params;
        self.bottom.forward(p, dense_x, n, &mut ws.bottom_acts);
        let z = ws.bottom_acts.last().expect("nonempty");
        self.interaction.forward(z, emb, n, &mut ws.inter);
        self.top.forward(p, &ws.inter, n, &mut ws.top_acts);
        ws.n = n;
    }

    /// Forward pass for `n = dense_x.len() / num_dense` samples: `dense_x [n, num_dense]`,
    /// `emb [n, T, d]`. Returns the logits `[n]` (stored in the workspace).
    pub fn forward<'w>(
        &self,
        dense_x: &[f32],
        emb: &[f32],
        ws: &'w mut Workspace,
    ) -> Result<&'w [f32]> {
        let n = self.check(dense_x, emb, ws)?;
        self.forward_inner(dense_x, emb, n, ws);
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
        let logits = self.forward(dense_x, emb, ws)?;
        if probs.len() != logits.len() {
            return Err(ModelError::Shape {
                what: "probs",
                expected: logits.len(),
                got: probs.len(),
            });
        }
        for (p, &l) in probs.iter_mut().zip(logits) {
            *p = sigmoid(l);
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
        let n = self.check(dense_x, emb, ws)?;
        if labels.len() != n {
            return Err(ModelError::Shape {
                what: "labels",
                expected: n,
                got: labels.len(),
            });
        }
        self.forward_inner(dense_x, emb, n, ws);
        let p = &self.params;
        let ws = &mut *ws;
        let logits = &ws.top_acts.last().expect("nonempty")[..n];
        let loss = bce_with_logits(logits, labels, &mut ws.dlogits[..n]);
        // top MLP backward -> d(interaction output) in d_inter
        self.top.backward(
            p,
            &mut ws.grads,
            &ws.inter,
            &ws.top_acts,
            &mut ws.dlogits,
            &mut ws.ga,
            &mut ws.gb,
            Some(&mut ws.d_inter),
            n,
            &mut ws.scratch,
        );
        let z = ws.bottom_acts.last().expect("nonempty");
        self.interaction
            .backward(z, emb, &ws.d_inter, n, &mut ws.d_bottom, &mut ws.d_emb);
        self.bottom.backward(
            p,
            &mut ws.grads,
            dense_x,
            &ws.bottom_acts,
            &mut ws.d_bottom,
            &mut ws.ga,
            &mut ws.gb,
            None,
            n,
            &mut ws.scratch,
        );
        Ok(loss)
    }
}

/// Every activation and temporary of a step, allocated once for a maximum batch size:
/// steps do not allocate. Also holds the outputs of the last step: logits, the flat
/// dense gradient and the embedding gradient.
#[derive(Clone, Debug)]
pub struct Workspace {
    capacity: usize,
    n: usize,
    num_params: usize,
    bottom_acts: Vec<Vec<f32>>,
    inter: Vec<f32>,
    top_acts: Vec<Vec<f32>>,
    dlogits: Vec<f32>,
    d_inter: Vec<f32>,
    d_bottom: Vec<f32>,
    d_emb: Vec<f32>,
    ga: Vec<f32>,
    gb: Vec<f32>,
    scratch: Vec<f32>,
    grads: Vec<f32>,
}

impl Workspace {
    /// Workspace for `model` and batches of at most `capacity` samples.
    pub fn new(model: &DenseDlrm, capacity: usize) -> Self {
        let acts = |m: &Mlp| -> Vec<Vec<f32>> {
            m.layers
                .iter()
                .map(|l| vec![0.0; capacity * l.out_dim])
                .collect()
        };
        let max_w = model.bottom.max_width().max(model.top.max_width());
        let scratch = model
            .bottom
            .layers
            .iter()
            .chain(&model.top.layers)
            .map(|l| l.scratch_len())
            .max()
            .unwrap_or(0);
        let c = &model.config;
        Self {
            capacity,
            n: 0,
            num_params: model.num_params(),
            bottom_acts: acts(&model.bottom),
            inter: vec![0.0; capacity * model.interaction.out_dim()],
            top_acts: acts(&model.top),
            dlogits: vec![0.0; capacity],
            d_inter: vec![0.0; capacity * model.interaction.out_dim()],
            d_bottom: vec![0.0; capacity * model.bottom.out_dim()],
            d_emb: vec![0.0; capacity * c.num_tables * c.embedding_dim],
            ga: vec![0.0; capacity * max_w],
            gb: vec![0.0; capacity * max_w],
            scratch: vec![0.0; scratch],
            grads: vec![0.0; model.num_params()],
        }
    }

    /// Maximum batch size.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Batch size of the last call.
    pub fn batch(&self) -> usize {
        self.n
    }

    /// Logits of the last forward (`[n]`).
    pub fn logits(&self) -> &[f32] {
        &self.top_acts.last().expect("nonempty")[..self.n]
    }

    /// Flat dense gradient of the last `forward_backward` (params layout).
    pub fn grads(&self) -> &[f32] {
        &self.grads
    }

    /// Mutable flat dense gradient (e.g. to average across workers in place).
    pub fn grads_mut(&mut self) -> &mut [f32] {
        &mut self.grads
    }

    /// Gradient w.r.t. the embedding input of the last `forward_backward` (`[n, T, d]`).
    pub fn d_emb(&self) -> &[f32] {
        let per = self.d_emb.len() / self.capacity.max(1);
        &self.d_emb[..self.n * per]
    }

    /// Output of bottom-MLP layer `i` for the last forward (`[n, width]`).
    pub fn bottom_activation(&self, i: usize) -> &[f32] {
        let a = &self.bottom_acts[i];
        &a[..self.n * (a.len() / self.capacity.max(1))]
    }

    /// Output of top-MLP layer `i` for the last forward (`[n, width]`).
    pub fn top_activation(&self, i: usize) -> &[f32] {
        let a = &self.top_acts[i];
        &a[..self.n * (a.len() / self.capacity.max(1))]
    }

    /// Interaction output of the last forward (`[n, width]`).
    pub fn interaction_output(&self) -> &[f32] {
        &self.inter[..self.n * (self.inter.len() / self.capacity.max(1))]
    }
}
