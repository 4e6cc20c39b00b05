//! A transformer over a behaviour sequence and its candidate (BST: Chen et al., "Behavior
//! Sequence Transformer for E-commerce Recommendation in Alibaba", DLP-KDD 2019).
//!
//! A row's tokens are its history items, oldest first, then the candidate (the query
//! slot's embedding), each plus a learned embedding of its recency: the candidate is
//! position 0, the newest history item 1, the oldest `len`. Each layer is a pre-norm
//! encoder block:
//!
//! ```text
//! Y₁ = X + MultiHead(N₁ W_q, N₁ W_k, N₁ W_v) W_o    N₁ = LayerNorm(X);
//!                                                 softmax(q·k / sqrt(d/heads)) per head
//! Y  = Y₁ + ReLU(LayerNorm(Y₁) W₁ + b₁) W₂ + b₂
//! ```
//!
//! BST places the norms after each residual sum (post-norm). Here the pooled vector fills
//! an embedding slot that the interaction multiplies with the other slots, so it must
//! live on the embeddings' scale: a post-norm output has unit variance whatever the
//! embeddings' scale (which starts at ±1/√rows). Pre-norm keeps the candidate's own
//! embedding on a residual path to the output, and with `W_o`, `W₂` and their biases
//! starting at zero (the residual branches start as the identity, as in Fixup and
//! ReZero) the unit starts as the candidate's embedding and learns what of the history
//! to add. The position table starts at zero too, so the items' content, not their
//! positions, leads the first steps.
//!
//! Every token attends to every token of its own row (no causal mask: BST's choice, and
//! the history is all in the past of the candidate). The pooled vector is the
//! candidate's output of the last layer, so that layer computes queries, attention and
//! feed-forward for the candidate token alone; keys and values still come from all
//! tokens. The rows of a block run as one set of GEMMs over all their tokens; only the
//! softmax over each row's own tokens is per row.
//!
//! Parameters, from the unit's offset: the position table `[max_len + 1, d]`, then per
//! layer `W_q, W_k, W_v, W_o` (each `d × d` with a bias), the first layer norm, `W₁`
//! (`d → ffn`), `W₂` (`ffn → d`) and the second layer norm (`N₁` and `LayerNorm(Y₁)`).

use crate::layers::{Activation, Linear};
use crate::norm::{LayerNorm, NormActs};
use serde::{Deserialize, Serialize};

/// The transformer of a history (`[model.transformer]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformerConfig {
    /// Attention heads; they split the embedding width, so they must divide it.
    pub heads: usize,
    /// Encoder layers.
    pub layers: usize,
    /// Hidden width of each layer's feed-forward network.
    pub ffn: usize,
    /// Learned recency embeddings added to the tokens; `false`: the tokens carry no order.
    pub positions: bool,
}

impl TransformerConfig {
    /// Why the configuration cannot run on `d`-wide embeddings, if it cannot.
    pub fn check(&self, d: usize) -> Option<String> {
        if self.heads == 0 || self.layers == 0 || self.ffn == 0 {
            return Some("heads, layers and ffn must each be at least 1".into());
        }
        if !d.is_multiple_of(self.heads) {
            return Some(format!(
                "{} heads do not divide the embedding width {d}",
                self.heads
            ));
        }
        None
    }
}

/// One encoder layer's parameters (where each lies in the flat vector).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// `W_q`, `W_k`, `W_v`, `W_o` with their biases.
    pub q: Linear,
    /// See `q`.
    pub k: Linear,
    /// See `q`.
    pub v: Linear,
    /// See `q`.
    pub o: Linear,
    /// The norm before the attention (`N₁`).
    pub norm1: LayerNorm,
    /// The feed-forward network: `d → ffn` (ReLU), `ffn → d`.
    pub ffn1: Linear,
    /// See `ffn1`.
    pub ffn2: Linear,
    /// The norm before the feed-forward network.
    pub norm2: LayerNorm,
}

