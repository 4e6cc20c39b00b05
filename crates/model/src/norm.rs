//! Layer normalization (Ba, Kiros, Hinton 2016) of a hidden layer's pre-activation.
//!
//! Per row `z [w]`: `x̂ = (z − μ) / sqrt(σ² + ε)`, `y = γ ⊙ x̂ + β`, with `μ`, `σ²` the
//! row's mean and (population) variance. Unlike batch normalization it has no state
//! across samples: a worker's step, a prediction of one row and a parameter server's
//! flat dense vector (which holds `γ`, `β` like any weight) all see the same function.

/// Added to the variance before the square root.
pub const EPS: f32 = 1e-5;

/// One layer norm of width `width`; `γ [width]` then `β [width]` at `offset` of the flat
/// parameter buffer (gradients at the same offsets of the flat gradient).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerNorm {
    /// Features per row.
    pub width: usize,
    /// Offset of `γ`; `β` follows it.
    pub offset: usize,
}

/// What a forward keeps for the backward: the normalized rows and their `1 / sqrt(σ² + ε)`.
#[derive(Clone, Debug, Default)]
pub struct NormActs {
    /// `x̂ [rows, width]`.
    pub xhat: Vec<f32>,
    /// `1 / sqrt(σ² + ε)` per row.
    pub rstd: Vec<f32>,
}

impl NormActs {
    /// Buffers for `rows` rows of `norm`.
    pub fn new(norm: &LayerNorm, rows: usize) -> Self {
        Self {
            xhat: vec![0.0; rows * norm.width],
            rstd: vec![0.0; rows],
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
