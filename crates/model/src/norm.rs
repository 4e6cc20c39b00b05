//! Normalization of a hidden layer's pre-activation: layer normalization (Ba, Kiros,
//! Hinton 2016) and batch normalization (Ioffe, Szegedy 2015).
//!
//! Layer norm, per row `z [w]`: `x̂ = (z − μ) / sqrt(σ² + ε)`, `y = γ ⊙ x̂ + β`, with `μ`,
//! `σ²` the row's mean and (population) variance. It has no state across samples: a
//! worker's step, a prediction of one row and a parameter server's flat dense vector
//! (which holds `γ`, `β` like any weight) all see the same function.
//!
//! Batch norm takes `μ`, `σ²` per feature over the rows of a training step instead, and
//! predicts with running averages of them. Two choices make it fit a trainer whose step
//! runs in row blocks on several threads and whose weights live on parameter servers:
//!
//! * **Ghost batches.** The statistics of a step are those of its row block
//!   ([`crate::dlrm::BLOCK_ROWS`] rows), not of the whole batch (Hoffer, Hubara, Soudry
//!   2017, "Train longer, generalize better"). A block is computed start to finish on one
//!   thread, so the step needs no barrier between threads, and since blocks have a fixed
//!   size the result is the same on any number of threads. Large batches keep the noise
//!   of a 256-row batch that batch norm's regularization comes from.
//! * **Running statistics in the flat parameter vector.** The running mean and variance
//!   follow `γ`, `β`. A training step writes, at their offsets of the flat gradient, the
//!   step's statistic minus the running value (weighted by the block's share of the
//!   batch, so the blocks' sum is the batch's), and the dense optimizer applies it as
//!   `running += momentum · that` ([`crate::optim::RunningAverages`]), on a trainer and
//!   on the parameter servers alike. So checkpoints, re-sharding, export and serving
//!   carry them as they carry any weight.

/// Added to the variance before the square root.
pub const EPS: f32 = 1e-5;

/// How much of a step's statistic a running average takes (PyTorch's default
/// `momentum`): `running += MOMENTUM · (step − running)`.
pub const MOMENTUM: f32 = 0.1;

/// Which normalization the hidden layers of a model's MLPs have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// [`LayerNorm`].
    Layer,
    /// [`BatchNorm`].
    Batch,
}

/// How a forward pass runs the norms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NormMode {
    /// A prediction: a batch norm uses its running statistics.
    Inference,
    /// A training step: a batch norm uses the statistics of the rows it is given, and its
    /// backward writes their difference to the running ones with `weight`, the rows'
    /// share of the step's batch.
    Training {
        /// The rows' share of the batch (`rows / batch`).
        weight: f32,
    },
}

/// One layer norm of width `width`; `γ [width]` then `β [width]` at `offset` of the flat
/// parameter buffer (gradients at the same offsets of the flat gradient).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerNorm {
    /// Features per row.
    pub width: usize,
    /// Offset of `γ`; `β` follows it.
    pub offset: usize,
}

/// One batch norm of width `width`: `γ [width]`, `β [width]`, then the running mean
/// `[width]` and running variance `[width]` at `offset` of the flat parameter buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchNorm {
    /// Features per row.
    pub width: usize,
    /// Offset of `γ`; `β`, the running mean and the running variance follow it.
    pub offset: usize,
}

/// A hidden layer's norm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Norm {
    /// Per row.
    Layer(LayerNorm),
    /// Per feature over the step's rows.
    Batch(BatchNorm),
}

/// What a forward keeps for the backward.
#[derive(Clone, Debug, Default)]
pub struct NormActs {
    /// `x̂ [rows, width]`.
    pub xhat: Vec<f32>,
    /// `1 / sqrt(σ² + ε)`: per row (layer norm) or per feature (batch norm; in
    /// inference, the fused scale).
    pub rstd: Vec<f32>,
    /// Batch norm: the rows' mean per feature (in inference, the fused shift).
    pub mean: Vec<f32>,
    /// Batch norm: the rows' unbiased variance per feature, the running variance's target.
    pub var: Vec<f32>,
    /// Batch norm: the weight of the rows' statistics in the running averages (0 after an
    /// inference forward).
    pub weight: f32,
}

