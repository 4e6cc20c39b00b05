//! Shared helpers: seeded batches and a naive sequential reference optimizer.

use std::collections::BTreeMap;

use elastrec_embedding::{EmbeddingConfig, EmbeddingStore, SparseOptimizerConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A random batch: `n x T` ids drawn from a small skewed range (so duplicates are common)
/// and `n x T x d` gradients.
pub fn batch(
    seed: u64,
    n: usize,
    tables: usize,
    dim: usize,
    id_range: u64,
) -> (Vec<u64>, Vec<f32>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let ids = (0..n * tables)
        .map(|_| {
            // Squaring a uniform value skews towards small ids: many duplicates.
            let u: f64 = rng.random();
            (u * u * id_range as f64) as u64
        })
        .collect();
    let grads = (0..n * tables * dim)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    (ids, grads)
}

pub fn config(rows: Vec<u64>, dim: usize, optimizer: SparseOptimizerConfig) -> EmbeddingConfig {
    EmbeddingConfig {
        dim,
        rows,
        optimizer,
        seed: 11,
        dynamic: None,
    }
}

pub fn adagrad(lr: f32, eps: f32, initial_accumulator: f32) -> SparseOptimizerConfig {
    SparseOptimizerConfig::RowWiseAdagrad {
        lr,
        eps,
        initial_accumulator,
    }
}

/// Naive reference: copies every table into maps, then for each table sums gradients per row
/// in sample order and applies the update formula written out independently of the crate.
pub struct Reference {
    pub dim: usize,
    pub optimizer: SparseOptimizerConfig,
    /// (table, row) -> weights ++ state
    pub rows: BTreeMap<(usize, u64), Vec<f32>>,
}

impl Reference {
    pub fn from_store(store: &EmbeddingStore) -> Self {
        let mut rows = BTreeMap::new();
        for t in 0..store.num_tables() {
            let snap = store.export_table(t).unwrap();
            for (i, &r) in snap.rows.iter().enumerate() {
                rows.insert((t, r), snap.row_values(i).to_vec());
            }
        }
        Self {
            dim: store.dim(),
            optimizer: store.config().optimizer,
            rows,
        }
    }

    pub fn apply(&mut self, row_ids: &[u64], grads: &[f32], tables: usize) {
        let d = self.dim;
        let n = row_ids.len() / tables;
        for t in 0..tables {
            let mut sums: BTreeMap<u64, Vec<f32>> = BTreeMap::new();
            for s in 0..n {
                let g = &grads[(s * tables + t) * d..(s * tables + t + 1) * d];
                let acc = sums
                    .entry(row_ids[s * tables + t])
                    .or_insert_with(|| vec![0.0; d]);
                for j in 0..d {
                    acc[j] += g[j];
                }
            }
            for (row, g) in sums {
                let v = self.rows.get_mut(&(t, row)).unwrap();
                match self.optimizer {
                    SparseOptimizerConfig::Sgd { lr } => {
                        for j in 0..d {
                            v[j] -= lr * g[j];
                        }
                    }
                    SparseOptimizerConfig::RowWiseAdagrad { lr, eps, .. } => {
                        let mut mean = 0.0f32;
                        for x in &g {
                            mean += x * x;
                        }
                        mean /= d as f32;
                        v[d] += mean;
                        let denom = v[d].sqrt() + eps;
                        for j in 0..d {
                            v[j] -= lr / denom * g[j];
                        }
                    }
                    SparseOptimizerConfig::Adagrad { lr, eps, .. } => {
                        for j in 0..d {
                            v[d + j] += g[j] * g[j];
                            v[j] -= lr * g[j] / (v[d + j].sqrt() + eps);
                        }
                    }
                    SparseOptimizerConfig::Adam {
                        lr,
                        beta1,
                        beta2,
                        eps,
                    } => {
                        // Layout [w | m | v | t], in f64 here.
                        v[3 * d] += 1.0;
                        let t = v[3 * d] as i32;
                        for j in 0..d {
                            let gj = f64::from(g[j]);
                            let m = f64::from(beta1) * f64::from(v[d + j])
                                + (1.0 - f64::from(beta1)) * gj;
                            let s = f64::from(beta2) * f64::from(v[2 * d + j])
                                + (1.0 - f64::from(beta2)) * gj * gj;
                            let m_hat = m / (1.0 - f64::from(beta1).powi(t));
                            let s_hat = s / (1.0 - f64::from(beta2).powi(t));
                            v[j] -=
                                (f64::from(lr) * m_hat / (s_hat.sqrt() + f64::from(eps))) as f32;
                            v[d + j] = m as f32;
                            v[2 * d + j] = s as f32;
                        }
                    }
                    SparseOptimizerConfig::Ftrl {
                        lr, beta, l1, l2, ..
                    } => {
                        // Layout [w | z | n].
                        for j in 0..d {
                            let (w, z, n) = (v[j], v[d + j], v[2 * d + j]);
                            let n2 = n + g[j] * g[j];
                            let z2 = z + g[j] - (n2.sqrt() - n.sqrt()) / lr * w;
                            v[d + j] = z2;
                            v[2 * d + j] = n2;
                            v[j] = if z2.abs() <= l1 {
                                0.0
                            } else {
                                let shrunk = if z2 > 0.0 { z2 - l1 } else { z2 + l1 };
                                -shrunk / ((beta + n2.sqrt()) / lr + l2)
                            };
                        }
                    }
                }
            }
        }
    }

    pub fn assert_matches(&self, store: &EmbeddingStore, tol: f32) {
        for (&(t, row), v) in &self.rows {
            let got = store.table(t).unwrap().row(row).unwrap();
            for (j, (a, b)) in got.iter().zip(v).enumerate() {
                assert!(
                    (a - b).abs() <= tol * (1.0 + b.abs()),
                    "table {t} row {row} [{j}]: store {a} vs reference {b}"
                );
            }
        }
    }
}
