//! Fully connected layers with fused bias + activation, and MLP stacks.
//!
//! Activations are batch-major (`[n, in]` row-major). A layer owns no memory: its weight
//! `W [out, in]` (row-major, PyTorch layout) and bias `b [out]` live at fixed offsets of the
//! model's flat parameter buffer, and its gradients at the same offsets of the flat gradient
//! buffer.
//!
//! Everything here runs on the calling thread: [`crate::DenseDlrm`] parallelizes a step by
//! giving each thread whole row blocks of the batch, which keeps every GEMM on one core's
//! caches and needs no synchronization inside a layer.

use crate::gemm::{sgemm, MatRef};
use crate::init::InitRng;
use crate::norm::{Norm, NormActs, NormKind, NormMode};

/// Activation applied after the affine map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// Identity.
    None,
    /// `max(x, 0)`.
    Relu,
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
}

/// Numerically stable logistic function.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// `y = act(x W^T + b)`: a linear layer whose parameters live in a flat buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Linear {
    /// Input width.
    pub in_dim: usize,
    /// Output width.
    pub out_dim: usize,
    /// Offset of `W [out, in]` in the flat parameter buffer.
    pub w_offset: usize,
    /// Offset of `b [out]` in the flat parameter buffer.
    pub b_offset: usize,
    /// Activation fused after the affine map.
    pub act: Activation,
}

impl Linear {
    /// A layer whose parameters start at `offset` (weights, then bias).
    pub fn new(in_dim: usize, out_dim: usize, offset: usize, act: Activation) -> Self {
        Self {
            in_dim,
            out_dim,
            w_offset: offset,
            b_offset: offset + in_dim * out_dim,
            act,
        }
    }

    /// Number of parameters (`out * in + out`).
    pub fn num_params(&self) -> usize {
        self.out_dim * (self.in_dim + 1)
    }

    /// One past the last parameter offset.
    pub fn end_offset(&self) -> usize {
        self.b_offset + self.out_dim
    }

    /// Weight and bias slices of `params`.
    pub fn weights<'a>(&self, params: &'a [f32]) -> (&'a [f32], &'a [f32]) {
        (
            &params[self.w_offset..self.b_offset],
            &params[self.b_offset..self.end_offset()],
        )
    }

    /// Glorot/Xavier-uniform weights, bias uniform in `±1/sqrt(in)`, from a SplitMix64
    /// stream keyed by `(seed, stream)`.
    pub fn init(&self, params: &mut [f32], seed: u64, stream: u64) {
        let mut rng = InitRng::new(seed, stream);
        let a = (6.0 / (self.in_dim + self.out_dim) as f32).sqrt();
        for w in &mut params[self.w_offset..self.b_offset] {
            *w = rng.uniform_sym(a);
        }
        let ab = 1.0 / (self.in_dim as f32).sqrt();
        for b in &mut params[self.b_offset..self.end_offset()] {
            *b = rng.uniform_sym(ab);
        }
    }

    /// Forward pass: `y[n, out] = act(x[n, in] W^T + b)`.
    ///
    /// One GEMM, then one pass over `y` that adds the bias and applies the activation.
    pub fn forward(&self, params: &[f32], x: &[f32], n: usize, y: &mut [f32]) {
        let (inp, out) = (self.in_dim, self.out_dim);
        if n == 0 {
            return;
        }
        let (w, b) = self.weights(params);
        let y = &mut y[..n * out];
        sgemm(
            1.0,
            MatRef::row_major(&x[..n * inp], n, inp),
            MatRef::row_major_t(w, out, inp),
            0.0,
            y,
        );
        bias_act_rows(y, b, self.act);
    }

    /// Backward pass.
    ///
    /// * `x`: the forward input `[n, in]`; `y`: the forward output `[n, out]`.
    /// * `dy`: on entry the gradient w.r.t. `y`; on exit w.r.t. the pre-activation.
    /// * writes (overwrites) `dW` and `db` at this layer's offsets in `grads`.
    /// * `dx`: if given, receives the gradient w.r.t. `x` `[n, in]`.
    ///
    /// The activation derivative and the bias-gradient column sums are fused in one pass
    /// over `dy`; `dW = dy^T x` and `dx = dy W` are GEMMs on strided views (no transposes).
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        params: &[f32],
        grads: &mut [f32],
        x: &[f32],
        y: &[f32],
        dy: &mut [f32],
        dx: Option<&mut [f32]>,
        n: usize,
    ) {
        self.backward_scaled(params, grads, x, y, dy, dx, n, 1.0);
    }

    /// [`Linear::backward`] of a layer whose stored output `y` went through inverted
    /// dropout after the activation: a kept unit was scaled by `keep_scale`, a dropped one
    /// is 0. Only for ReLU layers, where `y > 0` still marks the units that pass a
    /// gradient, and each passes `keep_scale` times it.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_scaled(
        &self,
        params: &[f32],
        grads: &mut [f32],
        x: &[f32],
        y: &[f32],
        dy: &mut [f32],
        dx: Option<&mut [f32]>,
        n: usize,
        keep_scale: f32,
    ) {
        debug_assert!(keep_scale == 1.0 || self.act == Activation::Relu);
        let (inp, out) = (self.in_dim, self.out_dim);
        if n == 0 {
            grads[self.w_offset..self.end_offset()].fill(0.0);
            return;
        }
        let dy = &mut dy[..n * out];
        let y = &y[..n * out];
        // 1. activation derivative fused with the bias gradient (column sums of dy).
        let db = &mut grads[self.b_offset..self.end_offset()];
        act_grad_colsum(dy, y, db, self.act, keep_scale);
        let dy = &*dy;
        // 2. dW[out, in] = dy^T[out, n] x[n, in]
        sgemm(
            1.0,
            MatRef::row_major_t(dy, n, out),
            MatRef::row_major(&x[..n * inp], n, inp),
            0.0,
            &mut grads[self.w_offset..self.b_offset],
        );
        // 3. dx[n, in] = dy[n, out] W[out, in]
        if let Some(dx) = dx {
            let (w, _) = self.weights(params);
            sgemm(
                1.0,
                MatRef::row_major(dy, n, out),
                MatRef::row_major(w, out, inp),
                0.0,
                &mut dx[..n * inp],
            );
        }
    }

    /// Forward FLOPs per sample (multiply-add counted as 2).
    pub fn forward_flops(&self) -> u64 {
        2 * (self.in_dim * self.out_dim) as u64
    }
}

