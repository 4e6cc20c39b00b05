//! Multi-gate mixture of experts (MMoE; Ma et al. 2018, "Modeling Task Relationships in
//! Multi-task Learning with Multi-gate Mixture-of-Experts").
//!
//! `K` expert MLPs read the same input `x` (the interaction output, or the cross layers'
//! output of a DCN-v2). Each task `t` has a gate, a linear map to `K` scores followed by a
//! softmax, and mixes the experts' outputs with its gate's weights:
//!
//! ```text
//! g_t(x) = softmax(G_t x + c_t)            (K weights)
//! f_t(x) = Σ_k g_t(x)_k · e_k(x)           (the expert width E)
//! y_t    = tower_t(f_t(x))                 (task t's logit)
//! ```
//!
//! With `task_experts = m > 0` the head is a customized gate control (CGC, the extraction
//! layer of PLE; Tang et al. 2020, "Progressive Layered Extraction"): beside the `K`
//! shared experts, each task has `m` experts of its own, and its gate mixes the shared
//! ones and its own (`K + m` weights). The other tasks' experts get no gradient from it,
//! so a task whose signal conflicts with the others' keeps experts they cannot pull away
//! (the "seesaw" MMoE shows when tasks share little).
//!
//! Task 0's tower is the model's top MLP (so a one-task model's logit, and every consumer
//! of "the logit", is task 0's); the towers of tasks `1..T` are built here with the same
//! sizes. The loss is the tasks' mean BCE summed with the tasks' weights
//! ([`MmoeConfig::weights`], 1 each by default). Gradients reach the shared experts
//! from every task, each weighted by its gate, and the gates learn which experts serve
//! which task.

use crate::layers::{Activation, Dropout, Linear, Mlp};
use crate::loss::bce_sum_with_logits;
use crate::norm::{Norm, NormActs, NormKind, NormMode};
use serde::{Deserialize, Serialize};

/// Most tasks a model can have: a data row carries one 0/1 label digit per task, and the
/// readers keep the labels after the first in a byte's bits.
pub const MAX_TASKS: usize = 8;

/// Shape of a multi-task MMoE head.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MmoeConfig {
    /// Tasks (labels), at least 1 and at most [`MAX_TASKS`]; task 0 is the one whose logit
    /// the model reports as its prediction (e.g. the click), the others follow in the
    /// order of the label digits.
    pub tasks: usize,
    /// Experts `K`, at least 1.
    pub experts: usize,
    /// Hidden and output sizes of every expert MLP (its input is the interaction output);
    /// the last is the width `E` the towers read.
    pub expert: Vec<usize>,
    /// Each task's weight in the loss, `L = Σ_t w_t · mean BCE_t`: one per task, finite,
    /// at least 0, not all 0. Empty: 1 for every task. A task of a rarer label (a
    /// conversion) or of less interest to the business is down- or up-weighted here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weights: Vec<f32>,
    /// Experts of each task's own (CGC / PLE), beside the `experts` shared ones; 0 (the
    /// default): MMoE, every expert shared.
    #[serde(default, skip_serializing_if = "crate::dlrm::is_zero")]
    pub task_experts: usize,
}

impl MmoeConfig {
    /// Why the weights cannot be used, if they cannot.
    pub fn check_weights(&self) -> Result<(), String> {
        if self.weights.is_empty() {
            return Ok(());
        }
        if self.weights.len() != self.tasks {
            return Err(format!(
                "{} task weights for {} tasks (give one per task, or none for 1 each)",
                self.weights.len(),
                self.tasks
            ));
        }
        if let Some((t, w)) = self
            .weights
            .iter()
            .enumerate()
            .find(|(_, w)| !w.is_finite() || **w < 0.0)
        {
            return Err(format!(
                "task {t}'s weight is {w}: weights must be finite and at least 0"
            ));
        }
        if self.weights.iter().all(|&w| w == 0.0) {
            return Err("every task weight is 0: nothing would be trained".into());
        }
        Ok(())
    }

    /// Task `t`'s weight in the loss.
    pub fn weight(&self, t: usize) -> f32 {
        self.weights.get(t).copied().unwrap_or(1.0)
    }
}

