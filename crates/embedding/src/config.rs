//! Typed, documented, defaulted configuration of the embedding store.

use serde::{Deserialize, Serialize};

use crate::dynamic::{DynamicConfig, DYNAMIC_KEY_SPACE};
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
    /// With `dynamic`, each table's memory budget: the bytes of that many hashed rows.
    pub rows: Vec<u64>,
    /// Sparse optimizer applied to every table. Default: row-wise Adagrad with its defaults.
    #[serde(default)]
    pub optimizer: SparseOptimizerConfig,
    /// Seed of the deterministic initialization. Default: 0.
    #[serde(default)]
    pub seed: u64,
    /// Dynamic tables (a growing key → row map with admission and eviction) instead of
    /// hashed ones. Default: none (hashed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic: Option<DynamicConfig>,
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
            dynamic: None,
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
        if let Some(d) = &self.dynamic {
            d.validate()?;
        }
        self.optimizer.validate()
    }

    /// The row count ids are hashed over, per table: `rows`, or a dynamic table's
    /// [`DYNAMIC_KEY_SPACE`]. What a process routing ids to parameter servers must use.
    pub fn key_spaces(&self) -> Vec<u64> {
        match self.dynamic {
            None => self.rows.clone(),
            Some(_) => vec![DYNAMIC_KEY_SPACE; self.rows.len()],
        }
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
/// * `adagrad`: one accumulator per weight, `a_j += g_j^2`, `w_j -= lr * g_j / (sqrt(a_j) +
///   eps)`. State: `d` floats.
/// * `adam`: lazy Adam (the rows of a batch move, the others keep their moments, as
///   TensorFlow's LazyAdam and PyTorch's SparseAdam). Per row: `t += 1`,
///   `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g^2`,
///   `w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)`. Each row counts its own
///   steps `t`, so a rare row's first update is bias-corrected like a frequent row's.
///   State: `m` (`d`), `v` (`d`), `t` (1): `2d + 1` floats. `t` is a float: exact up to
///   2^24 updates of one row, long after the correction factors reach 1.
/// * `ftrl`: FTRL-Proximal (McMahan et al., KDD 2013), per weight with `z` and `n`:
///   `sigma = (sqrt(n + g^2) - sqrt(n)) / lr`, `z += g - sigma * w`, `n += g^2`, then
///   `w = 0` when `|z| <= l1`, else `w = -(z - sign(z) l1) / ((beta + sqrt(n)) / lr + l2)`.
///   State: `z` (`d`, starts at 0), `n` (`d`, starts at `initial_accumulator`).
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
    /// Adagrad with one accumulator per weight.
    Adagrad {
        /// Learning rate. Default 0.01.
        #[serde(default = "default_lr")]
        lr: f32,
        /// Added to `sqrt(accumulator)` in the denominator. Default 1e-8.
        #[serde(default = "default_eps")]
        eps: f32,
        /// Accumulator value of a fresh weight. Default 0.0.
        #[serde(default)]
        initial_accumulator: f32,
    },
    /// Lazy Adam with a per-row step count.
    Adam {
        /// Learning rate. Default 0.001.
        #[serde(default = "default_adam_lr")]
        lr: f32,
        /// Decay of the first moment. Default 0.9.
        #[serde(default = "default_beta1")]
        beta1: f32,
        /// Decay of the second moment. Default 0.999.
        #[serde(default = "default_beta2")]
        beta2: f32,
        /// Added to the square root of the second moment. Default 1e-8.
        #[serde(default = "default_eps")]
        eps: f32,
    },
    /// FTRL-Proximal, per weight.
    Ftrl {
        /// Learning rate (alpha). Default 0.05.
        #[serde(default = "default_ftrl_lr")]
        lr: f32,
        /// Beta of the per-weight rate. Default 1.0.
        #[serde(default = "default_ftrl_beta")]
        beta: f32,
        /// L1 strength: weights whose `|z|` stays at or below it are exactly 0. Default 0.
        #[serde(default)]
        l1: f32,
        /// L2 strength. Default 0.
        #[serde(default)]
        l2: f32,
        /// `n` of a fresh weight. Default 0.1 (as TensorFlow's).
        #[serde(default = "default_ftrl_accumulator")]
        initial_accumulator: f32,
    },
}

