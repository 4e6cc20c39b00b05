//! Dense optimizers over flat parameter / gradient slices.
//!
//! State lives in flat buffers of the same length as the parameters, so the parameter
//! server can shard, ship and checkpoint it as plain slices. Updates run in parallel
//! chunks with plain loops the compiler vectorizes.

use rayon::prelude::*;
use std::ops::Range;

/// Elements per rayon task.
const CHUNK: usize = 1 << 14;

/// An optimizer that updates a flat parameter slice in place from a gradient slice.
pub trait DenseOptimizer: Send {
    /// One update step. `params` and `grads` must have the length the optimizer was
    /// built for.
    fn step(&mut self, params: &mut [f32], grads: &[f32]);

    /// Optimizer state buffers (for checkpoints), in a fixed order.
    fn state(&self) -> Vec<&[f32]>;

    /// Mutable state buffers (for restores), same order as [`DenseOptimizer::state`].
    fn state_mut(&mut self) -> Vec<&mut [f32]>;

    /// Updates only the parameters `[offset, offset + grads.len())` of the slice (`params`
    /// is the whole slice the optimizer was built for) and their state, without advancing
    /// the step count: Adam's bias correction uses the current count (at least 1). This
    /// finishes a step whose other parameters were updated elsewhere: after a parameter
    /// server re-sharding, the part of a push that the old servers refused reaches the new
    /// owners of its parameters, whose step count (the largest of the old servers') already
    /// includes the step.
    ///
    /// # Panics
    /// If the range is not inside the slice.
    fn step_range(&mut self, params: &mut [f32], grads: &[f32], offset: usize);

    /// Steps taken, for optimizers whose update depends on it (Adam's bias correction);
    /// checkpoints carry it beside [`DenseOptimizer::state`].
    fn steps(&self) -> u64 {
        0
    }

    /// Restores the step count saved by [`DenseOptimizer::steps`].
    fn set_steps(&mut self, _steps: u64) {}

    /// Sets the learning rate of the next steps (a schedule's warm-up or decay).
    fn set_lr(&mut self, lr: f32);
}

/// Serializable choice of dense optimizer with its hyper-parameters.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum DenseOptimizerConfig {
    /// Plain SGD.
    Sgd {
        /// Learning rate.
        lr: f32,
        /// L2 penalty: `weight_decay · p` is added to each gradient (PyTorch semantics).
        #[serde(default, skip_serializing_if = "is_zero")]
        weight_decay: f32,
    },
    /// Adagrad (PyTorch semantics: `p -= lr g / (sqrt(acc) + eps)`).
    Adagrad {
        /// Learning rate.
        lr: f32,
        /// Initial accumulator value.
        #[serde(default)]
        initial_accumulator: f32,
        /// Added to the square root of the accumulator.
        #[serde(default = "default_adagrad_eps")]
        eps: f32,
        /// L2 penalty: `weight_decay · p` is added to each gradient (PyTorch semantics).
        #[serde(default, skip_serializing_if = "is_zero")]
        weight_decay: f32,
    },
    /// Adam with bias correction.
    Adam {
        /// Learning rate.
        lr: f32,
        /// First-moment decay.
        #[serde(default = "default_beta1")]
        beta1: f32,
        /// Second-moment decay.
        #[serde(default = "default_beta2")]
        beta2: f32,
        /// Added to the square root of the corrected second moment.
        #[serde(default = "default_adam_eps")]
        eps: f32,
        /// L2 penalty added to each gradient before the moments (`torch.optim.Adam`'s
        /// `weight_decay`, not AdamW's decoupled decay).
        #[serde(default, skip_serializing_if = "is_zero")]
        weight_decay: f32,
    },
}

// Zero decay is not written, so configs (and job fingerprints) from before it existed
// serialize as they did.
fn is_zero(v: &f32) -> bool {
    *v == 0.0
}

fn default_adagrad_eps() -> f32 {
    1e-10
}
fn default_beta1() -> f32 {
    0.9
}
fn default_beta2() -> f32 {
    0.999
}
fn default_adam_eps() -> f32 {
    1e-8
}