impl Block {
    fn new(d: usize, ffn: usize, offset: usize) -> Self {
        let q = Linear::new(d, d, offset, Activation::None);
        let k = Linear::new(d, d, q.end_offset(), Activation::None);
        let v = Linear::new(d, d, k.end_offset(), Activation::None);
        let o = Linear::new(d, d, v.end_offset(), Activation::None);
        let norm1 = LayerNorm {
            width: d,
            offset: o.end_offset(),
        };
        let ffn1 = Linear::new(d, ffn, norm1.end_offset(), Activation::Relu);
        let ffn2 = Linear::new(ffn, d, ffn1.end_offset(), Activation::None);
        let norm2 = LayerNorm {
            width: d,
            offset: ffn2.end_offset(),
        };
        Self {
            q,
            k,
            v,
            o,
            norm1,
            ffn1,
            ffn2,
            norm2,
        }
    }

    fn end_offset(&self) -> usize {
        self.norm2.end_offset()
    }
}

/// The encoder of one history unit; its parameters at an offset of the flat vector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequenceTransformer {
    config: TransformerConfig,
    d: usize,
    max_len: usize,
    offset: usize,
    blocks: Vec<Block>,
}

/// One layer's forward values, kept for the backward.
#[derive(Debug, Default, Clone)]
struct LayerActs {
    /// Input tokens `[tokens, d]`, and normalized (`N₁`).
    x: Vec<f32>,
    xn: Vec<f32>,
    n1: NormActs,
    /// The query tokens' normalized inputs `[m, d]` (all tokens, or each row's
    /// candidate).
    xq: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Attention probabilities, per query token and head over its row's tokens.
    p: Vec<f32>,
    /// Heads' outputs, concatenated `[m, d]`.
    c: Vec<f32>,
    o: Vec<f32>,
    /// After the attention's residual sum `[m, d]`, and normalized.
    y1: Vec<f32>,
    y1n: Vec<f32>,
    n2: NormActs,
    /// Feed-forward hidden `[m, ffn]` and output `[m, d]`.
    h: Vec<f32>,
    f: Vec<f32>,
    /// The layer's output `[m, d]`.
    y: Vec<f32>,
}

/// Buffers of the backward, kept across batches.
#[derive(Debug, Default, Clone)]
struct Scratch {
    dy: Vec<f32>,
    df: Vec<f32>,
    dh: Vec<f32>,
    dy1: Vec<f32>,
    dy1n: Vec<f32>,
    dout: Vec<f32>,
    dc: Vec<f32>,
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
    dxq: Vec<f32>,
    dxn: Vec<f32>,
    dxv: Vec<f32>,
    dx: Vec<f32>,
}

/// What a forward of a row block keeps for its backward.
#[derive(Debug, Default, Clone)]
pub struct TransformerActs {
    /// Token width.
    d: usize,
    /// Each row's first token; its tokens are `len + 1` from there, the candidate last.
    starts: Vec<usize>,
    layers: Vec<LayerActs>,
    scratch: Scratch,
}

impl TransformerActs {
    /// Row `r`'s pooled vector (`d` floats) of the last forward.
    pub fn output(&self, r: usize) -> &[f32] {
        let y = &self.layers.last().expect("a forward ran").y;
        &y[r * self.d..][..self.d]
    }

    /// Where the backward reads the outputs' gradient: `[n, d]`, sized for the last
    /// forward's `n` rows.
    pub fn output_grad(&mut self) -> &mut [f32] {
        let n = self.starts.len();
        self.scratch.dy.resize(n * self.d, 0.0);
        &mut self.scratch.dy
    }
}

/// Which tokens of a block a layer computes outputs for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Queries {
    /// Every token (a layer before the last).
    All,
    /// Each row's candidate token (the last layer).
    Candidates,
}

impl Queries {
    /// What layer `i` of `0..=last` computes: only the last needs just the candidates.
    fn of_layer(i: usize, last: usize) -> Self {
        if i == last {
            Self::Candidates
        } else {
            Self::All
        }
    }

