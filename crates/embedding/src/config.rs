//! Typed, documented, defaulted configuration of the embedding store.

use serde::{Deserialize, Serialize};

use crate::error::{EmbeddingError, Result};

/// Configuration of a set of embedding tables sharing one dimension and one sparse optimizer.
///
/// In TOML (every field but `rows` has a default):
///
/// ```toml
/// dim = 16
/// rows = [1460, 583, 1000000]
/// seed = 0
/// [optimizer]
/// type = "row_wise_adagrad"
/// lr = 0.01
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingConfig {
    /// Embedding dimension `d` of every table. Default: [`EmbeddingConfig::DEFAULT_DIM`] (16).
    #[serde(default = "default_dim")]
    pub dim: usize,
    /// Number of hashed rows of each table, one entry per categorical feature. Required.
    pub rows: Vec<u64>,
    /// Sparse optimizer applied to every table. Default: row-wise Adagrad with its defaults.
    #[serde(default)]
    pub optimizer: SparseOptimizerConfig,
    /// Seed of the deterministic initialization. Default: 0.
    #[serde(default)]
    pub seed: u64,
}

fn default_dim() -> usize {
    EmbeddingConfig::DEFAULT_DIM
}

impl EmbeddingConfig {
    /// Default embedding dimension.
    pub const DEFAULT_DIM: usize = 16;

    /// A config with the given table sizes and every other field at its default.
    pub fn with_rows(rows: Vec<u64>) -> Self {
        Self {
            dim: Self::DEFAULT_DIM,
            rows,
            optimizer: SparseOptimizerConfig::default(),
            seed: 0,
        }
    }

    /// Checks every field; the store constructors call this.
    pub fn validate(&self) -> Result<()> {
        if self.dim == 0 {
            return Err(EmbeddingError::ZeroDim);
        }
        if self.rows.is_empty() {
            return Err(EmbeddingError::NoTables);
        }
        if let Some(table) = self.rows.iter().position(|&r| r == 0) {
            return Err(EmbeddingError::ZeroRows { table });
        }
        self.optimizer.validate()
    }

    /// Number of tables.
    pub fn num_tables(&self) -> usize {
        self.rows.len()
    }
}

/// Sparse optimizer applied once per unique row per batch (after duplicate rows' gradients
/// are summed). Tagged by `type` in TOML/JSON.
///
/// Updates, with `g` the summed gradient of a row and `w` its `d` weights:
/// * `sgd`: `w -= lr * g`. No state.
/// * `row_wise_adagrad`: one accumulator `a` per row (stored right after the weights),
///   `a += mean_j(g_j^2)` then `w_j -= lr * g_j / (sqrt(a) + eps)`, as FBGEMM / torchrec
///   row-wise Adagrad (without weight decay).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum SparseOptimizerConfig {
    /// Plain stochastic gradient descent.
    Sgd {
        /// Learning rate. Default 0.01.
        #[serde(default = "default_lr")]
        lr: f32,
    },
    /// Row-wise Adagrad: one accumulator float per row.
    RowWiseAdagrad {
        /// Learning rate. Default 0.01.
        #[serde(default = "default_lr")]
        lr: f32,
        /// Added to `sqrt(accumulator)` in the denominator. Default 1e-8.
        #[serde(default = "default_eps")]
        eps: f32,
        /// Accumulator value of a fresh row. Default 0.0.
        #[serde(default)]
        initial_accumulator: f32,
    },
}

fn default_lr() -> f32 {
    SparseOptimizerConfig::DEFAULT_LR
}

fn default_eps() -> f32 {
    SparseOptimizerConfig::DEFAULT_EPS
}

impl Default for SparseOptimizerConfig {
    fn default() -> Self {
        Self::RowWiseAdagrad {
            lr: Self::DEFAULT_LR,
            eps: Self::DEFAULT_EPS,
            initial_accumulator: 0.0,
        }
    }
}

impl SparseOptimizerConfig {
    /// Default learning rate of every sparse optimizer.
    pub const DEFAULT_LR: f32 = 0.01;
    /// Default Adagrad epsilon.
    pub const DEFAULT_EPS: f32 = 1e-8;

    /// Floats of optimizer state stored after the weights of each row.
    pub fn state_len(&self) -> usize {
        match self {
            Self::Sgd { .. } => 0,
            Self::RowWiseAdagrad { .. } => 1,
        }
    }

    /// Initial value of each state float of a fresh row.
    pub fn initial_state(&self) -> f32 {
        match self {
            Self::Sgd { .. } => 0.0,
            Self::RowWiseAdagrad {
                initial_accumulator,
                ..
            } => *initial_accumulator,
        }
    }

    /// Checks hyper-parameter ranges.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(EmbeddingError::Optimizer { reason });
        match *self {
            Self::Sgd { lr } if !(lr.is_finite() && lr >= 0.0) => bad(format!("lr {lr} must be finite and >= 0")),
            Self::RowWiseAdagrad { lr, .. } if !(lr.is_finite() && lr >= 0.0) => {
                bad(format!("lr {lr} must be finite and >= 0"))
            }
            Self::RowWiseAdagrad { eps, .. } if !(eps.is_finite() && eps >= 0.0) => {
                bad(format!("eps {eps} must be finite and >= 0"))
            }
            Self::RowWiseAdagrad {
                eps,
                initial_accumulator,
                ..
            } if !(initial_accumulator.is_finite() && initial_accumulator >= 0.0)
                || (eps == 0.0 && initial_accumulator == 0.0) =>
            {
                bad(format!(
                    "initial_accumulator {initial_accumulator} must be finite and >= 0, and > 0 when eps is 0"
                ))
            }
            _ => Ok(()),
        }
    }
}