/// Experts, gates and the towers of tasks `1..T` (parameters contiguous, from an offset).
#[derive(Clone, Debug, PartialEq)]
pub struct Mmoe {
    /// The expert MLPs (ReLU on every layer, the last included): the `K` shared ones,
    /// then each task's own, task by task.
    pub experts: Vec<Mlp>,
    /// Shared experts `K`.
    pub shared: usize,
    /// Experts of each task's own `m` (0: MMoE).
    pub per_task: usize,
    /// One gate per task: `in → K + m` scores (the softmax follows).
    pub gates: Vec<Linear>,
    /// Towers of tasks `1..T`, each with the top MLP's sizes over the expert width.
    pub towers: Vec<Mlp>,
    /// Each task's weight in the loss (`T` of them).
    pub weights: Vec<f32>,
}

impl Mmoe {
    /// The head for input width `in_dim`, towers of sizes `tower` (excluding their input,
    /// ending with 1), parameters from `offset`. With a `norm` every hidden layer of the
    /// experts and towers is `Linear → Norm → ReLU` (as the model's bottom and top MLPs),
    /// the norms' floats after the head's other parameters.
    pub fn new(
        config: &MmoeConfig,
        in_dim: usize,
        tower: &[usize],
        offset: usize,
        norm: Option<NormKind>,
    ) -> Self {
        let mut off = offset;
        let mut sizes = vec![in_dim];
        sizes.extend_from_slice(&config.expert);
        let (shared, per_task) = (config.experts, config.task_experts);
        let experts: Vec<Mlp> = (0..shared + config.tasks * per_task)
            .map(|_| {
                let m = Mlp::new(&sizes, off, Activation::Relu, Activation::Relu);
                off += m.num_params();
                m
            })
            .collect();
        let gates: Vec<Linear> = (0..config.tasks)
            .map(|_| {
                let l = Linear::new(in_dim, shared + per_task, off, Activation::None);
                off = l.end_offset();
                l
            })
            .collect();
        let width = *config.expert.last().expect("validated");
        let mut tower_sizes = vec![width];
        tower_sizes.extend_from_slice(tower);
        let towers: Vec<Mlp> = (1..config.tasks)
            .map(|_| {
                let m = Mlp::new(&tower_sizes, off, Activation::Relu, Activation::None);
                off += m.num_params();
                m
            })
            .collect();
        let (experts, towers) = if let Some(kind) = norm {
            let mut normed = |mlps: Vec<Mlp>| -> Vec<Mlp> {
                mlps.into_iter()
                    .map(|m| {
                        let m = m.with_norm(kind, off);
                        off += m.norm_params();
                        m
                    })
                    .collect()
            };
            (normed(experts), normed(towers))
        } else {
            (experts, towers)
        };
        Self {
            experts,
            shared,
            per_task,
            gates,
            towers,
            weights: (0..config.tasks).map(|t| config.weight(t)).collect(),
        }
    }

    /// Tasks.
    pub fn tasks(&self) -> usize {
        self.gates.len()
    }

    /// Weights of each gate: the shared experts and the task's own.
    pub fn gate_width(&self) -> usize {
        self.shared + self.per_task
    }

    /// The experts task `t`'s gate mixes: (gate column, expert index) for the shared
    /// experts, then for the task's own.
    pub fn gated(&self, t: usize) -> impl Iterator<Item = (usize, usize)> {
        let (k, m) = (self.shared, self.per_task);
        (0..k)
            .map(|j| (j, j))
            .chain((0..m).map(move |i| (k + i, k + t * m + i)))
    }

    /// The column of expert `j` in task `t`'s gate, if that gate mixes it.
    fn column(&self, t: usize, j: usize) -> Option<usize> {
        let (k, m) = (self.shared, self.per_task);
        match j.checked_sub(k) {
            None => Some(j),
            Some(own) if m > 0 && own / m == t => Some(k + own % m),
            Some(_) => None,
        }
    }

    /// The experts' output width `E` (the towers' input).
    pub fn out_dim(&self) -> usize {
        self.experts[0].out_dim()
    }

    /// Parameters of the head (the layer norms' included).
    pub fn num_params(&self) -> usize {
        self.experts
            .iter()
            .chain(&self.towers)
            .map(|m| m.num_params() + m.norm_params())
            .sum::<usize>()
            + self.gates.iter().map(Linear::num_params).sum::<usize>()
    }