fn default_adam_lr() -> f32 {
    0.001
}
fn default_beta1() -> f32 {
    0.9
}
fn default_beta2() -> f32 {
    0.999
}
fn default_ftrl_lr() -> f32 {
    0.05
}
fn default_ftrl_beta() -> f32 {
    1.0
}
fn default_ftrl_accumulator() -> f32 {
    0.1
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

    /// The same optimizer with its learning rate multiplied by `scale` (a schedule's
    /// warm-up or decay).
    pub fn with_lr_scale(mut self, scale: f32) -> Self {
        match &mut self {
            Self::Sgd { lr }
            | Self::RowWiseAdagrad { lr, .. }
            | Self::Adagrad { lr, .. }
            | Self::Adam { lr, .. }
            | Self::Ftrl { lr, .. } => *lr *= scale,
        }
        self
    }

    /// Floats of optimizer state stored after the `dim` weights of each row.
    pub fn state_len(&self, dim: usize) -> usize {
        match self {
            Self::Sgd { .. } => 0,
            Self::RowWiseAdagrad { .. } => 1,
            Self::Adagrad { .. } => dim,
            Self::Adam { .. } => 2 * dim + 1,
            Self::Ftrl { .. } => 2 * dim,
        }
    }

    /// Writes the state of a fresh row (`state_len(dim)` floats).
    pub fn init_state(&self, state: &mut [f32]) {
        match *self {
            Self::Sgd { .. } | Self::Adam { .. } => state.fill(0.0),
            Self::RowWiseAdagrad {
                initial_accumulator,
                ..
            }
            | Self::Adagrad {
                initial_accumulator,
                ..
            } => state.fill(initial_accumulator),
            Self::Ftrl {
                initial_accumulator,
                ..
            } => {
                let (z, n) = state.split_at_mut(state.len() / 2);
                z.fill(0.0);
                n.fill(initial_accumulator);
            }
        }
    }

    /// Checks hyper-parameter ranges.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(EmbeddingError::Optimizer { reason });
        let finite_non_negative = |name: &str, v: f32| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                bad(format!("{name} {v} must be finite and >= 0"))
            }
        };
        match *self {
            Self::Sgd { lr } => finite_non_negative("lr", lr),
            Self::RowWiseAdagrad {
                lr,
                eps,
                initial_accumulator,
            }
            | Self::Adagrad {
                lr,
                eps,
                initial_accumulator,
            } => {
                finite_non_negative("lr", lr)?;
                finite_non_negative("eps", eps)?;
                finite_non_negative("initial_accumulator", initial_accumulator)?;
                if eps == 0.0 && initial_accumulator == 0.0 {
                    return bad(format!(
                        "initial_accumulator {initial_accumulator} must be > 0 when eps is 0 (a zero gradient would divide by 0)"
                    ));
                }
                Ok(())
            }
            Self::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => {
                finite_non_negative("lr", lr)?;
                for (name, b) in [("beta1", beta1), ("beta2", beta2)] {
                    if !(0.0..1.0).contains(&b) {
                        return bad(format!("{name} {b} must be in [0, 1)"));
                    }
                }
                if !(eps.is_finite() && eps > 0.0) {
                    return bad(format!("eps {eps} must be finite and > 0"));
                }
                Ok(())
            }
            Self::Ftrl {
                lr,
                beta,
                l1,
                l2,
                initial_accumulator,
            } => {
                if !(lr.is_finite() && lr > 0.0) {
                    return bad(format!(
                        "lr {lr} must be finite and > 0 (FTRL divides by it)"
                    ));
                }
                finite_non_negative("beta", beta)?;
                finite_non_negative("l1", l1)?;
                finite_non_negative("l2", l2)?;
                finite_non_negative("initial_accumulator", initial_accumulator)
            }
        }
    }
}