impl NormActs {
    /// Buffers for `rows` rows of `norm`.
    pub fn new(norm: &Norm, rows: usize) -> Self {
        let w = norm.width();
        match norm {
            Norm::Layer(_) => Self {
                xhat: vec![0.0; rows * w],
                rstd: vec![0.0; rows],
                ..Self::default()
            },
            Norm::Batch(_) => Self {
                xhat: vec![0.0; rows * w],
                rstd: vec![0.0; w],
                mean: vec![0.0; w],
                var: vec![0.0; w],
                weight: 0.0,
            },
        }
    }
}

impl Norm {
    /// A norm of `kind` and `width` with parameters from `offset`.
    pub fn new(kind: NormKind, width: usize, offset: usize) -> Self {
        match kind {
            NormKind::Layer => Self::Layer(LayerNorm { width, offset }),
            NormKind::Batch => Self::Batch(BatchNorm { width, offset }),
        }
    }

    /// Features per row.
    pub fn width(&self) -> usize {
        match self {
            Self::Layer(n) => n.width,
            Self::Batch(n) => n.width,
        }
    }

    /// Offset of its first parameter (`γ`).
    pub fn offset(&self) -> usize {
        match self {
            Self::Layer(n) => n.offset,
            Self::Batch(n) => n.offset,
        }
    }

    /// Floats in the flat parameter buffer (a batch norm's running statistics included).
    pub fn num_params(&self) -> usize {
        match self {
            Self::Layer(n) => n.num_params(),
            Self::Batch(n) => n.num_params(),
        }
    }

    /// End of its floats in the flat buffer.
    pub fn end_offset(&self) -> usize {
        self.offset() + self.num_params()
    }

    /// The offsets that hold running statistics, not weights (empty for a layer norm).
    pub fn statistics(&self) -> std::ops::Range<usize> {
        match self {
            Self::Layer(n) => n.end_offset()..n.end_offset(),
            Self::Batch(n) => n.statistics(),
        }
    }

    /// Initial values: the identity on normalized rows (and for a batch norm, running
    /// statistics of a standard normal).
    pub fn init(&self, params: &mut [f32]) {
        match self {
            Self::Layer(n) => n.init(params),
            Self::Batch(n) => n.init(params),
        }
    }

    /// Normalizes the first `n` rows of `z` in place, keeping what the backward needs in
    /// `acts`.
    pub fn forward(
        &self,
        params: &[f32],
        z: &mut [f32],
        n: usize,
        acts: &mut NormActs,
        mode: NormMode,
    ) {
        match self {
            Self::Layer(norm) => norm.forward(params, z, n, acts),
            Self::Batch(norm) => match mode {
                NormMode::Training { weight } => norm.forward_train(params, z, n, acts, weight),
                NormMode::Inference => norm.forward_infer(params, z, n, acts),
            },
        }
    }

    /// Backward of a training forward: `dy` becomes the gradient w.r.t. `z`; the
    /// parameters' gradients (and a batch norm's running-statistic differences) are
    /// written into `grads`.
    pub fn backward(
        &self,
        params: &[f32],
        grads: &mut [f32],
        dy: &mut [f32],
        n: usize,
        acts: &NormActs,
    ) {
        match self {
            Self::Layer(norm) => norm.backward(params, grads, dy, n, acts),
            Self::Batch(norm) => norm.backward(params, grads, dy, n, acts),
        }
    }
}

impl LayerNorm {
    /// Parameters: `γ` and `β`.
    pub fn num_params(&self) -> usize {
        2 * self.width
    }

    /// End of its parameters in the flat buffer.
    pub fn end_offset(&self) -> usize {
        self.offset + self.num_params()
    }

    /// `γ = 1`, `β = 0`: the identity on normalized rows.
    pub fn init(&self, params: &mut [f32]) {
        let (g, b) = params[self.offset..self.end_offset()].split_at_mut(self.width);
        g.fill(1.0);
        b.fill(0.0);
    }

    /// Normalizes the first `n` rows of `z` in place (`z` becomes `y`), keeping `x̂` and
    /// the inverse deviations in `acts`.
    pub fn forward(&self, params: &[f32], z: &mut [f32], n: usize, acts: &mut NormActs) {
        let w = self.width;
        let (gamma, beta) = params[self.offset..self.end_offset()].split_at(w);
        for ((row, xhat), rstd) in z[..n * w]
            .chunks_exact_mut(w)
            .zip(acts.xhat.chunks_exact_mut(w))
            .zip(&mut acts.rstd)
        {
            let mean = row.iter().sum::<f32>() / w as f32;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / w as f32;
            let r = 1.0 / (var + EPS).sqrt();
            *rstd = r;
            for (((v, xh), g), b) in row.iter_mut().zip(xhat.iter_mut()).zip(gamma).zip(beta) {
                *xh = (*v - mean) * r;
                *v = g * *xh + b;
            }
        }
    }

