//! The cross network of DCN-v2 (Wang et al., "DCN V2", WWW 2021, Eq. 1): explicit feature
//! crosses of bounded degree on top of the interaction output.
//!
//! With `x_0` the interaction output (width `D`), layer `l` computes
//! `x_{l+1} = x_0 ⊙ (W_l x_l + b_l) + x_l`, with a full-rank `W_l [D, D]`. Layer `l` adds
//! crosses of degree `l + 2`; the residual keeps the lower ones. The top MLP reads
//! `x_L` (the "stacked" structure of the paper).
//!
//! Backward, with `g = ∂L/∂x_{l+1}` and `u_l = W_l x_l + b_l`:
//! `∂L/∂x_0 += g ⊙ u_l`; `∂L/∂u_l = g ⊙ x_0`, through the linear map to `∂L/∂W_l`,
//! `∂L/∂b_l` and `∂L/∂x_l = g + W_lᵀ (g ⊙ x_0)`.

use crate::layers::{Activation, Linear};

/// `L` cross layers of width `D`, their parameters in the model's flat buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrossNet {
    /// The linear maps `u_l = W_l x_l + b_l`.
    pub layers: Vec<Linear>,
}

/// Activations of one row block: per layer `u_l` and `x_{l+1}`, `[rows, D]` each.
#[derive(Clone, Debug, Default)]
pub struct CrossActs {
    u: Vec<Vec<f32>>,
    x: Vec<Vec<f32>>,
    /// Backward scratch: the running `∂L/∂x_l`, `∂L/∂u_l` and the linear map's `∂L/∂x_l`.
    g: Vec<f32>,
    du: Vec<f32>,
    dlin: Vec<f32>,
}

impl CrossNet {
    /// `count` layers of width `dim`, their parameters from `offset` on.
    pub fn new(dim: usize, count: usize, offset: usize) -> Self {
        let mut at = offset;
        let layers = (0..count)
            .map(|_| {
                let l = Linear::new(dim, dim, at, Activation::None);
                at = l.end_offset();
                l
            })
            .collect();
        Self { layers }
    }

    /// Width `D`.
    pub fn dim(&self) -> usize {
        self.layers.first().map_or(0, |l| l.in_dim)
    }

    /// Parameters of every layer.
    pub fn num_params(&self) -> usize {
        self.layers.iter().map(Linear::num_params).sum()
    }

    /// Buffers for blocks of `rows` rows.
    pub fn acts(&self, rows: usize) -> CrossActs {
        let w = rows * self.dim();
        CrossActs {
            u: vec![vec![0.0; w]; self.layers.len()],
            x: vec![vec![0.0; w]; self.layers.len()],
            g: vec![0.0; w],
            du: vec![0.0; w],
            dlin: vec![0.0; w],
        }
    }

    /// The output `x_L` of the last [`CrossNet::forward`] (`x_0` itself without layers).
    pub fn output<'a>(&self, acts: &'a CrossActs, x0: &'a [f32]) -> &'a [f32] {
        acts.x.last().map_or(x0, Vec::as_slice)
    }

    /// Forward over `n` rows of `x0 [n, D]`.
    pub fn forward(&self, params: &[f32], x0: &[f32], n: usize, acts: &mut CrossActs) {
        let d = self.dim();
        let x0 = &x0[..n * d];
        for (l, layer) in self.layers.iter().enumerate() {
            let (done, rest) = acts.x.split_at_mut(l);
            let input: &[f32] = if l == 0 { x0 } else { &done[l - 1] };
            let u = &mut acts.u[l];
            layer.forward(params, input, n, u);
            let out = &mut rest[0][..n * d];
            for (((o, &a), &ui), &xi) in
                out.iter_mut().zip(x0).zip(&u[..n * d]).zip(&input[..n * d])
            {
                *o = a * ui + xi;
            }
        }
    }

    /// Backward from `d_out = ∂L/∂x_L` (`[n, D]`): writes every layer's `∂W`, `∂b` into
    /// `grads` and `∂L/∂x_0` into `dx0`.
    #[allow(clippy::too_many_arguments)] // the same buffers as `Linear::backward`, plus x_0
    pub fn backward(
        &self,
        params: &[f32],
        grads: &mut [f32],
        x0: &[f32],
        acts: &mut CrossActs,
        d_out: &[f32],
        dx0: &mut [f32],
        n: usize,
    ) {
        let d = self.dim();
        let w = n * d;
        let (x0, dx0) = (&x0[..w], &mut dx0[..w]);
        if self.layers.is_empty() {
            dx0.copy_from_slice(&d_out[..w]);
            return;
        }
        dx0.fill(0.0);
        acts.g[..w].copy_from_slice(&d_out[..w]);
        for l in (0..self.layers.len()).rev() {
            let CrossActs { u, x, g, du, dlin } = acts;
            let (g, du, dlin) = (&mut g[..w], &mut du[..w], &mut dlin[..w]);
            for (((dx, dui), (&gi, &ui)), &a) in dx0
                .iter_mut()
                .zip(du.iter_mut())
                .zip(g.iter().zip(&u[l][..w]))
                .zip(x0)
            {
                *dx += gi * ui;
                *dui = gi * a;
            }
            let input: &[f32] = if l == 0 { x0 } else { &x[l - 1] };
            self.layers[l].backward(params, grads, input, &u[l], du, Some(dlin), n);
            for (gi, &li) in g.iter_mut().zip(dlin.iter()) {
                *gi += li;
            }
        }
        // What is left in `g` is ∂L/∂x_0 through the first layer's input.
        for (dx, &gi) in dx0.iter_mut().zip(&acts.g[..w]) {
            *dx += gi;
        }
    }

    /// Forward FLOPs per sample: each layer's map plus the gate and residual.
    pub fn forward_flops(&self) -> u64 {
        self.layers
            .iter()
            .map(|l| l.forward_flops() + 2 * l.out_dim as u64)
            .sum()
    }
}
