//! Target attention over a behaviour sequence (DIN: Zhou et al., "Deep Interest Network
//! for Click-Through Rate Prediction", KDD 2018): each history item `h_t` is scored
//! against the query `q` (the candidate item's embedding) by a small MLP over
//! `[h_t, q, h_t − q, h_t ⊙ q]`, and the history pools into one vector
//! `Σ_t w_t h_t`, with `w_t` the raw scores (DIN's choice: the sum keeps how much of the
//! history relates to the candidate) or their softmax over the history.
//!
//! The pooled vector fills the history's embedding slot, so every model family reads it
//! as it reads any pooled slot. The attention MLP's parameters are part of the model's
//! flat dense vector. A row of an embedding slot is `row` floats: the first `d` are the
//! embedding the MLP scores, the rest (a first-order weight) is pooled with the same
//! weights.
//!
//! A unit may pool by a transformer instead ([`crate::transformer`], BST): the history and
//! the candidate encoded together, the candidate's output as the pooled vector; a
//! first-order float is then the mean of the items'.
//!
//! Inputs per unit: the histories `[n, max_len, row]` (zero-padded) and their lengths
//! `[n]`, each at least 1 (an empty history is the table's null row, once).

use crate::layers::{Activation, Linear, Mlp};
use crate::transformer::{dot, softmax, SequenceTransformer, TransformerActs, TransformerConfig};
use serde::{Deserialize, Serialize};

/// One history pooled by target attention (`[model.attention]`, per feature).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionConfig {
    /// The embedding slot the pooled history fills.
    pub slot: usize,
    /// The embedding slot of the query (the candidate item).
    pub query: usize,
    /// Longest history (the padded length of the input).
    pub max_len: usize,
    /// Hidden sizes of the scoring MLP (its output is one score).
    pub mlp: Vec<usize>,
    /// Softmax-normalized weights; `false`: DIN's raw scores.
    #[serde(default)]
    pub softmax: bool,
    /// Pool by a transformer over the history and the query (BST) instead of DIN's
    /// scoring MLP (`mlp` and `softmax` are then unused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transformer: Option<TransformerConfig>,
}

/// What pools a unit's history.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Pooler {
    /// DIN's scoring MLP over `[h, q, h − q, h ⊙ q]`.
    Din(Mlp),
    /// A transformer over `[history…, candidate]`.
    Transformer(SequenceTransformer),
}

/// A target-attention unit with its parameters at an offset of the flat dense vector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetAttention {
    /// Its configuration.
    pub config: AttentionConfig,
    /// Where its parameters start.
    offset: usize,
    pooler: Pooler,
    /// Embedding width scored.
    d: usize,
    /// Floats per embedding row (`d`, or `d + 1` with a first-order weight).
    row: usize,
}

/// What a forward keeps for the backward, and the backward's buffers (kept across
/// batches).
#[derive(Debug, Default, Clone)]
pub struct AttentionActs {
    /// The parameter gradient of a block's backward (of a unit [`TargetAttention::alone`]).
    pub grads: Vec<f32>,
    /// Each row's first pair.
    starts: Vec<usize>,
    /// The MLP's input, one `[h, q, h − q, h ⊙ q]` per (row, item) pair.
    x: Vec<f32>,
    acts: Vec<Vec<f32>>,
    /// The pooling weight of each pair.
    weights: Vec<f32>,
    dy: Vec<f32>,
    ga: Vec<f32>,
    gb: Vec<f32>,
    dx: Vec<f32>,
    /// A transformer's forward values and buffers.
    encoder: TransformerActs,
}

impl TargetAttention {
    /// A unit scoring `d`-wide embeddings in rows of `row` floats, its parameters from
    /// `offset`.
    pub fn new(config: AttentionConfig, d: usize, row: usize, offset: usize) -> Self {
        let pooler = match &config.transformer {
            Some(t) => Pooler::Transformer(SequenceTransformer::new(
                t.clone(),
                d,
                config.max_len,
                offset,
            )),
            None => {
                let mut sizes = vec![4 * d];
                sizes.extend_from_slice(&config.mlp);
                sizes.push(1);
                Pooler::Din(Mlp::new(&sizes, offset, Activation::Relu, Activation::None))
            }
        };
        Self {
            config,
            offset,
            pooler,
            d,
            row,
        }
    }