fn bias_act_rows(chunk: &mut [f32], b: &[f32], act: Activation) {
    let out = b.len();
    match act {
        Activation::None => {
            for row in chunk.chunks_exact_mut(out) {
                for (v, &bb) in row.iter_mut().zip(b) {
                    *v += bb;
                }
            }
        }
        Activation::Relu => {
            for row in chunk.chunks_exact_mut(out) {
                for (v, &bb) in row.iter_mut().zip(b) {
                    *v = (*v + bb).max(0.0);
                }
            }
        }
        Activation::Sigmoid => {
            for row in chunk.chunks_exact_mut(out) {
                for (v, &bb) in row.iter_mut().zip(b) {
                    *v = sigmoid(*v + bb);
                }
            }
        }
    }
}

fn act_grad_colsum(dy: &mut [f32], y: &[f32], part: &mut [f32], act: Activation, scale: f32) {
    let out = part.len();
    part.fill(0.0);
    let rows = dy.chunks_exact_mut(out).zip(y.chunks_exact(out));
    match act {
        Activation::None => {
            for (drow, _) in rows {
                for (p, d) in part.iter_mut().zip(drow.iter()) {
                    *p += *d;
                }
            }
        }
        Activation::Relu => {
            for (drow, yrow) in rows {
                for ((p, d), &yy) in part.iter_mut().zip(drow.iter_mut()).zip(yrow) {
                    let g = if yy > 0.0 { *d * scale } else { 0.0 };
                    *d = g;
                    *p += g;
                }
            }
        }
        Activation::Sigmoid => {
            for (drow, yrow) in rows {
                for ((p, d), &yy) in part.iter_mut().zip(drow.iter_mut()).zip(yrow) {
                    let g = *d * yy * (1.0 - yy);
                    *d = g;
                    *p += g;
                }
            }
        }
    }
}

/// A stack of [`Linear`] layers with contiguous parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mlp {
    /// The layers, input to output.
    pub layers: Vec<Linear>,
    /// Norms of the hidden layers' pre-activations (one per layer but the last), or
    /// none. A normalized layer's [`Linear`] has no activation: the ReLU follows the norm
    /// ([`Mlp::with_norm`]).
    pub norms: Vec<Norm>,
}