impl DenseOptimizerConfig {
    /// The configured learning rate.
    pub fn lr(&self) -> f32 {
        match *self {
            Self::Sgd { lr, .. } | Self::Adagrad { lr, .. } | Self::Adam { lr, .. } => lr,
        }
    }

    /// The configured L2 penalty.
    pub fn weight_decay(&self) -> f32 {
        match *self {
            Self::Sgd { weight_decay, .. }
            | Self::Adagrad { weight_decay, .. }
            | Self::Adam { weight_decay, .. } => weight_decay,
        }
    }

    /// Builds the optimizer for `num_params` parameters.
    pub fn build(&self, num_params: usize) -> Box<dyn DenseOptimizer> {
        match *self {
            Self::Sgd { lr, weight_decay } => Box::new(Sgd { lr, weight_decay }),
            Self::Adagrad {
                lr,
                initial_accumulator,
                eps,
                weight_decay,
            } => Box::new(Adagrad {
                weight_decay,
                ..Adagrad::new(num_params, lr, initial_accumulator, eps)
            }),
            Self::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => Box::new(Adam {
                weight_decay,
                ..Adam::new(num_params, lr, beta1, beta2, eps)
            }),
        }
    }

    /// [`DenseOptimizerConfig::build`] for a slice whose offsets `statistics` hold
    /// running statistics ([`crate::DenseDlrm::statistic_ranges`], shifted to the slice):
    /// those follow [`RunningAverages`], the rest this optimizer. Without statistics, the
    /// optimizer itself.
    pub fn build_with_statistics(
        &self,
        num_params: usize,
        statistics: Vec<Range<usize>>,
    ) -> Box<dyn DenseOptimizer> {
        let inner = self.build(num_params);
        if statistics.is_empty() {
            inner
        } else {
            Box::new(RunningAverages::new(
                inner,
                statistics,
                crate::norm::MOMENTUM,
            ))
        }
    }
}

/// The ranges of `statistics` (offsets of the whole flat vector) that fall in `slice`,
/// relative to its start: what a parameter server holding `slice` applies as running
/// averages.
pub fn statistics_in(statistics: &[Range<usize>], slice: &Range<usize>) -> Vec<Range<usize>> {
    statistics
        .iter()
        .filter_map(|r| {
            let (a, b) = (r.start.max(slice.start), r.end.min(slice.end));
            (a < b).then(|| a - slice.start..b - slice.start)
        })
        .collect()
}

/// A dense optimizer whose slice holds running statistics (batch norms') at some offsets:
/// there the "gradient" a step carries is the step's statistic minus the running value,
/// and the update is `p += momentum · g`, whatever the optimizer (no learning rate, no
/// weight decay, no moments). Everywhere else `inner` updates as it would.
///
/// `inner` steps the whole slice, then the statistics are put back and moved by their
/// own rule; its state at those offsets (moments, accumulators) is never read.
pub struct RunningAverages {
    inner: Box<dyn DenseOptimizer>,
    /// Offsets of the slice, sorted, disjoint.
    statistics: Vec<Range<usize>>,
    momentum: f32,
    /// The statistics' values before `inner`'s step.
    saved: Vec<f32>,
}

impl RunningAverages {
    /// `inner` for the weights, running averages with `momentum` at `statistics`.
    pub fn new(
        inner: Box<dyn DenseOptimizer>,
        mut statistics: Vec<Range<usize>>,
        momentum: f32,
    ) -> Self {
        statistics.sort_by_key(|r| r.start);
        Self {
            inner,
            statistics,
            momentum,
            saved: Vec::new(),
        }
    }

    /// The statistics' offsets within `[offset, offset + len)`, relative to `offset`.
    fn within(&self, offset: usize, len: usize) -> Vec<Range<usize>> {
        statistics_in(&self.statistics, &(offset..offset + len))
    }

    /// Keeps the statistics at `ranges` of `part` aside.
    fn save(&mut self, part: &[f32], ranges: &[Range<usize>]) {
        self.saved.clear();
        for r in ranges {
            self.saved.extend_from_slice(&part[r.clone()]);
        }
    }