    /// The queries of row `r`, whose `t_row` tokens start at token `start`.
    fn of_row(self, r: usize, start: usize, t_row: usize) -> std::ops::Range<usize> {
        match self {
            Self::All => start..start + t_row,
            Self::Candidates => r..r + 1,
        }
    }
}

impl SequenceTransformer {
    /// An encoder of `d`-wide tokens over histories of up to `max_len` items, its
    /// parameters from `offset`.
    pub fn new(config: TransformerConfig, d: usize, max_len: usize, offset: usize) -> Self {
        let mut at = offset + (max_len + 1) * d;
        let blocks = (0..config.layers)
            .map(|_| {
                let b = Block::new(d, config.ffn, at);
                at = b.end_offset();
                b
            })
            .collect();
        Self {
            config,
            d,
            max_len,
            offset,
            blocks,
        }
    }

    /// Its parameters.
    pub fn num_params(&self) -> usize {
        self.blocks.last().map_or(0, Block::end_offset) - self.offset
    }

    /// Its settings.
    pub fn config(&self) -> &TransformerConfig {
        &self.config
    }

    /// Its encoder layers, first to last.
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// Where the recency table `[max_len + 1, d]` lies in the flat vector (row `k`: the
    /// token `k` places before the candidate, which is row 0).
    pub fn positions(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + (self.max_len + 1) * self.d
    }

    /// Initializes its parameters ([module docs](self)): `W_q, W_k, W_v, W₁` each from
    /// its own stream, counted from `stream` (the streams used are returned); `W_o`, `W₂`,
    /// their biases and the position table zero; the norms the identity.
    pub fn init(&self, params: &mut [f32], seed: u64, stream: u64) -> u64 {
        let mut next = stream;
        for b in &self.blocks {
            for l in [&b.q, &b.k, &b.v, &b.ffn1] {
                l.init(params, seed, next);
                next += 1;
            }
            for l in [&b.o, &b.ffn2] {
                params[l.w_offset..l.end_offset()].fill(0.0);
            }
            b.norm1.init(params);
            b.norm2.init(params);
        }
        params[self.positions()].fill(0.0);
        next - stream
    }