    /// The experts' and towers' norms (none without), for initialization.
    pub fn norms(&self) -> impl Iterator<Item = &Norm> {
        self.experts
            .iter()
            .chain(&self.towers)
            .flat_map(|m| &m.norms)
    }

    /// Every linear layer, in parameter order (for initialization).
    pub fn layers(&self) -> impl Iterator<Item = &Linear> {
        self.experts
            .iter()
            .flat_map(|m| &m.layers)
            .chain(&self.gates)
            .chain(self.towers.iter().flat_map(|m| &m.layers))
    }

    /// Widest layer (input or output) of the experts and towers, for the backward's
    /// ping-pong buffers.
    pub fn max_width(&self) -> usize {
        self.experts
            .iter()
            .chain(&self.towers)
            .map(Mlp::max_width)
            .max()
            .unwrap_or(0)
    }

    /// Forward FLOPs per sample of the experts, gates, mixing and the extra towers.
    pub fn forward_flops(&self) -> u64 {
        let mix = 2 * (self.tasks() * self.gate_width() * self.out_dim()) as u64;
        self.experts.iter().map(Mlp::forward_flops).sum::<u64>()
            + self.gates.iter().map(Linear::forward_flops).sum::<u64>()
            + self.towers.iter().map(Mlp::forward_flops).sum::<u64>()
            + mix
    }

    /// Buffers of one row block of `rows` rows.
    pub fn acts(&self, rows: usize) -> MmoeActs {
        let layer_acts = |m: &Mlp| -> Vec<Vec<f32>> {
            m.layers
                .iter()
                .map(|l| vec![0.0; rows * l.out_dim])
                .collect()
        };
        let (t, k, e) = (self.tasks(), self.gate_width(), self.out_dim());
        let in_dim = self.experts[0].in_dim();
        MmoeActs {
            experts: self.experts.iter().map(layer_acts).collect(),
            expert_norms: self.experts.iter().map(|m| m.norm_acts(rows)).collect(),
            tower_norms: self.towers.iter().map(|m| m.norm_acts(rows)).collect(),
            gates: vec![vec![0.0; rows * k]; t],
            mixes: vec![vec![0.0; rows * e]; t],
            towers: self.towers.iter().map(layer_acts).collect(),
            d_mixes: vec![vec![0.0; rows * e]; t],
            d_expert: vec![0.0; rows * e],
            d_gate: vec![0.0; rows * k],
            dx: vec![0.0; rows * in_dim],
            labels: vec![0.0; rows],
            dlogits: vec![0.0; rows],
        }
    }

    /// Experts, gates (softmax weights into `acts.gates`), each task's mixture (into
    /// `acts.mixes`) and the towers of tasks `1..T` (`acts.towers`, under `dropout` in a
    /// training step) of `n` rows of `x [n, in]`, their norms run in `mode`. Task 0's
    /// tower, the model's top MLP, runs in the caller on `acts.mixes[0]`.
    pub fn forward(
        &self,
        params: &[f32],
        x: &[f32],
        n: usize,
        acts: &mut MmoeActs,
        dropout: Option<Dropout>,
        mode: NormMode,
    ) {
        for ((expert, out), norms) in self
            .experts
            .iter()
            .zip(&mut acts.experts)
            .zip(&mut acts.expert_norms)
        {
            expert.forward_full(params, x, n, out, norms, None, mode);
        }
        let (k, e) = (self.gate_width(), self.out_dim());
        for (t, (gate, (g, mix))) in self
            .gates
            .iter()
            .zip(acts.gates.iter_mut().zip(&mut acts.mixes))
            .enumerate()
        {
            gate.forward(params, x, n, g);
            for row in g[..n * k].chunks_exact_mut(k) {
                softmax_in_place(row);
            }
            let mix = &mut mix[..n * e];
            mix.fill(0.0);
            for (col, j) in self.gated(t) {
                let out = acts.experts[j].last().expect("nonempty");
                add_gated(mix, out, g, (k, col), e);
            }
        }
        for (t, tower) in self.towers.iter().enumerate() {
            tower.forward_full(
                params,
                &acts.mixes[t + 1],
                n,
                &mut acts.towers[t],
                &mut acts.tower_norms[t],
                task_dropout(dropout, t + 1),
                mode,
            );
        }
    }