    /// Puts the saved statistics back into `part`, each moved by `momentum` times its
    /// entry of `grads` (same offsets as `part`).
    fn move_statistics(&self, part: &mut [f32], grads: &[f32], ranges: &[Range<usize>]) {
        let mut old = self.saved.iter();
        for r in ranges {
            for (p, &g) in part[r.clone()].iter_mut().zip(&grads[r.clone()]) {
                *p = old.next().expect("saved before the step") + self.momentum * g;
            }
        }
    }
}

impl DenseOptimizer for RunningAverages {
    fn step(&mut self, params: &mut [f32], grads: &[f32]) {
        let ranges = self.within(0, params.len());
        self.save(params, &ranges);
        self.inner.step(params, grads);
        self.move_statistics(params, grads, &ranges);
    }

    fn step_range(&mut self, params: &mut [f32], grads: &[f32], offset: usize) {
        let part = offset..offset + grads.len();
        let ranges = self.within(offset, grads.len());
        self.save(&params[part.clone()], &ranges);
        self.inner.step_range(params, grads, offset);
        self.move_statistics(&mut params[part], grads, &ranges);
    }

    fn state(&self) -> Vec<&[f32]> {
        self.inner.state()
    }

    fn state_mut(&mut self) -> Vec<&mut [f32]> {
        self.inner.state_mut()
    }

    fn steps(&self) -> u64 {
        self.inner.steps()
    }

    fn set_steps(&mut self, steps: u64) {
        self.inner.set_steps(steps);
    }

    fn set_lr(&mut self, lr: f32) {
        self.inner.set_lr(lr);
    }
}

/// `p -= lr * g`.
#[derive(Clone, Debug)]
pub struct Sgd {
    /// Learning rate.
    pub lr: f32,
    /// L2 penalty added to each gradient.
    pub weight_decay: f32,
}

impl Sgd {
    /// SGD with learning rate `lr`.
    pub fn new(lr: f32) -> Self {
        Self {
            lr,
            weight_decay: 0.0,
        }
    }
}

impl Sgd {
    fn update(&self, params: &mut [f32], grads: &[f32]) {
        assert_eq!(params.len(), grads.len());
        let (lr, wd) = (self.lr, self.weight_decay);
        params
            .par_chunks_mut(CHUNK)
            .zip(grads.par_chunks(CHUNK))
            .for_each(|(p, g)| {
                for (p, g) in p.iter_mut().zip(g) {
                    *p -= lr * (g + wd * *p);
                }
            });
    }
}

impl DenseOptimizer for Sgd {
    fn step(&mut self, params: &mut [f32], grads: &[f32]) {
        self.update(params, grads);
    }

    fn step_range(&mut self, params: &mut [f32], grads: &[f32], offset: usize) {
        self.update(&mut params[offset..offset + grads.len()], grads);
    }

    fn state(&self) -> Vec<&[f32]> {
        Vec::new()
    }

    fn state_mut(&mut self) -> Vec<&mut [f32]> {
        Vec::new()
    }

    fn set_lr(&mut self, lr: f32) {
        self.lr = lr;
    }
}

/// Adagrad: `acc += g^2; p -= lr * g / (sqrt(acc) + eps)`.
#[derive(Clone, Debug)]
pub struct Adagrad {
    /// Learning rate.
    pub lr: f32,
    /// Added to `sqrt(acc)`.
    pub eps: f32,
    /// L2 penalty added to each gradient.
    pub weight_decay: f32,
    /// Sum of squared gradients per parameter.
    pub accum: Vec<f32>,
}

impl Adagrad {
    /// Adagrad state for `num_params` parameters.
    pub fn new(num_params: usize, lr: f32, initial_accumulator: f32, eps: f32) -> Self {
        Self {
            lr,
            eps,
            weight_decay: 0.0,
            accum: vec![initial_accumulator; num_params],
        }
    }
}

