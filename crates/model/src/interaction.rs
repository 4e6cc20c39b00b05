//! Feature interactions between the bottom-MLP output and the embedding vectors.
//!
//! Inputs are the bottom output `z [n, db]` and the embeddings `e [n, T, d]`
//! (row-major, one sample's `T` vectors contiguous).
//!
//! * [`InteractionKind::Dot`] (needs `db == d`): with features `f_0 = z`, `f_{t+1} = e_t`
//!   (`F = T + 1`), the output row is `[z, <f_i, f_j> for i in 1..F for j in 0..i]`,
//!   width `d + F(F-1)/2`, the strictly-lower-triangular pairwise dot products in row-major
//!   order, as in the DLRM reference.
//! * [`InteractionKind::Concat`]: the output row is `[z, e_0, ..., e_{T-1}]`, width
//!   `db + T d`.

use rayon::prelude::*;

use crate::layers::ROWS_PER_TASK;

/// Which interaction the model uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InteractionKind {
    /// Pairwise dot products (DLRM default).
    Dot,
    /// Plain concatenation.
    Concat,
}

/// Shape of an interaction: bottom width, table count, embedding dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interaction {
    /// Kind of interaction.
    pub kind: InteractionKind,
    /// Bottom-MLP output width `db`.
    pub bottom_dim: usize,
    /// Number of embedding vectors per sample `T`.
    pub num_tables: usize,
    /// Embedding dimension `d`.
    pub dim: usize,
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent lanes so the compiler can vectorize without reassociation flags.
    let mut acc = [0.0f32; 8];
    let (ac, ar) = a.split_at(a.len() / 8 * 8);
    let (bc, br) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(8).zip(bc.chunks_exact(8)) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

#[inline]
fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yy, xx) in y.iter_mut().zip(x) {
        *yy += alpha * xx;
    }
}

impl Interaction {
    /// Output width per sample.
    pub fn out_dim(&self) -> usize {
        match self.kind {
            InteractionKind::Dot => {
                let f = self.num_tables + 1;
                self.bottom_dim + f * (f - 1) / 2
            }
            InteractionKind::Concat => self.bottom_dim + self.num_tables * self.dim,
        }
    }

    /// Forward FLOPs per sample (dot products; concat is a copy and counts 0).
    pub fn forward_flops(&self) -> u64 {
        match self.kind {
            InteractionKind::Dot => {
                let f = self.num_tables + 1;
                (f * (f - 1) / 2 * 2 * self.dim) as u64
            }
            InteractionKind::Concat => 0,
        }
    }

    /// Backward FLOPs per sample.
    pub fn backward_flops(&self) -> u64 {
        2 * self.forward_flops()
    }

    /// Forward: `out [n, out_dim]` from `z [n, db]` and `emb [n, T, d]`.
    pub fn forward(&self, z: &[f32], emb: &[f32], n: usize, out: &mut [f32]) {
        let (db, t, d, od) = (self.bottom_dim, self.num_tables, self.dim, self.out_dim());
        let out = &mut out[..n * od];
        let z = &z[..n * db];
        let emb = &emb[..n * t * d];
        let kind = self.kind;
        out.par_chunks_mut(ROWS_PER_TASK * od)
            .zip(z.par_chunks(ROWS_PER_TASK * db))
            .zip(emb.par_chunks(ROWS_PER_TASK * t * d))
            .for_each(|((oc, zc), ec)| {
                for ((orow, zrow), erow) in oc
                    .chunks_exact_mut(od)
                    .zip(zc.chunks_exact(db))
                    .zip(ec.chunks_exact(t * d))
                {
                    orow[..db].copy_from_slice(zrow);
                    match kind {
                        InteractionKind::Concat => orow[db..].copy_from_slice(erow),
                        InteractionKind::Dot => {
                            let feat = |i: usize| -> &[f32] {
                                if i == 0 {
                                    zrow
                                } else {
                                    &erow[(i - 1) * d..i * d]
                                }
                            };
                            let mut k = db;
                            for i in 1..=t {
                                let fi = feat(i);
                                for j in 0..i {
                                    orow[k] = dot(fi, feat(j));
                                    k += 1;
                                }
                            }
                        }
                    }
                }
            });
    }

    /// Backward: from `dout [n, out_dim]` writes (overwrites) `dz [n, db]` and
    /// `demb [n, T, d]`. Needs the forward inputs `z` and `emb`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        z: &[f32],
        emb: &[f32],
        dout: &[f32],
        n: usize,
        dz: &mut [f32],
        demb: &mut [f32],
    ) {
        let (db, t, d, od) = (self.bottom_dim, self.num_tables, self.dim, self.out_dim());
        let kind = self.kind;
        let dz = &mut dz[..n * db];
        let demb = &mut demb[..n * t * d];
        dz.par_chunks_mut(ROWS_PER_TASK * db)
            .zip(demb.par_chunks_mut(ROWS_PER_TASK * t * d))
            .zip(dout[..n * od].par_chunks(ROWS_PER_TASK * od))
            .zip(z[..n * db].par_chunks(ROWS_PER_TASK * db))
            .zip(emb[..n * t * d].par_chunks(ROWS_PER_TASK * t * d))
            .for_each(|((((dzc, dec), goc), zc), ec)| {
                for ((((dzr, der), gr), zr), er) in dzc
                    .chunks_exact_mut(db)
                    .zip(dec.chunks_exact_mut(t * d))
                    .zip(goc.chunks_exact(od))
                    .zip(zc.chunks_exact(db))
                    .zip(ec.chunks_exact(t * d))
                {
                    dzr.copy_from_slice(&gr[..db]);
                    match kind {
                        InteractionKind::Concat => der.copy_from_slice(&gr[db..]),
                        InteractionKind::Dot => dot_backward_row(zr, er, &gr[db..], dzr, der, d),
                    }
                }
            });
    }
}

/// Gather form: `df_i = sum_{j<i} g(i,j) f_j + sum_{j>i} g(j,i) f_j`, so each output row is
/// written by exactly one loop and nothing aliases.
fn dot_backward_row(z: &[f32], e: &[f32], g: &[f32], dz: &mut [f32], de: &mut [f32], d: usize) {
    let t = e.len() / d;
    let feat = |i: usize| -> &[f32] {
        if i == 0 {
            z
        } else {
            &e[(i - 1) * d..i * d]
        }
    };
    let pair = |i: usize, j: usize| i * (i - 1) / 2 + j; // i > j
                                                         // feature 0 (bottom output): only pairs (j, 0) with j > 0.
    for j in 1..=t {
        axpy(g[pair(j, 0)], feat(j), dz);
    }
    for i in 1..=t {
        let di = &mut de[(i - 1) * d..i * d];
        di.fill(0.0);
        for j in 0..i {
            axpy(g[pair(i, j)], feat(j), di);
        }
        for j in i + 1..=t {
            axpy(g[pair(j, i)], feat(j), di);
        }
    }
}