    /// Parameters of the scoring MLP or the transformer.
    pub fn num_params(&self) -> usize {
        match &self.pooler {
            Pooler::Din(mlp) => mlp.num_params(),
            Pooler::Transformer(t) => t.num_params(),
        }
    }

    /// The transformer of a BST unit; `None` for a DIN unit.
    pub fn transformer(&self) -> Option<&SequenceTransformer> {
        match &self.pooler {
            Pooler::Transformer(t) => Some(t),
            Pooler::Din(_) => None,
        }
    }

    /// DIN's scoring MLP over `[h, q, h − q, h ⊙ q]`; `None` for a transformer unit.
    pub fn din_mlp(&self) -> Option<&Mlp> {
        match &self.pooler {
            Pooler::Din(mlp) => Some(mlp),
            Pooler::Transformer(_) => None,
        }
    }

    /// Where its parameters lie in the flat dense vector.
    pub fn params_range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.num_params()
    }

    /// The same unit with its parameters at offset 0: it runs on a slice of just its
    /// parameters and writes its gradient into a buffer of just its own.
    pub fn alone(&self) -> Self {
        Self::new(self.config.clone(), self.d, self.row, 0)
    }

    /// Initializes its parameters, each linear layer from its own stream counted from
    /// `stream`; returns the streams used.
    pub fn init(&self, params: &mut [f32], seed: u64, stream: u64) -> u64 {
        match &self.pooler {
            Pooler::Din(mlp) => {
                for (i, l) in mlp.layers.iter().enumerate() {
                    l.init(params, seed, stream + i as u64);
                }
                mlp.layers.len() as u64
            }
            Pooler::Transformer(t) => t.init(params, seed, stream),
        }
    }

    /// The scoring MLP's layers (none for a transformer).
    pub fn layers(&self) -> &[Linear] {
        match &self.pooler {
            Pooler::Din(mlp) => &mlp.layers,
            Pooler::Transformer(_) => &[],
        }
    }

    /// Floats of its input per row: `max_len` items of `row` floats.
    pub fn input_width(&self) -> usize {
        self.config.max_len * self.row
    }

    /// Pools each row's history into `emb`'s slot ([module docs](self)): `hist
    /// [n, max_len, row]`, `lens [n]` (1..=max_len), `emb [n, slots, row]` (the query
    /// slot is read, the unit's slot written).
    pub fn forward(
        &self,
        params: &[f32],
        hist: &[f32],
        lens: &[u32],
        emb: &mut [f32],
        slots: usize,
        acts: &mut AttentionActs,
    ) {
        let mlp = match &self.pooler {
            Pooler::Din(mlp) => mlp,
            Pooler::Transformer(t) => {
                return self.encode(t, params, hist, lens, emb, slots, acts);
            }
        };
        let (d, row, t_max) = (self.d, self.row, self.config.max_len);
        acts.starts.clear();
        let mut pairs = 0;
        for &l in lens {
            acts.starts.push(pairs);
            pairs += l as usize;
        }
        acts.x.resize(pairs * 4 * d, 0.0);
        for (r, &l) in lens.iter().enumerate() {
            let q = &emb[(r * slots + self.config.query) * row..][..d];
            for t in 0..l as usize {
                let h = &hist[(r * t_max + t) * row..][..d];
                let x = &mut acts.x[(acts.starts[r] + t) * 4 * d..][..4 * d];
                let (xh, rest) = x.split_at_mut(d);
                let (xq, rest) = rest.split_at_mut(d);
                let (xdiff, xprod) = rest.split_at_mut(d);
                for k in 0..d {
                    xh[k] = h[k];
                    xq[k] = q[k];
                    xdiff[k] = h[k] - q[k];
                    xprod[k] = h[k] * q[k];
                }
            }
        }
        acts.acts.resize_with(mlp.layers.len(), Vec::new);
        for (a, l) in acts.acts.iter_mut().zip(&mlp.layers) {
            a.resize(pairs * l.out_dim, 0.0);
        }
        mlp.forward(params, &acts.x, pairs, &mut acts.acts);
        let scores = acts.acts.last().expect("an output layer");
        acts.weights.clear();
        acts.weights.extend_from_slice(&scores[..pairs]);
        if self.config.softmax {
            for (&start, &l) in acts.starts.iter().zip(lens) {
                softmax(&mut acts.weights[start..][..l as usize]);
            }
        }
        for (r, &l) in lens.iter().enumerate() {
            let out = &mut emb[(r * slots + self.config.slot) * row..][..row];
            out.fill(0.0);
            for t in 0..l as usize {
                let w = acts.weights[acts.starts[r] + t];
                let h = &hist[(r * t_max + t) * row..][..row];
                for (o, &v) in out.iter_mut().zip(h) {
                    *o += w * v;
                }
            }
        }
    }

    /// The backward of the last [`TargetAttention::forward`] with the same inputs:
    /// from the gradient of the pooled slot in `d_emb`, writes the histories' gradient
    /// into `d_hist` (`[n, max_len, row]`, padding 0), adds the query's to `d_emb`'s query
    /// slot and writes the MLP's parameter gradient into `grads` (at its offsets).
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        params: &[f32],
        grads: &mut [f32],
        hist: &[f32],
        lens: &[u32],
        emb: &[f32],
        d_emb: &mut [f32],
        d_hist: &mut [f32],
        slots: usize,
        acts: &mut AttentionActs,
    ) {
        let mlp = match &self.pooler {
            Pooler::Din(mlp) => mlp,
            Pooler::Transformer(t) => {
                return self.encode_backward(t, params, grads, lens, d_emb, d_hist, slots, acts);
            }
        };
        let (d, row, t_max) = (self.d, self.row, self.config.max_len);
        let pairs = acts.weights.len();
        // d score of each pair: dp · h_t, through the softmax when there is one.
        acts.dy.resize(pairs, 0.0);
        for (r, &l) in lens.iter().enumerate() {
            let dp = &d_emb[(r * slots + self.config.slot) * row..][..row];
            let start = acts.starts[r];
            for t in 0..l as usize {
                let h = &hist[(r * t_max + t) * row..][..row];
                acts.dy[start + t] = dot(dp, h);
            }
            if self.config.softmax {
                let w = &acts.weights[start..start + l as usize];
                let dw = &mut acts.dy[start..start + l as usize];
                let mean = dot(w, dw);
                for (g, &wt) in dw.iter_mut().zip(w) {
                    *g = wt * (*g - mean);
                }
            }
        }
        let width = mlp.max_width();
        acts.ga.resize(pairs * width, 0.0);
        acts.gb.resize(pairs * width, 0.0);
        acts.dx.resize(pairs * 4 * d, 0.0);
        mlp.backward(
            params,
            grads,
            &acts.x,
            &acts.acts,
            &mut acts.dy,
            &mut acts.ga,
            &mut acts.gb,
            Some(&mut acts.dx),
            pairs,
        );
        d_hist[..lens.len() * t_max * row].fill(0.0);
        let mut dq = vec![0.0f32; d];
        for (r, &l) in lens.iter().enumerate() {
            dq.fill(0.0);
            let q = &emb[(r * slots + self.config.query) * row..][..d];
            let dp = &d_emb[(r * slots + self.config.slot) * row..][..row];
            for t in 0..l as usize {
                let pair = acts.starts[r] + t;
                let w = acts.weights[pair];
                let h = &hist[(r * t_max + t) * row..][..row];
                let dh = &mut d_hist[(r * t_max + t) * row..][..row];
                for (g, &p) in dh.iter_mut().zip(dp) {
                    *g = w * p;
                }
                let dx = &acts.dx[pair * 4 * d..][..4 * d];
                let (dxh, rest) = dx.split_at(d);
                let (dxq, rest) = rest.split_at(d);
                let (dxdiff, dxprod) = rest.split_at(d);
                for k in 0..d {
                    dh[k] += dxh[k] + dxdiff[k] + dxprod[k] * q[k];
                    dq[k] += dxq[k] - dxdiff[k] + dxprod[k] * h[k];
                }
            }
            let dq_slot = &mut d_emb[(r * slots + self.config.query) * row..][..d];
            for (g, &v) in dq_slot.iter_mut().zip(&dq) {
                *g += v;
            }
        }
    }

    /// The transformer's forward: the candidate's output fills the slot's first `d`
    /// floats, the items' mean the rest of the row (a first-order weight).
    #[allow(clippy::too_many_arguments)]
    fn encode(
        &self,
        t: &SequenceTransformer,
        params: &[f32],
        hist: &[f32],
        lens: &[u32],
        emb: &mut [f32],
        slots: usize,
        acts: &mut AttentionActs,
    ) {
        let (d, row, t_max) = (self.d, self.row, self.config.max_len);
        let (query, slot) = (self.config.query, self.config.slot);
        {
            let emb = &*emb;
            let q = |r: usize| &emb[(r * slots + query) * row..][..d];
            t.forward(params, hist, lens, row, q, &mut acts.encoder);
        }
        for (r, &l) in lens.iter().enumerate() {
            let out = &mut emb[(r * slots + slot) * row..][..row];
            out[..d].copy_from_slice(acts.encoder.output(r));
            let rest = &mut out[d..];
            rest.fill(0.0);
            for item in 0..l as usize {
                let h = &hist[(r * t_max + item) * row..][d..row];
                for (o, &v) in rest.iter_mut().zip(h) {
                    *o += v / l as f32;
                }
            }
        }
    }

    /// The backward of [`TargetAttention::encode`].
    #[allow(clippy::too_many_arguments)]
    fn encode_backward(
        &self,
        t: &SequenceTransformer,
        params: &[f32],
        grads: &mut [f32],
        lens: &[u32],
        d_emb: &mut [f32],
        d_hist: &mut [f32],
        slots: usize,
        acts: &mut AttentionActs,
    ) {
        let (d, row, t_max) = (self.d, self.row, self.config.max_len);
        let (query, slot) = (self.config.query, self.config.slot);
        let g = acts.encoder.output_grad();
        for r in 0..lens.len() {
            g[r * d..][..d].copy_from_slice(&d_emb[(r * slots + slot) * row..][..d]);
        }
        d_hist[..lens.len() * t_max * row].fill(0.0);
        // The first-order floats of the items share the slot's equally.
        for (r, &l) in lens.iter().enumerate() {
            let dp = &d_emb[(r * slots + slot) * row..][d..row];
            for item in 0..l as usize {
                let dh = &mut d_hist[(r * t_max + item) * row..][d..row];
                for (o, &v) in dh.iter_mut().zip(dp) {
                    *o = v / l as f32;
                }
            }
        }
        let mut dq = vec![0.0f32; lens.len() * d];
        t.backward(
            params,
            grads,
            lens,
            |r, item, g| d_hist[(r * t_max + item) * row..][..d].copy_from_slice(g),
            |r, g| dq[r * d..][..d].copy_from_slice(g),
            &mut acts.encoder,
        );
        for (r, g) in dq.chunks_exact(d).enumerate() {
            for (o, &v) in d_emb[(r * slots + query) * row..][..d].iter_mut().zip(g) {
                *o += v;
            }
        }
    }

    /// Forward FLOPs per history item (of a full history for a transformer; the DIN
    /// pooling is a few more than its MLP's).
    pub fn flops_per_item(&self) -> u64 {
        match &self.pooler {
            Pooler::Din(mlp) => mlp.forward_flops(),
            Pooler::Transformer(t) => t.flops_per_item(self.config.max_len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A unit over 3 slots (slot 0 the query, slot 2 the history), two rows with
    /// histories of 3 and 1 items, random inputs, and the loss `Σ c · emb`.
    struct Case {
        unit: TargetAttention,
        params: Vec<f32>,
        hist: Vec<f32>,
        lens: Vec<u32>,
        emb: Vec<f32>,
        c: Vec<f32>,
    }

    const SLOTS: usize = 3;

    fn case(softmax: bool, row_extra: usize, transformer: Option<TransformerConfig>) -> Case {
        let (d, t_max) = (4, 3);
        let row = d + row_extra;
        let config = AttentionConfig {
            slot: 2,
            query: 0,
            max_len: t_max,
            mlp: vec![5, 3],
            softmax,
            transformer,
        };
        let unit = TargetAttention::new(config, d, row, 0);
        let mut params = vec![0.0; unit.num_params()];
        unit.init(&mut params, 7, 0);
        // Biases away from 0 keep the ReLUs off their kinks for finite differences.
        let mut rng = crate::init::InitRng::new(3, 0);
        let mut draw = |k: usize| (0..k).map(|_| rng.uniform_sym(1.0)).collect::<Vec<f32>>();
        if unit.config.transformer.is_some() {
            // A transformer starts as the identity on the candidate (zero output
            // projections and positions), where most of its gradients are 0: check them
            // away from it.
            for (p, r) in params.iter_mut().zip(draw(unit.num_params())) {
                *p += 0.5 * r;
            }
        }
        let lens = vec![3, 1];
        let mut hist = draw(2 * t_max * row);
        // Padding stays zero, as the lookups leave it.
        for v in &mut hist[(t_max + 1) * row..] {
            *v = 0.0;
        }
        let emb = draw(2 * SLOTS * row);
        let c = draw(2 * SLOTS * row);
        Case {
            unit,
            params,
            hist,
            lens,
            emb,
            c,
        }
    }

    fn loss(k: &Case, params: &[f32], hist: &[f32], emb: &[f32]) -> f64 {
        let mut emb = emb.to_vec();
        let mut acts = AttentionActs::default();
        k.unit
            .forward(params, hist, &k.lens, &mut emb, SLOTS, &mut acts);
        emb.iter().zip(&k.c).map(|(a, b)| f64::from(a * b)).sum()
    }

    fn check(softmax: bool, row_extra: usize) {
        check_unit(case(softmax, row_extra, None));
    }

    fn check_unit(k: Case) {
        let softmax = k.unit.config.softmax;
        let mut emb = k.emb.clone();
        let mut acts = AttentionActs::default();
        k.unit
            .forward(&k.params, &k.hist, &k.lens, &mut emb, SLOTS, &mut acts);
        // d loss / d emb is c, except at the pooled slot, which the forward overwrote:
        // the query reaches the loss only through the pooling there.
        let mut d_emb = k.c.clone();
        let mut grads = vec![0.0; k.params.len()];
        let mut d_hist = vec![0.0; k.hist.len()];
        k.unit.backward(
            &k.params,
            &mut grads,
            &k.hist,
            &k.lens,
            &emb,
            &mut d_emb,
            &mut d_hist,
            SLOTS,
            &mut acts,
        );
        let eps = 1e-3;
        let numeric = |f: &dyn Fn(f32) -> f64| (f(eps) - f(-eps)) / (2.0 * f64::from(eps));
        let close = |a: f64, b: f32, what: &str| {
            assert!(
                (a - f64::from(b)).abs() <= 2e-3 * (1.0 + a.abs()),
                "{what}: numeric {a} against analytic {b} (softmax {softmax})"
            );
        };
        for i in 0..k.params.len() {
            let g = numeric(&|e| {
                let mut p = k.params.clone();
                p[i] += e;
                loss(&k, &p, &k.hist, &k.emb)
            });
            close(g, grads[i], &format!("param {i}"));
        }
        let row = k.unit.row;
        for i in 0..k.hist.len() {
            let (r, t) = (i / (3 * row), (i / row) % 3);
            if t >= k.lens[r] as usize {
                assert_eq!(d_hist[i], 0.0, "padding gets no gradient");
                continue;
            }
            let g = numeric(&|e| {
                let mut h = k.hist.clone();
                h[i] += e;
                loss(&k, &k.params, &h, &k.emb)
            });
            close(g, d_hist[i], &format!("history float {i}"));
        }
        // The query slot (slot 0): its gradient is c plus what flows through attention.
        for r in 0..2 {
            for j in 0..row {
                let i = r * SLOTS * row + j;
                let g = numeric(&|e| {
                    let mut em = k.emb.clone();
                    em[i] += e;
                    loss(&k, &k.params, &k.hist, &em)
                });
                close(g, d_emb[i], &format!("query float {i}"));
            }
        }
    }

    #[test]
    fn gradients_match_finite_differences_with_raw_scores() {
        check(false, 0);
    }

    #[test]
    fn gradients_match_finite_differences_with_softmax() {
        check(true, 0);
    }

    #[test]
    fn gradients_match_finite_differences_with_no_hidden_layer() {
        for softmax in [false, true] {
            let mut k = case(softmax, 0, None);
            let mut config = k.unit.config.clone();
            config.mlp.clear();
            k.unit = TargetAttention::new(config, 4, 4, 0);
            k.params = vec![0.0; k.unit.num_params()];
            k.unit.init(&mut k.params, 7, 0);
            check_unit(k);
        }
    }

    #[test]
    fn a_first_order_float_is_pooled_with_the_same_weights() {
        check(false, 1);
        check(true, 1);
    }

    fn transformer(heads: usize, layers: usize) -> Option<TransformerConfig> {
        Some(TransformerConfig {
            heads,
            layers,
            ffn: 6,
            positions: true,
        })
    }

    #[test]
    fn a_transformer_of_one_layer_has_the_gradients_of_finite_differences() {
        check_unit(case(false, 0, transformer(1, 1)));
        check_unit(case(false, 0, transformer(2, 1)));
    }

    #[test]
    fn a_transformer_of_two_layers_has_the_gradients_of_finite_differences() {
        check_unit(case(false, 0, transformer(2, 2)));
    }

    #[test]
    fn a_transformer_pools_a_first_order_float_by_the_items_mean() {
        check_unit(case(false, 1, transformer(2, 1)));
        let k = case(false, 1, transformer(2, 1));
        let mut emb = k.emb.clone();
        let mut acts = AttentionActs::default();
        k.unit
            .forward(&k.params, &k.hist, &k.lens, &mut emb, SLOTS, &mut acts);
        let row = 5;
        let mean = (k.hist[4] + k.hist[row + 4] + k.hist[2 * row + 4]) / 3.0;
        assert!((emb[2 * row + 4] - mean).abs() < 1e-6);
    }

    #[test]
    fn a_transformer_sees_the_order_of_the_history_through_its_positions() {
        // The same items in another order pool to another vector with positions, and to
        // the same one without.
        for positions in [true, false] {
            let mut k = case(false, 0, transformer(2, 1));
            let mut config = k.unit.config.clone();
            config
                .transformer
                .as_mut()
                .expect("a transformer")
                .positions = positions;
            // The same weights either way: without positions, the table is not read.
            k.unit = TargetAttention::new(config, 4, 4, 0);
            let pooled = |hist: &[f32]| {
                let mut emb = k.emb.clone();
                let mut acts = AttentionActs::default();
                k.unit
                    .forward(&k.params, hist, &k.lens, &mut emb, SLOTS, &mut acts);
                emb[2 * 4..3 * 4].to_vec()
            };
            let mut swapped = k.hist.clone();
            let (first, rest) = swapped.split_at_mut(4);
            first.swap_with_slice(&mut rest[4..8]);
            let (a, b) = (pooled(&k.hist), pooled(&swapped));
            let differ = a.iter().zip(&b).any(|(x, y)| (x - y).abs() > 1e-4);
            assert_eq!(differ, positions, "{a:?} against {b:?}");
        }
    }

    #[test]
    fn the_item_like_the_query_weighs_most_under_softmax() {
        // With h ⊙ q as a feature, an MLP that sums it scores each item by h · q.
        let d = 2;
        let config = AttentionConfig {
            slot: 1,
            query: 0,
            max_len: 2,
            mlp: vec![],
            softmax: true,
            transformer: None,
        };
        let unit = TargetAttention::new(config, d, d, 0);
        let mut params = vec![0.0; unit.num_params()];
        params[3 * d..4 * d].fill(4.0);
        let hist = [1.0, 0.0, 0.0, 1.0];
        let mut emb = [1.0, 0.0, 0.0, 0.0];
        let mut acts = AttentionActs::default();
        unit.forward(&params, &hist, &[2], &mut emb, 2, &mut acts);
        let w = &acts.weights;
        assert!((w[0] + w[1] - 1.0).abs() < 1e-6);
        assert!(w[0] > 0.98, "{w:?}");
        assert!((emb[2] - w[0]).abs() < 1e-6 && (emb[3] - w[1]).abs() < 1e-6);
    }
}