impl Adagrad {
    /// Updates `params` (`[offset, offset + len)` of the slice) with their accumulators.
    fn update(&mut self, params: &mut [f32], grads: &[f32], offset: usize) {
        assert_eq!(params.len(), grads.len());
        let (lr, eps, wd) = (self.lr, self.eps, self.weight_decay);
        let accum = &mut self.accum[offset..offset + params.len()];
        params
            .par_chunks_mut(CHUNK)
            .zip(grads.par_chunks(CHUNK))
            .zip(accum.par_chunks_mut(CHUNK))
            .for_each(|((p, g), a)| {
                for ((p, &g), a) in p.iter_mut().zip(g).zip(a.iter_mut()) {
                    let g = g + wd * *p;
                    *a += g * g;
                    *p -= lr * g / (a.sqrt() + eps);
                }
            });
    }
}

impl DenseOptimizer for Adagrad {
    fn step(&mut self, params: &mut [f32], grads: &[f32]) {
        assert_eq!(params.len(), self.accum.len());
        self.update(params, grads, 0);
    }

    fn step_range(&mut self, params: &mut [f32], grads: &[f32], offset: usize) {
        self.update(&mut params[offset..offset + grads.len()], grads, offset);
    }

    fn state(&self) -> Vec<&[f32]> {
        vec![&self.accum]
    }

    fn state_mut(&mut self) -> Vec<&mut [f32]> {
        vec![&mut self.accum]
    }

    fn set_lr(&mut self, lr: f32) {
        self.lr = lr;
    }
}

/// Adam with bias correction (PyTorch semantics; `weight_decay` is an L2 penalty).
#[derive(Clone, Debug)]
pub struct Adam {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Added to the corrected RMS.
    pub eps: f32,
    /// L2 penalty added to each gradient before the moments.
    pub weight_decay: f32,
    /// Steps taken so far.
    pub t: u64,
    /// First moment.
    pub m: Vec<f32>,
    /// Second moment.
    pub v: Vec<f32>,
}

impl Adam {
    /// Adam state for `num_params` parameters.
    pub fn new(num_params: usize, lr: f32, beta1: f32, beta2: f32, eps: f32) -> Self {
        Self {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay: 0.0,
            t: 0,
            m: vec![0.0; num_params],
            v: vec![0.0; num_params],
        }
    }
}

impl Adam {
    /// Updates `params` (`[offset, offset + len)` of the slice) with their moments, bias
    /// corrected for step `t`.
    fn update(&mut self, params: &mut [f32], grads: &[f32], offset: usize, t: u64) {
        assert_eq!(params.len(), grads.len());
        let (b1, b2, eps, wd) = (self.beta1, self.beta2, self.eps, self.weight_decay);
        let bc1 = 1.0 - (b1 as f64).powi(t as i32);
        let bc2 = 1.0 - (b2 as f64).powi(t as i32);
        let step_size = (self.lr as f64 / bc1) as f32;
        let inv_sqrt_bc2 = (1.0 / bc2.sqrt()) as f32;
        let range = offset..offset + params.len();
        params
            .par_chunks_mut(CHUNK)
            .zip(grads.par_chunks(CHUNK))
            .zip(self.m[range.clone()].par_chunks_mut(CHUNK))
            .zip(self.v[range].par_chunks_mut(CHUNK))
            .for_each(|(((p, g), m), v)| {
                for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
                    let g = g + wd * *p;
                    *m = b1 * *m + (1.0 - b1) * g;
                    *v = b2 * *v + (1.0 - b2) * g * g;
                    let denom = v.sqrt() * inv_sqrt_bc2 + eps;
                    *p -= step_size * *m / denom;
                }
            });
    }
}

impl DenseOptimizer for Adam {
    fn step(&mut self, params: &mut [f32], grads: &[f32]) {
        assert_eq!(params.len(), self.m.len());
        self.t += 1;
        self.update(params, grads, 0, self.t);
    }

    fn step_range(&mut self, params: &mut [f32], grads: &[f32], offset: usize) {
        let t = self.t.max(1);
        self.update(&mut params[offset..offset + grads.len()], grads, offset, t);
    }

    fn state(&self) -> Vec<&[f32]> {
        vec![&self.m, &self.v]
    }

    fn state_mut(&mut self) -> Vec<&mut [f32]> {
        vec![&mut self.m, &mut self.v]
    }

    fn steps(&self) -> u64 {
        self.t
    }

    fn set_steps(&mut self, steps: u64) {
        self.t = steps;
    }

