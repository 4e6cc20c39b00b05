//! What an evaluation over held-out samples reports, in one shape for every role: the
//! worker computes it, the master records it and writes it to `result.json`.

use serde::{Deserialize, Serialize};

/// Held-out evaluation result.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EvalResult {
    /// Exact ROC AUC over the whole held-out set.
    pub auc: f64,
    /// Mean log loss.
    pub logloss: f64,
    /// Samples evaluated.
    pub samples: u64,
}
