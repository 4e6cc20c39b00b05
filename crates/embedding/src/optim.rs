//! Sparse optimizer math on one row `[d weights | state]` (the formulas are on
//! [`crate::SparseOptimizerConfig`]). Plumbing lives in `table.rs`;
//! the hyper-parameters come from [`crate::SparseOptimizerConfig`].

/// One optimizer's update of one row; the table code is generic over it, so dispatch on the
/// optimizer kind happens once per batch, not once per row.
pub(crate) trait RowUpdate: Copy + Send + Sync {
    /// Updates `row = [w (g.len() floats) | state]` with the (already summed) gradient `g`.
    fn apply(&self, row: &mut [f32], g: &[f32]);
}

/// `w -= lr * g`.
#[derive(Clone, Copy)]
pub(crate) struct Sgd {
    pub lr: f32,
}

impl RowUpdate for Sgd {
    #[inline]
    fn apply(&self, row: &mut [f32], g: &[f32]) {
        for (w, g) in row.iter_mut().zip(g) {
            *w -= self.lr * g;
        }
    }
}

/// `acc += sum(g^2) / d; w -= (lr / (sqrt(acc) + eps)) * g`.
#[derive(Clone, Copy)]
pub(crate) struct RowWiseAdagrad {
    pub lr: f32,
    pub eps: f32,
}

impl RowUpdate for RowWiseAdagrad {
    #[inline]
    fn apply(&self, row: &mut [f32], g: &[f32]) {
        let d = g.len();
        let (w, acc) = row.split_at_mut(d);
        let sq: f32 = g.iter().map(|g| g * g).sum();
        let a = acc[0] + sq / d as f32;
        acc[0] = a;
        let step = self.lr / (a.sqrt() + self.eps);
        for (w, g) in w.iter_mut().zip(g) {
            *w -= step * g;
        }
    }
}

/// `a_j += g_j^2; w_j -= lr * g_j / (sqrt(a_j) + eps)`.
#[derive(Clone, Copy)]
pub(crate) struct Adagrad {
    pub lr: f32,
    pub eps: f32,
}

impl RowUpdate for Adagrad {
    #[inline]
    fn apply(&self, row: &mut [f32], g: &[f32]) {
        let (w, acc) = row.split_at_mut(g.len());
        for ((w, a), g) in w.iter_mut().zip(acc.iter_mut()).zip(g) {
            *a += g * g;
            *w -= self.lr * g / (a.sqrt() + self.eps);
        }
    }
}

/// Lazy Adam with a per-row step count: row = `[w | m | v | t]`.
#[derive(Clone, Copy)]
pub(crate) struct Adam {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
}

impl RowUpdate for Adam {
    #[inline]
    fn apply(&self, row: &mut [f32], g: &[f32]) {
        let d = g.len();
        let (w, state) = row.split_at_mut(d);
        let (m, rest) = state.split_at_mut(d);
        let (v, t) = rest.split_at_mut(d);
        t[0] += 1.0;
        // The corrections in f64: `beta^t` of a frequent row underflows f32 gracefully,
        // but `1 - beta2^t` for small t loses digits in f32.
        let steps = f64::from(t[0]);
        let c1 = (1.0 - f64::from(self.beta1).powf(steps)) as f32;
        let c2 = (1.0 - f64::from(self.beta2).powf(steps)) as f32;
        for (((w, m), v), &g) in w.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(g) {
            *m = self.beta1 * *m + (1.0 - self.beta1) * g;
            *v = self.beta2 * *v + (1.0 - self.beta2) * g * g;
            *w -= self.lr * (*m / c1) / ((*v / c2).sqrt() + self.eps);
        }
    }
}

/// FTRL-Proximal per weight: row = `[w | z | n]`.
#[derive(Clone, Copy)]
pub(crate) struct Ftrl {
    pub lr: f32,
    pub beta: f32,
    pub l1: f32,
    pub l2: f32,
}

impl RowUpdate for Ftrl {
    #[inline]
    fn apply(&self, row: &mut [f32], g: &[f32]) {
        let d = g.len();
        let (w, state) = row.split_at_mut(d);
        let (z, n) = state.split_at_mut(d);
        for (((w, z), n), &g) in w.iter_mut().zip(z.iter_mut()).zip(n.iter_mut()).zip(g) {
            let n_new = *n + g * g;
            let sigma = (n_new.sqrt() - n.sqrt()) / self.lr;
            *z += g - sigma * *w;
            *n = n_new;
            *w = if z.abs() <= self.l1 {
                0.0
            } else {
                -(*z - z.signum() * self.l1) / ((self.beta + n_new.sqrt()) / self.lr + self.l2)
            };
        }
    }
}

/// Evaluates `$body` with `$u` bound to the monomorphic updater of optimizer config `$opt`.
macro_rules! dispatch_update {
    ($opt:expr, |$u:ident| $body:expr) => {
        match $opt {
            $crate::config::SparseOptimizerConfig::Sgd { lr } => {
                let $u = $crate::optim::Sgd { lr };
                $body
            }
            $crate::config::SparseOptimizerConfig::RowWiseAdagrad { lr, eps, .. } => {
                let $u = $crate::optim::RowWiseAdagrad { lr, eps };
                $body
            }
            $crate::config::SparseOptimizerConfig::Adagrad { lr, eps, .. } => {
                let $u = $crate::optim::Adagrad { lr, eps };
                $body
            }
            $crate::config::SparseOptimizerConfig::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => {
                let $u = $crate::optim::Adam {
                    lr,
                    beta1,
                    beta2,
                    eps,
                };
                $body
            }
            $crate::config::SparseOptimizerConfig::Ftrl {
                lr, beta, l1, l2, ..
            } => {
                let $u = $crate::optim::Ftrl { lr, beta, l1, l2 };
                $body
            }
        }
    };
}
pub(crate) use dispatch_update;