    fn set_lr(&mut self, lr: f32) {
        self.lr = lr;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step split into two ranges (the second applied with `step_range`, the count
    /// already advanced by the first) equals one whole step, for every optimizer.
    #[test]
    fn a_step_split_into_ranges_equals_the_whole_step() {
        let configs = [
            DenseOptimizerConfig::Sgd {
                lr: 0.1,
                weight_decay: 0.0,
            },
            DenseOptimizerConfig::Adagrad {
                lr: 0.1,
                initial_accumulator: 0.5,
                eps: 1e-10,
                weight_decay: 0.01,
            },
            DenseOptimizerConfig::Adam {
                lr: 0.01,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.01,
            },
        ];
        let n = 10;
        let grads: Vec<Vec<f32>> = (0..3)
            .map(|s| (0..n).map(|i| (i as f32 - 4.0) * 0.1 + s as f32).collect())
            .collect();
        for c in configs {
            let (mut whole, mut split) = (c.build(n), c.build(n));
            let mut pw: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect();
            let mut ps = pw.clone();
            for g in &grads {
                whole.step(&mut pw, g);
                // The first 4 parameters by a full step (as the server that accepted its
                // part), then the rest by a range step, as if re-split.
                let mut head = g.clone();
                head[4..].fill(0.0);
                let keep_tail = ps[4..].to_vec();
                let state_tail: Vec<Vec<f32>> =
                    split.state().iter().map(|b| b[4..].to_vec()).collect();
                split.step(&mut ps, &head);
                ps[4..].copy_from_slice(&keep_tail);
                for (b, t) in split.state_mut().into_iter().zip(&state_tail) {
                    b[4..].copy_from_slice(t);
                }
                split.step_range(&mut ps, &g[4..], 4);
            }
            assert_eq!(pw, ps, "{c:?}");
            assert_eq!(whole.steps(), split.steps(), "{c:?}");
            for (a, b) in whole.state().iter().zip(split.state()) {
                assert_eq!(*a, b, "{c:?}");
            }
        }
    }

    /// Running statistics move by `momentum · g` whatever the optimizer (no rate, no
    /// weight decay, no moments), the other parameters exactly as without them; a step
    /// split into ranges (a parameter server's re-sharding) equals the whole step.
    #[test]
    fn running_averages_move_by_their_own_rule() {
        let adam = DenseOptimizerConfig::Adam {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.1,
        };
        let n = 12;
        let stats = vec![3..5, 8..10];
        let grads: Vec<Vec<f32>> = (0..3)
            .map(|s| (0..n).map(|i| (i as f32 - 5.0) * 0.1 + s as f32).collect())
            .collect();
        let (mut with, mut plain) = (adam.build_with_statistics(n, stats.clone()), adam.build(n));
        let mut split = adam.build_with_statistics(n, stats.clone());
        let p0: Vec<f32> = (0..n).map(|i| 0.5 + i as f32 * 0.01).collect();
        let (mut pw, mut pp, mut ps) = (p0.clone(), p0.clone(), p0.clone());
        for g in &grads {
            let before = pw.clone();
            with.step(&mut pw, g);
            plain.step(&mut pp, g);
            for i in 0..n {
                if stats.iter().any(|r| r.contains(&i)) {
                    assert_eq!(pw[i], before[i] + 0.1 * g[i], "statistic {i}");
                } else {
                    assert_eq!(pw[i], pp[i], "weight {i}");
                }
            }
            // Split at 4, inside neither range, and at 9, inside the second.
            let mut head = g.clone();
            head[4..].fill(0.0);
            let keep: Vec<f32> = ps[4..].to_vec();
            split.step(&mut ps, &head);
            ps[4..].copy_from_slice(&keep);
            split.step_range(&mut ps, &g[4..9], 4);
            split.step_range(&mut ps, &g[9..], 9);
        }
        for i in 0..n {
            if stats.iter().any(|r| r.contains(&i)) || i < 4 {
                assert_eq!(ps[i], pw[i], "{i}");
            }
        }
        assert_eq!(
            statistics_in(&[3..5, 8..10, 20..30], &(4..22)),
            vec![0..1, 4..6, 16..18]
        );
    }
}