    /// Backward of [`Mmoe::forward`], after the caller's backward of task 0's tower wrote
    /// `acts.d_mixes[0]`: the towers of tasks `1..T` against their labels
    /// (`task_labels [n, T - 1]`, row-major; each loss's gradient scaled by
    /// `grad_scale` and the task's weight), then the experts and gates. Parameter
    /// gradients go into `grads` (overwritten), the gradient w.r.t. `x` into `dx [n, in]`
    /// (overwritten); `ga`/`gb` as for [`Mlp::backward`]. Returns the weighted sum of the
    /// losses of tasks `1..T`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        params: &[f32],
        grads: &mut [f32],
        x: &[f32],
        acts: &mut MmoeActs,
        (task_labels, weights, grad_scale): (&[f32], &[f32], f32),
        dx: &mut [f32],
        ga: &mut [f32],
        gb: &mut [f32],
        n: usize,
        dropout: Option<Dropout>,
    ) -> f64 {
        let mut loss = 0.0;
        let extra = self.tasks() - 1;
        for (t, tower) in self.towers.iter().enumerate() {
            for (l, row) in acts.labels[..n]
                .iter_mut()
                .zip(task_labels.chunks_exact(extra))
            {
                *l = row[t];
            }
            let logits = acts.towers[t].last().expect("nonempty");
            let w = self.weights[t + 1];
            loss += f64::from(w)
                * bce_sum_with_logits(
                    &logits[..n],
                    &acts.labels[..n],
                    weights,
                    grad_scale * w,
                    &mut acts.dlogits[..n],
                );
            tower.backward_full(
                params,
                grads,
                &acts.mixes[t + 1],
                &acts.towers[t],
                &acts.tower_norms[t],
                &mut acts.dlogits,
                ga,
                gb,
                Some(&mut acts.d_mixes[t + 1]),
                n,
                task_dropout(dropout, t + 1),
            );
        }
        self.backward_shared(params, grads, x, acts, dx, ga, gb, n);
        loss
    }

    /// The experts' and gates' part of [`Mmoe::backward`], from every task's mixture
    /// gradient (`acts.d_mixes`).
    #[allow(clippy::too_many_arguments)]
    fn backward_shared(
        &self,
        params: &[f32],
        grads: &mut [f32],
        x: &[f32],
        acts: &mut MmoeActs,
        dx: &mut [f32],
        ga: &mut [f32],
        gb: &mut [f32],
        n: usize,
    ) {
        let (k, e) = (self.gate_width(), self.out_dim());
        let in_dim = self.experts[0].in_dim();
        let dx = &mut dx[..n * in_dim];
        dx.fill(0.0);
        // Each expert's output gradient: the mixture gradients of the tasks whose gates mix
        // it, weighted by their gates, `∂L/∂e_j = Σ_t g_t,j ∂L/∂f_t`.
        for (j, (expert, out)) in self.experts.iter().zip(&acts.experts).enumerate() {
            let d = &mut acts.d_expert[..n * e];
            d.fill(0.0);
            for (t, (g, dm)) in acts.gates.iter().zip(&acts.d_mixes).enumerate() {
                if let Some(col) = self.column(t, j) {
                    add_gated(d, dm, g, (k, col), e);
                }
            }
            expert.backward_full(
                params,
                grads,
                x,
                out,
                &acts.expert_norms[j],
                d,
                ga,
                gb,
                Some(&mut acts.dx),
                n,
                None,
            );
            add_into(dx, &acts.dx[..n * in_dim]);
        }
        // Each gate: `∂L/∂g_t,j = ⟨e_j, ∂L/∂f_t⟩`, through the softmax to the scores:
        // `∂L/∂s_j = g_j (∂L/∂g_j − Σ_i g_i ∂L/∂g_i)`.
        for (t, ((gate, g), dm)) in self
            .gates
            .iter()
            .zip(&acts.gates)
            .zip(&acts.d_mixes)
            .enumerate()
        {
            let dg = &mut acts.d_gate[..n * k];
            for (r, (dg, w)) in dg.chunks_exact_mut(k).zip(g.chunks_exact(k)).enumerate() {
                let dm = &dm[r * e..(r + 1) * e];
                for (col, j) in self.gated(t) {
                    let out = acts.experts[j].last().expect("nonempty");
                    dg[col] = out[r * e..(r + 1) * e]
                        .iter()
                        .zip(dm)
                        .map(|(a, b)| a * b)
                        .sum();
                }
                let mean: f32 = dg.iter().zip(w).map(|(d, w)| d * w).sum();
                for (d, &w) in dg.iter_mut().zip(w) {
                    *d = w * (*d - mean);
                }
            }
            // The gate's activation is the identity: its stored output is not read.
            gate.backward(params, grads, x, g, dg, Some(&mut acts.dx), n);
            add_into(dx, &acts.dx[..n * in_dim]);
        }
    }
}