    /// Backward: `dy` (the gradient w.r.t. `y`) becomes, in place, the gradient w.r.t.
    /// `z`; `dγ = Σ dy ⊙ x̂` and `dβ = Σ dy` are written (overwritten) into `grads`.
    ///
    /// With `g = γ ⊙ dy`: `dz = r (g − mean(g) − x̂ mean(g ⊙ x̂))`.
    pub fn backward(
        &self,
        params: &[f32],
        grads: &mut [f32],
        dy: &mut [f32],
        n: usize,
        acts: &NormActs,
    ) {
        let w = self.width;
        let gamma = &params[self.offset..self.offset + w];
        let (dgamma, dbeta) = grads[self.offset..self.end_offset()].split_at_mut(w);
        dgamma.fill(0.0);
        dbeta.fill(0.0);
        for ((row, xhat), &r) in dy[..n * w]
            .chunks_exact_mut(w)
            .zip(acts.xhat.chunks_exact(w))
            .zip(&acts.rstd)
        {
            let (mut mean_g, mut mean_gx) = (0.0f32, 0.0f32);
            for ((((d, &xh), &g), dg), db) in row
                .iter()
                .zip(xhat)
                .zip(gamma)
                .zip(dgamma.iter_mut())
                .zip(dbeta.iter_mut())
            {
                *dg += d * xh;
                *db += d;
                let gd = g * d;
                mean_g += gd;
                mean_gx += gd * xh;
            }
            mean_g /= w as f32;
            mean_gx /= w as f32;
            for ((d, &xh), &g) in row.iter_mut().zip(xhat).zip(gamma) {
                *d = r * (g * *d - mean_g - xh * mean_gx);
            }
        }
    }
}

impl BatchNorm {
    /// Floats: `γ`, `β` and the two running statistics.
    pub fn num_params(&self) -> usize {
        4 * self.width
    }

    /// End of its floats in the flat buffer.
    pub fn end_offset(&self) -> usize {
        self.offset + self.num_params()
    }

    /// The running mean's and variance's offsets.
    pub fn statistics(&self) -> std::ops::Range<usize> {
        self.offset + 2 * self.width..self.end_offset()
    }

    /// `γ = 1`, `β = 0`, running mean 0 and variance 1 (PyTorch's initial values).
    pub fn init(&self, params: &mut [f32]) {
        let p = &mut params[self.offset..self.end_offset()];
        let (affine, stats) = p.split_at_mut(2 * self.width);
        let (g, b) = affine.split_at_mut(self.width);
        g.fill(1.0);
        b.fill(0.0);
        let (mean, var) = stats.split_at_mut(self.width);
        mean.fill(0.0);
        var.fill(1.0);
    }