impl Mlp {
    /// Layers for `sizes = [in, h1, ..., out]`, parameters from `offset`; every layer uses
    /// `hidden_act` except the last, which uses `last_act`.
    pub fn new(
        sizes: &[usize],
        offset: usize,
        hidden_act: Activation,
        last_act: Activation,
    ) -> Self {
        let mut layers = Vec::with_capacity(sizes.len().saturating_sub(1));
        let mut off = offset;
        for (i, w) in sizes.windows(2).enumerate() {
            let act = if i + 2 == sizes.len() {
                last_act
            } else {
                hidden_act
            };
            let l = Linear::new(w[0], w[1], off, act);
            off = l.end_offset();
            layers.push(l);
        }
        Self {
            layers,
            norms: Vec::new(),
        }
    }

    /// The same MLP with a layer norm between each hidden layer's affine map and its
    /// ReLU ([`Mlp::with_norm`] of [`NormKind::Layer`]).
    pub fn with_layer_norm(self, offset: usize) -> Self {
        self.with_norm(NormKind::Layer, offset)
    }

    /// The same MLP with a norm of `kind` between each hidden layer's affine map and its
    /// ReLU (`Linear → Norm → ReLU`); the norms' floats start at `offset`.
    ///
    /// # Panics
    /// If a hidden layer's activation is not ReLU.
    pub fn with_norm(mut self, kind: NormKind, offset: usize) -> Self {
        let hidden = self.layers.len() - 1;
        let mut off = offset;
        for l in &mut self.layers[..hidden] {
            assert_eq!(l.act, Activation::Relu, "norms are built for ReLU layers");
            l.act = Activation::None;
            let norm = Norm::new(kind, l.out_dim, off);
            off = norm.end_offset();
            self.norms.push(norm);
        }
        self
    }

    /// Floats of the norms (0 without; a batch norm's running statistics included).
    pub fn norm_params(&self) -> usize {
        self.norms.iter().map(Norm::num_params).sum()
    }

    /// Buffers a forward of `rows` rows keeps for the norms' backward (none without).
    pub fn norm_acts(&self, rows: usize) -> Vec<NormActs> {
        self.norms.iter().map(|n| NormActs::new(n, rows)).collect()
    }

    /// Input width.
    pub fn in_dim(&self) -> usize {
        self.layers[0].in_dim
    }

    /// Output width.
    pub fn out_dim(&self) -> usize {
        self.layers[self.layers.len() - 1].out_dim
    }

    /// Total parameters.
    pub fn num_params(&self) -> usize {
        self.layers.iter().map(Linear::num_params).sum()
    }

    /// Widest layer output.
    pub fn max_width(&self) -> usize {
        self.layers
            .iter()
            .map(|l| l.out_dim.max(l.in_dim))
            .max()
            .unwrap_or(0)
    }

    /// Forward: `acts[i]` receives layer `i`'s output.
    pub fn forward(&self, params: &[f32], x: &[f32], n: usize, acts: &mut [Vec<f32>]) {
        self.forward_full(params, x, n, acts, &mut [], None, NormMode::Inference);
    }

