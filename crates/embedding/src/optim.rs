//! Sparse optimizer math on one row `[d weights | state]`. Plumbing lives in `table.rs`;
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
        }
    };
}
pub(crate) use dispatch_update;