    /// Encodes each row's history and candidate; row `r`'s pooled vector is then
    /// [`TransformerActs::output`]`(r)`. `hist [n, max_len, row]` (item `t` of row `r` at
    /// `(r · max_len + t) · row`), `lens [n]` (1..=max_len), `query(r)` the candidate's
    /// `d` floats.
    pub fn forward<'a>(
        &self,
        params: &[f32],
        hist: &[f32],
        lens: &[u32],
        row: usize,
        query: impl Fn(usize) -> &'a [f32],
        acts: &mut TransformerActs,
    ) {
        let d = self.d;
        acts.starts.clear();
        let mut tokens = 0;
        for &l in lens {
            acts.starts.push(tokens);
            tokens += l as usize + 1;
        }
        acts.layers
            .resize_with(self.blocks.len(), LayerActs::default);
        // The first layer's input: items oldest first, then the candidate, each plus
        // the embedding of its recency.
        let pos = &params[self.positions()];
        let x = &mut acts.layers[0].x;
        x.resize(tokens * d, 0.0);
        for (r, &l) in lens.iter().enumerate() {
            let l = l as usize;
            for t in 0..=l {
                let src = if t == l {
                    query(r)
                } else {
                    &hist[(r * self.max_len + t) * row..][..d]
                };
                let dst = &mut x[(acts.starts[r] + t) * d..][..d];
                dst.copy_from_slice(&src[..d]);
                if self.config.positions {
                    for (o, &p) in dst.iter_mut().zip(&pos[(l - t) * d..][..d]) {
                        *o += p;
                    }
                }
            }
        }
        let last = self.blocks.len() - 1;
        for (i, b) in self.blocks.iter().enumerate() {
            if i > 0 {
                let (before, rest) = acts.layers.split_at_mut(i);
                rest[0].x.clear();
                rest[0].x.extend_from_slice(&before[i - 1].y);
            }
            let queries = Queries::of_layer(i, last);
            self.layer_forward(b, params, lens, &acts.starts, queries, &mut acts.layers[i]);
        }
        acts.d = d;
    }

    fn layer_forward(
        &self,
        b: &Block,
        params: &[f32],
        lens: &[u32],
        starts: &[usize],
        queries: Queries,
        a: &mut LayerActs,
    ) {
        let d = self.d;
        let tokens = a.x.len() / d;
        let m = match queries {
            Queries::All => tokens,
            Queries::Candidates => lens.len(),
        };
        a.xn.clear();
        a.xn.extend_from_slice(&a.x);
        norm_buffers(&mut a.n1, tokens, d);
        b.norm1.forward(params, &mut a.xn, tokens, &mut a.n1);
        a.xq.clear();
        match queries {
            Queries::All => a.xq.extend_from_slice(&a.xn),
            Queries::Candidates => {
                for (r, &l) in lens.iter().enumerate() {
                    a.xq.extend_from_slice(&a.xn[(starts[r] + l as usize) * d..][..d]);
                }
            }
        }
        for (buf, rows) in [(&mut a.q, m), (&mut a.k, tokens), (&mut a.v, tokens)] {
            buf.resize(rows * d, 0.0);
        }
        b.q.forward(params, &a.xq, m, &mut a.q);
        b.k.forward(params, &a.xn, tokens, &mut a.k);
        b.v.forward(params, &a.xn, tokens, &mut a.v);
        // Attention within each row.
        let heads = self.config.heads;
        let hd = d / heads;
        let scale = 1.0 / (hd as f32).sqrt();
        a.c.clear();
        a.c.resize(m * d, 0.0);
        a.p.clear();
        for (r, &l) in lens.iter().enumerate() {
            let (start, t_row) = (starts[r], l as usize + 1);
            for i in queries.of_row(r, start, t_row) {
                for h in 0..heads {
                    let qv = &a.q[i * d + h * hd..][..hd];
                    let at = a.p.len();
                    for j in 0..t_row {
                        let kv = &a.k[(start + j) * d + h * hd..][..hd];
                        a.p.push(scale * dot(qv, kv));
                    }
                    softmax(&mut a.p[at..]);
                    let c = &mut a.c[i * d + h * hd..][..hd];
                    for j in 0..t_row {
                        let w = a.p[at + j];
                        let vv = &a.v[(start + j) * d + h * hd..][..hd];
                        for (o, &x) in c.iter_mut().zip(vv) {
                            *o += w * x;
                        }
                    }
                }
            }
        }
        a.o.resize(m * d, 0.0);
        b.o.forward(params, &a.c, m, &mut a.o);
        a.y1.clear();
        for i in 0..m {
            let token = query_token(queries, i, starts, lens);
            let x = &a.x[token * d..][..d];
            a.y1.extend(x.iter().zip(&a.o[i * d..][..d]).map(|(x, o)| x + o));
        }
        a.y1n.clear();
        a.y1n.extend_from_slice(&a.y1);
        norm_buffers(&mut a.n2, m, d);
        b.norm2.forward(params, &mut a.y1n, m, &mut a.n2);
        a.h.resize(m * self.config.ffn, 0.0);
        b.ffn1.forward(params, &a.y1n, m, &mut a.h);
        a.f.resize(m * d, 0.0);
        b.ffn2.forward(params, &a.h, m, &mut a.f);
        a.y.clear();
        a.y.extend(a.y1.iter().zip(&a.f).map(|(x, f)| x + f));
    }

    /// The backward of the last [`SequenceTransformer::forward`] with the same inputs:
    /// from the outputs' gradient (written into [`TransformerActs::output_grad`]) passes
    /// the gradient of item `t` of row `r` to `d_item(r, t, g)` and of the candidate to
    /// `d_query(r, g)`, and writes the parameter gradient into `grads` (overwritten, at
    /// its offsets).
    pub fn backward(
        &self,
        params: &[f32],
        grads: &mut [f32],
        lens: &[u32],
        mut d_item: impl FnMut(usize, usize, &[f32]),
        mut d_query: impl FnMut(usize, &[f32]),
        acts: &mut TransformerActs,
    ) {
        let d = self.d;
        let TransformerActs {
            starts,
            layers,
            scratch: s,
            ..
        } = acts;
        let last = self.blocks.len() - 1;
        for (i, b) in self.blocks.iter().enumerate().rev() {
            let queries = Queries::of_layer(i, last);
            self.layer_backward(b, params, grads, lens, starts, queries, &layers[i], s);
            // This layer's input gradient is the previous layer's output gradient.
            std::mem::swap(&mut s.dy, &mut s.dx);
        }
        let dpos = &mut grads[self.positions()];
        dpos.fill(0.0);
        for (r, &l) in lens.iter().enumerate() {
            let l = l as usize;
            for t in 0..=l {
                let g = &s.dy[(starts[r] + t) * d..][..d];
                if self.config.positions {
                    for (p, &v) in dpos[(l - t) * d..][..d].iter_mut().zip(g) {
                        *p += v;
                    }
                }
                if t == l {
                    d_query(r, g);
                } else {
                    d_item(r, t, g);
                }
            }
        }
    }

    /// One layer's backward: `s.dy` (the output gradient, `[m, d]`) to `s.dx` (the input
    /// tokens' gradient, `[tokens, d]`).
    #[allow(clippy::too_many_arguments)]
    fn layer_backward(
        &self,
        b: &Block,
        params: &[f32],
        grads: &mut [f32],
        lens: &[u32],
        starts: &[usize],
        queries: Queries,
        a: &LayerActs,
        s: &mut Scratch,
    ) {
        let d = self.d;
        let tokens = a.x.len() / d;
        let m = a.xq.len() / d;
        // Y = Y₁ + FFN(LN(Y₁)).
        s.df.clear();
        s.df.extend_from_slice(&s.dy);
        s.dh.resize(m * self.config.ffn, 0.0);
        b.ffn2
            .backward(params, grads, &a.h, &a.f, &mut s.df, Some(&mut s.dh), m);
        s.dy1n.resize(m * d, 0.0);
        b.ffn1
            .backward(params, grads, &a.y1n, &a.h, &mut s.dh, Some(&mut s.dy1n), m);
        b.norm2.backward(params, grads, &mut s.dy1n, m, &a.n2);
        s.dy1.clear();
        s.dy1.extend(s.dy.iter().zip(&s.dy1n).map(|(a, b)| a + b));
        // Y₁ = X_q + Attention(N₁) W_o.
        s.dout.clear();
        s.dout.extend_from_slice(&s.dy1);
        s.dc.resize(m * d, 0.0);
        b.o.backward(params, grads, &a.c, &a.o, &mut s.dout, Some(&mut s.dc), m);
        self.attention_backward(lens, starts, queries, a, s);
        s.dxq.resize(m * d, 0.0);
        b.q.backward(params, grads, &a.xq, &a.q, &mut s.dq, Some(&mut s.dxq), m);
        s.dxn.resize(tokens * d, 0.0);
        s.dxv.resize(tokens * d, 0.0);
        b.k.backward(
            params,
            grads,
            &a.xn,
            &a.k,
            &mut s.dk,
            Some(&mut s.dxn),
            tokens,
        );
        b.v.backward(
            params,
            grads,
            &a.xn,
            &a.v,
            &mut s.dv,
            Some(&mut s.dxv),
            tokens,
        );
        for (g, &v) in s.dxn.iter_mut().zip(&s.dxv) {
            *g += v;
        }
        for i in 0..m {
            let token = query_token(queries, i, starts, lens);
            for (o, &g) in s.dxn[token * d..][..d].iter_mut().zip(&s.dxq[i * d..][..d]) {
                *o += g;
            }
        }
        b.norm1.backward(params, grads, &mut s.dxn, tokens, &a.n1);
        // The input's gradient: through N₁, plus the residual of the query tokens.
        s.dx.clear();
        s.dx.extend_from_slice(&s.dxn);
        for i in 0..m {
            let token = query_token(queries, i, starts, lens);
            for (o, &g) in s.dx[token * d..][..d].iter_mut().zip(&s.dy1[i * d..][..d]) {
                *o += g;
            }
        }
    }

    /// The softmax attention's backward: `s.dc` to `s.dq`, `s.dk`, `s.dv`.
    fn attention_backward(
        &self,
        lens: &[u32],
        starts: &[usize],
        queries: Queries,
        a: &LayerActs,
        s: &mut Scratch,
    ) {
        let d = self.d;
        let tokens = a.x.len() / d;
        let m = a.xq.len() / d;
        let heads = self.config.heads;
        let hd = d / heads;
        let scale = 1.0 / (hd as f32).sqrt();
        s.dq.clear();
        s.dq.resize(m * d, 0.0);
        for buf in [&mut s.dk, &mut s.dv] {
            buf.clear();
            buf.resize(tokens * d, 0.0);
        }
        let mut dp = Vec::new();
        let mut at = 0;
        for (r, &l) in lens.iter().enumerate() {
            let (start, t_row) = (starts[r], l as usize + 1);
            for i in queries.of_row(r, start, t_row) {
                for h in 0..heads {
                    let p = &a.p[at..at + t_row];
                    at += t_row;
                    let dc = &s.dc[i * d + h * hd..][..hd];
                    dp.clear();
                    for (j, &pj) in p.iter().enumerate() {
                        let tok = (start + j) * d + h * hd;
                        dp.push(dot(dc, &a.v[tok..][..hd]));
                        for (g, &x) in s.dv[tok..][..hd].iter_mut().zip(dc) {
                            *g += pj * x;
                        }
                    }
                    let mean = dot(p, &dp);
                    let qv = &a.q[i * d + h * hd..][..hd];
                    for (j, &pj) in p.iter().enumerate() {
                        let ds = scale * pj * (dp[j] - mean);
                        let tok = (start + j) * d + h * hd;
                        let dq = &mut s.dq[i * d + h * hd..][..hd];
                        for (g, &kv) in dq.iter_mut().zip(&a.k[tok..][..hd]) {
                            *g += ds * kv;
                        }
                        for (g, &qx) in s.dk[tok..][..hd].iter_mut().zip(qv) {
                            *g += ds * qx;
                        }
                    }
                }
            }
        }
    }

    /// Forward FLOPs per history item of one row of `len` items (the projections,
    /// the attention and the feed-forward of each layer).
    pub fn flops_per_item(&self, len: usize) -> u64 {
        let (d, f, t) = (self.d as u64, self.config.ffn as u64, len as u64 + 1);
        let layer = 2 * 4 * d * d + 2 * 2 * d * f + 2 * 2 * t * d;
        layer * self.blocks.len() as u64
    }
}

/// The token of query `i` of a layer.
fn query_token(queries: Queries, i: usize, starts: &[usize], lens: &[u32]) -> usize {
    match queries {
        Queries::All => i,
        Queries::Candidates => starts[i] + lens[i] as usize,
    }
}

fn norm_buffers(n: &mut NormActs, rows: usize, width: usize) {
    n.xhat.resize(rows * width, 0.0);
    n.rstd.resize(rows, 0.0);
}

pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

pub(crate) fn softmax(v: &mut [f32]) {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut total = 0.0;
    for x in v.iter_mut() {
        *x = (*x - max).exp();
        total += *x;
    }
    for x in v.iter_mut() {
        *x /= total;
    }
}