    /// [`Mlp::forward`] with `dropout` applied to every hidden layer's output (not the
    /// last layer's), and for an MLP with norms ([`Mlp::with_norm`]) running them in
    /// `mode` and keeping what their backward needs in `norm_acts` ([`Mlp::norm_acts`];
    /// empty without). [`Mlp::backward_full`] is the backward of a training forward.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_full(
        &self,
        params: &[f32],
        x: &[f32],
        n: usize,
        acts: &mut [Vec<f32>],
        norm_acts: &mut [NormActs],
        dropout: Option<Dropout>,
        mode: NormMode,
    ) {
        let last = self.layers.len() - 1;
        for (i, l) in self.layers.iter().enumerate() {
            let (prev, rest) = acts.split_at_mut(i);
            let inp: &[f32] = if i == 0 { x } else { &prev[i - 1] };
            l.forward(params, inp, n, &mut rest[0]);
            if let Some(norm) = self.norms.get(i) {
                let y = &mut rest[0][..n * l.out_dim];
                norm.forward(params, y, n, &mut norm_acts[i], mode);
                for v in y.iter_mut() {
                    *v = v.max(0.0);
                }
            }
            if let (Some(d), true) = (dropout, i < last) {
                d.apply(i, &mut rest[0][..n * l.out_dim], l.out_dim);
            }
        }
    }

    /// Backward from `dy` (gradient w.r.t. the MLP output, clobbered). `ga`/`gb` are
    /// ping-pong buffers of at least `n * max_width`; if `dx` is given it receives the
    /// gradient w.r.t. the MLP input.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        params: &[f32],
        grads: &mut [f32],
        x: &[f32],
        acts: &[Vec<f32>],
        dy: &mut [f32],
        ga: &mut [f32],
        gb: &mut [f32],
        dx: Option<&mut [f32]>,
        n: usize,
    ) {
        self.backward_full(params, grads, x, acts, &[], dy, ga, gb, dx, n, None);
    }

    /// Backward of [`Mlp::forward_full`] with the same `norm_acts` and `dropout` (whose
    /// masks are the zeros the forward left in the hidden activations).
    #[allow(clippy::too_many_arguments)]
    pub fn backward_full(
        &self,
        params: &[f32],
        grads: &mut [f32],
        x: &[f32],
        acts: &[Vec<f32>],
        norm_acts: &[NormActs],
        dy: &mut [f32],
        ga: &mut [f32],
        gb: &mut [f32],
        mut dx: Option<&mut [f32]>,
        n: usize,
        dropout: Option<Dropout>,
    ) {
        let last = self.layers.len() - 1;
        let hidden_scale = dropout.map_or(1.0, |d| d.keep_scale());
        // The current gradient lives in `dy`, then alternates between `ga` and `gb`.
        let mut which: Option<bool> = None;
        for i in (0..self.layers.len()).rev() {
            let l = &self.layers[i];
            let mut scale = if i < last { hidden_scale } else { 1.0 };
            let (cur, next): (&mut [f32], &mut [f32]) = match which {
                None => (&mut *dy, &mut *ga),
                Some(false) => (&mut *ga, &mut *gb),
                Some(true) => (&mut *gb, &mut *ga),
            };
            if let Some(norm) = self.norms.get(i) {
                // ReLU (and dropout) after the norm, then the norm, then the affine map
                // whose own activation is the identity.
                let w = l.out_dim;
                for (g, &y) in cur[..n * w].iter_mut().zip(&acts[i][..n * w]) {
                    *g = if y > 0.0 { *g * scale } else { 0.0 };
                }
                norm.backward(params, grads, cur, n, &norm_acts[i]);
                scale = 1.0;
            }
            if i == 0 {
                l.backward_scaled(params, grads, x, &acts[0], cur, dx.take(), n, scale);
            } else {
                let x = &acts[i - 1];
                l.backward_scaled(params, grads, x, &acts[i], cur, Some(next), n, scale);
                which = Some(which == Some(false));
            }
        }
    }

    /// Forward FLOPs per sample.
    pub fn forward_flops(&self) -> u64 {
        self.layers.iter().map(Linear::forward_flops).sum()
    }
}

/// Inverted dropout of a training step: each unit of a hidden activation is zeroed with
/// probability `rate` and the others scaled by `1 / (1 - rate)`.
///
/// The mask is a counter-based hash of (`seed`, row, layer, unit), not a generator's
/// stream: a row's mask does not depend on which thread or row block computes it, so a
/// step gives the same result on any number of threads, and nothing needs storing for
/// the backward pass (the zeros in the activation are the mask).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    /// Probability of dropping a unit, in `[0, 1)`.
    pub rate: f32,
    /// The step's seed (a training step draws a new one).
    pub seed: u64,
    /// Row of the batch the activations given to [`Dropout::apply`] start at.
    pub row0: u64,
}

impl Dropout {
    /// Factor of the kept units.
    pub fn keep_scale(&self) -> f32 {
        1.0 / (1.0 - self.rate)
    }

    /// Applies the mask of hidden layer `layer` to `y [rows, width]`.
    pub fn apply(&self, layer: usize, y: &mut [f32], width: usize) {
        use elastrec_common::splitmix::{derive, mix64, GOLDEN_GAMMA};
        // A unit is dropped when 32 hash bits fall below rate · 2^32.
        let threshold = (self.rate as f64 * 4_294_967_296.0) as u64;
        let scale = self.keep_scale();
        let layer_key = derive(self.seed, layer as u64 + 1);
        for (r, row) in y.chunks_exact_mut(width).enumerate() {
            let row_key = derive(layer_key, self.row0 + r as u64);
            // One 64-bit hash decides two units.
            for (j, pair) in row.chunks_mut(2).enumerate() {
                let h = mix64(row_key.wrapping_add((j as u64 + 1).wrapping_mul(GOLDEN_GAMMA)));
                for (k, v) in pair.iter_mut().enumerate() {
                    let bits = (h >> (32 * k)) & 0xFFFF_FFFF;
                    *v = if bits < threshold { 0.0 } else { *v * scale };
                }
            }
        }
    }
}