    /// `(γ, β, running mean, running variance)`.
    fn parts<'a>(&self, params: &'a [f32]) -> [&'a [f32]; 4] {
        let w = self.width;
        let p = &params[self.offset..self.end_offset()];
        [&p[..w], &p[w..2 * w], &p[2 * w..3 * w], &p[3 * w..]]
    }

    /// A training forward of the first `n` rows of `z`, in place: per feature, the rows'
    /// mean and (population) variance normalize them; the unbiased variance is kept as
    /// the running variance's target. One row has no variance: its statistics get no
    /// weight in the running averages.
    fn forward_train(
        &self,
        params: &[f32],
        z: &mut [f32],
        n: usize,
        acts: &mut NormActs,
        weight: f32,
    ) {
        let w = self.width;
        let [gamma, beta, _, _] = self.parts(params);
        let z = &mut z[..n * w];
        let (mean, var, rstd) = (&mut acts.mean, &mut acts.var, &mut acts.rstd);
        mean.fill(0.0);
        for row in z.chunks_exact(w) {
            for (m, &v) in mean.iter_mut().zip(row) {
                *m += v;
            }
        }
        let inv_n = 1.0 / n.max(1) as f32;
        mean.iter_mut().for_each(|m| *m *= inv_n);
        var.fill(0.0);
        for row in z.chunks_exact(w) {
            for ((s, &v), &m) in var.iter_mut().zip(row).zip(mean.iter()) {
                *s += (v - m) * (v - m);
            }
        }
        let unbiased = if n > 1 { 1.0 / (n - 1) as f32 } else { 0.0 };
        for (s, r) in var.iter_mut().zip(rstd.iter_mut()) {
            *r = 1.0 / (*s * inv_n + EPS).sqrt();
            *s *= unbiased;
        }
        acts.weight = if n > 1 { weight } else { 0.0 };
        for (row, xhat) in z.chunks_exact_mut(w).zip(acts.xhat.chunks_exact_mut(w)) {
            for (((((v, xh), &m), &r), &g), &b) in row
                .iter_mut()
                .zip(xhat.iter_mut())
                .zip(mean.iter())
                .zip(rstd.iter())
                .zip(gamma)
                .zip(beta)
            {
                *xh = (*v - m) * r;
                *v = g * *xh + b;
            }
        }
    }

    /// A prediction's forward of the first `n` rows of `z`, in place, with the running
    /// statistics: `y = a ⊙ z + c`, `a = γ / sqrt(σ²_run + ε)`, `c = β − a ⊙ μ_run`.
    fn forward_infer(&self, params: &[f32], z: &mut [f32], n: usize, acts: &mut NormActs) {
        let w = self.width;
        let [gamma, beta, run_mean, run_var] = self.parts(params);
        let (scale, shift) = (&mut acts.rstd, &mut acts.mean);
        for (((((a, c), &g), &b), &m), &v) in scale
            .iter_mut()
            .zip(shift.iter_mut())
            .zip(gamma)
            .zip(beta)
            .zip(run_mean)
            .zip(run_var)
        {
            *a = g / (v + EPS).sqrt();
            *c = b - *a * m;
        }
        acts.weight = 0.0;
        for row in z[..n * w].chunks_exact_mut(w) {
            for ((v, &a), &c) in row.iter_mut().zip(scale.iter()).zip(shift.iter()) {
                *v = a * *v + c;
            }
        }
    }

    /// Backward of [`BatchNorm::forward_train`] over the same rows: with
    /// `dβ = Σ_rows dy`, `dγ = Σ_rows dy ⊙ x̂`,
    /// `dz = γ r (dy − dβ / n − x̂ ⊙ dγ / n)`. Also writes, at the running statistics'
    /// offsets, `weight · (rows' statistic − running value)`.
    fn backward(
        &self,
        params: &[f32],
        grads: &mut [f32],
        dy: &mut [f32],
        n: usize,
        acts: &NormActs,
    ) {
        let w = self.width;
        let [gamma, _, run_mean, run_var] = self.parts(params);
        let g = &mut grads[self.offset..self.end_offset()];
        let (affine, stats) = g.split_at_mut(2 * w);
        let (dgamma, dbeta) = affine.split_at_mut(w);
        dgamma.fill(0.0);
        dbeta.fill(0.0);
        let dy = &mut dy[..n * w];
        for (row, xhat) in dy.chunks_exact(w).zip(acts.xhat.chunks_exact(w)) {
            for (((dg, db), &d), &xh) in dgamma.iter_mut().zip(dbeta.iter_mut()).zip(row).zip(xhat)
            {
                *dg += d * xh;
                *db += d;
            }
        }
        let inv_n = 1.0 / n.max(1) as f32;
        for (row, xhat) in dy.chunks_exact_mut(w).zip(acts.xhat.chunks_exact(w)) {
            for (((((d, &xh), &g), &r), &dg), &db) in row
                .iter_mut()
                .zip(xhat)
                .zip(gamma)
                .zip(&acts.rstd)
                .zip(dgamma.iter())
                .zip(dbeta.iter())
            {
                *d = g * r * (*d - db * inv_n - xh * dg * inv_n);
            }
        }
        let (d_mean, d_var) = stats.split_at_mut(w);
        for ((d, &m), &run) in d_mean.iter_mut().zip(&acts.mean).zip(run_mean) {
            *d = acts.weight * (m - run);
        }
        for ((d, &v), &run) in d_var.iter_mut().zip(&acts.var).zip(run_var) {
            *d = acts.weight * (v - run);
        }
    }
}