/// Buffers of one row block's MMoE forward and backward.
#[derive(Clone, Debug)]
pub struct MmoeActs {
    /// Per expert, per layer: the outputs.
    pub experts: Vec<Vec<Vec<f32>>>,
    /// Per expert: what its layer norms' backward needs (empty without layer norm).
    expert_norms: Vec<Vec<NormActs>>,
    /// Per task `1..T`: what its tower's layer norms' backward needs.
    tower_norms: Vec<Vec<NormActs>>,
    /// Per task: the gate's softmax weights `[n, K]`.
    pub gates: Vec<Vec<f32>>,
    /// Per task: the mixture `[n, E]` its tower reads.
    pub mixes: Vec<Vec<f32>>,
    /// Per task `1..T`, per layer: the tower's outputs (the last is the task's logit).
    pub towers: Vec<Vec<Vec<f32>>>,
    /// Per task: the gradient w.r.t. its mixture.
    pub d_mixes: Vec<Vec<f32>>,
    d_expert: Vec<f32>,
    d_gate: Vec<f32>,
    dx: Vec<f32>,
    /// One task's labels of the block, gathered from the batch's row-major task labels.
    pub labels: Vec<f32>,
    /// One task's logit gradient.
    pub dlogits: Vec<f32>,
}

/// The dropout of task `t`'s tower: its own masks (a seed per task), so the towers do
/// not drop the same units.
fn task_dropout(dropout: Option<Dropout>, task: usize) -> Option<Dropout> {
    dropout.map(|d| Dropout {
        seed: elastrec_common::splitmix::derive(d.seed, task as u64),
        ..d
    })
}

fn softmax_in_place(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in row.iter_mut() {
        *v /= sum;
    }
}

/// `out[r] += gates[r, j] · src[r]` for every row `r` of width `e`, with `gates` row-major
/// `[n, k]`: a gate-weighted expert output into a task's mixture (forward), and a task's
/// mixture gradient into expert `j`'s output gradient (backward).
fn add_gated(out: &mut [f32], src: &[f32], gates: &[f32], (k, j): (usize, usize), e: usize) {
    for ((o, s), w) in out
        .chunks_exact_mut(e)
        .zip(src.chunks_exact(e))
        .zip(gates.chunks_exact(k))
    {
        let w = w[j];
        for (o, &v) in o.iter_mut().zip(s) {
            *o += w * v;
        }
    }
}

fn add_into(out: &mut [f32], add: &[f32]) {
    for (o, a) in out.iter_mut().zip(add) {
        *o += a;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_are_distributions_and_mixtures_follow_them() {
        let cfg = MmoeConfig {
            tasks: 2,
            experts: 3,
            expert: vec![5, 4],
            weights: Vec::new(),
            task_experts: 0,
        };
        let head = Mmoe::new(&cfg, 6, &[3, 1], 0, None);
        let mut params = vec![0.0; head.num_params()];
        for (i, l) in head.layers().enumerate() {
            l.init(&mut params, 9, i as u64);
        }
        let n = 3;
        let x: Vec<f32> = (0..n * 6).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut acts = head.acts(n);
        head.forward(&params, &x, n, &mut acts, None, NormMode::Inference);
        for (t, g) in acts.gates.iter().enumerate() {
            for r in 0..n {
                let w = &g[r * 3..(r + 1) * 3];
                assert!((w.iter().sum::<f32>() - 1.0).abs() < 1e-6);
                assert!(w.iter().all(|&v| v > 0.0));
                for c in 0..4 {
                    let want: f32 = (0..3).map(|j| w[j] * acts.experts[j][1][r * 4 + c]).sum();
                    assert!((acts.mixes[t][r * 4 + c] - want).abs() < 1e-6);
                }
            }
        }
        assert_eq!(head.towers.len(), 1);
    }
}
